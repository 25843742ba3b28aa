"""Sphinx configuration for nsqclient's documentation (``make docs``: -W, nitpicky)."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))
sys.path.insert(0, os.path.abspath("_ext"))

project = "nsqclient"
author = "nsqclient developers"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "nsqclient_options"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
exclude_patterns = ["_build"]
html_theme = "alabaster"
# Flags such as --max-msg-size must survive copy and paste: no en dashes, no curly quotes.
smartquotes = False

# Every cross-reference must resolve.  The builds run offline (no intersphinx), so names from
# the standard library and third-party packages that appear in signatures are listed here.
nitpicky = True
nitpick_ignore = [
    ("py:class", name)
    for name in (
        "concurrent.futures._base.Future",
        "nsqclient.lookupd._pool.T",
        "nsqclient.conn._awaiting.T",
        # the alias as annotations name it; documented as nsqclient.conn.AnyFuture
        "nsqclient.conn._futures.AnyFuture",
        "concurrent.futures.Future",
        "Future",
        "threading.Thread",
        "ssl.SSLContext",
        "socket.socket",
        "decimal.Decimal",
        "Decimal",
        "requests.Response",
        "requests.Session",
        "collections.abc.Callable",
        "collections.abc.Sequence",
        "collections.abc.Mapping",
        "collections.abc.Iterable",
        "collections.abc.Iterator",
        "typing.Any",
        "Any",
        "enum.Enum",
        "Exception",
        "TimeoutError",
        "ValueError",
        "argparse.ArgumentTypeError",
        "NamedTuple",
    )
]
