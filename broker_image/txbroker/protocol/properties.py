"""The message properties the broker parses, and their rules: one parser each, used where a message
is admitted (bad input is refused there, naming the property, before anything is written) and
where the store derives state from a stored record (which must never fail on a record in the log:
one that an older broker admitted reads as unset)."""

from __future__ import annotations

import math

from txbroker.protocol.names import PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS

MAX_IMMUNITY_S = 30 * 24 * 3600  # a month: beyond any check interval anyone sets


class PropertyError(ValueError):
    """A message property the broker reads holds what it cannot use."""


def immunity_ms(properties: dict[str, str]) -> int:
    """CHECK_IMMUNITY_TIME_IN_SECONDS in milliseconds (0: not set). Seconds as RocketMQ's producers
    write them (an integer), or a decimal; raises PropertyError naming the property otherwise."""
    text = properties.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
    if text is None:
        return 0
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= MAX_IMMUNITY_S:  # NaN fails this too
        raise PropertyError(f"property {PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS}={text[:40]!r}: seconds from 0 to "
                            f"{MAX_IMMUNITY_S} (a number such as 30)")
    return int(seconds * 1000)


def stored_immunity_ms(properties: dict[str, str]) -> int:
    """As immunity_ms, for a record already in the log: unreadable means unset."""
    try:
        return immunity_ms(properties)
    except PropertyError:
        return 0


def check_admissible(properties: dict[str, str]) -> None:
    """Every property a half message's first message may carry that the broker parses (raises
    PropertyError)."""
    immunity_ms(properties)


def share_properties(msgs, shared: dict[str, str]) -> None:
    """Give each message the properties its send or record carries once for all, under its own.
    The messages without properties of their own (a Spark task's) hold the one dict, and a reader
    of the record (its cache too) is given that same dict: nothing may change a message's
    properties in place; whoever adds one builds a new dict (store/reads.py `by_id`)."""
    for m in msgs:
        own = m.properties
        m.properties = {**shared, **own} if own else shared
