"""Bad options fail at save()/load()/start(), before any task runs, naming the option."""

from __future__ import annotations

import pytest

from spark_helpers import free_port_unused

pytest.importorskip("pyspark.sql.datasource")


def _df(spark):
    return spark.range(5).selectExpr("id", "concat('k', id) AS k", "cast(id AS string) AS s", "binary(s) AS b")


def _save(df, opts, mode="append"):
    df.write.format("txbroker").options(**opts).mode(mode).save()


def assert_names_option(excinfo, option, *fragments):
    text = str(excinfo.value)
    assert f"txbroker option '{option}'" in text, text[-2000:]
    for f in fragments:
        assert f in text, text[-2000:]


@pytest.mark.parametrize("missing", ["topic", "brokers", "producerGroup"])
def test_missing_required_option(spark, tx_env, missing):
    opts = tx_env.options("Orders")
    del opts[missing]
    with pytest.raises(Exception) as e:
        _save(_df(spark), opts)
    assert_names_option(e, missing, "is required")
    assert tx_env.pending() == []


def test_unknown_broker_fails_fast(spark, tx_env):
    opts = tx_env.options("Orders", brokers=f"127.0.0.1:{free_port_unused()}")
    with pytest.raises(Exception) as e:
        _save(_df(spark), opts)
    assert_names_option(e, "brokers", "no broker reachable")


def test_malformed_broker_and_topic(spark, tx_env):
    with pytest.raises(Exception) as e:
        _save(_df(spark), tx_env.options("Orders", brokers="localhost"))
    assert_names_option(e, "brokers", "HOST:PORT")
    with pytest.raises(Exception) as e:
        _save(_df(spark), tx_env.options("no spaces allowed"))
    assert_names_option(e, "topic", "invalid topic name")


@pytest.mark.parametrize("option", ["keyColumn", "tagsColumn", "bodyColumn"])
def test_wrong_column(spark, tx_env, option):
    with pytest.raises(Exception) as e:
        _save(_df(spark), tx_env.options("Orders", **{option: "no_such_column"}))
    assert_names_option(e, option, "no column 'no_such_column'", "columns: id, k, s, b")
    assert tx_env.pending() == []


def test_body_format_must_match_the_column(spark, tx_env):
    with pytest.raises(Exception) as e:
        _save(_df(spark), tx_env.options("Orders", bodyColumn="s", bodyFormat="bytes"))
    assert_names_option(e, "bodyColumn", "is string, not binary")
    with pytest.raises(Exception) as e:
        _save(_df(spark), tx_env.options("Orders", bodyFormat="xml"))
    assert_names_option(e, "bodyFormat", "must be auto, json, bytes or string")


def test_numbers_and_modes(spark, tx_env):
    with pytest.raises(Exception) as e:
        _save(_df(spark), tx_env.options("Orders", batchSize="0"))
    assert_names_option(e, "batchSize", "between 1 and 100000")
    with pytest.raises(Exception) as e:
        _save(_df(spark), tx_env.options("Orders", batchSize="many"))
    assert_names_option(e, "batchSize", "expected an integer")
    with pytest.raises(Exception) as e:
        _save(_df(spark), tx_env.options("Orders"), mode="overwrite")
    assert_names_option(e, "mode", "append")


def test_reused_job_id_is_refused(spark, tx_env):
    opts = tx_env.options("Orders", jobId="nightly-1")
    _save(_df(spark), opts)
    with pytest.raises(Exception) as e:
        _save(_df(spark), opts)
    assert_names_option(e, "jobId", "already COMMITTED")


def test_read_options(spark, tx_env):
    reader = spark.read.format("txbroker")
    with pytest.raises(Exception) as e:
        reader.option("brokers", tx_env.brokers).load().collect()
    assert_names_option(e, "topic", "is required")
    with pytest.raises(Exception) as e:
        reader.option("brokers", tx_env.brokers).option("topic", "NeverWritten").load().collect()
    assert_names_option(e, "topic", "does not exist")
    with pytest.raises(Exception) as e:
        (spark.read.format("txbroker").option("brokers", f"127.0.0.1:{free_port_unused()}").option("topic", "T")
         .load().collect())
    assert_names_option(e, "brokers", "no broker reachable")
    with pytest.raises(Exception) as e:
        (spark.read.format("txbroker").option("brokers", tx_env.brokers).option("topic", "T")
         .option("startingOffsets", "{bad").load().collect())
    assert_names_option(e, "startingOffsets", "JSON object")


def test_streaming_needs_a_checkpoint(spark, tx_env, tmp_path):
    stream = spark.readStream.format("rate").option("rowsPerSecond", 1).load()
    with pytest.raises(Exception) as e:
        q = (stream.writeStream.format("txbroker").options(**tx_env.options("Orders", jobId="x"))
             .option("checkpointLocation", str(tmp_path / "cp")).start())
        try:
            q.processAllAvailable()
        finally:
            q.stop()
    assert_names_option(e, "jobId", "batch writes")
