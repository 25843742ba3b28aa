"""Simulated platforms: take away, in this process, what macOS's or Windows' CPython lacks.

Put this directory first on ``PYTHONPATH`` with ``NSQCLIENT_SIMULATE=macos`` or ``windows``
and every Python process started with that environment (the test run, and the CLI and the
embedded servers it starts) loses, before anything else is imported:

* ``macos``: epoll (select.epoll and its constants) and the Linux-only os calls.
* ``windows``: select.poll/epoll/kqueue, fork and its hooks, process groups, POSIX
  signals (SIGKILL, SIGHUP, SIGSTOP, ...) and their calls, os.O_DIRECTORY, AF_UNIX, the
  modules fcntl, resource, pwd, grp and termios; ``select.select`` refuses anything that is
  not a socket and three empty lists, as Windows' does; asyncio's ``add_signal_handler``
  raises NotImplementedError, as Windows' event loops do.

It stays Linux underneath: sys.platform, the socket stack and the file system are Linux's
(user ids stay: pytest asks for them on any sys.platform but Windows),
macOS's kqueue is not there to be chosen, and a Popen is still killed with a POSIX signal
(the stand-in for Windows' TerminateProcess).  Without ``NSQCLIENT_SIMULATE`` it does nothing.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from typing import Any

PLATFORM = os.environ.get("NSQCLIENT_SIMULATE", "")

_LINUX_ONLY_OS = (
    "sched_getaffinity",
    "sched_setaffinity",
    "pipe2",
    "memfd_create",
    "eventfd",
    "pidfd_open",
    "posix_fadvise",
    "splice",
    "copy_file_range",
)

_WINDOWS_MISSING_OS = (
    *_LINUX_ONLY_OS,
    "fork",
    "forkpty",
    "register_at_fork",
    "killpg",
    "getpgid",
    "getpgrp",
    "setpgid",
    "setpgrp",
    "setsid",
    "getsid",
    "getloadavg",
    "nice",
    "mkfifo",
    "statvfs",
    "fstatvfs",
    "sync",
    "chown",
    "fchown",
    "lchown",
    "ttyname",
    "uname",
    "wait3",
    "wait4",
    "O_DIRECTORY",
    "O_NOFOLLOW",
)

_WINDOWS_MISSING_SIGNAL = (
    "SIGKILL",
    "SIGHUP",
    "SIGQUIT",
    "SIGUSR1",
    "SIGUSR2",
    "SIGPIPE",
    "SIGALRM",
    "SIGCHLD",
    "SIGCONT",
    "SIGSTOP",
    "SIGTSTP",
    "SIGTTIN",
    "SIGTTOU",
    "SIGWINCH",
    "SIGURG",
    "SIGXCPU",
    "SIGXFSZ",
    "SIGVTALRM",
    "SIGPROF",
    "SIGIO",
    "SIGPOLL",
    "SIGPWR",
    "SIGSYS",
    "SIGTRAP",
    "SIGBUS",
    "SIGRTMIN",
    "SIGRTMAX",
    "alarm",
    "pause",
    "setitimer",
    "getitimer",
    "siginterrupt",
    "pthread_kill",
    "pthread_sigmask",
    "sigpending",
    "sigwait",
    "sigwaitinfo",
    "sigtimedwait",
)

_WINDOWS_MISSING_MODULES = ("fcntl", "resource", "pwd", "grp", "termios")


def _remove(module: object, names: tuple[str, ...]) -> None:
    for name in names:
        if hasattr(module, name):
            delattr(module, name)


def _replace(module: object, name: str, value: object) -> None:
    """Put the platform's own version of ``name`` in place."""
    setattr(module, name, value)


def _remove_prefixed(module: object, prefixes: tuple[str, ...]) -> None:
    for name in list(vars(module)):
        if name.startswith(prefixes):
            delattr(module, name)


def _is_socket(item: object) -> bool:
    fd = item if isinstance(item, int) else getattr(item, "fileno", lambda: -1)()
    try:
        return stat.S_ISSOCK(os.fstat(fd).st_mode)
    except (OSError, TypeError):
        return False


def _windows_select(real_select: Callable[..., Any]) -> Callable[..., Any]:
    def select(rlist: Any, wlist: Any, xlist: Any, timeout: float | None = None) -> Any:
        if not rlist and not wlist and not xlist:
            raise OSError(22, "An invalid argument was supplied (Windows: select() of nothing)")
        for item in (*rlist, *wlist, *xlist):
            if not _is_socket(item):
                raise OSError(10038, "An operation was attempted on something that is not a socket")
        return real_select(rlist, wlist, xlist, timeout)

    return select


def _loopback_socketpair(*args: object) -> tuple[Any, Any]:
    """Windows has no AF_UNIX pair: its socketpair() connects two TCP sockets on loopback."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    return a, b


def _simulate_macos() -> None:
    import select

    _remove_prefixed(select, ("epoll", "EPOLL"))
    _remove(os, _LINUX_ONLY_OS)


def _simulate_windows() -> None:
    import select
    import selectors
    import signal
    import socket
    import subprocess  # before select loses poll: its pipes need a selector that takes pipes

    _remove_prefixed(select, ("epoll", "EPOLL", "poll", "POLL", "kqueue", "kevent", "KQ_"))
    windows_select = _windows_select(select.select)
    select.select = windows_select
    # selectors chose its classes when imported: leave it only what Windows has.
    _remove(selectors, ("EpollSelector", "PollSelector", "DevpollSelector", "KqueueSelector"))
    _replace(selectors.SelectSelector, "_select", staticmethod(windows_select))
    _replace(selectors, "DefaultSelector", selectors.SelectSelector)
    _remove(os, _WINDOWS_MISSING_OS)
    sigkill = signal.SIGKILL
    _remove(signal, _WINDOWS_MISSING_SIGNAL)
    _remove(socket, ("AF_UNIX",))
    _replace(socket, "socketpair", _loopback_socketpair)
    for name in _WINDOWS_MISSING_MODULES:
        sys.modules[name] = None  # type: ignore[assignment]  # so that importing it fails

    # Windows' Popen.kill() is TerminateProcess; here it must stay a POSIX signal.
    def kill(self: subprocess.Popen[Any]) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sigkill)
            except ProcessLookupError:
                pass

    _replace(subprocess.Popen, "kill", kill)

    import asyncio

    def add_signal_handler(self: object, *args: object) -> None:
        raise NotImplementedError

    _replace(asyncio.SelectorEventLoop, "add_signal_handler", add_signal_handler)


if PLATFORM == "macos":
    _simulate_macos()
elif PLATFORM == "windows":
    _simulate_windows()
elif PLATFORM:
    raise SystemExit(f"NSQCLIENT_SIMULATE={PLATFORM!r}: say macos or windows")
