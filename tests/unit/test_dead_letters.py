"""Re-sending a dead letter (txbroker dlq resend, the console): the copy goes to the topic the dead
letter came from, without the retry bookkeeping, marked with the dead letter's id; anything else
is refused, naming what is wrong."""

import pytest

from txbroker.client.dead_letters import resend_message
from txbroker.protocol.bodies import MessageExt
from txbroker.protocol.names import (
    PROPERTY_DELAY, PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_RECONSUME_TIME, PROPERTY_RESENT_FROM_DLQ,
    PROPERTY_RETRY_TOPIC, dlq_topic,
)


def dead_letter(topic=dlq_topic("cg"), **props) -> MessageExt:
    return MessageExt("00000000000000070000", topic, 0, 3, b"order 42", "paid", "order-42", props)


def test_a_dead_letter_goes_back_to_its_topic_afresh():
    m = resend_message(dead_letter(**{PROPERTY_RETRY_TOPIC: "Orders", PROPERTY_ORIGIN_MESSAGE_ID: "x",
                                      PROPERTY_RECONSUME_TIME: "16", PROPERTY_DELAY: "3", "app": "kept"}), "cg")
    assert (m.topic, m.body, m.tags, m.keys) == ("Orders", b"order 42", "paid", "order-42")
    assert m.properties == {"app": "kept", PROPERTY_RESENT_FROM_DLQ: "00000000000000070000"}


def test_only_the_groups_dead_letters_that_name_their_topic_are_resent():
    with pytest.raises(ValueError, match="is in Orders, not in %DLQ%cg"):
        resend_message(dead_letter("Orders", **{PROPERTY_RETRY_TOPIC: "Orders"}), "cg")
    with pytest.raises(ValueError, match="does not say its original topic"):
        resend_message(dead_letter(), "cg")
