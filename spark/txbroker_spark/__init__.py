"""Transactional publishing from PySpark to txbroker, exactly once (DESIGN.md, "Spark").

    from txbroker_spark import register
    register(spark)                       # or txbroker_spark.session.local_session()
    (df.write.format("txbroker")
       .option("brokers", "127.0.0.1:10911").option("topic", "Orders")
       .option("producerGroup", "orders-publisher")
       .mode("append").save())

Each write is one coordinated transaction on the broker: the driver's commit is one decision
request and the broker makes the messages visible. See spark/README.md for the options and the
guarantees.
"""

from txbroker_spark.deferred import DeferredJob, JobAborted
from txbroker_spark.jobs import new_job_id
from txbroker_spark.session import local_session, register

__all__ = ["DeferredJob", "JobAborted", "local_session", "new_job_id", "register"]
