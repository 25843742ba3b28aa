"""Run real ``nsqd``/``nsqlookupd`` binaries behind the same Cluster interface as EmbeddedNSQ.

:class:`RealNSQ` spawns the binaries found in a directory (``NSQ_BIN_DIR`` by default) on free
loopback ports, with ``--broadcast-address=127.0.0.1`` and their data under a temporary
directory.  Each process writes its output to a log file; when a process fails to start, the
error carries the tail of that log, and :meth:`RealNSQ.log_tail` gives it on demand (the pytest
plugin attaches it to failing tests).

Options are given as nsqd's flag names with underscores; durations are seconds (floats) and are
converted to Go durations (``msg_timeout=1.5`` becomes ``--msg-timeout=1500ms``, see
:func:`~.gostyle.flags.duration_flag`).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .gostyle.flags import duration_flag
from .nodes import LookupdNode, Node, free_ports

__all__ = ["Node", "LookupdNode", "RealNSQ", "RealNSQError", "nsqd_flags"]

log = logging.getLogger("nsqclient.testing.real")

HOST = "127.0.0.1"

#: Seconds to wait for a spawned process to answer ``/ping``.
START_TIMEOUT = 15.0
#: Seconds to wait for a terminated process to exit before killing it.
STOP_TIMEOUT = 10.0
#: Seconds to wait for nsqlookupd to see an nsqd arrive or leave.
REGISTER_TIMEOUT = 10.0

# nsqd flags that take a Go duration; their option values are seconds.
_DURATION_OPTIONS = frozenset(
    {
        "msg_timeout",
        "max_msg_timeout",
        "max_req_timeout",
        "max_heartbeat_interval",
        "max_output_buffer_timeout",
        "min_output_buffer_timeout",
        "output_buffer_timeout",
        "http_client_connect_timeout",
        "http_client_request_timeout",
        "sync_timeout",
        "statsd_interval",
        "e2e_processing_latency_window_time",
    }
)
# Options understood by the embedded NSQ only; the real runner ignores them.
_EMBEDDED_ONLY_OPTIONS = frozenset({"lookupd_legacy_json", "split_writes", "split_writes_seed"})
# Options the runner sets itself.
_RESERVED_OPTIONS = frozenset(
    {
        "tcp_address",
        "http_address",
        "https_address",
        "broadcast_address",
        "data_path",
        "lookupd_tcp_address",
    }
)
# --tls-required takes false / tcp-https / true; the interface uses nsqd's enum 0 / 1 / 2.
_TLS_REQUIRED = {0: "false", 1: "tcp-https", 2: "true"}


class RealNSQError(RuntimeError):
    """A real nsqd or nsqlookupd failed to start, stop or register."""


def _flag_value(name: str, value: Any) -> str:
    if name in _DURATION_OPTIONS:
        return duration_flag(value)
    if name == "tls_required":
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int):
            if value not in _TLS_REQUIRED:
                raise ValueError(f"tls_required must be 0, 1 or 2, not {value!r}")
            return _TLS_REQUIRED[value]
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def nsqd_flags(options: dict[str, Any]) -> list[str]:
    """nsqd command-line flags for interface options (``{"max_rdy_count": 5}`` ->
    ``["--max-rdy-count=5"]``).  Options set to None and embedded-only options are left out;
    a list value gives the flag once per item."""
    flags: list[str] = []
    for name, value in options.items():
        if value is None or name in _EMBEDDED_ONLY_OPTIONS:
            continue
        if name in _RESERVED_OPTIONS:
            raise ValueError(f"option {name!r} is set by the runner itself")
        flag = "--" + name.replace("_", "-")
        values: Iterable[Any] = value if isinstance(value, list | tuple) else [value]
        for item in values:
            flags.append(f"{flag}={_flag_value(name, item)}")
    return flags


def _http_get(url: str, timeout: float) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (loopback)
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


# Every process started by any RealNSQ, killed at interpreter exit if still running.
_LIVE: weakref.WeakSet[_Process] = weakref.WeakSet()


def _only_lookupd(i: int) -> None:
    if i != 0:
        raise IndexError(f"RealNSQ runs one nsqlookupd (0), not {i}")


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_LIVE):
        proc.kill()


class _Process:
    """One spawned binary, its log file and its lifecycle."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            out.write(f"=== {time.strftime('%H:%M:%S')} {' '.join(self.argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        _LIVE.add(self)
        log.debug("started %s (pid %d)", self.name, self.proc.pid)

    def wait_ping(self, http_port: int, timeout: float = START_TIMEOUT) -> None:
        """Wait until ``/ping`` answers 200; raise RealNSQError (with the log tail) if the
        process exits first or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        url = f"http://{HOST}:{http_port}/ping"
        last: object = None
        while True:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise RealNSQError(
                    f"{self.name} exited with status {code} while starting\n{self.tail()}"
                )
            try:
                status, body = _http_get(url, timeout=0.5)
                # with --tls-required=true plain HTTP answers 403 TLS_REQUIRED: it is up
                if status == 200 or (status == 403 and b"TLS_REQUIRED" in body):
                    return
                last = f"HTTP {status}"
            except OSError as exc:
                last = exc
            if time.monotonic() >= deadline:
                raise RealNSQError(
                    f"{self.name} did not answer {url} within {timeout}s ({last})\n{self.tail()}"
                )
            _PAUSE.wait(0.02)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the process, if it runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)

    def freeze(self, signum: int, timeout: float = START_TIMEOUT) -> None:
        """Send ``signum`` (SIGSTOP) and return once the kernel shows the process stopped: the
        signal is delivered asynchronously, and a request written before the process stops
        would still be answered."""
        self.signal(signum)
        proc = self.proc
        if proc is None:
            return
        deadline = time.monotonic() + timeout
        while not _is_stopped(proc.pid):
            if time.monotonic() > deadline:
                raise RealNSQError(f"{self.name} did not stop within {timeout}s")
            _PAUSE.wait(0.001)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        if hasattr(signal, "SIGCONT"):  # POSIX: a frozen one (stall_nsqd) could not exit
            proc.send_signal(signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log.warning("%s did not exit within %.1fs of SIGTERM; killing it", self.name, timeout)
            proc.kill()
            proc.wait(timeout=timeout)
        _LIVE.discard(self)

    def kill(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                pass

    def address_in_use(self) -> bool:
        try:
            return "address already in use" in self.log_path.read_text(errors="replace")
        except OSError:
            return False

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"--- {self.name}: no log ({exc})"
        body = "\n".join(text.splitlines()[-lines:])
        return f"--- {self.name} ({self.log_path}), last {lines} lines:\n{body}"


_PAUSE = threading.Event()  # never set: a bounded pause between polls


@dataclass
class _NsqdSlot:
    index: int
    node: Node
    options: dict[str, Any]
    data_path: Path
    process: _Process | None = None
    stopped: bool = True


@dataclass
class _LookupdSlot:
    node: LookupdNode
    process: _Process | None = None
    stopped: bool = True


class RealNSQ:
    """nsqlookupd and nsqd processes from ``bin_dir`` (default ``$NSQ_BIN_DIR``).

    Implements the shared Cluster interface (see the testing docs): ``start()``, ``close()``,
    ``nsqds``, ``nsqd``, ``lookupd``, ``stop_nsqd(i)``, ``start_nsqd(i)``, ``add_nsqd()``,
    ``stop_lookupd()``, ``start_lookupd()``.  The embedded-only fault controls raise
    NotImplementedError.
    """

    kind = "real"

    def __init__(
        self,
        nsqd_count: int = 1,
        lookupd: bool = True,
        data_dir: str | os.PathLike[str] | None = None,
        bin_dir: str | os.PathLike[str] | None = None,
        **nsqd_options: Any,
    ):
        bin_dir = bin_dir if bin_dir is not None else os.environ.get("NSQ_BIN_DIR")
        if not bin_dir:
            raise RealNSQError("RealNSQ needs bin_dir or the NSQ_BIN_DIR environment variable")
        self.bin_dir = Path(bin_dir)
        for binary in ("nsqd", "nsqlookupd"):
            if not os.access(self.bin_dir / binary, os.X_OK):
                raise RealNSQError(f"no executable {binary} in {self.bin_dir}")
        if nsqd_count < 0:
            raise ValueError("nsqd_count must be >= 0")
        self._nsqd_count = nsqd_count
        self._want_lookupd = lookupd
        self._nsqd_options = dict(nsqd_options)
        nsqd_flags(self._nsqd_options)  # validate early
        self._own_dir = data_dir is None
        self._data_dir: Path | None = None if data_dir is None else Path(data_dir)
        self._nsqd_slots: list[_NsqdSlot] = []
        self._lookupd_slot: _LookupdSlot | None = None
        self._lock = threading.RLock()
        self._started = False
        self._closed = False

    # ----------------------------------------------------------------------------------------
    # Cluster interface

    @property
    def nsqds(self) -> list[Node]:
        return [slot.node for slot in self._nsqd_slots]

    @property
    def nsqd(self) -> Node:
        if not self._nsqd_slots:
            raise IndexError("this cluster has no nsqd")
        return self._nsqd_slots[0].node

    @property
    def lookupd(self) -> LookupdNode | None:
        return None if self._lookupd_slot is None else self._lookupd_slot.node

    @property
    def data_dir(self) -> Path:
        if self._data_dir is None:
            raise RealNSQError("the cluster is not started")
        return self._data_dir

    def start(self) -> RealNSQ:
        """Start nsqlookupd (if wanted) and the nsqds; return once all answer ``/ping`` and
        every nsqd is registered with nsqlookupd."""
        with self._lock:
            if self._closed:
                raise RealNSQError("cannot start a closed cluster")
            if self._started:
                return self
            self._started = True
            try:
                if self._data_dir is None:
                    self._data_dir = Path(tempfile.mkdtemp(prefix="nsq-real-"))
                self._data_dir.mkdir(parents=True, exist_ok=True)
                if self._want_lookupd:
                    self._start_new_lookupd()
                for _ in range(self._nsqd_count):
                    self._start_new_nsqd(self._nsqd_options)
            except BaseException:
                self.close()
                raise
        return self

    def close(self) -> None:
        """Stop every process (nsqds first) and remove the data directory if it was ours."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            errors = []
            for slot in self._nsqd_slots:
                if slot.process is not None:
                    try:
                        slot.process.stop()
                    except Exception as exc:  # keep stopping the others
                        errors.append(exc)
                slot.stopped = True
            if self._lookupd_slot is not None and self._lookupd_slot.process is not None:
                try:
                    self._lookupd_slot.process.stop()
                except Exception as exc:
                    errors.append(exc)
                self._lookupd_slot.stopped = True
            if self._own_dir and self._data_dir is not None:
                shutil.rmtree(self._data_dir, ignore_errors=True)
            if errors:
                raise RealNSQError(f"errors while stopping: {errors}")

    def __enter__(self) -> RealNSQ:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def stop_nsqd(self, i: int) -> None:
        """Terminate nsqd ``i`` and wait for it to exit (and for nsqlookupd to drop it)."""
        with self._lock:
            slot = self._nsqd_slots[i]
            if slot.stopped:
                return
            assert slot.process is not None
            slot.process.stop()
            slot.stopped = True
            if self._lookupd_running():
                self._wait_registered(slot, present=False)

    def start_nsqd(self, i: int) -> None:
        """Restart nsqd ``i`` on the same ports with the same data path."""
        with self._lock:
            self._check_open()
            slot = self._nsqd_slots[i]
            if not slot.stopped:
                return
            self._spawn_nsqd(slot)

    def add_nsqd(self, **nsqd_options: Any) -> Node:
        """Start one more nsqd (the cluster's options overridden by ``nsqd_options``)."""
        with self._lock:
            self._check_open()
            return self._start_new_nsqd({**self._nsqd_options, **nsqd_options}).node

    def stop_lookupd(self, i: int = 0) -> None:
        """Terminate nsqlookupd (``i``: 0, the only one) and wait for it to exit."""
        _only_lookupd(i)
        with self._lock:
            slot = self._require_lookupd()
            if slot.stopped:
                return
            assert slot.process is not None
            slot.process.stop()
            slot.stopped = True

    def start_lookupd(self, i: int = 0) -> None:
        """Restart nsqlookupd on the same ports.  The nsqds reconnect on their own schedule
        (real nsqd retries on its next lookupd command or 15 s ping), so this does not wait
        for them to register again."""
        _only_lookupd(i)
        with self._lock:
            self._check_open()
            slot = self._require_lookupd()
            if not slot.stopped:
                return
            self._spawn_lookupd(slot)

    def drop_connections(self, i: int) -> None:
        raise NotImplementedError("drop_connections is an embedded-only fault control")

    def stall_nsqd(self, i: int) -> None:
        """Freeze nsqd ``i`` (SIGSTOP): the kernel still accepts connections and buffers what
        is written, nothing is answered.  POSIX only: NotImplementedError where the platform
        has no SIGSTOP (Windows)."""
        self._nsqd_process(i).freeze(_posix_signal("SIGSTOP", "stall_nsqd"))

    def unstall_nsqd(self, i: int) -> None:
        """Resume nsqd ``i`` after :meth:`stall_nsqd` (SIGCONT)."""
        self._nsqd_process(i).signal(_posix_signal("SIGCONT", "unstall_nsqd"))

    def stall_lookupd(self, i: int = 0) -> None:
        """Freeze nsqlookupd (SIGSTOP): connections are accepted by the kernel, nothing is
        answered."""
        self._lookupd_process(i).freeze(signal.SIGSTOP)

    def unstall_lookupd(self, i: int = 0) -> None:
        """Resume nsqlookupd after :meth:`stall_lookupd` (SIGCONT)."""
        self._lookupd_process(i).signal(signal.SIGCONT)

    def _lookupd_process(self, i: int) -> _Process:
        _only_lookupd(i)
        with self._lock:
            process = self._require_lookupd().process
        if process is None or not process.running:
            raise RealNSQError("nsqlookupd is not running")
        return process

    def _nsqd_process(self, i: int) -> _Process:
        with self._lock:
            process = self._nsqd_slots[i].process
        if process is None or not process.running:
            raise RealNSQError(f"nsqd {i} is not running")
        return process

    def inject_frame(self, i: int, raw: bytes) -> None:
        raise NotImplementedError("inject_frame is an embedded-only fault control")

    # ----------------------------------------------------------------------------------------
    # Diagnostics

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of every process log, one section per process."""
        parts = []
        if self._lookupd_slot is not None and self._lookupd_slot.process is not None:
            parts.append(self._lookupd_slot.process.tail(lines))
        for slot in self._nsqd_slots:
            if slot.process is not None:
                parts.append(slot.process.tail(lines))
        return "\n".join(parts)

    def __repr__(self) -> str:
        nodes = ", ".join(n.tcp_address for n in self.nsqds)
        where = self.lookupd.tcp_address if self.lookupd else None
        return f"<RealNSQ nsqds=[{nodes}] lookupd={where}>"

    # ----------------------------------------------------------------------------------------
    # Internals

    def _check_open(self) -> None:
        if self._closed or not self._started:
            raise RealNSQError("the cluster is not running (start() it first)")

    def _require_lookupd(self) -> _LookupdSlot:
        if self._lookupd_slot is None:
            raise RealNSQError("this cluster was created with lookupd=False")
        return self._lookupd_slot

    def _lookupd_running(self) -> bool:
        return self._lookupd_slot is not None and not self._lookupd_slot.stopped

    def _start_new_lookupd(self, attempts: int = 3) -> None:
        for attempt in range(attempts):
            tcp_port, http_port = free_ports(2)
            slot = _LookupdSlot(LookupdNode(HOST, tcp_port, http_port))
            self._lookupd_slot = slot
            try:
                self._spawn_lookupd(slot)
                return
            except RealNSQError:
                if attempt + 1 < attempts and slot.process and slot.process.address_in_use():
                    log.info("nsqlookupd port clash, retrying on other ports")
                    continue
                raise

    def _argv(self, binary: str, node: Node, *more: str) -> list[str]:
        """The command line of ``binary`` (nsqd or nsqlookupd) serving ``node``: listening on its
        TCP and HTTP addresses and naming HOST to its clients, then the ``more`` flags."""
        return [
            str(self.bin_dir / binary),
            f"--tcp-address={node.tcp_address}",
            f"--http-address={node.http_address}",
            f"--broadcast-address={HOST}",
            *more,
        ]

    def _spawn_lookupd(self, slot: _LookupdSlot) -> None:
        node = slot.node
        argv = self._argv("nsqlookupd", node)
        self._launch(
            slot, _Process(f"nsqlookupd@{node.tcp_port}", argv, self.data_dir / "nsqlookupd.log")
        )

    def _start_new_nsqd(self, options: dict[str, Any], attempts: int = 3) -> _NsqdSlot:
        nsqd_flags(options)  # validate before taking ports
        index = len(self._nsqd_slots)
        wants_https = bool(options.get("tls_cert"))
        for attempt in range(attempts):
            ports = free_ports(3 if wants_https else 2)
            node = Node(HOST, ports[0], ports[1], ports[2] if wants_https else None)
            data_path = self.data_dir / f"nsqd{index}"
            data_path.mkdir(parents=True, exist_ok=True)
            slot = _NsqdSlot(index, node, dict(options), data_path)
            self._nsqd_slots.append(slot)
            try:
                self._spawn_nsqd(slot)
                return slot
            except RealNSQError:
                self._nsqd_slots.pop()
                if attempt + 1 < attempts and slot.process and slot.process.address_in_use():
                    log.info("nsqd port clash, retrying on other ports")
                    continue
                raise
        raise AssertionError("unreachable")

    def _spawn_nsqd(self, slot: _NsqdSlot) -> None:
        node = slot.node
        argv = self._argv(
            "nsqd",
            node,
            f"--https-address={'' if node.https_port is None else f'{HOST}:{node.https_port}'}",
            f"--data-path={slot.data_path}",
            f"--node-id={slot.index % 1024}",
        )
        if self._lookupd_slot is not None:
            argv.append(f"--lookupd-tcp-address={self._lookupd_slot.node.tcp_address}")
        argv += nsqd_flags(slot.options)
        process = _Process(
            f"nsqd{slot.index}@{node.tcp_port}", argv, self.data_dir / f"nsqd{slot.index}.log"
        )

        def registered() -> None:
            if self._lookupd_running():
                self._wait_registered(slot, present=True)

        self._launch(slot, process, registered)

    def _launch(
        self,
        slot: _NsqdSlot | _LookupdSlot,
        process: _Process,
        ready: Callable[[], None] | None = None,
    ) -> None:
        """Start ``process`` for ``slot`` and wait until it answers ``/ping`` (and ``ready``
        returns); kill it when it does not."""
        slot.process = process
        process.spawn()
        slot.stopped = False
        try:
            process.wait_ping(slot.node.http_port)
            if ready is not None:
                ready()
        except BaseException:
            process.kill()
            slot.stopped = True
            raise

    def _registered_tcp_ports(self) -> set[int]:
        assert self._lookupd_slot is not None
        status, body = _http_get(f"{self._lookupd_slot.node.http_url}/nodes", timeout=2.0)
        if status != 200:
            raise RealNSQError(f"nsqlookupd /nodes answered HTTP {status}: {body[:200]!r}")
        return {p["tcp_port"] for p in json.loads(body).get("producers") or []}

    def _wait_registered(self, slot: _NsqdSlot, present: bool) -> None:
        deadline = time.monotonic() + REGISTER_TIMEOUT
        port = slot.node.tcp_port
        while True:
            try:
                if (port in self._registered_tcp_ports()) == present:
                    return
            except OSError:
                pass
            if time.monotonic() >= deadline:
                what = "register with" if present else "leave"
                raise RealNSQError(
                    f"nsqd{slot.index} did not {what} nsqlookupd within {REGISTER_TIMEOUT}s\n"
                    + self.log_tail(15)
                )
            _PAUSE.wait(0.02)


def _posix_signal(name: str, control: str) -> int:
    """The signal ``name``, or NotImplementedError saying which fault ``control`` needs it."""
    signum = getattr(signal, name, None)
    if signum is None:
        raise NotImplementedError(
            f"{control} needs {name}, which this platform does not have (POSIX only)"
        )
    return int(signum)


def _is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state T): from /proc where there is one (Linux), from
    ``ps`` elsewhere (macOS, the BSDs)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rpartition(")")[2].split()[0] in ("T", "t")
    except FileNotFoundError:
        pass
    except OSError:
        return False
    result = subprocess.run(
        ["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True, timeout=10
    )
    return result.stdout.strip().startswith("T")
