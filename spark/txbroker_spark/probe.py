"""The driver's checks at planning, before any task runs: a broker answers, accepts these
credentials and TLS, and, for a streaming writer, lets them act for its producer group.

A batch writer needs no separate group check: its planning opens the job (OPEN_JOB), a real request
of the group, and the broker's refusal of it names the access key the same way.
"""

from __future__ import annotations

from txbroker.client import background
from txbroker.client.connection import BrokerClient
from txbroker.client.errors import BrokerError, ClientError, TlsHandshakeError
from txbroker.client.transaction_session import TransactionSession
from txbroker.protocol.bodies import RouteRequest, RouteResponse
from txbroker.protocol.codes import RequestCode, ResponseCode

from txbroker_spark.options import OptionError
from txbroker_spark.security import BrokerSecurity


async def _probe(brokers, topic: str, timeout: float, security: BrokerSecurity, group: str | None) -> int | None:
    client = BrokerClient(brokers, request_timeout=timeout, connect_timeout=min(timeout, 3.0),
                          **security.client_kwargs())
    try:
        if group is not None:
            try:
                await TransactionSession(client, group).check_group_right()
            except BrokerError as e:
                if security.refusal(e) is not None:  # no right to the group (or no credentials at all)
                    raise
        try:
            r: RouteResponse = await client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, RouteRequest(topic),
                                                    RouteResponse, retry=False)
        except BrokerError as e:
            if e.code == ResponseCode.TOPIC_NOT_EXIST:
                return None
            raise
        return r.queue_count
    finally:
        await client.close()


def probe_brokers(brokers: list[str], topic: str, timeout: float = 5.0, security: BrokerSecurity | None = None,
                  group: str | None = None) -> int | None:
    """Fail fast, naming option 'brokers' when no broker answers, or the credentials or TLS option
    the broker refused (also when they may not act for `group`, a streaming writer's producer
    group); returns the topic's queue count (None if it does not exist yet)."""
    security = security or BrokerSecurity()
    try:
        return background.run(_probe(brokers, topic, timeout, security, group), timeout + 5)
    except (BrokerError, TlsHandshakeError) as e:
        named = security.refusal(e)
        if named is not None:
            raise named from None
        if not isinstance(e, BrokerError):
            raise
        raise OptionError("brokers", f"the broker at {e.broker} answered {e.code_name}: {e.remark}") from None
    except (ClientError, OSError, TimeoutError) as e:
        raise OptionError("brokers", f"no broker reachable at {','.join(brokers)}: {e}") from None
