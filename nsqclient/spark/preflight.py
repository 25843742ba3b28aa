"""Does the Python that Spark starts have nsqclient?  Asked on the driver, before any query.

Spark runs a Python data source's code (the driver-side reader, the executors' tasks) in the
interpreter its SparkContext names (``sc.pythonExec``: ``$PYSPARK_PYTHON`` when the context
started, else ``python3`` from the ``PATH``), not in the driver's own.  When that interpreter
lacks nsqclient or one of its dependencies, the first query fails deep inside Spark with a bare
``ModuleNotFoundError: No module named 'snappy'``.  :func:`check_worker_python` runs that
interpreter once, on the driver, and turns such a failure into an error that says which
interpreter it is and what to set.  It imports nothing of pyspark.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

__all__ = ["WorkerPythonError", "check_worker_python"]

#: what a Python worker needs: nsqclient with its dependencies (the package imports them all),
#: the source/sink's own modules that import no pyspark, and pyarrow
_PROBE = "import nsqclient, nsqclient.spark.options, pyarrow"

_checked: set[str] = set()
_lock = threading.Lock()


class WorkerPythonError(RuntimeError):
    """The Python Spark starts for the data source cannot import nsqclient (or pyarrow)."""


def _where(executable: str) -> str:
    env = os.environ.get("PYSPARK_PYTHON")
    if env and env == executable:
        return f"{executable!r} (PYSPARK_PYTHON)"
    if not env and executable == "python3":
        return "'python3' from the PATH (PYSPARK_PYTHON was not set when Spark started)"
    return f"{executable!r} (the SparkContext's pythonExec)"


def check_worker_python(executable: str, timeout: float = 60.0) -> None:
    """Raise :class:`WorkerPythonError` when ``executable`` (as Spark would start it: found
    on the ``PATH``, in the current directory) cannot import nsqclient and pyarrow.

    Skipped when ``executable`` is this very interpreter, and for an interpreter already
    checked by this process."""
    found = shutil.which(executable) or executable
    if os.path.abspath(found) == os.path.abspath(sys.executable):
        return
    with _lock:
        if found in _checked:
            return
    hint = (
        f"Set PYSPARK_PYTHON to a Python that has nsqclient[spark] installed (this one does: "
        f"PYSPARK_PYTHON={sys.executable}) before the SparkSession starts, or install "
        f"nsqclient[spark] into that Python; on a cluster, on every worker too (docs/spark.rst)"
    )
    try:
        proc = subprocess.run(
            [found, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except OSError as exc:
        raise WorkerPythonError(
            f"Spark runs the nsq data source in {_where(executable)}, which cannot be "
            f"started: {exc}.  {hint}."
        ) from None
    except subprocess.TimeoutExpired:
        return  # a slow machine is no proof of a broken interpreter: let Spark try
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit status {proc.returncode}"
        raise WorkerPythonError(
            f"Spark runs the nsq data source in {_where(executable)}, which cannot import "
            f"nsqclient: {reason}.  {hint}."
        )
    with _lock:
        _checked.add(found)
