"""A class-data-sharing archive of a local Spark driver's classes, so each test's driver JVM maps
Spark's classes from one file instead of loading and verifying them again (JDK 17's dynamic CDS).

The Spark tests start a driver JVM per run (the session fixture, every spark_driver.py, orders_job.py
and demo run): 11-13 s each to start, run a small job and stop on this project's 2-vCPU hosts, 7-8 s
with this archive and C1 only (`-XX:TieredStopAtLevel=1`: such short runs never repay C2's
compilations). `make test` builds the archive once into the cache (`cd tests; python -m support.spark_cds`);
tests/spark/conftest.py hands `java_options()` to every driver through SPARK_SUBMIT_OPTS. Keyed by
the JDK and Spark's jars as installed: a new JDK, pyspark or virtualenv gets its own archive, and a
JVM whose classpath does not match one simply loads its classes as before (its CDS log lines are
off, so nothing is printed).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from support import cache

_CACHE = cache.CACHE / "spark-cds"
_QUIET = "-Xlog:cds=off,cds+dynamic=off"  # unified logging's warnings go to stdout otherwise
_C1_ONLY = "-XX:TieredStopAtLevel=1"
_KEEP = 3

# What the archive is made from: a driver's session, Python tasks, a write, a query with a shuffle.
_TRAINING = """
from txbroker_spark import local_session
spark = local_session("txbroker-cds", "local[2,4]", log_level="ERROR")
df = spark.range(2000, numPartitions=4).selectExpr("id", "concat('row-', id) AS payload")
df.rdd.mapPartitions(lambda rows: [sum(1 for _ in rows)]).sum()
df.write.format("noop").mode("overwrite").save()
df.groupBy((df.id % 7).alias("k")).count().collect()
spark.createDataFrame([(1, "a")], "id LONG, payload STRING").toPandas()
jvm = spark.sparkContext._gateway.proc
spark.stop()
jvm.stdin.close()  # the gateway JVM exits on its stdin's end, and writes the archive as it exits
jvm.wait(300)
"""

_CHECK = """
from txbroker_spark import local_session
local_session("txbroker-cds-check", "local[1]", log_level="ERROR").stop()
"""


def _key() -> str | None:
    try:
        import pyspark
    except ImportError:
        return None
    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=60).stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    jars = Path(pyspark.__file__).parent / "jars"
    # JDK 17 checks an archive's classpath by each jar's path, size and modification time: a new
    # virtualenv (a CI clone's, even at the same path) needs an archive of its own
    listing = sorted(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in jars.glob("*.jar"))
    h = hashlib.sha256("\n".join([java, pyspark.__version__, str(jars.resolve()), *listing]).encode())
    return h.hexdigest()[:16]


def archive() -> Path | None:
    """The archive for this JDK and Spark, if it has been built."""
    key = _key()
    path = _CACHE / f"{key}.jsa" if key else None
    return path if path is not None and path.is_file() else None


def java_options() -> str:
    """Driver JVM options for the tests: C1 only, and the archive where there is one."""
    path = archive()
    return " ".join([_C1_ONLY, *([f"-XX:SharedArchiveFile={path}", _QUIET] if path else [])])


def build() -> int:
    key = _key()
    if key is None:
        print("spark-cds: no pyspark or java here; the Spark tests start without an archive", file=sys.stderr)
        return 0
    final = _CACHE / f"{key}.jsa"
    if final.is_file():
        return 0
    _CACHE.mkdir(parents=True, exist_ok=True)
    print(f"spark-cds: building {final} (once per JDK and virtualenv; about 40 s)", file=sys.stderr)
    fd, tmp = tempfile.mkstemp(dir=_CACHE, suffix=".jsa.tmp")
    os.close(fd)
    os.unlink(tmp)
    log = final.with_suffix(".log")
    env = {**os.environ, "SPARK_SUBMIT_OPTS": f"-XX:ArchiveClassesAtExit={tmp} {_QUIET}"}
    spark_dir = Path(__file__).resolve().parents[2] / "spark"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(spark_dir), env.get("PYTHONPATH")]))
    with open(log, "wb") as out:
        r = subprocess.run([sys.executable, "-c", _TRAINING], stdout=out, stderr=subprocess.STDOUT, env=env,
                           timeout=600)
    if r.returncode != 0 or not Path(tmp).is_file():
        Path(tmp).unlink(missing_ok=True)
        # not fatal: the tests start their drivers without it, as before
        print(f"spark-cds: the training run failed ({r.returncode}); see {log}", file=sys.stderr)
        return 0
    # A driver started as the tests start theirs must map it (-Xshare:on fails where it would not)
    # before it is published under its key.
    env["SPARK_SUBMIT_OPTS"] = f"-XX:SharedArchiveFile={tmp} -Xshare:on"
    with open(log, "ab") as out:
        r = subprocess.run([sys.executable, "-c", _CHECK], stdout=out, stderr=subprocess.STDOUT, env=env, timeout=600)
    if r.returncode == 0:
        os.replace(tmp, final)
    else:
        print(f"spark-cds: a driver could not map the archive, so it is not kept; see {log}", file=sys.stderr)
    for old in _CACHE.glob("*.jsa.tmp"):  # a build cut short
        old.unlink(missing_ok=True)
    # other checkouts' and earlier JDKs' or Sparks': the newest few stay (each is 160 MB)
    for old in sorted(_CACHE.glob("*.jsa"), key=lambda p: p.stat().st_mtime, reverse=True)[_KEEP:]:
        old.unlink(missing_ok=True)
        old.with_suffix(".log").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(build())
