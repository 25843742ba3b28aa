"""Shared plumbing for the benchmark scripts in ``bench/`` (not part of the package).

The scripts compare nsqclient with pynsq on one broker in one run.  The parent process owns the
broker (real binaries, the embedded NSQ, or an existing nsqd given on the command line), makes a
fresh topic per case, and runs each client in its own subprocess, one after the other, so that
the clients share neither RSS nor the GIL (nor the GIL of the embedded broker).  A child prints
one ``BENCH-RESULT {json}`` line; the parent checks the broker's ``/stats`` so that no figure
rests on the client's own word.

Rates are messages per second; times are seconds; memory is KiB (as ``/proc`` reports it).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

MESSAGE_SIZE = 200
RESULT_MARK = "BENCH-RESULT "
HTTP_TIMEOUT = 10.0

_run_id = f"{os.getpid() % 100000}_{int(time.time()) % 100000}"
_topic_seq = 0


def valgrind_path() -> str:
    """valgrind's path, or exit saying how to get it."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind not found on PATH (Debian: apt-get install valgrind)")
    return valgrind


def instructions(script: str, child_args: Sequence[str]) -> int:
    """The machine instructions the Python program ``script`` runs with ``child_args``, all
    told, counted by ``valgrind --tool=callgrind`` (the same for the same code and inputs,
    whatever else the machine does)."""
    argv = [valgrind_path(), "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    argv += [sys.executable, script, *child_args]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    found = re.search(r"Collected\s*:\s*(\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"valgrind printed no count for {child_args}:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def step_instructions(
    script: str,
    steps: Sequence[str],
    child: Callable[[str, int], None],
    argv: Sequence[str],
    *,
    default: int,
    base: int,
    what: str,
) -> tuple[int, dict[str, float]] | None:
    """The command line of an instructions script (``script``, its ``steps``): in the child
    (``--child STEP``), run ``child(step, n)`` and return None; in the parent, return N
    (``-n``, ``default``) and each step's instructions per ``what``, from a child with ``base``
    of it against one with ``base`` + N."""
    parser = argparse.ArgumentParser(
        description=(sys.modules["__main__"].__doc__ or "").splitlines()[0]
    )
    parser.add_argument("-n", "--messages", type=int, default=default, help=f"{what}s measured")
    parser.add_argument("--child", choices=steps, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    n = args.messages
    if args.child:
        child(args.child, n)
        return None
    valgrind_path()

    def count(step: str, times: int) -> int:
        return instructions(script, ["--child", step, "-n", str(times)])

    return n, {step: (count(step, base + n) - count(step, base)) / n for step in steps}


def message_body(size: int = MESSAGE_SIZE) -> bytes:
    """One message body of ``size`` bytes (printable, so it is readable in nsq_tail)."""
    pattern = b"nsqclient-bench-0123456789abcdefghijklmnopqrstuvwxyz-"
    return (pattern * (size // len(pattern) + 1))[:size]


def fresh_topic(case: str, client: str) -> str:
    """A topic name no earlier case of this run used (nsqd limits names to 64 characters)."""
    global _topic_seq
    _topic_seq += 1
    name = f"b{_run_id}_{_topic_seq}_{case}_{client}"
    return "".join(c if c.isalnum() or c in "_-." else "_" for c in name)[:64]


# ------------------------------------------------------------------------------ memory


def proc_status_kib(field: str = "VmRSS") -> int:
    """A ``/proc/self/status`` field in KiB (``VmRSS``: resident set; ``VmHWM``: its peak);
    0 where /proc is not available."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_seconds() -> float:
    """CPU time (user + system, all threads) this process used so far, in seconds."""
    return time.process_time()  # CLOCK_PROCESS_CPUTIME_ID: finer than os.times()' ticks


# ------------------------------------------------------------------------------ /proc (Linux)


#: clock ticks per second: the unit of /proc's CPU times
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class ProcStat(NamedTuple):
    """What ``/proc/<pid>/stat`` says of a process (times in clock ticks)."""

    ppid: int
    #: utime + stime: its own CPU, all its threads
    cpu: int
    #: cutime + cstime: the CPU of its children it waited for
    children_cpu: int


def proc_stat(pid: int) -> ProcStat | None:
    """``pid``'s :class:`ProcStat`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    # after "pid (comm)": state, ppid, ... utime (14), stime, cutime, cstime (1-based)
    return ProcStat(
        int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
    )


def proc_argv(pid: int) -> list[str]:
    """``pid``'s command line ([] when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def process_table() -> dict[int, ProcStat]:
    """Every process's :class:`ProcStat`, by pid."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = proc_stat(int(entry))
            if stat is not None:
                table[int(entry)] = stat
    return table


def descendants(table: dict[int, ProcStat], roots: Iterable[int]) -> set[int]:
    """The pids of ``table`` below ``roots`` (children, their children...)."""
    children: dict[int, list[int]] = {}
    for pid, stat in table.items():
        children.setdefault(stat.ppid, []).append(pid)
    found: set[int] = set()
    todo = [child for root in roots for child in children.get(root, [])]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def socket_owners(remote_port: int) -> dict[int, int]:
    """``{local port: pid}`` of the established TCP connections to ``remote_port``."""
    by_inode: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "01" and int(fields[2].rsplit(":", 1)[1], 16) == remote_port:
                by_inode[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    owners: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in by_inode:
                owners[by_inode[target[8:-1]]] = int(entry)
    return owners


# ------------------------------------------------------------------------------ Spark


def spark_session(master: str, app: str) -> Any:
    """A SparkSession on ``master`` named ``app`` (UI off, 2 shuffle partitions, no adaptive
    plans, Python workers running this interpreter) with the ``nsq`` format registered."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import nsqclient.spark

    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.adaptive.enabled", "false")
    )
    if not master.startswith("local"):
        builder = builder.config("spark.executor.memory", "768m").config("spark.cores.max", "2")
    if os.environ.get("PYTHONPATH"):
        # The executors' Python workers import what this process imports (e.g. a worktree's
        # nsqclient before the installed one); local workers inherit it anyway.
        builder = builder.config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    nsqclient.spark.register(spark)
    return spark


# ------------------------------------------------------------------------------ broker


@dataclass
class Node:
    """One nsqd: its TCP and HTTP ``host:port`` and its process (for its CPU time), if known."""

    tcp_address: str
    http_address: str
    pid: int | None = None


@dataclass
class Broker:
    """Where the benchmark's nsqd is: its TCP and HTTP ``host:port`` and what it is.

    ``nodes`` lists every nsqd the run has (the first is ``tcp_address``/``http_address``);
    a broker given on the command line has one."""

    tcp_address: str
    http_address: str
    kind: str  # "real", "embedded" or "external"
    description: str
    pid: int | None = None  # the broker's process (for its CPU time), when known
    nodes: list[Node] = field(default_factory=list)


def find_listener_pid(tcp_address: str) -> int | None:
    """The pid of a local process started with ``--tcp-address=<tcp_address>`` (how nsqd and
    the embedded NSQ's command line take it), or None."""
    needle = f"--tcp-address={tcp_address}".encode()
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if needle in argv:
            return int(entry)
    return None


def process_cpu_seconds(pid: int | None) -> float | None:
    """CPU time (user + system, all threads) process ``pid`` used so far, in seconds, from
    ``/proc/<pid>/stat``; None when unknown."""
    stat = None if pid is None else proc_stat(pid)
    return None if stat is None else stat.cpu / CLK_TCK


class CpuWindow:
    """CPU used by this process and by the broker between :meth:`start` and :meth:`stop`."""

    def __init__(self, broker_pid: int | None):
        self.broker_pid = broker_pid
        self.wall = self.cpu = 0.0
        self.broker_cpu: float | None = None
        self._t0: float | None = None

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._c0 = cpu_seconds()
        self._b0 = process_cpu_seconds(self.broker_pid)

    def stop(self) -> None:
        if self._t0 is None:
            return  # never started (the run failed before the clock began)
        self.wall = time.perf_counter() - self._t0
        self.cpu = cpu_seconds() - self._c0
        b1 = process_cpu_seconds(self.broker_pid)
        self.broker_cpu = None if b1 is None or self._b0 is None else b1 - self._b0

    @property
    def started_at(self) -> float | None:
        """When :meth:`start` was called (``time.perf_counter``), None before."""
        return self._t0

    def as_dict(self) -> dict[str, Any]:
        return {"seconds": self.wall, "cpu": self.cpu, "broker_cpu": self.broker_cpu}


def describe_cpu(result: dict[str, Any], n: int) -> str:
    """``"12.3 us CPU/msg, broker 87% of a core"`` for a child's result."""
    text = f"{result['cpu'] / n * 1e6:5.1f} us CPU/msg"
    if result.get("broker_cpu") is not None and result["seconds"] > 0:
        text += f", broker {100 * result['broker_cpu'] / result['seconds']:3.0f}% of a core"
    return text


def argument_parser(doc: str, messages: int, messages_help: str) -> argparse.ArgumentParser:
    """A parser described by ``doc``'s first paragraph, with the broker arguments and
    ``-n/--messages`` (default ``messages``)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    add_broker_arguments(parser)
    add_messages_argument(parser, messages, messages_help)
    return parser


def add_messages_argument(parser: argparse.ArgumentParser, default: int, help: str) -> None:
    """``-n/--messages`` (default ``default``)."""
    parser.add_argument("-n", "--messages", type=int, default=default, help=help)


def add_broker_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("broker")
    group.add_argument(
        "--broker",
        choices=("auto", "real", "embedded"),
        default="auto",
        help="start real binaries (from --bin-dir / $NSQ_BIN_DIR) or the embedded NSQ; "
        "auto: real when NSQ_BIN_DIR is set, else embedded (default: auto)",
    )
    group.add_argument(
        "--bin-dir",
        default=os.environ.get("NSQ_BIN_DIR"),
        help="directory holding nsqd and nsqlookupd (default: $NSQ_BIN_DIR)",
    )
    group.add_argument("--nsqd", metavar="HOST:PORT", help="use this running nsqd (TCP address)")
    group.add_argument(
        "--nsqd-http",
        metavar="HOST:PORT",
        help="HTTP address of --nsqd (default: its TCP port + 1)",
    )
    group.add_argument(
        "--mem-queue-size",
        type=int,
        default=None,
        help="nsqd --mem-queue-size for a broker this script starts (default: enough to keep "
        "every message of the run in memory, so that nsqd's disk queue and its fsyncs do not "
        "slow the broker down)",
    )
    group.add_argument(
        "--lookupd",
        metavar="HOST:PORT",
        help="use the first nsqd this running nsqlookupd (HTTP address) knows",
    )


def _http_json(url: str, method: str = "GET", timeout: float = HTTP_TIMEOUT) -> Any:
    req = urllib.request.Request(
        url, method=method, headers={"Accept": "application/vnd.nsq; version=1.0"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (loopback/args)
        body = resp.read()
    if not body:
        return None
    data = json.loads(body)
    # pre-1.0 nsqd/nsqlookupd wrap their replies
    if isinstance(data, dict) and "status_code" in data and "data" in data:
        data = data["data"]
    return data


def _from_lookupd(lookupd: str) -> tuple[str, str]:
    base = lookupd if "://" in lookupd else f"http://{lookupd}"
    nodes = _http_json(base.rstrip("/") + "/nodes").get("producers") or []
    if not nodes:
        raise SystemExit(f"nsqlookupd {lookupd} knows no nsqd")
    node = nodes[0]
    host = node.get("broadcast_address") or node.get("hostname")
    return f"{host}:{node['tcp_port']}", f"{host}:{node['http_port']}"


@contextlib.contextmanager
def open_broker(
    args: argparse.Namespace, nsqd_count: int = 1, **nsqd_options: Any
) -> Iterator[Broker]:
    """Start (or find) the nsqd the run uses; stop it afterwards if we started it.

    ``nsqd_count`` nsqd are started (the first is the one most cases use); a broker given on
    the command line is one nsqd whatever ``nsqd_count`` says."""
    if args.nsqd or args.lookupd:
        if args.nsqd:
            tcp = args.nsqd
            host, _, port = tcp.rpartition(":")
            http = args.nsqd_http or f"{host}:{int(port) + 1}"
        else:
            tcp, http = _from_lookupd(args.lookupd)
        try:
            urllib.request.urlopen(f"http://{http}/ping", timeout=HTTP_TIMEOUT).close()  # noqa: S310
        except OSError as exc:
            raise SystemExit(
                f"nsqd HTTP at {http} does not answer /ping ({exc}); pass --nsqd-http HOST:PORT"
            ) from exc
        pid = find_listener_pid(tcp)
        yield Broker(
            tcp, http, "external", f"existing nsqd {tcp} (http {http})", pid, [Node(tcp, http, pid)]
        )
        return
    kind = args.broker
    if kind == "auto":
        kind = "real" if args.bin_dir else "embedded"
    if kind == "real":
        if not args.bin_dir:
            raise SystemExit("--broker real needs --bin-dir or NSQ_BIN_DIR")
        from nsqclient.testing.real import RealNSQ

        cluster: Any = RealNSQ(
            nsqd_count=nsqd_count, lookupd=False, bin_dir=args.bin_dir, **nsqd_options
        )
        what = f"real nsqd from {args.bin_dir}"
    else:
        try:
            from nsqclient.testing import EmbeddedNSQ  # type: ignore[attr-defined]
        except ImportError:
            try:
                from nsqclient.testing.cluster import EmbeddedNSQ  # type: ignore[no-redef]
            except ImportError as exc:
                raise SystemExit(
                    f"the embedded NSQ is not available ({exc}); "
                    "set NSQ_BIN_DIR or pass --nsqd HOST:PORT"
                ) from exc
        cluster = EmbeddedNSQ(nsqd_count=nsqd_count, lookupd=False, **nsqd_options)
        what = "embedded nsqd (in the parent process, its own GIL)"
    cluster.start()
    try:
        nodes = [
            Node(
                n.tcp_address,
                n.http_address,
                os.getpid() if kind == "embedded" else find_listener_pid(n.tcp_address),
            )
            for n in cluster.nsqds
        ]
        first = nodes[0]
        where = first.tcp_address if len(nodes) == 1 else ", ".join(n.tcp_address for n in nodes)
        yield Broker(
            first.tcp_address, first.http_address, kind, f"{what} at {where}", first.pid, nodes
        )
    finally:
        cluster.close()


# ------------------------------------------------------------------------------ nsqd HTTP


def topic_stats(http_address: str, topic: str) -> dict[str, Any] | None:
    """The topic's entry of nsqd ``/stats`` (with its channels), or None if nsqd has no such
    topic."""
    query = urllib.parse.urlencode({"format": "json", "topic": topic})
    data = _http_json(f"http://{http_address}/stats?{query}")
    for entry in data.get("topics") or []:
        if entry.get("topic_name") == topic:
            return entry
    return None


def channel_stats(http_address: str, topic: str, channel: str) -> dict[str, Any] | None:
    entry = topic_stats(http_address, topic)
    for ch in (entry or {}).get("channels") or []:
        if ch.get("channel_name") == channel:
            return ch
    return None


def channel_finish_count(http_address: str, topic: str, channel: str) -> int:
    """How many of the channel's messages nsqd counts as FINished: its clients' ``finish_count``
    summed (nsqd's ``/stats`` has no such count for the channel itself; a client's goes with
    its connection, so read it while the consumer is connected)."""
    query = urllib.parse.urlencode(
        {"format": "json", "topic": topic, "channel": channel, "include_mem": "false"}
    )
    data = _http_json(f"http://{http_address}/stats?{query}")
    total = 0
    for entry in data.get("topics") or []:
        if entry.get("topic_name") != topic:
            continue
        for ch in entry.get("channels") or []:
            if ch.get("channel_name") == channel:
                total += sum(int(c.get("finish_count", 0)) for c in ch.get("clients") or [])
    return total


def create_channel(http_address: str, topic: str, channel: str) -> None:
    """Create ``topic`` and ``channel`` over HTTP, so that published messages go straight to the
    channel."""
    q = urllib.parse.urlencode({"topic": topic})
    _http_json(f"http://{http_address}/topic/create?{q}", method="POST")
    q = urllib.parse.urlencode({"topic": topic, "channel": channel})
    _http_json(f"http://{http_address}/channel/create?{q}", method="POST")


def fill_topic(broker: Broker, topic: str, channel: str, n: int) -> None:
    """Create ``topic``/``channel`` and publish N 200-byte messages to it (MPUBs of 1000)."""
    import nsqclient

    create_channel(broker.http_address, topic, channel)
    body = message_body()
    with nsqclient.Producer(broker.tcp_address) as producer:
        for i in range(0, n, 1000):
            producer.mpub(topic, [body] * min(1000, n - i))


def delete_topic(http_address: str, topic: str) -> None:
    """Delete a topic (and its messages) once a case is verified, so that a long run does not
    pile up messages in the broker's memory.  Failures are ignored."""
    q = urllib.parse.urlencode({"topic": topic})
    try:
        _http_json(f"http://{http_address}/topic/delete?{q}", method="POST")
    except (OSError, ValueError):
        pass


def wait_for(what: str, probe: Callable[[], Any], ok: Callable[[Any], bool], timeout: float) -> Any:
    """Call ``probe`` until ``ok(result)`` or ``timeout`` seconds pass; return the last result
    (the caller decides what a miss means)."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    value = None
    while True:
        try:
            value = probe()
        except (OSError, ValueError) as exc:
            value = exc
        if not isinstance(value, Exception) and ok(value):
            return value
        if time.monotonic() >= deadline:
            print(f"  ! gave up waiting for {what}: last saw {value!r}", file=sys.stderr)
            return value
        pause.wait(0.05)


def topic_message_count(http_address: str, topic: str) -> int:
    entry = topic_stats(http_address, topic)
    return int(entry["message_count"]) if entry else 0


# ------------------------------------------------------------------------------ children


class ChildError(RuntimeError):
    """A benchmark subprocess failed."""


def run_child(
    script: str, spec: dict[str, Any], timeout: float, python: str | None = None
) -> dict[str, Any]:
    """Run ``script --child SPEC`` with this interpreter (or ``python``: a peer's virtualenv,
    see :func:`peer_python`); return its ``BENCH-RESULT`` dict.

    The child's stderr passes through (its log and profile go there).  With
    ``spec["py_spy"]`` (the py-spy binary) and ``spec["profile"]`` (a directory), the child
    runs under ``py-spy record`` and a summary of the samples is written next to them.  A
    child run by another interpreter gets no ``PYTHONPATH``: it imports its own packages and
    the stdlib-only ``_common`` beside the script, nothing of this process's path."""
    env = None
    if python is not None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    argv = [python or sys.executable, script, "--child", json.dumps(spec)]
    raw = None
    if spec.get("py_spy") and spec.get("profile"):
        Path(spec["profile"]).mkdir(parents=True, exist_ok=True)
        raw = Path(spec["profile"]) / f"{spec['client']}-{spec['case']}.pyspy.txt"
        argv = [
            spec["py_spy"],
            "record",
            "--format",
            "raw",
            "--threads",
            "--gil",
            "--rate",
            "500",
            "--nonblocking",
            "-o",
            str(raw),
            "--",
            *argv,
        ]
    try:
        proc = subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=None,
            text=True,
            timeout=timeout,
            check=False,
            env=env,
        )
    except subprocess.TimeoutExpired as exc:
        what = f"{spec.get('client')} {spec.get('case')}"
        raise ChildError(f"{what}: no result in {timeout}s") from exc
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            result = json.loads(line[len(RESULT_MARK) :])
    if proc.returncode != 0 or result is None:
        raise ChildError(
            f"{spec.get('client')} {spec.get('case')}: child exited {proc.returncode}, "
            f"output: {proc.stdout[-2000:]}"
        )
    if result.get("error"):
        raise ChildError(f"{spec.get('client')} {spec.get('case')}: {result['error']}")
    if raw is not None and raw.exists():
        summary = raw.with_name(raw.name.replace(".pyspy.txt", ".pyspy-summary.txt"))
        summary.write_text(summarize_py_spy(raw))
        print(f"  py-spy profile of {spec['client']} {spec['case']}: {summary}", file=sys.stderr)
    return result


def stop_process(proc: subprocess.Popen) -> None:
    """Stop a child process: SIGTERM, then SIGKILL if it is still there after 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def emit_result(result: dict[str, Any]) -> None:
    """In a child: hand the result to the parent (one line on stdout)."""
    sys.stdout.write(RESULT_MARK + json.dumps(result) + "\n")
    sys.stdout.flush()


# ------------------------------------------------------------------------------ profiling


class ThreadProfiler:
    """cProfile in every thread started while it is active (wall-clock timer: time a thread
    spends blocked shows up in the blocking call, e.g. ``acquire`` or ``recv``).

    Threads that exist before :meth:`start` (other than the caller) are not profiled.
    """

    def __init__(self) -> None:
        self._profiles: list[cProfile.Profile] = []
        self._lock = threading.Lock()

    def _new(self) -> cProfile.Profile:
        prof = cProfile.Profile()
        with self._lock:
            self._profiles.append(prof)
        return prof

    def _bootstrap(self, frame: Any, event: str, arg: Any) -> None:
        sys.setprofile(None)
        self._new().enable()

    def start(self) -> None:
        threading.setprofile(self._bootstrap)
        self._new().enable()

    def stop(self) -> None:
        threading.setprofile(None)  # type: ignore[arg-type]
        with self._lock:
            self._profiles[0].disable()

    def report(self, path: str | None, limit: int = 30) -> str:
        """Merge the threads' profiles; write a pstats dump to ``path`` (if given) and return
        the top ``limit`` functions by own time and by cumulative time."""
        with self._lock:
            profiles = list(self._profiles)
        stats: pstats.Stats | None = None
        out = io.StringIO()
        for prof in profiles:
            try:
                if stats is None:
                    stats = pstats.Stats(prof, stream=out)
                else:
                    stats.add(prof)
            except TypeError:  # a thread that recorded nothing
                continue
        if stats is None:
            return "(no profile data)"
        if path:
            stats.dump_stats(path)
        stats.strip_dirs().sort_stats("tottime").print_stats(limit)
        stats.sort_stats("cumulative").print_stats(limit)
        return out.getvalue()


def find_py_spy(explicit: str | None) -> str | None:
    """The py-spy binary: ``explicit``, else ``$PY_SPY``, else ``py-spy`` on PATH."""
    import shutil

    for candidate in (explicit, os.environ.get("PY_SPY"), shutil.which("py-spy")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _thread_role(name: str) -> str:
    # "nsq-reader-127.0.0.1:4150" -> "nsq-reader", "nsq-worker-3" -> "nsq-worker"
    parts = name.split("-")
    return "-".join(parts[:2]) if len(parts) > 2 else name


def summarize_py_spy(raw_path: Path, limit: int = 30) -> str:
    """Summarise py-spy's raw (collapsed-stack) output: samples per thread role, the hottest
    lines (where the samples were taken) and the functions on the most stacks."""
    from collections import Counter

    roles: Counter[str] = Counter()
    leaves: Counter[tuple[str, str]] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw_path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        role = "?"
        if frames and frames[0].startswith("thread ("):
            # "thread (tid): name", or "thread (tid)" before the thread had a name
            role = _thread_role(frames[0].partition("): ")[2] or "MainThread")
            frames = frames[1:]
        total += count
        roles[role] += count
        if frames:
            leaves[(role, frames[-1])] += count
        for frame in set(
            f.split(" (")[0] + " (" + f.rpartition(" (")[2].split(":")[0] + ")" for f in frames
        ):
            inclusive[frame] += count
    if not total:
        return "(no samples)"
    out = [f"{total} samples of the thread holding the GIL", "", "samples by thread:"]
    for role, count in roles.most_common():
        out.append(f"  {100 * count / total:5.1f}%  {role}")
    out += ["", f"hottest lines (self), top {limit}:"]
    for (role, frame), count in leaves.most_common(limit):
        out.append(f"  {100 * count / total:5.1f}%  [{role}] {frame}")
    out += ["", f"functions on the most stacks (inclusive), top {limit}:"]
    for frame, count in inclusive.most_common(limit):
        out.append(f"  {100 * count / total:5.1f}%  {frame}")
    return "\n".join(out) + "\n"


@contextlib.contextmanager
def maybe_profile(spec: dict[str, Any]) -> Iterator[None]:
    """Profile the block when the child's spec asks for it (``profile``: a directory)."""
    directory = spec.get("profile")
    if not directory or spec.get("py_spy"):
        yield
        return
    profiler = ThreadProfiler()
    profiler.start()
    try:
        yield
    finally:
        profiler.stop()
        Path(directory).mkdir(parents=True, exist_ok=True)
        stem = Path(directory) / f"{spec['client']}-{spec['case']}"
        text = profiler.report(str(stem) + ".pstats")
        stem.with_suffix(".txt").write_text(text)
        print(f"  profile of {spec['client']} {spec['case']}: {stem}.txt", file=sys.stderr)


# ------------------------------------------------------------------------------ output


def fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def fmt_ratio(ours: float | None, theirs: float | None) -> str:
    if not ours or not theirs:
        return "-"
    return f"{ours / theirs:.2f}x"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A plain-text table, columns right-aligned except the first."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        parts = [str(cells[0]).ljust(widths[0])]
        parts += [str(c).rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return " | ".join(parts)

    print(line(headers))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(line(row))


def describe_machine() -> str:
    return f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {load_average()}"


def load_average() -> str:
    """The 1-minute load average: other work on the machine skews every figure."""
    try:
        return f"load average {os.getloadavg()[0]:.2f}"
    except OSError:
        return "load average unknown"


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("profiling")
    group.add_argument(
        "--profile",
        metavar="DIR",
        help="profile the children into DIR: with py-spy when found (sampling, every thread, "
        "little overhead), else cProfile in every thread (slow: figures drop several-fold)",
    )
    add_profiler_arguments(group)
    group.add_argument(
        "--profile-clients",
        default="nsqclient",
        help="which clients --profile applies to, comma-separated (default nsqclient)",
    )


def add_profiler_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--profiler`` and ``--py-spy``: which profiler (what :func:`profile_spec` reads)."""
    parser.add_argument(
        "--profiler",
        choices=("auto", "py-spy", "cprofile"),
        default="auto",
        help="auto: py-spy if found, else cProfile",
    )
    parser.add_argument("--py-spy", metavar="PATH", help="py-spy binary (default $PY_SPY, PATH)")


def profile_spec(args: argparse.Namespace, client: str) -> dict[str, Any]:
    """The ``profile`` / ``py_spy`` entries of a child's spec."""
    if not args.profile or client not in comma_list(args.profile_clients):
        return {"profile": None, "py_spy": None}
    py_spy = None
    if args.profiler in ("auto", "py-spy"):
        py_spy = find_py_spy(args.py_spy)
        if py_spy is None and args.profiler == "py-spy":
            raise SystemExit("py-spy not found: pass --py-spy PATH or set PY_SPY")
    return {"profile": args.profile, "py_spy": py_spy}


def add_repeat_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="measure every case this many times, interleaving the clients (A, B, A, B...), "
        "and report the best run of each (default 3)",
    )
    add_quick_argument(parser)


def add_quick_argument(
    parser: argparse.ArgumentParser,
    help: str = "every case tiny and once (a smoke test that the script works, not a measure)",
) -> None:
    parser.add_argument("--quick", action="store_true", help=help)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Profiling, ``--child-timeout``, ``--repeat`` and ``--quick``."""
    add_profile_arguments(parser)
    parser.add_argument("--child-timeout", type=float, default=900.0, help="seconds per child")
    add_repeat_argument(parser)


#: ``--quick``'s caps on the arguments the scripts share (those a script has)
QUICK_LIMITS: dict[str, float] = {
    "repeat": 1,
    "child_timeout": 120.0,
    "stall_timeout": 15.0,
    "rss_messages": 4000,
    "go_runfor": 0.2,
    "go_messages": 50_000,
}


def apply_quick(args: argparse.Namespace, **limits: float) -> None:
    """With ``--quick``: cap every argument of :data:`QUICK_LIMITS` that ``args`` has (one
    repeat, the child and stall timeouts, the memory run, the Go tools' run), and the
    script's own ``limits`` (``messages=3000``...)."""
    if not args.quick:
        return
    for name, cap in {**QUICK_LIMITS, **limits}.items():
        if hasattr(args, name):
            setattr(args, name, min(getattr(args, name), cap))


def add_size_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", type=int, default=MESSAGE_SIZE, help="body bytes")


def add_max_in_flight_argument(
    parser: argparse.ArgumentParser, help: str = "(default 2500)"
) -> None:
    parser.add_argument("--max-in-flight", type=int, default=2500, help=help)


def add_stall_timeout_argument(parser: argparse.ArgumentParser, who: str) -> None:
    """``--stall-timeout``: ``who`` (``"a consumer that receives"``) nothing that long fails."""
    parser.add_argument(
        "--stall-timeout",
        type=float,
        default=30.0,
        help=f"{who} nothing for this many seconds fails (default 30)",
    )


def add_cases_argument(parser: argparse.ArgumentParser, default: Iterable[str], help: str) -> None:
    parser.add_argument("--cases", default=",".join(default), help=help)


def add_clients_argument(parser: argparse.ArgumentParser, clients: Sequence[str], go: str) -> None:
    """``--clients``: any of ``clients`` (all by default); ``go`` is the Go tool among them."""
    parser.add_argument(
        "--clients",
        default=",".join(clients),
        help=f"comma-separated subset of {','.join(clients)} (default: all; gnsq, {NSQ_PY} and "
        f"{go} are left out when gnsq does not import / {NSQ_PY}'s virtualenv cannot be made "
        f"(see --peer-venvs) / NSQ_BIN_DIR has no {go})",
    )


def add_go_tool_arguments(parser: argparse.ArgumentParser, tool: str, rss_help: str) -> None:
    """``--rss-messages`` (the memory run: ``rss_help``) and ``--go-runfor`` (of ``tool``)."""
    parser.add_argument(
        "--rss-messages", type=int, default=1_000_000, help=rss_help + " (default 1000000)"
    )
    parser.add_argument(
        "--go-runfor", type=float, default=1.0, help=f"{tool}'s --runfor in seconds (1)"
    )


def comma_list(text: str) -> list[str]:
    """The non-empty items of a comma-separated argument, stripped."""
    return [item.strip() for item in text.split(",") if item.strip()]


def choice_list(
    parser: argparse.ArgumentParser, text: str, known: Collection[str], what: str
) -> list[str]:
    """The comma-separated ``text``; a parser error for an item not in ``known`` (``what``:
    ``"client"``, ``"case"``)."""
    names = comma_list(text)
    for name in names:
        if name not in known:
            parser.error(f"unknown {what} {name!r}; choose from {','.join(known)}")
    return names


def run_as_child(argv: Sequence[str], child_main: Callable[[dict[str, Any]], None]) -> bool:
    """Run ``child_main`` when this process is a child (``--child SPEC``); True then."""
    if len(argv) == 2 and argv[0] == "--child":
        child_main(json.loads(argv[1]))
        return True
    return False


def go_tool_result(out: dict[str, Any], seconds: float, messages: float) -> dict[str, Any]:
    """A Go bench tool's rate, run time and CPU as a measured result (CPU per message over
    ``messages``)."""
    return {
        "rate": out["rate"],
        "seconds": seconds,
        "cpu": out["cpu"],
        "us_per_msg": out["cpu"] / messages * 1e6 if messages else None,
    }


def print_not_measured(notes: Sequence[str], report: bool = False) -> None:
    """The clients left out: on stderr while measuring, after the table in the ``report``."""
    for note in notes:
        if report:
            print(f"\nnot measured: {note}")
        else:
            print(f"  (not measured) {note}", file=sys.stderr)


# ------------------------------------------------------------------------------ reports


def rate_cell(r: dict[str, Any] | None) -> str:
    """``"12,345/s (4.5 us)"``: a result's rate and CPU per message; ``>=`` before a rate that
    is a lower bound (the Go reader ran dry), ``-`` when not measured."""
    if not r or not r.get("rate"):
        return "-"
    text = f"{r['rate']:,.0f}/s"
    if r.get("us_per_msg") is not None:
        text += f" ({r['us_per_msg']:.1f} us)"
    if r.get("drained"):
        text = ">= " + text
    return text


def print_report_intro(title: str, broker: Broker, cells: str) -> None:
    """The report's title, the broker and machine, and what its cells hold."""
    print()
    print(title)
    print()
    print(f"broker: {broker.description}; {describe_machine()}")
    print(cells)
    print()


def comparison_headers(tool: str, *more: str) -> list[str]:
    """The headers of a comparison table: the case, nsqclient, pynsq, gnsq and nsq-py (with
    their versions), the Go ``tool``, then ``more``."""
    versions = library_versions()
    return [
        "case",
        "nsqclient",
        f"pynsq {versions.get('pynsq', '?')}",
        f"gnsq {versions.get('gnsq', '-')}",
        f"{NSQ_PY} {NSQ_PY_VERSION}",
        tool,
        *more,
    ]


def print_rss_growth(what: str, since: str, growth_mib: float) -> None:
    """The memory verdict: ``growth_mib`` from ``since`` to 100% of ``what``, against 10 MB."""
    print(
        f"\nRSS growth over {what} ({since} -> 100%): {growth_mib:+.1f} MiB; target < 10 MB: "
        f"{target_check(growth_mib, 10.0, at_most=True)}"
    )


# ------------------------------------------------------------------------------ Markdown


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table (numbers right-aligned)."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        parts = [str(cells[0]).ljust(widths[0])]
        parts += [str(c).rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "| " + " | ".join(parts) + " |"

    rule = "|" + "|".join("-" * (w + 1) + (":" if i else "-") for i, w in enumerate(widths)) + "|"
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def target_check(value: float | None, target: float, at_most: bool = False) -> str:
    """``"ok"`` or ``"MISS"`` for a ratio against its target (``-`` when not measured)."""
    if value is None:
        return "-"
    good = value <= target if at_most else value >= target
    return "ok" if good else "MISS"


def ratio(ours: float | None, theirs: float | None) -> float | None:
    return ours / theirs if ours and theirs else None


def fmt_x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) of already sorted values, nearest rank."""
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, int(round(q * len(sorted_values) + 0.5)) - 1))
    return sorted_values[index]


def latency_summary(latencies: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/max of latencies in seconds, returned in microseconds."""
    values = sorted(latencies)
    return {
        "p50_us": percentile(values, 0.50) * 1e6,
        "p90_us": percentile(values, 0.90) * 1e6,
        "p99_us": percentile(values, 0.99) * 1e6,
        "max_us": (values[-1] if values else float("nan")) * 1e6,
    }


# ------------------------------------------------------------------------------ other clients


def library_versions() -> dict[str, str]:
    """Installed versions of the clients compared (``pynsq``, ``gnsq``, ``nsqclient``)."""
    from importlib import metadata

    found = {}
    for name in ("nsqclient", "pynsq", "gnsq", "gevent", "tornado"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def gnsq_problem() -> str | None:
    """Why gnsq cannot run here (None when ``import gnsq`` works in a fresh interpreter)."""
    proc = subprocess.run(
        [sys.executable, "-c", "import gnsq, gevent"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if proc.returncode == 0:
        return None
    last = (proc.stderr.strip().splitlines() or ["?"])[-1]
    return f"does not import ({last}); pip install gnsq (the bench extra has it)"


# ------------------------------------------------------------------------------ peers in a venv

#: nsq-py, the select()-loop client: its package is ``nsq``, as pynsq's is, so it cannot share
#: an interpreter with pynsq and runs from a virtualenv of its own (:func:`peer_python`)
NSQ_PY = "nsq-py"
NSQ_PY_VERSION = "0.1.12"
#: what a child of nsq-py's virtualenv checks before it measures: ``nsq`` is nsq-py, not pynsq
NSQ_PY_CHECK = (
    "import nsq, nsq.reader, nsq.client; from importlib.metadata import version; "
    "print(version('nsq-py'), nsq.__version__)"
)


def add_peer_venv_argument(parser: argparse.ArgumentParser) -> None:
    """``--peer-venvs``: where peers that need an interpreter of their own get one."""
    parser.add_argument(
        "--peer-venvs",
        metavar="DIR",
        default=os.environ.get("NSQCLIENT_BENCH_VENVS"),
        help=f"directory of the virtualenvs made for peers whose package clashes with another's "
        f"({NSQ_PY}'s nsq with pynsq's), made on first use and reused (needs pip and the "
        "package index; default $NSQCLIENT_BENCH_VENVS, else ~/.cache/nsqclient-bench)",
    )


def peer_venvs_dir(args: argparse.Namespace) -> Path:
    """``--peer-venvs``, else ``$XDG_CACHE_HOME/nsqclient-bench`` (``~/.cache`` by default)."""
    if getattr(args, "peer_venvs", None):
        return Path(args.peer_venvs).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "nsqclient-bench"


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _last_line(text: str) -> str:
    return (text.strip().splitlines() or ["?"])[-1]


def _check_venv(python: Path, check: str) -> tuple[str | None, str]:
    """Run ``check`` (code printing a version) in ``python``: ``(version, "")`` or ``(None,
    why)``."""
    if not python.exists():
        return None, f"{python} does not exist"
    try:
        proc = subprocess.run(
            [str(python), "-c", check], capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{python}: {exc}"
    if proc.returncode != 0:
        return None, f"{python}: {_last_line(proc.stderr)}"
    return proc.stdout.strip(), ""


def peer_python(
    args: argparse.Namespace, name: str, requirement: str, check: str
) -> tuple[str | None, str]:
    """The interpreter of the virtualenv ``name`` (in :func:`peer_venvs_dir`) that has
    ``requirement`` installed, made when missing or broken; ``(python, what check printed)``,
    or ``(None, why not)`` when it cannot be made (no pip, no network, a build failure): the
    caller reports the case as not measured.

    The venv is made beside its final place and renamed into it, so that a run that fails
    half-way leaves nothing that looks usable and two runs at once do not share a half-made
    one.  It is tied to this interpreter's version (in its name)."""
    import shutil

    tag = f"py{sys.version_info[0]}.{sys.version_info[1]}"
    venv = peer_venvs_dir(args) / f"{name}-{tag}"
    found, _ = _check_venv(_venv_python(venv), check)
    if found is not None:
        return str(_venv_python(venv)), found
    staging = venv.with_name(f"{venv.name}.tmp-{os.getpid()}")
    print(f"  making the {requirement} virtualenv {venv} (once)...", file=sys.stderr)
    try:
        venv.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        for argv, what in (
            ([sys.executable, "-m", "venv", str(staging)], "python -m venv"),
            (
                [
                    str(_venv_python(staging)),
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    requirement,
                ],
                f"pip install {requirement}",
            ),
        ):
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
            if proc.returncode != 0:
                return None, f"{what} failed: {_last_line(proc.stderr + proc.stdout)}"
        found, why = _check_venv(_venv_python(staging), check)
        if found is None:
            return None, f"installed but does not import: {why}"
        if venv.exists():
            shutil.rmtree(venv, ignore_errors=True)  # broken: it failed the check above
        try:
            staging.rename(venv)
        except OSError:
            pass  # another run put one there first: use it if it works
        found, why = _check_venv(_venv_python(venv), check)
        if found is None:
            return None, why
        return str(_venv_python(venv)), found
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"cannot make {venv}: {exc}"
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def nsq_py_python(args: argparse.Namespace) -> tuple[str | None, str]:
    """nsq-py's interpreter (its venv, made when missing) and ``""``, or None and why not.
    The venv must hold nsq-py :data:`NSQ_PY_VERSION`, and ``nsq`` must be that package."""
    python, found = peer_python(
        args, f"{NSQ_PY}-{NSQ_PY_VERSION}", f"{NSQ_PY}=={NSQ_PY_VERSION}", NSQ_PY_CHECK
    )
    if python is None:
        return None, found
    if found.split() != [NSQ_PY_VERSION, NSQ_PY_VERSION]:
        return None, f"{python} has {NSQ_PY} / nsq {found!r}, not {NSQ_PY_VERSION}"
    return python, ""


# ------------------------------------------------------------------------------ go-nsq tools


def go_tool(args: argparse.Namespace, name: str) -> str | None:
    """The path of go-nsq's ``name`` (``bench_reader``, ``bench_writer``) in ``--bin-dir``
    ($NSQ_BIN_DIR), or None."""
    if not getattr(args, "bin_dir", None) or getattr(args, "no_go_tools", False):
        return None
    path = os.path.join(args.bin_dir, name)
    return path if os.access(path, os.X_OK) else None


def run_go_tool(argv: Sequence[str], timeout: float) -> dict[str, Any]:
    """Run one of nsq's ``bench/`` tools; return its ``ops/s``, its wall time and the CPU time
    (user + system, all its threads) it used.  The tools log one line
    ``duration: 1.0s - 104.6mb/s - 548431.3ops/s - 1.8us/op``."""
    import re
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    output = proc.stdout + proc.stderr
    found = re.search(r"duration: (\S+) - .*? - ([0-9.]+)ops/s", output)
    if proc.returncode != 0 or not found:
        raise ChildError(f"{argv[0]} exited {proc.returncode}: {output[-2000:]}")
    return {
        "rate": float(found.group(2)),
        "wall": wall,
        "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "output": output.strip().splitlines()[-1],
    }


def message_frames(n: int, size: int) -> bytes:
    """``n`` classic NSQ message frames of ``size``-byte bodies, as nsqd sends them (for the
    step benches, which feed them to the client with no broker)."""
    from nsqclient import protocol

    body = os.urandom(size // 2 + 1).hex().encode()[:size]
    now = time.time_ns()
    return b"".join(
        protocol.encode_frame(
            protocol.FRAME_TYPE_MESSAGE, protocol.encode_message(now, 1, b"%016x" % i, body)
        )
        for i in range(n)
    )
