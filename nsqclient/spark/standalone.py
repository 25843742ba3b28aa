"""A Spark standalone cluster on this machine, for tests and benchmarks.

:class:`StandaloneCluster` starts a master and workers from the installed pyspark's own
``bin/spark-class`` (``org.apache.spark.deploy.master.Master`` and
``org.apache.spark.deploy.worker.Worker spark://...``) on free loopback ports, each in a
process group of its own (a worker's executors are its children, so killing the group is a
machine going away), with ``PYSPARK_PYTHON`` pointing at the interpreter given (this one by
default), and stops them all on :meth:`StandaloneCluster.stop`::

    with StandaloneCluster(workers=2) as cluster:
        spark = cluster.session_builder().getOrCreate()
        ...
        spark.stop()

:meth:`StandaloneCluster.session_builder` is ``SparkSession.builder.master(cluster.url)`` that
also makes this process's SparkContext name that interpreter (``PYSPARK_PYTHON``): executors
run the Python the driver names, not the one in their worker's environment.

It runs on Linux only (:func:`check_platform` refuses any other platform at once, by name).
It needs Java (``JAVA_HOME`` or ``java`` on the PATH) and imports nothing of pyspark but its
location (and ``SparkSession``, in :meth:`StandaloneCluster.session_builder`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["StandaloneCluster", "StandaloneError", "check_platform", "spark_home"]

HOST = "127.0.0.1"


class StandaloneError(RuntimeError):
    """The cluster did not start (the message carries the tail of the failing log)."""


def spark_home() -> Path:
    """``$SPARK_HOME``, else the installed pyspark's directory (which has ``bin/`` and
    ``jars/``)."""
    env = os.environ.get("SPARK_HOME")
    if env:
        return Path(env)
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise StandaloneError("pyspark is not installed and SPARK_HOME is not set")
    return Path(spec.origin).parent


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass
class _Daemon:
    name: str
    argv: list[str]
    log: Path
    web_port: int
    process: subprocess.Popen[bytes] | None = None

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def check_platform(platform: str | None = None) -> None:
    """Raise :class:`StandaloneError` at once off Linux: the cluster's processes are found
    and killed through process groups and ``/proc``, which only Linux has together.
    ``platform`` is ``sys.platform`` by default."""
    platform = sys.platform if platform is None else platform
    if not platform.startswith("linux"):
        raise StandaloneError(
            f"nsqclient.spark.standalone runs Spark clusters for tests on Linux only (it needs "
            f"/proc and process groups); this is {platform!r}. Start a standalone cluster with "
            "Spark's own sbin/start-master.sh and sbin/start-worker.sh instead"
        )


class StandaloneCluster:
    """A master and ``workers`` workers (``cores`` cores and ``memory`` each).

    Args:
        workers: how many workers.
        cores, memory: what each worker offers (``--cores``, ``--memory``).
        python: the Python of the cluster's Spark applications (``PYSPARK_PYTHON``); this one
            by default.  It is set in the environment of the master and the workers, but
            Spark runs the interpreter the *driver* names: a session made with
            :meth:`session_builder` names it; a session made otherwise needs
            ``PYSPARK_PYTHON`` set in its process before it starts.
        work_dir: where logs and the workers' directories go (a temporary directory, removed
            by :meth:`stop`, by default).
        start_timeout: seconds to wait for the master and every worker to be ALIVE.
    """

    def __init__(
        self,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        python: str | None = None,
        work_dir: str | None = None,
        start_timeout: float = 90.0,
    ):
        check_platform()
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.python = python or sys.executable
        self.start_timeout = start_timeout
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="nsq-spark-standalone-"))
        self.port = _free_port()
        self.web_port = _free_port()
        self.url = f"spark://{HOST}:{self.port}"
        self._master: _Daemon | None = None
        self._workers: list[_Daemon] = []
        self._lock = threading.Lock()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ lifecycle

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_home()),
            PYSPARK_PYTHON=self.python,
            SPARK_LOCAL_IP=HOST,
            SPARK_LOG_DIR=str(self.work_dir / "logs"),
            SPARK_WORKER_DIR=str(self.work_dir / "work"),
        )
        return env

    def _spawn(self, daemon: _Daemon) -> None:
        daemon.log.parent.mkdir(parents=True, exist_ok=True)
        with open(daemon.log, "ab") as log:
            daemon.process = subprocess.Popen(
                daemon.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._env(),
                cwd=self.work_dir,
                start_new_session=True,  # its own process group: the executors come with it
            )

    def start(self) -> StandaloneCluster:
        """Start the master, then the workers; return when every worker is ALIVE."""
        spark_class = str(spark_home() / "bin" / "spark-class")
        self._master = _Daemon(
            "master",
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                HOST,
                "--port",
                str(self.port),
                "--webui-port",
                str(self.web_port),
            ],
            self.work_dir / "logs" / "master.log",
            self.web_port,
        )
        try:
            self._spawn(self._master)
            self._wait(lambda state: state.get("status") == "ALIVE", self._master)
            for i in range(self.workers):
                self.start_worker(i)
            self._wait(lambda state: self.alive_workers(state) >= self.workers, self._master)
        except BaseException:
            self.stop()
            raise
        return self

    def start_worker(self, index: int | None = None) -> None:
        """Start a worker (the ``index``-th again after :meth:`kill_worker`, else a new one)."""
        with self._lock:
            if index is not None and index < len(self._workers):
                daemon = self._workers[index]
            else:
                index = len(self._workers)
                port, web = _free_port(), _free_port()
                daemon = _Daemon(
                    f"worker-{index}",
                    [
                        str(spark_home() / "bin" / "spark-class"),
                        "org.apache.spark.deploy.worker.Worker",
                        self.url,
                        "--host",
                        HOST,
                        "--port",
                        str(port),
                        "--webui-port",
                        str(web),
                        "--cores",
                        str(self.cores),
                        "--memory",
                        self.memory,
                        "--work-dir",
                        str(self.work_dir / "work" / f"worker-{index}"),
                    ],
                    self.work_dir / "logs" / f"worker-{index}.log",
                    web,
                )
                self._workers.append(daemon)
            self._spawn(daemon)

    def session_builder(self) -> Any:
        """``SparkSession.builder`` for this cluster, its driver on the loopback address, its
        Python ``python``: call ``.getOrCreate()`` on it (after ``.appName()``,
        ``.config()``... as you like).

        Spark starts a session's Python processes (the nsq source's driver-side reader, the
        executors' Python workers) with the interpreter its SparkContext took from
        ``$PYSPARK_PYTHON`` in the driver's environment when it started, else ``python3``
        from the ``PATH``; ``spark.pyspark.python`` and ``spark.pyspark.driver.python`` are
        read by ``spark-submit`` only, not by a builder in a running script, and the
        ``PYSPARK_PYTHON`` of the workers' environment does not count.  So this sets
        ``PYSPARK_PYTHON`` in this process's environment (``os.environ``) to ``python``,
        and ``SPARK_LOCAL_IP`` to ``127.0.0.1`` unless it is set (the driver's JVM then binds
        its web UI there, not to every interface, and does not warn that the hostname
        resolves to a loopback address).  Neither has any effect on a SparkContext already
        running in this process."""
        from pyspark.sql import SparkSession

        os.environ["PYSPARK_PYTHON"] = self.python
        os.environ.setdefault("SPARK_LOCAL_IP", HOST)
        return (
            SparkSession.builder.master(self.url)
            .config("spark.driver.host", HOST)
            .config("spark.driver.bindAddress", HOST)
        )

    def state(self) -> dict[str, Any]:
        """The master's ``/json/`` (workers, applications, status)."""
        assert self._master is not None
        url = f"http://{HOST}:{self.web_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as reply:  # noqa: S310 (loopback)
            return dict(json.loads(reply.read()))

    @staticmethod
    def alive_workers(state: dict[str, Any]) -> int:
        return sum(1 for w in state.get("workers") or [] if w.get("state") == "ALIVE")

    def _wait(self, ready: Any, daemon: _Daemon) -> None:
        deadline = time.monotonic() + self.start_timeout
        pause = threading.Event()
        last: Any = None
        while time.monotonic() < deadline:
            for d in [self._master, *self._workers]:
                if d is not None and d.process is not None and d.process.poll() is not None:
                    raise StandaloneError(
                        f"Spark {d.name} exited with {d.process.returncode}:\n{d.tail()}"
                    )
            try:
                last = self.state()
                if ready(last):
                    return
            except (OSError, ValueError) as exc:
                last = exc
            pause.wait(0.2)
        raise StandaloneError(
            f"the standalone cluster was not ready within {self.start_timeout:g}s "
            f"(last: {last!r}):\n{daemon.tail()}"
        )

    def kill_worker(self, index: int) -> None:
        """SIGKILL the worker and its executors (its whole process group): a machine gone."""
        daemon = self._workers[index]
        if daemon.process is not None and daemon.process.poll() is None:
            os.killpg(daemon.process.pid, signal.SIGKILL)
            daemon.process.wait(10)

    def executor_pids(self, index: int) -> list[int]:
        """The executor processes of worker ``index`` (its process group but itself)."""
        daemon = self._workers[index]
        if daemon.process is None:
            return []
        group = daemon.process.pid
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == group:
                continue
            try:
                if os.getpgid(int(entry)) == group:
                    pids.append(int(entry))
            except OSError:
                continue
        return pids

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the workers (with their executors), then the master; SIGKILL what is left
        after ``timeout`` seconds."""
        daemons = [d for d in [*self._workers, self._master] if d is not None]
        for daemon in daemons:
            if daemon.process is not None and daemon.process.poll() is None:
                try:
                    os.killpg(daemon.process.pid, signal.SIGTERM)
                except OSError:
                    pass
        deadline = time.monotonic() + timeout
        for daemon in daemons:
            if daemon.process is None:
                continue
            try:
                daemon.process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(daemon.process.pid, signal.SIGKILL)  # the group's leftovers too
            except OSError:
                pass
            if daemon.process.poll() is None:
                daemon.process.wait(5)
        if self._own_dir:
            import shutil

            shutil.rmtree(self.work_dir, ignore_errors=True)
