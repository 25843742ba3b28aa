"""Byte streams over a socket: plain TCP, TLS, snappy and deflate, in the order NSQ layers them.

A :class:`Transport` wraps one connected socket.  The connection's handshake (magic, IDENTIFY,
upgrades, AUTH) runs on a single thread; after it, one reader at a time calls :meth:`recv` or
:meth:`recv_within` (the connection's reader thread, or on a plain transport a requester that
took the reading over: see :meth:`Connection.read_until <nsqclient.conn.Connection.read_until>`)
and one writer at a time calls :meth:`sendall` and :meth:`flush` (the connection serialises its
writers with a lock, and in caller-reads mode its readers too).  That is the only concurrency
the class supports: one reader plus one writer, never two of either at once.

Layers, bottom up, as nsqd applies them after IDENTIFY::

    TCP  ->  TLS (optional)  ->  snappy OR deflate (optional)  ->  NSQ frames

TLS is driven through :class:`ssl.SSLObject` over a pair of :class:`ssl.MemoryBIO`, never an
:class:`ssl.SSLSocket`, so that the reader and the writer can work at the same time: every call
into the SSL object takes a lock, the socket itself is read and written outside that lock.  A
read can make OpenSSL produce bytes for the peer (a TLS 1.3 KeyUpdate reply, a post-handshake
client certificate).  The reader never writes the socket, so it leaves those
bytes pending and calls the callback given to :meth:`Transport.set_output_callback`; the writer
then calls :meth:`Transport.flush`.  Without a callback they stay pending until the next
:meth:`Transport.sendall` or :meth:`Transport.flush`, which always send pending TLS output first.

Upgrades and bytes already read.  ``recv(n)`` never returns more than ``n`` bytes.  Without TLS
it never reads more than ``n`` bytes from the socket; with TLS the ciphertext is read greedily,
but bytes TLS decrypted and ``recv`` did not return stay inside TLS, below any later
compression layer, where they belong.  So a handshake that reads frame by frame (``recv(4)``
for the size, then ``recv(size)``) never holds bytes of the next layer and needs nothing more.
A handshake that reads greedily, where one ``recv(65536)`` may return the IDENTIFY reply *and*
the compressed ``OK`` nsqd sends right after it, must give the bytes it has not consumed back
with :meth:`Transport.push_back` before calling ``upgrade_snappy()``/``upgrade_deflate()``
(or ``upgrade_tls()``); the upgrade feeds them to the new layer as its first input.

Errors: :meth:`Transport.recv` returns ``b""`` at end of stream (a TLS close_notify or a TCP close,
with or without close_notify) and keeps returning ``b""`` after it.  It raises :class:`OSError`
(``TimeoutError`` after the read timeout, ``ssl.SSLError`` for TLS failures) and
:class:`nsqclient.errors.ProtocolError` when the compressed stream is corrupt.  After any
exception other than ``TimeoutError`` the transport is broken and the connection must be closed;
after a ``TimeoutError`` in :meth:`recv` it can be called again (nothing read is lost).  A
``TimeoutError`` in :meth:`sendall` may leave part of the data sent: close the connection.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import snappy

from ..errors import ProtocolError
from ..platforms import readable_waiter

__all__ = ["Transport", "make_tls_context"]

logger = logging.getLogger("nsqclient.transport")

#: Raw bytes asked of the socket per read when TLS is on (the ciphertext goes into a MemoryBIO).
_TLS_RAW_READ = 128 * 1024
#: Bytes of the layer below asked for per read when decompressing.
_COMPRESSED_READ = 64 * 1024
#: Plaintext handed to SSLObject.write per call; bounds the ciphertext held in memory at once.
_TLS_WRITE_CHUNK = 256 * 1024


class Transport:
    """A byte stream over one connected socket, with optional TLS and snappy/deflate layers.

    ``sock`` is a connected, blocking stream socket.  The transport owns it from now on: it
    changes its timeout (see :meth:`settimeout`) and closes it in :meth:`close`.

    ``bytes_in`` and ``bytes_out`` count the raw bytes read from and written to the socket (after
    TLS and compression), updated by the reader and the writer respectively.
    """

    def __init__(self, sock: socket.socket):
        self._sock = sock
        # Writes go through _wsock: the same socket, or after set_timeouts() a duplicate of it
        # whose Python-level timeout bounds writes only.
        self._wsock = sock
        self._closed = False
        self._shut_down = False
        self.bytes_in = 0
        self.bytes_out = 0
        self._recv_view: memoryview | None = None  # see _recv_copy
        # Bytes of the current top layer read but not yet returned by recv(): _rbuf[_rpos:].
        self._rbuf = b""
        self._rpos = 0
        # TLS state; every call into _sslobj or the BIOs holds _tls_lock.
        self._tls_lock = threading.Lock()
        self._sslobj: ssl.SSLObject | None = None
        self._incoming: ssl.MemoryBIO | None = None
        self._outgoing: ssl.MemoryBIO | None = None
        self._tls_eof = False
        self._raw_buf: bytearray | None = None
        self._raw_view: memoryview | None = None
        self._plain_buf: bytearray | None = None
        self._plain_view: memoryview | None = None
        self._output_callback: Callable[[], None] | None = None
        # Compression state: _compress is used by the writer only, _decompress by the reader only.
        self._compression: str | None = None
        self._compress: Callable[[bytes], bytes] | None = None
        self._decompress: Callable[[bytes], bytes] | None = None
        # A duplicate of the socket in non-blocking mode, for recv_nowait() (made on first use),
        # and a waiter on it for recv_within() (see platforms.readable_waiter).
        self._nsock: socket.socket | None = None
        self._readable: Callable[[float], list[Any]] | None = None
        self._close_waiter: Callable[[], None] = _nothing

    # ----------------------------------------------------------------------------------------
    # Introspection

    @property
    def tls_version(self) -> str | None:
        """The negotiated TLS version (``"TLSv1.3"``...), or ``None`` without TLS."""
        if self._sslobj is None:
            return None
        return self._sslobj.version()

    @property
    def compression(self) -> str | None:
        """``"snappy"``, ``"deflate"`` or ``None``."""
        return self._compression

    @property
    def pending_output(self) -> int:
        """TLS bytes produced by reads and waiting for :meth:`flush` (0 without TLS)."""
        if self._outgoing is None:
            return 0
        with self._tls_lock:
            return self._outgoing.pending

    # ----------------------------------------------------------------------------------------
    # Socket control

    def settimeout(self, seconds: float | None) -> None:
        """Set one timeout in seconds for reads and writes alike (``None``: block forever).

        It bounds every single socket read, and every socket write: a :meth:`sendall` that has
        not completed after that long raises ``TimeoutError``.  The handshake runs under this;
        :meth:`set_timeouts` replaces it afterwards.
        """
        self._sock.settimeout(seconds)
        self._wsock.settimeout(seconds)

    def set_timeouts(self, read: float, write: float) -> None:
        """Bound reads and writes separately (seconds, both positive).

        A :meth:`recv` that gets no byte for ``read`` seconds raises ``TimeoutError``; a
        :meth:`sendall` that has not completed after ``write`` seconds raises ``TimeoutError``
        (part of the data may have been sent: close the connection).  Writes use a duplicate
        of the socket from then on, so that each direction keeps its own timeout.
        """
        if read <= 0 or write <= 0:
            raise ValueError(f"timeouts must be positive, not read={read!r} write={write!r}")
        self._sock.settimeout(read)
        if self._wsock is self._sock:
            self._wsock = self._sock.dup()
        self._wsock.settimeout(write)

    def set_output_callback(self, wake_writer: Callable[[], None] | None) -> None:
        """Register the function :meth:`recv` calls when a TLS read left bytes to send.

        It is called on the reader thread, outside any lock, and must only wake the writer
        thread, which then calls :meth:`flush`.  Set it when the reader and writer threads start;
        ``None`` removes it (pending output then waits for the next write).
        """
        self._output_callback = wake_writer

    def shutdown(self) -> None:
        """Shut the socket down both ways; a :meth:`recv` blocked in another thread returns ``b""``.

        Safe to call from any thread, more than once, and on a socket the peer already closed.
        From then on :meth:`recv` returns ``b""`` rather than raising for a reset connection
        (Linux answers data that arrives after a shutdown with a reset).
        """
        self._shut_down = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        """Close the socket (idempotent).

        Call :meth:`shutdown` first if a reader may be blocked in :meth:`recv`.
        """
        if self._closed:
            return
        self._closed = True
        self._output_callback = None
        self._close_waiter()
        for sock in {self._sock, self._wsock, self._nsock or self._sock}:
            try:
                sock.close()
            except OSError:  # pragma: no cover - close() on a socket practically never fails
                pass

    # ----------------------------------------------------------------------------------------
    # Reading

    @property
    def plain(self) -> bool:
        """True while no TLS or compression layer is installed: reads are plain socket reads,
        which :meth:`recv_nowait` and :meth:`recv_within` need."""
        return self._sslobj is None and self._decompress is None

    def fileno(self) -> int:
        """The socket's file descriptor (to poll for readability)."""
        return self._sock.fileno()

    def recv_nowait(self, max_bytes: int = 65536) -> bytes | None:
        """Plain transports only: up to ``max_bytes`` bytes already waiting, ``b""`` at end of
        stream, or None when nothing is waiting.  Never blocks."""
        if self._rpos < len(self._rbuf):
            return self._take(max_bytes)
        nsock = self._nsock
        if nsock is None:
            nsock = self._nonblocking_socket()
        try:
            return self._recv_copy(nsock, max_bytes)
        except BlockingIOError:
            return None

    def recv_within(self, max_bytes: int, timeout: float) -> bytes:
        """Plain transports only: like :meth:`recv`, but waiting at most ``timeout`` seconds
        (``TimeoutError`` then) instead of the read timeout.  The caller must be the only
        reader while it runs."""
        if self._rpos < len(self._rbuf):
            return self._take(max_bytes)
        if self._nsock is None:
            self._nonblocking_socket()
        readable = self._readable
        assert readable is not None
        deadline = time.monotonic() + timeout
        while True:
            # Poll first: a requester reads right after sending, before the answer is in.
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not readable(min(remaining, 3600.0) * 1000.0):
                raise TimeoutError(f"no data within {timeout:g} s")
            data = self.recv_nowait(max_bytes)
            if data is not None:
                return data

    def _nonblocking_socket(self) -> socket.socket:
        nsock = self._sock.dup()
        nsock.settimeout(0.0)
        self._readable, self._close_waiter = readable_waiter(nsock.fileno())
        self._nsock = nsock
        return nsock

    def push_back(self, data: bytes) -> None:
        """Give back bytes returned by :meth:`recv` that the caller did not consume.
        The next :meth:`recv` returns them first.  If a compression upgrade is made before that,
        they are decoded by the new layer instead: use this when a greedy read during the
        handshake returned the bytes that follow the last uncompressed frame.
        """
        if not data:
            return
        rest = self._rbuf[self._rpos :] if self._rpos else self._rbuf
        self._rbuf = bytes(data) + rest
        self._rpos = 0

    def recv(self, max_bytes: int = 65536) -> bytes:
        """Return the next 1 to ``max_bytes`` bytes of the stream; ``b""`` at end of stream.

        Blocks until at least one byte is available, up to the socket timeout (``TimeoutError``).
        Reader thread only (or the handshake thread before the reader starts).
        """
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, not {max_bytes!r}")
        if self._rpos < len(self._rbuf):
            return self._take(max_bytes)
        decompress = self._decompress
        if decompress is None:
            return self._lower_recv(max_bytes)
        while True:
            raw = self._lower_recv(_COMPRESSED_READ)
            if not raw:
                return b""
            out = decompress(raw)
            if not out:
                continue  # only part of a chunk so far
            if len(out) <= max_bytes:
                return out
            self._rbuf = out
            self._rpos = 0
            return self._take(max_bytes)

    def _take(self, max_bytes: int) -> bytes:
        buf = self._rbuf
        pos = self._rpos
        end = pos + max_bytes
        if end >= len(buf):
            chunk = buf[pos:] if pos else buf
            self._rbuf = b""
            self._rpos = 0
        else:
            chunk = buf[pos:end]
            self._rpos = end
        return chunk

    def _drain_rbuf(self) -> bytes:
        rest = self._rbuf[self._rpos :] if self._rpos else self._rbuf
        self._rbuf = b""
        self._rpos = 0
        return rest

    def _lower_recv(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` bytes from below the compression layer (TLS plaintext or TCP)."""
        if self._sslobj is not None:
            return self._tls_recv(max_bytes)
        return self._recv_copy(self._sock, max_bytes)

    def _recv_copy(self, sock: socket.socket, max_bytes: int) -> bytes:
        """``sock.recv(max_bytes)`` through a buffer kept for the purpose: the bytes returned
        are as large as the data, not ``max_bytes`` shrunk afterwards (a large allocation
        per read lets glibc's heap grow, see conn._WRITE_SIZE).  One reader at a time.  Counted
        in ``bytes_in``; ``b""`` once shut down; BlockingIOError from a non-blocking socket
        with nothing waiting."""
        view = self._recv_view
        if view is None or len(view) < max_bytes:
            view = self._recv_view = memoryview(bytearray(max_bytes))
        try:
            n = sock.recv_into(view, max_bytes)
        except BlockingIOError:
            raise
        except OSError:
            if self._shut_down:
                return b""
            raise
        self.bytes_in += n
        return view[:n].tobytes()

    def _tls_recv(self, max_bytes: int) -> bytes:
        if self._tls_eof:
            return b""
        sslobj = self._sslobj
        incoming = self._incoming
        outgoing = self._outgoing
        assert sslobj is not None and incoming is not None and outgoing is not None
        if self._plain_buf is None or len(self._plain_buf) < max_bytes:
            self._plain_buf = bytearray(max(max_bytes, 16 * 1024))
            self._plain_view = memoryview(self._plain_buf)
        plain = self._plain_view
        raw = self._raw_view
        assert plain is not None and raw is not None
        lock = self._tls_lock
        while True:
            pos = 0
            eof = False
            with lock:
                try:
                    # Decrypt every complete record already buffered, up to max_bytes.
                    while pos < max_bytes:
                        # With a buffer, read() returns the count it wrote there; typeshed
                        # declares bytes (the return without a buffer).
                        n: int = sslobj.read(max_bytes - pos, plain[pos:max_bytes])  # type: ignore[assignment]
                        if n == 0:  # close_notify received
                            eof = True
                            break
                        pos += n
                except ssl.SSLWantReadError:
                    pass
                except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                    # close_notify, or TCP closed without one (treated as EOF like SSLSocket does
                    # by default; the NSQ framing above notices a truncated frame anyway).
                    eof = True
                has_output = outgoing.pending > 0
            if has_output:
                callback = self._output_callback
                if callback is not None:
                    callback()
            if eof:
                self._tls_eof = True
            if pos or eof:
                return bytes(plain[:pos])
            try:
                n = self._sock.recv_into(raw)
            except OSError:
                if not self._shut_down:
                    raise
                n = 0
            self.bytes_in += n
            with lock:
                if n:
                    incoming.write(raw[:n])
                else:
                    incoming.write_eof()

    # ----------------------------------------------------------------------------------------
    # Writing

    def sendall(self, data: bytes) -> None:
        """Send all of ``data`` through every layer (compressing, encrypting).

        One writer at a time (or the handshake thread before the writer starts).  Pending TLS
        output produced by reads goes out first.  Raises ``OSError`` (``TimeoutError`` after the
        socket timeout without progress).
        """
        if self._compress is not None and data:
            data = self._compress(data)
        if self._sslobj is not None:
            self._tls_sendall(data)
        elif data:
            self._send_raw(data)

    def flush(self) -> None:
        """Send TLS bytes that reads produced (see :meth:`set_output_callback`).  A writer."""
        if self._sslobj is not None:
            self._tls_sendall(b"")

    def _tls_sendall(self, data: bytes) -> None:
        sslobj = self._sslobj
        outgoing = self._outgoing
        assert sslobj is not None and outgoing is not None
        view = memoryview(data)
        total = len(view)
        off = 0
        while True:
            with self._tls_lock:
                if off < total:
                    end = min(off + _TLS_WRITE_CHUNK, total)
                    off += sslobj.write(view[off:end])
                out = outgoing.read()
            if out:
                self._send_raw(out)
            if off >= total:
                return

    def _send_raw(self, data: bytes) -> None:
        wsock = self._wsock
        nsock = self._nsock
        if nsock is not None:
            # One non-blocking attempt first: it nearly always takes everything, and spares
            # the poll() a socket in timeout mode makes before each send.
            try:
                sent = nsock.send(data)
            except BlockingIOError:
                sent = 0
            if sent == len(data):
                self.bytes_out += sent
                return
            self.bytes_out += sent
            data = data[sent:]
        try:
            wsock.sendall(data)
        except TimeoutError as exc:
            raise TimeoutError(
                f"socket write did not complete within {wsock.gettimeout():g} s"
            ) from exc
        self.bytes_out += len(data)

    # ----------------------------------------------------------------------------------------
    # Upgrades (handshake phase, one thread)

    def upgrade_tls(
        self, context: ssl.SSLContext, server_hostname: str | None, timeout: float
    ) -> None:
        """Run the TLS client handshake now; from then on every byte goes through TLS.

        ``server_hostname`` is checked against the certificate when ``context.check_hostname``
        is on (an IP address matches an IP subjectAltName) and sent as SNI when it is a name.
        ``timeout`` (seconds) bounds the whole handshake (``TimeoutError``).  A certificate that
        fails verification raises :class:`ssl.SSLCertVerificationError` naming the host, the
        reason and the options that fix it (``tls_ca_file``, ``tls_verify=False``); a peer
        that closes during the handshake raises ``ConnectionError``.  Bytes given back with
        :meth:`push_back` before this call are fed to TLS as the first ciphertext.
        """
        if self._sslobj is not None:
            raise RuntimeError("TLS is already on for this transport")
        if self._compression is not None:
            raise RuntimeError("TLS must be negotiated before compression")
        if context.check_hostname and not server_hostname:
            raise ValueError("server_hostname is required when the TLS context checks host names")
        incoming = ssl.MemoryBIO()
        outgoing = ssl.MemoryBIO()
        sslobj = context.wrap_bio(
            incoming, outgoing, server_side=False, server_hostname=server_hostname
        )
        leftover = self._drain_rbuf()
        if leftover:
            incoming.write(leftover)
        raw_buf = bytearray(_TLS_RAW_READ)
        raw_view = memoryview(raw_buf)
        deadline = time.monotonic() + timeout
        previous_timeout = self._sock.gettimeout()
        try:
            while True:
                try:
                    sslobj.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    pass
                out = outgoing.read()
                if out:
                    self._handshake_send(out, deadline, timeout)
                n = self._handshake_recv(raw_view, deadline, timeout)
                if n:
                    incoming.write(raw_view[:n])
                else:
                    incoming.write_eof()
            out = outgoing.read()  # the client Finished (TLS 1.3) or the last flight
            if out:
                self._handshake_send(out, deadline, timeout)
        except ssl.SSLCertVerificationError as exc:
            self._send_alert(outgoing)
            peer = server_hostname or self._peer_name()
            reason = exc.verify_message or exc.reason or str(exc)
            err = ssl.SSLCertVerificationError(
                exc.errno,
                f"TLS certificate verification failed for {peer}: {reason}; pass the CA that"
                " signed nsqd's certificate as tls_ca_file (a PEM file), or tls_verify=False to"
                " skip verification (anyone on the path can then read and change the traffic)",
            )
            err.verify_code = exc.verify_code
            err.verify_message = exc.verify_message
            err.library = exc.library
            err.reason = exc.reason
            raise err from exc
        except ssl.SSLEOFError as exc:
            raise ConnectionError(
                f"{self._peer_name()} closed the connection during the TLS handshake"
            ) from exc
        except ssl.SSLError:
            self._send_alert(outgoing)
            raise
        finally:
            try:
                self._sock.settimeout(previous_timeout)
            except OSError:
                pass
        self._incoming = incoming
        self._outgoing = outgoing
        self._raw_buf = raw_buf
        self._raw_view = raw_view
        self._sslobj = sslobj
        logger.debug("TLS on with %s: %s %s", self._peer_name(), sslobj.version(), sslobj.cipher())

    def _handshake_send(self, data: bytes, deadline: float, timeout: float) -> None:
        self._set_remaining(deadline, timeout)
        try:
            self._sock.sendall(data)
        except TimeoutError:
            raise TimeoutError(f"TLS handshake timed out after {timeout:g} s") from None
        self.bytes_out += len(data)

    def _handshake_recv(self, view: memoryview, deadline: float, timeout: float) -> int:
        self._set_remaining(deadline, timeout)
        try:
            n = self._sock.recv_into(view)
        except TimeoutError:
            raise TimeoutError(f"TLS handshake timed out after {timeout:g} s") from None
        self.bytes_in += n
        return n

    def _set_remaining(self, deadline: float, timeout: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"TLS handshake timed out after {timeout:g} s")
        self._sock.settimeout(remaining)

    def _send_alert(self, outgoing: ssl.MemoryBIO) -> None:
        """Best effort: tell the peer why the handshake failed (the alert OpenSSL queued)."""
        try:
            out = outgoing.read()
            if out:
                self._sock.settimeout(1.0)
                self._sock.sendall(out)
                self.bytes_out += len(out)
        except OSError:
            pass

    def _peer_name(self) -> str:
        try:
            peer = self._sock.getpeername()
        except OSError:
            return "the server"
        if isinstance(peer, tuple) and len(peer) >= 2:
            return f"{peer[0]}:{peer[1]}"
        return str(peer) or "the server"

    def upgrade_snappy(self) -> None:
        """From now on both directions are snappy framed (stream format), above TLS if on.

        Bytes already received and not yet returned (see :meth:`push_back`) are decoded as the
        start of the snappy stream.
        """
        self._check_no_compression()
        compressor = snappy.StreamCompressor()
        decompressor = snappy.StreamDecompressor()

        def decompress(data: bytes) -> bytes:
            try:
                return decompressor.decompress(data)
            except Exception as exc:  # cramjam raises OSError or DecompressionError
                raise ProtocolError(f"corrupt snappy stream: {exc}") from exc

        self._install("snappy", compressor.add_chunk, decompress)

    def upgrade_deflate(self, level: int) -> None:
        """From now on both directions are raw deflate (no zlib header), above TLS if on.

        ``level`` is the compression level of what we send, 0 to 9 (use the ``deflate_level``
        nsqd answered in IDENTIFY).  Every :meth:`sendall` ends with a sync flush, so the server
        can decode each write as soon as it arrives.  Bytes already received and not yet
        returned (see :meth:`push_back`) are decoded as the start of the deflate stream.
        """
        if not 0 <= level <= 9:
            raise ValueError(f"deflate level must be 0 to 9, not {level!r}")
        self._check_no_compression()
        compressor = zlib.compressobj(level, zlib.DEFLATED, -15)
        decompressor = zlib.decompressobj(-15)
        sync = zlib.Z_SYNC_FLUSH

        def compress(data: bytes) -> bytes:
            return compressor.compress(data) + compressor.flush(sync)

        def decompress(data: bytes) -> bytes:
            try:
                return decompressor.decompress(data)
            except zlib.error as exc:
                raise ProtocolError(f"corrupt deflate stream: {exc}") from exc

        self._install("deflate", compress, decompress)

    def _check_no_compression(self) -> None:
        if self._compression is not None:
            raise RuntimeError(f"{self._compression} compression is already on")

    def _install(
        self, name: str, compress: Callable[[bytes], bytes], decompress: Callable[[bytes], bytes]
    ) -> None:
        leftover = self._drain_rbuf()
        self._compression = name
        self._compress = compress
        self._decompress = decompress
        if leftover:
            out = decompress(leftover)
            if out:
                self._rbuf = out
        logger.debug("%s compression on with %s", name, self._peer_name())


def make_tls_context(
    ca_file: str | None = None,
    verify: bool = True,
    cert_file: str | None = None,
    key_file: str | None = None,
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2,
) -> ssl.SSLContext:
    """A client :class:`ssl.SSLContext` for :meth:`Transport.upgrade_tls`.

    ``verify``: check the server certificate and host name, against ``ca_file`` (a PEM bundle)
    or, without one, the system's default CAs.  ``verify=False`` accepts any certificate.
    ``cert_file``/``key_file``: a client certificate for nsqd's ``--tls-client-auth-policy``
    (``key_file`` may be omitted when the key is in ``cert_file``).  ``min_version``: the oldest
    TLS version accepted.  Renegotiation is refused (nsqd, being Go, never asks for it).
    """
    if key_file is not None and cert_file is None:
        raise ValueError("key_file (option tls_key_file) needs cert_file (tls_cert_file)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = min_version
    if verify:
        context.verify_mode = ssl.CERT_REQUIRED
        context.check_hostname = True
        if ca_file is not None:
            context.load_verify_locations(cafile=ca_file)
        else:
            context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert_file is not None:
        context.load_cert_chain(cert_file, key_file)
    context.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    return context


def _nothing() -> None:
    pass
