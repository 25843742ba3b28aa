"""Importing nsqclient.spark without the ``spark`` extra names the extra to install.

Each case runs a fresh interpreter (this one, so nsqclient and the rest are there) in which
``sys.modules[name] = None`` makes ``import name`` fail as if it were not installed; the
conftest's importorskip concerns this process only, so the cases run wherever the rest of
tests/spark runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

PROBE = """
import json, sys
for name in sys.argv[2:]:
    sys.modules[name] = None  # as if it were not installed
try:
    __import__(sys.argv[1])
except ImportError as exc:
    print(json.dumps({"type": type(exc).__name__, "name": exc.name, "message": str(exc)}))
else:
    print(json.dumps(None))
"""


def import_without(module: str, *blocked: str) -> Any:
    """Import ``module`` in a new interpreter where the modules ``blocked`` cannot be imported;
    None when it imported, else the ImportError's type, name and message."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, module, *blocked],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_with_the_extra_installed_the_package_imports() -> None:
    assert import_without("nsqclient.spark") is None  # the probe itself reports success


@pytest.mark.parametrize("module", ["nsqclient.spark", "nsqclient.spark.standalone"])
def test_without_pyspark_the_error_names_the_extra(module: str) -> None:
    error = import_without(module, "pyspark")
    assert error is not None and error["type"] == "ModuleNotFoundError", error
    assert error["name"].startswith("pyspark"), error
    assert error["message"].startswith("nsqclient.spark needs pyspark >= 4.2 and pyarrow ("), error
    assert error["message"].endswith("): pip install 'nsqclient[spark]'"), error


def test_a_pyspark_without_the_data_source_api_gets_the_same_advice() -> None:
    # Spark 3.x has no pyspark.sql.datasource: the import fails there, not at "import pyspark".
    error = import_without("nsqclient.spark", "pyspark.sql.datasource")
    assert error is not None and error["type"] == "ModuleNotFoundError", error
    assert error["name"] == "pyspark.sql.datasource", error
    assert "pyspark >= 4.2" in error["message"], error
    assert error["message"].endswith("pip install 'nsqclient[spark]'"), error


def test_without_pyarrow_the_error_names_it_and_the_extra() -> None:
    error = import_without("nsqclient.spark", "pyarrow")
    assert error == {
        "type": "ModuleNotFoundError",
        "name": "pyarrow",
        "message": "nsqclient.spark needs pyarrow (No module named 'pyarrow'): "
        "pip install 'nsqclient[spark]'",
    }
