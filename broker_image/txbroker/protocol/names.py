"""The wire vocabulary beyond frames and bodies: message property names, system topic names and
the rules names must follow. Defined once here; the broker, the client, the CLI and Spark import
them. The names are RocketMQ's where RocketMQ has one, so its tools read our messages alike.
"""

from __future__ import annotations

import re

# ---- message properties -------------------------------------------------------------------------
# set by the broker on a half message it hands to a check-back or a lookup
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
# set by the producer: seconds before the first check-back of its transaction
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
# set by the broker on a message sent back for retry (and kept on its way to the dead letters)
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
# set by the broker on a delayed message while it waits in SCHEDULE_TOPIC
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_DELAY = "DELAY"
PROPERTY_DELIVER_MS = "TIMER_DELIVER_MS"
# set by `txbroker dlq resend` on what it re-sends: the dead letter's id
PROPERTY_RESENT_FROM_DLQ = "RESENT_FROM_DLQ"

# ---- system topics --------------------------------------------------------------------------------
RETRY_PREFIX = "%RETRY%"  # + consumer group: its retries
DLQ_PREFIX = "%DLQ%"      # + consumer group: its dead letters
GROUP_TOPIC_PREFIXES = (RETRY_PREFIX, DLQ_PREFIX)
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"        # where RocketMQ keeps half messages (we keep records)
OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"  # where RocketMQ marks them ended
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"  # half messages past their check-backs, when discarded
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"         # delayed messages until due
SYSTEM_TOPICS = frozenset({HALF_TOPIC, OP_HALF_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC, SCHEDULE_TOPIC})


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


# ---- name rules -----------------------------------------------------------------------------------
TOPIC_NAME = re.compile(r"^[%|a-zA-Z0-9_-]{1,127}$")  # RocketMQ's rule
TOPIC_NAME_RULE = "1-127 characters from letters, digits, '%', '|', '_', '-'"
ACCESS_KEY = re.compile(r"^[A-Za-z0-9._@-]{1,128}$")
ACCESS_KEY_RULE = "1-128 characters from letters, digits, '.', '_', '-', '@'"
JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,95}")   # fullmatch
JOB_NAME_RULE = "1-96 of A-Z a-z 0-9 . _ : -"
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")    # fullmatch
JOB_ID_RULE = "1-128 of A-Z a-z 0-9 . _ : -"
