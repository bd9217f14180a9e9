"""Reading committed messages by queue and offset (consumer groups build on this)."""

from __future__ import annotations

from dataclasses import dataclass

from txbroker.client import background
from txbroker.client.connection import BrokerClient
from txbroker.protocol.bodies import MessageExt, PullRequest, PullResponse, RouteRequest, RouteResponse
from txbroker.protocol.codes import RequestCode


@dataclass
class PullResult:
    messages: list[MessageExt]
    next_offset: int
    max_offset: int


class AsyncPullConsumer:
    def __init__(self, brokers, *, request_timeout: float = 10.0, require_master: bool = True):
        # Reads go to the master unless told otherwise (slaves serve reads only with slave_read_enable).
        self.client = BrokerClient(brokers, request_timeout=request_timeout, require_master=require_master)

    async def queue_count(self, topic: str) -> int:
        r: RouteResponse = await self.client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, RouteRequest(topic), RouteResponse)
        return r.queue_count

    async def pull(self, topic: str, queue_id: int, offset: int, max_messages: int = 32, wait_ms: int = 0) -> PullResult:
        """Messages of one queue from `offset`; with `wait_ms`, waits that long for one to arrive."""
        timeout = self.client.request_timeout + wait_ms / 1000
        r: PullResponse = await self.client.request(
            RequestCode.PULL_MESSAGE, PullRequest(topic, queue_id, offset, max_messages, wait_ms), PullResponse,
            timeout=timeout)
        return PullResult(r.messages, r.next_offset, r.max_offset)

    async def read_all(self, topic: str, max_messages: int = 1024) -> list[MessageExt]:
        """Every committed message of a topic, queue by queue (for checks and small topics)."""
        out: list[MessageExt] = []
        for q in range(await self.queue_count(topic)):
            offset = 0
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

    def pull(self, topic: str, queue_id: int, offset: int, max_messages: int = 32, wait_ms: int = 0) -> PullResult:
        return background.run(self._async.pull(topic, queue_id, offset, max_messages, wait_ms))

    def read_all(self, topic: str) -> list[MessageExt]:
        return background.run(self._async.read_all(topic))

    def shutdown(self) -> None:
        background.run(self._async.close())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
