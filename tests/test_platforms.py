"""What differs between platforms: nsqclient.platforms' answers and fallbacks, the CLI's
standard input where select() takes only sockets, the Spark test cluster's refusal off Linux,
and the simulation (tests/simulated/sitecustomize.py) that the simulated macOS and Windows
passes of ``make test`` run in.  The passes themselves run the integration tests."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from nsqclient import platforms
from nsqclient.cli import pub, to_file
from nsqclient.testing.waiting import wait_for

SIMULATED = Path(__file__).resolve().parent / "simulated"


def test_stop_signals_are_sigint_and_sigterm_and_sigbreak_where_it_exists(monkeypatch):
    assert platforms.stop_signals()[:2] == (signal.SIGINT, signal.SIGTERM)
    monkeypatch.setattr(signal, "SIGBREAK", 21, raising=False)  # Windows' Ctrl-Break
    assert platforms.stop_signals() == (signal.SIGINT, signal.SIGTERM, 21)
    monkeypatch.delattr(signal, "SIGBREAK")
    assert platforms.stop_signals() == (signal.SIGINT, signal.SIGTERM)


def test_register_at_fork_registers_nothing_where_there_is_no_fork(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "register_at_fork", lambda **kw: calls.append(kw), raising=False)
    assert platforms.register_at_fork(print) is True
    assert calls == [{"after_in_child": print}]
    monkeypatch.delattr(os, "register_at_fork")
    assert platforms.register_at_fork(print) is False
    assert len(calls) == 1


@pytest.mark.parametrize("without_poll", [False, True], ids=["poll", "selectors"])
def test_readable_waiter_waits_for_data_then_says_readable(monkeypatch, without_poll):
    if without_poll:
        monkeypatch.delattr(select, "poll", raising=False)
    a, b = socket.socketpair()
    try:
        wait, close = platforms.readable_waiter(a.fileno())
        assert not wait(0.0)
        b.sendall(b"x")
        assert wait(5000.0)
        assert a.recv(1) == b"x"
        assert not wait(0.0)
        close()
    finally:
        a.close()
        b.close()


def test_the_spark_test_cluster_refuses_every_platform_but_linux_at_once(monkeypatch):
    pytest.importorskip("pyspark", reason="nsqclient.spark needs pyspark (spark extra)")
    from nsqclient.spark.standalone import StandaloneCluster, StandaloneError, check_platform

    check_platform("linux")
    for name in ("darwin", "win32", "freebsd14"):
        with pytest.raises(StandaloneError, match=f"Linux only.*{name!r}"):
            check_platform(name)
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(StandaloneError, match="'darwin'"):
        StandaloneCluster(workers=1)  # before any port, directory or process is taken


def test_to_file_fsyncs_no_directory_where_directories_cannot_be_opened(monkeypatch, tmp_path):
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a: opened.append(path) or real_open(path, *a))
    monkeypatch.setattr(to_file, "_CAN_OPEN_DIRECTORIES", True)  # POSIX (Linux underneath)
    to_file._fsync_dir(str(tmp_path))
    assert opened == [str(tmp_path)]
    monkeypatch.setattr(to_file, "_CAN_OPEN_DIRECTORIES", False)
    to_file._fsync_dir(str(tmp_path))
    assert opened == [str(tmp_path)]


# ------------------------------------------------------------------- the CLI's standard input


def _refuse_non_sockets(monkeypatch):
    """select() as Windows has it: sockets only."""
    real = select.select

    def windows_select(r, w, x, timeout=None):
        for item in (*r, *w, *x):
            fd = item if isinstance(item, int) else item.fileno()
            if not isinstance(item, socket.socket) and not _is_socket(fd):
                raise OSError(10038, "not a socket")
        return real(r, w, x, timeout)

    monkeypatch.setattr(select, "select", windows_select)


def _is_socket(fd):
    import stat

    return stat.S_ISSOCK(os.fstat(fd).st_mode)


def _select_takes_pipes() -> bool:
    r, w = os.pipe()
    try:
        select.select([r], [], [], 0)
        return True
    except OSError:
        return False  # simulated Windows
    finally:
        os.close(r)
        os.close(w)


SELECTABLE = [
    pytest.param(
        True,
        id="select",
        marks=pytest.mark.skipif(not _select_takes_pipes(), reason="select() takes no pipe"),
    ),
    pytest.param(False, id="reader-thread"),
]


@pytest.mark.parametrize("selectable", SELECTABLE)
def test_pub_input_reads_a_pipe_to_its_end(monkeypatch, selectable):
    if not selectable:
        _refuse_non_sockets(monkeypatch)
    r, w = os.pipe()
    stop = threading.Event()
    source = pub._Input(r, stop)
    try:
        os.write(w, b"a\nb\n")
        os.close(w)
        assert b"".join(source.chunks()) == b"a\nb\n"
        assert source.ended
    finally:
        os.close(r)


@pytest.mark.parametrize("selectable", SELECTABLE)
def test_pub_input_sees_a_stop_while_the_pipe_is_idle(monkeypatch, selectable):
    if not selectable:
        _refuse_non_sockets(monkeypatch)
    r, w = os.pipe()
    stop = threading.Event()
    source = pub._Input(r, stop)
    chunks = source.chunks()
    try:
        os.write(w, b"first\n")
        assert next(chunks) == b"first\n"
        stop.set()  # the writer stays: only the stop can end the input
        assert list(chunks) == []
        assert not source.ended
        # no_wait: what the input already holds, then nothing more (the writer still there)
        os.write(w, b"held\n")
        if not selectable:  # held once the reader thread has handed it over
            wait_for(lambda: source._chunks is not None and source._chunks.qsize() > 0)
        source.no_wait(1024)
        assert b"".join(source.chunks()) == b"held\n"
        assert not source.ended
    finally:
        os.close(w)
        os.close(r)


# ------------------------------------------------------------------------- the simulation


def _simulated(platform: str, code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, NSQCLIENT_SIMULATE=platform, PYTHONPATH=str(SIMULATED))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


PROBE = """
    import asyncio, os, select, selectors, signal, socket
    missing = [
        name for name, there in [
            ("epoll", hasattr(select, "epoll")), ("poll", hasattr(select, "poll")),
            ("register_at_fork", hasattr(os, "register_at_fork")),
            ("fork", hasattr(os, "fork")), ("killpg", hasattr(os, "killpg")),
            ("SIGKILL", hasattr(signal, "SIGKILL")), ("SIGSTOP", hasattr(signal, "SIGSTOP")),
            ("O_DIRECTORY", hasattr(os, "O_DIRECTORY")),
        ] if not there
    ]
    for module in ("fcntl", "resource", "pwd", "grp", "termios"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    r, w = os.pipe()
    try:
        select.select([r], [], [], 0)
        pipe = "selects pipes"
    except OSError:
        pipe = "refuses pipes"
    try:
        select.select([], [], [], 0)
        empty = "selects nothing"
    except OSError:
        empty = "refuses nothing"
    loop = asyncio.new_event_loop()
    try:
        loop.add_signal_handler(signal.SIGTERM, print)
        handler = "signal handlers"
    except NotImplementedError:
        handler = "no signal handlers"
    loop.close()
    print(" ".join(missing) or "-", "|", pipe, "|", empty, "|", handler, "|",
          selectors.DefaultSelector.__name__)
"""


def test_the_simulations_take_away_what_each_platform_lacks():
    linux = _simulated("", PROBE)
    macos = _simulated("macos", PROBE)
    windows = _simulated("windows", PROBE)
    for done in (linux, macos, windows):
        assert done.returncode == 0, done.stderr
    assert linux.stdout.split() == (
        "- | selects pipes | selects nothing | signal handlers | EpollSelector".split()
    )
    assert macos.stdout.split() == (
        "epoll | selects pipes | selects nothing | signal handlers | PollSelector".split()
    )
    assert (
        windows.stdout.split()
        == (
            "epoll poll register_at_fork fork killpg SIGKILL SIGSTOP O_DIRECTORY"
            " fcntl resource pwd grp termios"
            " | refuses pipes | refuses nothing | no signal handlers | SelectSelector"
        ).split()
    )


def test_a_simulation_that_is_not_named_right_refuses_to_run():
    done = _simulated("beos", "print('ran')")
    assert done.returncode != 0
    assert "say macos or windows" in done.stderr
    assert "ran" not in done.stdout


def test_simulated_windows_still_runs_subprocesses_and_kills_them():
    done = _simulated(
        "windows",
        """
        import subprocess, sys
        print(subprocess.run([sys.executable, "-c", "print(6 * 7)"],
                             capture_output=True, text=True).stdout.strip())
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        p.kill()
        print(p.wait(10) != 0)
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["42", "True"]


@pytest.mark.parametrize("platform", ["macos", "windows"])
def test_a_producer_reads_with_its_reader_thread_where_there_is_no_epoll(platform):
    done = _simulated(
        platform,
        """
        from nsqclient import platforms
        from nsqclient.conn._connection import Connection
        print(platforms.HAS_EPOLL)
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]
