"""NSQ as a PySpark data source: a Structured Streaming source and a (streaming and batch) sink.

Requires Spark >= 4.2 with pyarrow (``pip install 'nsqclient[spark]'``; without them, importing
this package raises a ModuleNotFoundError that says so)::

    import nsqclient.spark
    nsqclient.spark.register(spark)          # registers the format "nsq"

    df = (spark.readStream.format("nsq")
          .option("topic", "clicks").option("channel", "spark")
          .option("nsqd_tcp_addresses", "127.0.0.1:4150")
          .load())                           # body, topic, message_id, timestamp, attempts, ...
    (df.selectExpr("upper(cast(body as string)) as body")
       .writeStream.format("nsq").option("topic", "clicks_upper")
       .option("nsqd_tcp_addresses", "127.0.0.1:4150")
       .option("checkpointLocation", "/tmp/ckpt").start())

At-least-once: a message is FINished only after Spark has committed the micro-batch that carried
it.  See docs/spark.rst for the exact guarantee, the options and the failure story.
"""

from __future__ import annotations

import importlib.util
from typing import Any

# pyspark and pyarrow come with the ``spark`` extra: say so instead of a bare "No module named".
# (A pyspark older than 4.0 has no pyspark.sql.datasource: the same advice.)  pyarrow is only
# looked for here, not imported: the modules that build rows import it when they do.
try:
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader
except ImportError as exc:
    if not (exc.name or "").startswith("pyspark"):
        raise
    raise ModuleNotFoundError(
        f"nsqclient.spark needs pyspark >= 4.2 and pyarrow ({exc}): pip install 'nsqclient[spark]'",
        name=exc.name,
    ) from exc
if importlib.util.find_spec("pyarrow") is None:
    raise ModuleNotFoundError(
        "nsqclient.spark needs pyarrow (No module named 'pyarrow'): pip install 'nsqclient[spark]'",
        name="pyarrow",
    )

from .options import SinkOptions, SourceOptions
from .preflight import WorkerPythonError, check_worker_python
from .rows import SCHEMA_DDL
from .sink import NSQStreamWriter, NSQWriter, check_frame
from .source import NSQInputPartition, NSQStreamReader

__all__ = [
    "NSQDataSource",
    "NSQStreamReader",
    "NSQStreamWriter",
    "NSQWriter",
    "NSQInputPartition",
    "SCHEMA_DDL",
    "WorkerPythonError",
    "register",
]


class NSQDataSource(DataSource):
    """The ``nsq`` data source.  Options are strings; see docs/spark.rst for the table."""

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> str:
        """The source's rows (see :data:`SCHEMA_DDL`)."""
        return SCHEMA_DDL

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802
        """The micro-batch reader (``spark.readStream.format("nsq")``)."""
        return NSQStreamReader(SourceOptions.parse(self.options))

    def writer(self, schema: Any, overwrite: bool) -> NSQWriter:
        """The batch writer (``df.write.format("nsq")``); ``overwrite`` means nothing here."""
        options = SinkOptions.parse(self.options)
        check_frame(schema.fieldNames(), options)
        return NSQWriter(options)

    def streamWriter(self, schema: Any, overwrite: bool) -> NSQStreamWriter:  # noqa: N802
        """The streaming writer (``df.writeStream.format("nsq")``)."""
        options = SinkOptions.parse(self.options)
        check_frame(schema.fieldNames(), options)
        return NSQStreamWriter(options)


def register(spark: Any, check_python: bool = True) -> None:
    """Register ``NSQDataSource`` as the format ``"nsq"`` in the session ``spark``.

    With ``check_python`` (the default), first check that the Python Spark starts for the data
    source (``$PYSPARK_PYTHON`` when the session started, else ``python3``) can import
    nsqclient and pyarrow, and raise :class:`WorkerPythonError` naming it and
    ``PYSPARK_PYTHON`` when it cannot (instead of a bare ``ModuleNotFoundError`` from inside
    Spark at the first query).  Costs nothing when that Python is the driver's own."""
    if check_python:
        try:
            executable = spark.sparkContext.pythonExec
        except Exception:  # Spark Connect: no SparkContext here, the server starts the workers
            executable = None
        if isinstance(executable, str) and executable:
            check_worker_python(executable)
    spark.dataSource.register(NSQDataSource)
