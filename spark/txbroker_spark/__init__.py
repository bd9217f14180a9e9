"""Transactional publishing from PySpark to txbroker, exactly once (DESIGN.md, "Spark").

    from txbroker_spark import register
    register(spark)                       # or txbroker_spark.session.local_session()
    (df.write.format("txbroker")
       .option("brokers", "127.0.0.1:10911").option("topic", "Orders")
       .option("producerGroup", "orders-publisher").option("ledger", "/data/ledger")
       .mode("append").save())

Run the ledger checker next to the ledger: `python -m txbroker_spark.checker --help`.
See spark/README.md for the options, the ledger and the guarantees.
"""

from txbroker_spark.deferred import DeferredJob, JobAborted
from txbroker_spark.ledger import Decision, Ledger
from txbroker_spark.session import local_session, register

__all__ = ["DeferredJob", "Decision", "JobAborted", "Ledger", "local_session", "register"]
