"""The real binaries' runner (nsqclient/testing/real.py): a stalled process is stopped, as the
kernel shows it, before ``stall_nsqd()`` returns, read from /proc or, where there is none, from
``ps``."""

from __future__ import annotations

import builtins
import os
import signal
import subprocess
import sys

import pytest

from nsqclient.testing import real
from nsqclient.testing.waiting import wait_for

pytestmark = pytest.mark.skipif(
    not hasattr(signal, "SIGSTOP") or not sys.platform.startswith("linux"),
    reason="SIGSTOP and /proc (the ps fallback is tested by taking /proc away)",
)


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait(10)


def test_a_running_process_is_not_stopped_and_a_stopped_one_is(sleeper):
    assert not real._is_stopped(sleeper.pid)
    os.kill(sleeper.pid, signal.SIGSTOP)
    wait_for(lambda: real._is_stopped(sleeper.pid), 10)
    os.kill(sleeper.pid, signal.SIGCONT)
    wait_for(lambda: not real._is_stopped(sleeper.pid), 10)


def test_without_proc_ps_tells(sleeper, monkeypatch):
    opened = builtins.open

    def no_proc(path, *args, **kwargs):
        if str(path).startswith("/proc/"):
            raise FileNotFoundError(path)
        return opened(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_proc)
    assert not real._is_stopped(sleeper.pid)
    os.kill(sleeper.pid, signal.SIGSTOP)
    wait_for(lambda: real._is_stopped(sleeper.pid), 10)


def test_freeze_returns_once_the_process_is_stopped(sleeper, tmp_path):
    process = real._Process("sleeper", [], tmp_path / "log")
    process.proc = sleeper
    process.freeze(signal.SIGSTOP)
    assert real._is_stopped(sleeper.pid)  # at once: no wait after freeze() returned
    os.kill(sleeper.pid, signal.SIGCONT)
