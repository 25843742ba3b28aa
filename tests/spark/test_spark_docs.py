"""docs/spark.rst's cluster instructions run as printed, the way a user runs them: in a shell
where the virtualenv is not activated (its ``bin/`` off the ``PATH``; no ``VIRTUAL_ENV``,
``SPARK_HOME``, ``PYSPARK_PYTHON``, ``SPARK_LOCAL_IP``), the docs' ``/opt/nsq-venv`` being this
interpreter's virtualenv.  The code is taken from the .rst, not copied here: the
StandaloneCluster snippet (with a job for its ``...``) and the commands of "A standalone
cluster by hand" (on free ports).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from nsqclient.testing.waiting import wait_for

DOC = Path(__file__).resolve().parents[2] / "docs" / "spark.rst"
VENV = "/opt/nsq-venv"  # the docs' virtualenv; here: sys.prefix


def section(title: str) -> str:
    """The text of docs/spark.rst under the heading ``title``, up to the next heading."""
    text = DOC.read_text(encoding="utf-8")
    match = re.search(rf"^{re.escape(title)}\n([-~=])\1+\n", text, re.M)
    assert match, f"no heading {title!r} in {DOC}"
    rest = text[match.end() :]
    after = re.search(r"^[^\n]+\n([-~=])\1{3,}\n", rest, re.M)
    return rest[: after.start()] if after else rest


def code_blocks(text: str, language: str) -> list[str]:
    """The ``.. code-block:: <language>`` blocks of ``text``, unindented."""
    blocks = re.findall(rf"\.\. code-block:: {language}\n\n((?:    .*\n|\n)+)", text)
    return ["\n".join(line[4:] for line in block.rstrip().splitlines()) + "\n" for block in blocks]


def shell_script(block: str) -> str:
    """A console block's commands (``$ `` lines and their ``\\`` continuations) as a script."""
    lines: list[str] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            lines.append(line[2:])
        elif lines and lines[-1].endswith("\\"):
            lines.append(line)
    return "\n".join(lines) + "\n"


def user_env() -> dict[str, str]:
    """This process's environment as the user's shell has it: the virtualenv not activated."""
    env = dict(os.environ)
    for name in (
        "VIRTUAL_ENV",
        "SPARK_HOME",
        "PYSPARK_PYTHON",
        "PYSPARK_DRIVER_PYTHON",
        "SPARK_LOCAL_IP",
    ):
        env.pop(name, None)
    venv_bin = os.path.realpath(os.path.join(sys.prefix, "bin"))
    env["PATH"] = os.pathsep.join(
        entry
        for entry in env.get("PATH", "").split(os.pathsep)
        if entry and os.path.realpath(entry) != venv_bin
    )
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no {path.name})"


def group_alive(group: int) -> list[int]:
    """The processes of process group ``group`` that are not zombies (Linux)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == group:
            pids.append(int(entry))
    return pids


def commands(script: str) -> list[str]:
    """A script's commands, a command's ``\\`` continuations joined to it."""
    return script.replace("\\\n", " ").splitlines()


# First of the module: the shared cluster stops right after it (conftest.py), before the
# snippet below starts a cluster of its own.
@pytest.mark.timeout(240)
def test_the_by_hand_master_and_worker_start_as_printed(
    tmp_path: Path, standalone_cluster: Any
) -> None:
    """The SPARK_HOME and master/worker blocks, run by bash with the virtualenv not
    activated: the master comes up on 127.0.0.1 at the URL the worker command names, and the
    worker registers with that URL's master, offering 1 core and 1 GiB.

    The master command runs as printed (on free ports); the worker command's URL is the shared
    ``standalone_cluster``'s master (its ``--host 127.0.0.1`` and its port for the printed
    7077): the worker registers at once with a master that is up, where it would wait 5-15 s
    for its next try at one still starting, and the master it names is shown to be the printed
    one by the URL the printed master reports."""
    blocks = code_blocks(section("A standalone cluster by hand"), "console")
    home, daemons = shell_script(blocks[0]), shell_script(blocks[1])
    assert "export SPARK_HOME=" in home, home
    assert "deploy.master.Master" in daemons and "deploy.worker.Worker" in daemons, daemons
    assert "7077" in daemons and "8080" in daemons and VENV in home + daemons
    (master,) = [c for c in commands(daemons) if "deploy.master.Master" in c]
    (worker,) = [c for c in commands(daemons) if "deploy.worker.Worker" in c]
    assert "--host 127.0.0.1 --port 7077 --webui-port 8080" in master, master
    printed_url = "spark://127.0.0.1:7077"
    assert printed_url in worker, worker
    port, web_port = free_port(), free_port()
    edited = {
        master: master.replace("7077", str(port)).replace("8080", str(web_port)),
        worker: worker.replace(printed_url, standalone_cluster.url),
    }
    script = home + "".join(edited.get(c, c) + "\n" for c in commands(daemons))
    script = script.replace(VENV, sys.prefix)
    shared_workers = {w["id"] for w in standalone_cluster.state().get("workers") or []}
    logs = [tmp_path / "master.log", tmp_path / "worker.log"]
    shell = subprocess.Popen(
        ["bash", "-e", "-c", script],
        env=user_env(),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # the daemons stay in its process group: killed below
    )
    group = shell.pid
    try:
        output = shell.communicate(timeout=60)[0].decode(errors="replace")
        assert shell.returncode == 0, output  # the commands ran; the daemons in the background

        def state(web: int) -> dict[str, Any] | None:
            try:
                url = f"http://127.0.0.1:{web}/json/"
                with urllib.request.urlopen(url, timeout=5) as reply:  # noqa: S310 (loopback)
                    data = dict(json.loads(reply.read()))
            except (OSError, ValueError):
                data = None
            if not group_alive(group):
                raise AssertionError("the master and the worker exited:\n" + tail(logs[0]))
            return data

        def new_worker() -> dict[str, Any] | None:
            found = [
                w
                for w in (state(standalone_cluster.web_port) or {}).get("workers") or []
                if w["id"] not in shared_workers and w.get("state") == "ALIVE"
            ]
            return found[0] if found else None

        ready = wait_for(
            lambda: (s := state(web_port)) and s.get("status") == "ALIVE" and s,
            timeout=150,
            interval=0.2,
            message=lambda: f"the master is not up: {state(web_port)}\n{tail(logs[0])}",
        )
        assert ready["url"] == f"spark://127.0.0.1:{port}"  # the worker command's, printed
        registered = wait_for(
            new_worker,
            timeout=150,
            interval=0.2,
            message=lambda: f"no worker registered: {new_worker()}\n{tail(logs[1])}",
        )
        assert (registered["host"], registered["cores"], registered["memory"]) == (
            "127.0.0.1",
            1,
            1024,
        )
        for log in logs:  # SPARK_LOCAL_IP: no "hostname ... resolves to a loopback address"
            assert "loopback address" not in log.read_text(errors="replace"), tail(log)
    finally:
        try:
            os.killpg(group, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            wait_for(lambda: not group_alive(group), timeout=30, interval=0.1)
        except AssertionError:
            os.killpg(group, signal.SIGKILL)
            wait_for(lambda: not group_alive(group), timeout=15, interval=0.1)
        if shell.poll() is None:
            shell.kill()
            shell.wait(10)


@pytest.mark.timeout(300)
def test_the_standalone_cluster_snippet_runs_as_printed(tmp_path: Path) -> None:
    """A session from ``cluster.session_builder()``, ``register``, and for the ``...`` a job
    that says which Python the executors run: this one (not ``python3`` from the PATH).  With
    one worker where the docs say two: a worker's and an executor's JVM less, 20-30 s on a
    2-core machine (test_spark_cluster.py runs two)."""
    (snippet,) = [
        b
        for b in code_blocks(section("Running on a cluster"), "python")
        if "StandaloneCluster(" in b
    ]
    placeholder = "...  # the queries\n"
    assert placeholder in snippet
    job = (
        "import sys; print('executors run', sorted(set(spark.sparkContext.parallelize("
        "range(2), 2).map(lambda _: sys.executable).collect())), flush=True)\n"
    )
    cluster = 'StandaloneCluster(workers=2, cores=1, memory="1g")'
    assert cluster in snippet
    program = snippet.replace(placeholder, job).replace(cluster, cluster.replace("2", "1"))
    proc = subprocess.run(
        [sys.executable, "-c", program],
        env=user_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    errors = "\n".join(line for line in proc.stderr.splitlines() if "Error" in line)
    assert proc.returncode == 0, errors + "\n" + proc.stderr[-3000:]
    assert f"executors run {[sys.executable]!r}" in proc.stdout.splitlines(), proc.stdout
    # session_builder() set SPARK_LOCAL_IP for the driver's JVM
    assert "resolves to a loopback address" not in proc.stderr


def test_outside_the_virtualenv_spark_class_cannot_find_spark_as_the_docs_say(
    tmp_path: Path,
) -> None:
    """Why the by-hand commands set SPARK_HOME first (the user's ``python3`` lacks pyspark)."""
    message = "Could not find valid SPARK_HOME"
    assert message in section("A standalone cluster by hand")
    probe = subprocess.run(
        ["python3", "-c", "import pyspark"], env=user_env(), capture_output=True, check=False
    )
    if probe.returncode == 0:
        pytest.skip("the python3 on the PATH has pyspark: spark-class finds Spark through it")
    proc = subprocess.run(
        [
            os.path.join(sys.prefix, "bin", "spark-class"),
            "org.apache.spark.deploy.master.Master",
            "--help",
        ],
        env=user_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert message in proc.stdout + proc.stderr
