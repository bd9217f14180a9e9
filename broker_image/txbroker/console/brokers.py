"""What the console shows, gathered from the brokers: through each broker's admin API (AdminClient,
run in a thread: it blocks) and, for message data (by key, consumer lag, dead letters and their
re-send), through the client library's data plane on the master. Every call carries the credentials
it is given, so the brokers decide what the caller may see and do."""

from __future__ import annotations

import asyncio
import urllib.parse
from dataclasses import dataclass, field

from txbroker.client.admin import AdminClient, AdminError
from txbroker.client.consumer import AsyncPullConsumer
from txbroker.client.errors import BrokerError, ClientError
from txbroker.client.dead_letters import resend_message
from txbroker.client.producer import AsyncProducer
from txbroker.protocol import admin as answers
from txbroker.protocol.bodies import MessageExt
from txbroker.protocol.names import DLQ_PREFIX, GROUP_TOPIC_PREFIXES, RETRY_PREFIX, SYSTEM_TOPICS, dlq_topic

RESEND_PRODUCER_GROUP = "txbroker-console"


class NoMaster(ClientError):
    """No broker of the list answered as a live master."""


@dataclass
class BrokerStatus:
    url: str
    info: answers.BrokerInfo | None = None
    error: str = ""

    @property
    def is_master(self) -> bool:
        return self.info is not None and self.info.role == "master" and not self.info.fenced_by


@dataclass
class GroupLag:
    topic: str
    committed: dict[int, int]
    ends: dict[int, int]

    @property
    def lag(self) -> int:
        return sum(max(0, self.ends.get(q, 0) - o) for q, o in self.committed.items())


@dataclass
class ConsumerGroup:
    name: str
    clients: list[str] = field(default_factory=list)
    lags: list[GroupLag] = field(default_factory=list)
    dead_letters_topic: bool = False
    errors: list[str] = field(default_factory=list)


def is_system_topic(name: str) -> bool:
    return name in SYSTEM_TOPICS or name.startswith(GROUP_TOPIC_PREFIXES)


class Cluster:
    """The brokers the console was given: admin URLs, and optionally their data-plane addresses
    (otherwise each master's `listen` from its configuration, with the admin URL's host when it
    listens on every address)."""

    def __init__(self, admin_urls: list[str], *, tls=None, data_addresses: list[str] | None = None,
                 timeout: float = 10.0):
        if not admin_urls:
            raise ValueError("at least one broker admin URL is needed")
        self.tls = tls
        self.admin_urls = [AdminClient(u, tls=tls).url for u in admin_urls]
        self.data_addresses = data_addresses or []
        self.timeout = timeout

    def admin(self, url: str, credentials) -> AdminClient:
        return AdminClient(url, self.timeout, credentials=credentials, tls=self.tls)

    async def call(self, url: str, credentials, method: str, *args):
        """A typed AdminClient method, run in a thread."""
        return await asyncio.to_thread(lambda: getattr(self.admin(url, credentials), method)(*args))

    # ---- brokers and roles ------------------------------------------------------------------------

    async def statuses(self, credentials) -> list[BrokerStatus]:
        async def one(url):
            try:
                return BrokerStatus(url, await self.call(url, credentials, "broker_info"))
            except AdminError as e:
                if e.status in (401, 403):
                    raise
                return BrokerStatus(url, error=str(e))
            except ClientError as e:
                return BrokerStatus(url, error=str(e))
        return list(await asyncio.gather(*(one(u) for u in self.admin_urls)))

    async def master(self, credentials, group: str | None = None) -> BrokerStatus:
        """The live master (the highest epoch answering as an unfenced master); with `group`, the live
        master of that broker group (a console given the brokers of several groups: jobs spanning them)."""
        if group:
            return self.group_master(await self.masters_by_group(credentials), group)
        masters = [s for s in await self.statuses(credentials) if s.is_master]
        if not masters:
            raise NoMaster("no broker of " + ", ".join(self.admin_urls) + " answers as a live master")
        return max(masters, key=lambda s: s.info.epoch)

    def group_master(self, masters: dict[str, BrokerStatus], group: str) -> BrokerStatus:
        """Of masters_by_group's answer, group `group`'s master (NoMaster naming the groups there are)."""
        if group not in masters:
            raise NoMaster(f"no broker of {', '.join(self.admin_urls)} answers as the live master of broker group "
                           f"{group!r} (the console's brokers serve: "
                           f"{', '.join(sorted(g or '(no group)' for g in masters)) or 'none'}); open the console "
                           f"of group {group}'s brokers")
        return masters[group]

    async def masters_by_group(self, credentials) -> dict[str, BrokerStatus]:
        """The live master of each broker group among the console's brokers ("" outside a cluster of
        groups), asked each master's group (GET /api/v1/cluster)."""
        masters = [s for s in await self.statuses(credentials) if s.is_master]
        groups = await asyncio.gather(*(self.call(s.url, credentials, "cluster_info") for s in masters))
        out: dict[str, BrokerStatus] = {}
        for s, c in zip(masters, groups):
            if c.group not in out or s.info.epoch > out[c.group].info.epoch:
                out[c.group] = s
        return out

    async def data_address(self, master: BrokerStatus, credentials) -> str:
        if self.data_addresses:
            return ",".join(self.data_addresses)
        config = await asyncio.to_thread(lambda: self.admin(master.url, credentials).get("/api/v1/config"))
        host, _, port = str(config.get("listen", "")).rpartition(":")
        host = host.strip("[]")
        if host in ("", "0.0.0.0", "::"):
            host = urllib.parse.urlsplit(master.url).hostname or "127.0.0.1"
        return f"{host}:{port}"

    async def _consumer(self, credentials) -> AsyncPullConsumer:
        master = await self.master(credentials)
        return AsyncPullConsumer(await self.data_address(master, credentials), credentials=credentials,
                                 tls=self.tls, request_timeout=self.timeout)

    # ---- messages ---------------------------------------------------------------------------------

    async def find_by_key(self, credentials, topic: str, key: str, limit: int = 32) -> list[MessageExt]:
        async with await self._consumer(credentials) as c:
            return await c.find_by_key(topic, key, limit)

    async def dead_letters(self, credentials, group: str, limit: int = 200) -> list[MessageExt]:
        async with await self._consumer(credentials) as c:
            try:
                return (await c.read_all(dlq_topic(group)))[:limit]
            except BrokerError as e:
                if e.code_name == "TOPIC_NOT_EXIST":
                    return []
                raise

    async def dead_letter(self, credentials, group: str, msg_id: str) -> MessageExt:
        async with await self._consumer(credentials) as c:
            m = await c.view(msg_id)
        if m.topic != dlq_topic(group):
            raise ValueError(f"message {msg_id} is in {m.topic}, not in {dlq_topic(group)}")
        return m

    async def resend(self, credentials, group: str, msg_id: str) -> tuple[str, str]:
        """Re-send a dead letter to its original topic (as `txbroker dlq resend`): (topic, new id)."""
        resend = resend_message(await self.dead_letter(credentials, group, msg_id), group)
        master = await self.master(credentials)
        async with AsyncProducer(RESEND_PRODUCER_GROUP, await self.data_address(master, credentials),
                                 credentials=credentials, tls=self.tls) as p:
            r = await p.send(resend)
        return resend.topic, r.msg_id

    # ---- consumer groups --------------------------------------------------------------------------

    async def consumer_groups(self, credentials) -> list[ConsumerGroup]:
        """Groups with live clients or retry/dead-letter topics, each with its lag on every topic it
        has committed offsets of (asked topic by topic: fine for a console's scale)."""
        master = await self.master(credentials)
        topics = (await self.call(master.url, credentials, "topics")).topics
        groups: dict[str, ConsumerGroup] = {g: ConsumerGroup(g, sorted(c))
                                           for g, c in master.info.consumer_groups.items()}
        for t in topics:
            for prefix in (RETRY_PREFIX, DLQ_PREFIX):
                if t.name.startswith(prefix):
                    g = groups.setdefault(t.name[len(prefix):], ConsumerGroup(t.name[len(prefix):]))
                    g.dead_letters_topic = g.dead_letters_topic or prefix == DLQ_PREFIX
        plain = [t.name for t in topics if not is_system_topic(t.name)]
        async with await self._consumer(credentials) as c:
            for g in groups.values():
                for topic in plain + [RETRY_PREFIX + g.name]:
                    if topic.startswith(RETRY_PREFIX) and topic not in {t.name for t in topics}:
                        continue
                    try:
                        committed, ends = await c.committed_offsets(g.name, topic)
                    except BrokerError as e:
                        if e.code_name == "NO_PERMISSION":
                            g.errors.append(f"{topic}: {e.remark}")
                        continue
                    if committed:
                        g.lags.append(GroupLag(topic, committed, ends))
        return sorted(groups.values(), key=lambda g: g.name)
