"""A small local SparkSession with what this package needs (the venv's Python for the workers,
the txbroker data source registered, no UI, few shuffle partitions)."""

from __future__ import annotations

import os
import sys


def local_session(app: str = "txbroker-spark", master: str = "local[2]", conf: dict | None = None,
                  log_level: str = "WARN"):
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
    }
    settings.update({k: str(v) for k, v in (conf or {}).items()})
    builder = SparkSession.builder.master(master).appName(app)
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    register(spark)
    return spark


def register(spark) -> None:
    """Make `format("txbroker")` known to this session."""
    from txbroker_spark.datasource import TxBrokerDataSource

    spark.dataSource.register(TxBrokerDataSource)
