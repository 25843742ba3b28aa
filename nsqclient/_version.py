"""The version of nsqclient, in a module that imports nothing (setup.cfg and the handshake read
it without importing the package)."""

__version__ = "0.1.0"
