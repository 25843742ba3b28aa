"""Fixtures for the tests of the ``nsqclient`` command: run it as a subprocess, watch its output."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nsqclient.testing.waiting import wait_for

#: Seconds any one tool run may take before the test fails.
RUN_TIMEOUT = 60.0


class Running:
    """A started ``nsqclient`` process whose stdout lines and stderr are collected by threads
    (stdout is left unread when ``read_stdout`` is False, so that the pipe fills up)."""

    def __init__(self, args: list[str], stdin: Any, read_stdout: bool):
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nsqclient", *args],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self._lines: list[bytes] = []
        self._stderr = bytearray()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._read_stderr, daemon=True)]
        if read_stdout:
            self._threads.append(threading.Thread(target=self._read_stdout, daemon=True))
        for t in self._threads:
            t.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lock:
                self._lines.append(line)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for chunk in iter(lambda: self.proc.stderr.read1(65536), b""):  # type: ignore[union-attr]
            with self._lock:
                self._stderr.extend(chunk)

    def lines(self) -> list[bytes]:
        with self._lock:
            return list(self._lines)

    @property
    def stderr(self) -> str:
        with self._lock:
            return self._stderr.decode("utf-8", "replace")

    def wait_lines(self, count: int, timeout: float = 20.0) -> list[bytes]:
        wait_for(
            lambda: len(self.lines()) >= count or self.proc.poll() is not None,
            timeout,
            message=lambda: f"{len(self.lines())} lines of {count}; stderr: {self.stderr}",
        )
        lines = self.lines()
        assert len(lines) >= count, f"exited {self.proc.returncode}: {self.stderr}"
        return lines

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = RUN_TIMEOUT) -> int:
        code = self.proc.wait(timeout)
        for t in self._threads:
            t.join(timeout)
        return code


class CLI:
    """Runs ``python -m nsqclient`` (the same interpreter as the tests)."""

    def __init__(self) -> None:
        self.running: list[Running] = []

    def run(
        self, *args: str, input: bytes | None = None, timeout: float = RUN_TIMEOUT
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "nsqclient", *args],
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
        )

    def start(
        self, *args: str, stdin: Any = subprocess.DEVNULL, read_stdout: bool = True
    ) -> Running:
        running = Running(list(args), stdin, read_stdout)
        self.running.append(running)
        return running

    def close(self) -> None:
        for running in self.running:
            if running.proc.poll() is None:
                running.proc.kill()
                running.proc.wait(10)
            for stream in (running.proc.stdin, running.proc.stdout, running.proc.stderr):
                if stream is not None:
                    stream.close()


@pytest.fixture
def cli() -> Iterator[CLI]:
    runner = CLI()
    yield runner
    runner.close()


@pytest.fixture
def free_port() -> Callable[[], int]:
    """A TCP port on 127.0.0.1 that nothing listens on (bound, then released)."""
    import socket

    def make() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    return make
