"""Reading committed messages by queue and offset (consumer groups build on this)."""

from __future__ import annotations

from dataclasses import dataclass

from txbroker.client import background
from txbroker.client.connection import BrokerClient
from txbroker.protocol.bodies import (
    CommitOffsetsRequest, MessageExt, PullRequest, PullResponse, QueryByKeyRequest, QueryByKeyResponse,
    QueryOffsetsRequest, QueryOffsetsResponse, QueueOffset, RouteRequest, RouteResponse, SearchOffsetRequest,
    SearchOffsetResponse, ViewMessageRequest,
)
from txbroker.protocol.codes import RequestCode


@dataclass
class PullResult:
    messages: list[MessageExt]
    next_offset: int
    max_offset: int


class AsyncPullConsumer:
    def __init__(self, brokers, *, request_timeout: float = 10.0, require_master: bool = True, credentials=None,
                 tls=None):
        # Reads go to the master unless told otherwise (slaves serve reads only with slave_read_enable).
        self.client = BrokerClient(brokers, request_timeout=request_timeout, require_master=require_master,
                                   credentials=credentials, tls=tls)

    async def queue_count(self, topic: str) -> int:
        r: RouteResponse = await self.client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, RouteRequest(topic), RouteResponse)
        return r.queue_count

    async def pull(self, topic: str, queue_id: int, offset: int, max_messages: int = 32, wait_ms: int = 0,
                   tags: str = "") -> PullResult:
        """Messages of one queue from `offset`; with `wait_ms`, waits that long for one to arrive.
        `tags` filters on the broker ("TagA || TagB"); filtered-out messages still move next_offset."""
        timeout = self.client.request_timeout + wait_ms / 1000
        r: PullResponse = await self.client.request(
            RequestCode.PULL_MESSAGE, PullRequest(topic, queue_id, offset, max_messages, wait_ms, "", tags),
            PullResponse, timeout=timeout)
        return PullResult(r.messages, r.next_offset, r.max_offset)

    async def committed_offsets(self, group: str, topic: str) -> tuple[dict[int, int], dict[int, int]]:
        """A group's committed offsets per queue, and each queue's end."""
        r: QueryOffsetsResponse = await self.client.request(
            RequestCode.QUERY_CONSUMER_OFFSET, QueryOffsetsRequest(group, topic), QueryOffsetsResponse)
        return r.offsets, r.max_offsets

    async def commit_offsets(self, group: str, offsets: dict[tuple[str, int], int], *,
                             only_forward: bool = False) -> None:
        """`only_forward`: a queue's offset is not moved back if the group's is already further (as
        push consumers commit, so two members of a rebalance never undo each other's progress)."""
        await self.client.request(RequestCode.UPDATE_CONSUMER_OFFSET, CommitOffsetsRequest(
            group, [QueueOffset(t, q, o) for (t, q), o in offsets.items()], only_forward=only_forward))

    async def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        r: SearchOffsetResponse = await self.client.request(
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, SearchOffsetRequest(topic, queue_id, timestamp_ms),
            SearchOffsetResponse)
        return r.offset

    async def find_by_key(self, topic: str, key: str, max_messages: int = 32) -> list[MessageExt]:
        r: QueryByKeyResponse = await self.client.request(
            RequestCode.QUERY_MESSAGE, QueryByKeyRequest(topic, key, max_messages), QueryByKeyResponse)
        return r.messages

    async def view(self, msg_id: str) -> MessageExt:
        return await self.client.request(RequestCode.VIEW_MESSAGE_BY_ID, ViewMessageRequest(msg_id), MessageExt)

    async def read_all(self, topic: str, max_messages: int = 1024) -> list[MessageExt]:
        """Every committed message of a topic still stored, queue by queue (for checks and small
        topics): each queue from its first stored message (retention may have deleted older ones)."""
        out: list[MessageExt] = []
        for q in range(await self.queue_count(topic)):
            offset = await self.search_offset(topic, q, 0)
            while True:
                r = await self.pull(topic, q, offset, max_messages)
                out.extend(r.messages)
                if not r.messages or r.next_offset >= r.max_offset:
                    break
                offset = r.next_offset
        return out

    async def close(self) -> None:
        await self.client.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


class PullConsumer:
    """Blocking form of AsyncPullConsumer."""

    def __init__(self, brokers, **kwargs):
        self._async = AsyncPullConsumer(brokers, **kwargs)

    def queue_count(self, topic: str) -> int:
        return background.run(self._async.queue_count(topic))

    def pull(self, topic: str, queue_id: int, offset: int, max_messages: int = 32, wait_ms: int = 0,
             tags: str = "") -> PullResult:
        return background.run(self._async.pull(topic, queue_id, offset, max_messages, wait_ms, tags))

    def committed_offsets(self, group: str, topic: str) -> tuple[dict[int, int], dict[int, int]]:
        return background.run(self._async.committed_offsets(group, topic))

    def commit_offsets(self, group: str, offsets: dict[tuple[str, int], int], *, only_forward: bool = False) -> None:
        background.run(self._async.commit_offsets(group, offsets, only_forward=only_forward))

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return background.run(self._async.search_offset(topic, queue_id, timestamp_ms))

    def find_by_key(self, topic: str, key: str, max_messages: int = 32) -> list[MessageExt]:
        return background.run(self._async.find_by_key(topic, key, max_messages))

    def view(self, msg_id: str) -> MessageExt:
        return background.run(self._async.view(msg_id))

    def read_all(self, topic: str) -> list[MessageExt]:
        return background.run(self._async.read_all(topic))

    def shutdown(self) -> None:
        background.run(self._async.close())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
