"""Who may do what: permissions, and the Principal a connection acts as once authenticated.

Patterns are shell-style globs (`*`, `?`), matched case-sensitively: topic names cannot contain
`*` or `?`, so a pattern is never mistaken for a name. Topic rules are "PATTERN=PUB", "=SUB",
"=PUB|SUB" or "=DENY"; the first rule that matches decides, and no match means no access (as
RocketMQ's defaultTopicPerm DENY). Being allowed to consume as group G also allows reading G's
retry and dead-letter topics (%RETRY%G, %DLQ%G), as in RocketMQ. `admin` is a superuser: the
admin API and every data-plane right. `monitor` reads the admin API (its GET requests: the web
console's read-only users) and grants nothing else. `replication` lets a slave subscribe to the log.

Every check answers from a per-principal cache after the first time, so authorising a request
costs a dict lookup; a reload builds new principals (and so new caches).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Callable

from txbroker.broker.replies import RequestError
from txbroker.protocol.codes import ResponseCode
from txbroker.protocol.names import GROUP_TOPIC_PREFIXES

PUB = 1
SUB = 2
_PERMS = {"PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB, "DENY": 0}
_VERBS = {PUB: "publish to", SUB: "subscribe to", PUB | SUB: "use"}
_CACHE_MAX = 10_000  # per principal and kind; beyond it answers are computed, not remembered


@dataclass(frozen=True, slots=True)
class TopicRule:
    pattern: str
    perms: int


def parse_topic_rule(text: str) -> TopicRule:
    pattern, sep, perms = text.rpartition("=")
    if not sep or not pattern or perms.strip().upper() not in _PERMS:
        raise ValueError(f"topic rule {text!r} must be PATTERN=PUB, PATTERN=SUB, PATTERN=PUB|SUB or PATTERN=DENY")
    return TopicRule(pattern.strip(), _PERMS[perms.strip().upper()])


@dataclass(frozen=True, slots=True)
class Permissions:
    topics: tuple[TopicRule, ...] = ()
    producer_groups: tuple[str, ...] = ()
    consumer_groups: tuple[str, ...] = ()
    admin: bool = False
    replication: bool = False
    monitor: bool = False  # the admin API's reads (GET), nothing else

    def topic_perms(self, topic: str) -> int:
        for rule in self.topics:
            if fnmatchcase(topic, rule.pattern):
                return rule.perms
        for prefix in GROUP_TOPIC_PREFIXES:
            if topic.startswith(prefix) and self.consumer_group(topic[len(prefix):]):
                return SUB
        return 0

    def producer_group(self, group: str) -> bool:
        return bool(group) and any(fnmatchcase(group, p) for p in self.producer_groups)

    def consumer_group(self, group: str) -> bool:
        return bool(group) and any(fnmatchcase(group, p) for p in self.consumer_groups)


def _denied(message: str) -> RequestError:
    return RequestError(ResponseCode.NO_PERMISSION, message)


class Principal:
    """An authenticated identity: its stored secret, validity, permissions, and cached answers.

    The request handlers call the `require_*` methods (through `connection.access`); each raises
    RequestError(NO_PERMISSION) naming the access key and what was refused.
    """

    __slots__ = ("access_key", "secret", "expires_at", "disabled", "perms", "on_denied",
                 "_topics", "_producer_groups", "_consumer_groups")

    def __init__(self, access_key: str, secret, perms: Permissions, expires_at: float = 0.0,
                 disabled: bool = False):
        self.access_key = access_key
        self.secret = secret  # ScramSecret
        self.perms = perms
        self.expires_at = expires_at  # epoch seconds; 0: never
        self.disabled = disabled
        self.on_denied: Callable[[str], None] | None = None  # metrics hook: called with the right refused
        self._topics: dict[str, int] = {}
        self._producer_groups: dict[str, bool] = {}
        self._consumer_groups: dict[str, bool] = {}

    def same_as(self, other: "Principal") -> bool:
        """Same secret, validity and permissions: a reload may keep this object (and its caches)."""
        return (self.secret == other.secret and self.expires_at == other.expires_at
                and self.disabled == other.disabled and self.perms == other.perms)

    def expired(self, now: float | None = None) -> bool:
        return bool(self.expires_at) and (time.time() if now is None else now) >= self.expires_at

    @property
    def is_admin(self) -> bool:
        return self.perms.admin

    # ---- checks (the hot path: one dict lookup each after the first) ---------------------------

    def may_topic(self, topic: str, wanted: int) -> bool:
        if self.perms.admin:
            return True
        perms = self._topics.get(topic)
        if perms is None:
            perms = self.perms.topic_perms(topic)
            if len(self._topics) < _CACHE_MAX:
                self._topics[topic] = perms
        return perms & wanted == wanted

    def require_topic(self, topic: str, wanted: int) -> None:
        if not self.may_topic(topic, wanted):
            self._deny("pub" if wanted == PUB else "sub",
                       f"access key {self.access_key!r} may not {_VERBS[wanted]} topic {topic!r}")

    def require_publish(self, messages) -> None:
        for m in messages:
            if not self.may_topic(m.topic, PUB):
                self._deny("pub", f"access key {self.access_key!r} may not publish to topic {m.topic!r}")

    def require_route(self, topic: str) -> None:
        """Looking a topic up needs either right on it."""
        if not (self.may_topic(topic, PUB) or self.may_topic(topic, SUB)):
            self._deny("sub", f"access key {self.access_key!r} has no right on topic {topic!r}")

    def require_create_topic(self, topic: str) -> None:
        """Creating a topic by request needs admin, or PUB on it (what sending to it would do anyway)."""
        if not self.may_topic(topic, PUB):
            self._deny("admin", f"access key {self.access_key!r} may not create topic {topic!r} "
                                "(needs admin, or PUB on the topic)")

    def require_producer_group(self, group: str) -> None:
        if self.perms.admin:
            return
        ok = self._producer_groups.get(group)
        if ok is None:
            ok = self.perms.producer_group(group)
            if len(self._producer_groups) < _CACHE_MAX:
                self._producer_groups[group] = ok
        if not ok:
            self._deny("producer_group", f"access key {self.access_key!r} may not act for producer group {group!r}")

    def require_consumer_group(self, group: str) -> None:
        if self.perms.admin:
            return
        ok = self._consumer_groups.get(group)
        if ok is None:
            ok = self.perms.consumer_group(group)
            if len(self._consumer_groups) < _CACHE_MAX:
                self._consumer_groups[group] = ok
        if not ok:
            self._deny("consumer_group", f"access key {self.access_key!r} may not consume as group {group!r}")

    def require_replication(self) -> None:
        if not (self.perms.replication or self.perms.admin):
            self._deny("replication", f"access key {self.access_key!r} may not replicate from this broker "
                                      "(needs the replication permission)")

    def require_admin(self) -> None:
        if not self.perms.admin:
            self._deny("admin", f"access key {self.access_key!r} is not an administrator")

    def require_admin_read(self) -> None:
        """Reading the admin API: admin or monitor."""
        if not (self.perms.admin or self.perms.monitor):
            self._deny("admin", f"access key {self.access_key!r} may not read the admin API "
                                "(needs admin or monitor)")

    def _deny(self, right: str, message: str) -> None:
        if self.on_denied is not None:
            self.on_denied(right)
        raise _denied(message)

    def __repr__(self) -> str:
        return f"Principal({self.access_key!r})"


class OpenAccess:
    """What a connection may do when authentication is off: everything (no checks, no cost)."""

    __slots__ = ()
    access_key = ""
    is_admin = True

    def may_topic(self, topic: str, wanted: int) -> bool:
        return True

    def require_topic(self, topic: str, wanted: int) -> None:
        pass

    def require_publish(self, messages) -> None:
        pass

    def require_route(self, topic: str) -> None:
        pass

    def require_create_topic(self, topic: str) -> None:
        pass

    def require_producer_group(self, group: str) -> None:
        pass

    def require_consumer_group(self, group: str) -> None:
        pass

    def require_replication(self) -> None:
        pass

    def require_admin(self) -> None:
        pass


class NoAccess(OpenAccess):
    """A connection that has not authenticated yet on a broker that requires it. The connection
    refuses its requests before any handler runs; this is the second lock on the door."""

    __slots__ = ()
    is_admin = False

    def _refuse(self, *args) -> None:
        raise RequestError(ResponseCode.UNAUTHORIZED, "authenticate first")

    def may_topic(self, topic: str, wanted: int) -> bool:
        return False

    require_topic = require_publish = require_route = require_create_topic = _refuse
    require_producer_group = require_consumer_group = require_replication = require_admin = _refuse


OPEN_ACCESS = OpenAccess()
NO_ACCESS = NoAccess()
