"""Dead letters: what re-sending one means, for every tool that does it (`txbroker dlq resend`, the
web console). A consumer group's dead letters live in %DLQ%<group>; each says which topic it came
from. Re-sending stores a copy in that topic, without the retry bookkeeping, marked with the dead
letter's id so it can be traced."""

from __future__ import annotations

from txbroker.protocol.bodies import Message, MessageExt
from txbroker.protocol.names import (
    PROPERTY_DELAY, PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_RECONSUME_TIME, PROPERTY_RESENT_FROM_DLQ,
    PROPERTY_RETRY_TOPIC, dlq_topic,
)

# what the broker added on the way to the dead-letter topic; a re-sent message starts afresh
_RETRY_PROPS = (PROPERTY_RETRY_TOPIC, PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_RECONSUME_TIME, PROPERTY_DELAY)


def resend_message(dead_letter: MessageExt, group: str) -> Message:
    """The message that re-sends `dead_letter` (read from `group`'s dead-letter topic) to its
    original topic. ValueError, naming what is wrong, for a message that is not one of the group's
    dead letters or does not say where it came from."""
    m = dead_letter
    if m.topic != dlq_topic(group):
        raise ValueError(f"message {m.msg_id} is in {m.topic}, not in {dlq_topic(group)}")
    topic = m.properties.get(PROPERTY_RETRY_TOPIC)
    if not topic:
        raise ValueError(f"message {m.msg_id} does not say its original topic ({PROPERTY_RETRY_TOPIC})")
    props = {k: v for k, v in m.properties.items() if k not in _RETRY_PROPS}
    props[PROPERTY_RESENT_FROM_DLQ] = m.msg_id
    return Message(topic, m.body, m.tags, m.keys, props)
