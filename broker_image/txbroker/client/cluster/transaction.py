"""Transactional producers of a cluster of broker groups.

One AsyncTransactionProducer per group registers the producer group there and answers that group's
check-backs with the one listener. A transaction whose messages land on one group (every send
without a selector, see placement.py) is that group's ordinary transaction. One whose messages land
on several spans them, under one transaction id:

  1. the half message on the first group (the home) is stored, as for any transaction;
  2. then one half message on each other group, naming the home (participants); if one cannot be
     stored, the home's is rolled back and the local transaction never runs;
  3. the local transaction runs once;
  4. its decision goes to the home (END_TRANSACTION): that is the commit point. UNKNOWN sends
     nothing, and the home checks back this producer group as for any transaction;
  5. then to each participant, which ends only as its home says (broker/transaction/participants.py).
     A participant the decision does not reach asks the home itself, so a producer that dies after
     step 4 leaves nothing torn.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass

from txbroker.client import background
from txbroker.client.cluster.producer import ClusterSender
from txbroker.client.errors import BrokerError, ClientError
from txbroker.client.log_limit import RepeatedWarnings
from txbroker.client.producer import as_list
from txbroker.client.transaction import AsyncTransactionProducer, TransactionListener
from txbroker.client.transaction_session import (
    EndsInFlight, LocalTransactionState, Prepared, TransactionSendResult, local_decision, local_decision_async,
)
from txbroker.protocol.bodies import Message
from txbroker.protocol.codes import ResponseCode

log = logging.getLogger(__name__)
_warnings = RepeatedWarnings(log)
_EXECUTE = "execute_local_transaction"


@dataclass
class Spanning:
    """A transaction's half messages on several groups, stored; the local transaction not yet run."""

    home: str
    home_half: Prepared
    participants: dict[str, Prepared]


class AsyncClusterTransactionProducer(ClusterSender):
    def __init__(self, group: str, bootstrap, listener: TransactionListener, *, request_timeout: float = 10.0,
                 route_refresh: float = 10.0, check_workers: int = 4, credentials=None, tls=None,
                 wait_end: bool = True):
        """`wait_end=False`, as AsyncTransactionProducer's: a send returns once the home's END is on
        its way; the participants are told once the home acknowledged it, and `result.ended` is done
        after both. flush() and close() wait for every transaction still ending."""
        if not group:
            raise ValueError("a transactional producer needs a producer group")
        self.group = group
        self.listener = listener
        self.wait_end = wait_end
        self._ending = EndsInFlight()
        self._kwargs = dict(request_timeout=request_timeout, check_workers=check_workers, credentials=credentials,
                            tls=tls)
        super().__init__(bootstrap, route_refresh=route_refresh, request_timeout=request_timeout,
                         credentials=credentials, tls=tls)

    def _make(self, g) -> AsyncTransactionProducer:
        return AsyncTransactionProducer(self.group, g.addresses, _Shared(self), **self._kwargs)

    # ---- the phases, shared by the asyncio and the blocking forms -----------------------------------

    async def place(self, msgs: list[Message], selector, arg) -> dict[str, list[Message]]:
        return await self.placement.place(msgs, self.groups.active, self._count, selector, arg)

    async def begin(self, parts: dict[str, list[Message]], txid: str) -> Spanning | TransactionSendResult:
        """Steps 1-2. A TransactionSendResult: not stored (rolled back); run no local transaction."""
        (home, home_msgs), *others = parts.items()
        home_session = self.groups.members[home].session
        try:
            begun = await home_session.begin(home_msgs, txid, [group for group, _msgs in others])
        except ClientError:
            self.placement.avoid(home)
            raise
        if isinstance(begun, TransactionSendResult):
            begun.groups = [home]
            return begun
        stored: dict[str, Prepared] = {}
        try:
            for group, msgs in others:
                stored[group] = await self.groups.members[group].session.prepare(msgs, txid, home=home)
        except ClientError as e:
            _warnings.warning("participant not stored", "transaction %s: its half message on group %s was not "
                              "stored (%s): rolling back, the local transaction does not run", txid, group, e)
            result = TransactionSendResult(e.code_name if isinstance(e, BrokerError) else "UNKNOWN_ERROR", txid, [],
                                           LocalTransactionState.ROLLBACK)
            try:
                await home_session.end(begun, LocalTransactionState.ROLLBACK)
            except ClientError as end_error:  # check-back asks the listener, whose transaction never ran
                result.end_error = str(end_error)
            await self._tell(stored, LocalTransactionState.ROLLBACK)
            result.groups = [home, *stored]
            return result
        return Spanning(home, begun, stored)

    async def finish(self, begun: Spanning, state: LocalTransactionState, wait_end: bool = True) -> TransactionSendResult:
        """Steps 4-5; without waiting for the END, step 5 follows its acknowledgement in `result.ended`."""
        result = await self.groups.members[begun.home].session.finish(begun.home_half, state, wait_end)
        result.groups = [begun.home, *begun.participants]
        for p in begun.participants.values():
            result.msg_ids += p.msg_ids
        if result.ended is None:
            if state is not LocalTransactionState.UNKNOWN and not result.end_error:
                await self._tell(begun.participants, state)
            return result
        if begun.participants:   # told only once the home has the decision: the home's END is the commit point
            result.ended = asyncio.ensure_future(self._tell_once_ended(result.ended, result, begun.participants, state))
        return self._ending.track(result)

    async def _tell_once_ended(self, home_ended: asyncio.Future, result: TransactionSendResult,
                               participants: dict[str, Prepared], state: LocalTransactionState) -> None:
        await home_ended
        if not result.end_error:
            await self._tell(participants, state)

    async def flush(self) -> None:
        """Wait until every transaction sent without waiting for its END has ended (or its END could
        not be delivered: its result's end_error; check-back decides)."""
        await self._ending.wait()

    async def close(self) -> None:
        await self.flush()
        await super().close()

    async def _tell(self, participants: dict[str, Prepared], state: LocalTransactionState) -> None:
        """The home's decision to the participants: a shortcut; each asks the home itself anyway."""
        async def one(group, prepared):
            try:
                await self.groups.members[group].session.end(prepared, state)
            except ClientError as e:
                _warnings.warning("participant not told", "transaction %s: group %s not told %s (%s); it asks its "
                                  "home group itself", prepared.transaction_id, group, state.name, e)

        await asyncio.gather(*(one(g, p) for g, p in participants.items()))

    async def place_and_begin(self, msgs: list[Message], selector, arg, txid: str) -> Spanning | TransactionSendResult:
        """Steps 1-2 where the messages go now; once more on the route read anew if the home refused
        them as a draining group (nothing stored then)."""
        try:
            return await self.begin(await self.place(msgs, selector, arg), txid)
        except BrokerError as e:
            if e.code != ResponseCode.SERVICE_NOT_AVAILABLE:
                raise
        await self.routes.update()
        return await self.begin(await self.place(msgs, selector, arg), txid)

    async def send_message_in_transaction(self, msg_or_msgs, arg=None, transaction_id: str | None = None,
                                          selector=None, wait_end: bool | None = None) -> TransactionSendResult:
        """As AsyncTransactionProducer's; with `selector`, messages may land on several groups."""
        msgs = as_list(msg_or_msgs)
        txid = transaction_id or uuid.uuid4().hex
        begun = await self.place_and_begin(msgs, selector, arg, txid)
        if isinstance(begun, TransactionSendResult):
            return begun
        state = await local_decision_async(_EXECUTE, txid, self.listener.execute_local_transaction, msg_or_msgs, arg)
        return await self.finish(begun, state, self.wait_end if wait_end is None else wait_end)


class _Shared(TransactionListener):
    """Each group's producer answers check-backs with the cluster producer's listener, as it is now."""

    def __init__(self, owner: AsyncClusterTransactionProducer):
        self._owner = owner

    def execute_local_transaction(self, msg, arg):
        return self._owner.listener.execute_local_transaction(msg, arg)

    def check_local_transaction(self, msg):
        return self._owner.listener.check_local_transaction(msg)


class ClusterTransactionProducer(background.Blocking):
    """Blocking form of AsyncClusterTransactionProducer: the local transaction runs in the caller's thread."""

    def __init__(self, group: str, bootstrap, listener: TransactionListener, **kwargs):
        self._async = AsyncClusterTransactionProducer(group, bootstrap, listener, **kwargs)

    @property
    def route(self):
        return self._async.routes.route

    def send_message_in_transaction(self, msg_or_msgs, arg=None, transaction_id: str | None = None,
                                    selector=None, wait_end: bool | None = None) -> TransactionSendResult:
        a = self._async
        msgs = as_list(msg_or_msgs)
        txid = transaction_id or uuid.uuid4().hex
        begun = background.run(a.place_and_begin(msgs, selector, arg, txid))
        if isinstance(begun, TransactionSendResult):
            return begun
        state = local_decision(_EXECUTE, txid, a.listener.execute_local_transaction, msg_or_msgs, arg)
        return background.run(a.finish(begun, state, a.wait_end if wait_end is None else wait_end))

    def flush(self) -> None:
        """Wait until every transaction sent without waiting for its END has ended."""
        background.run(self._async.flush())

    def refresh_route(self) -> bool:
        return background.run(self._async.routes.update())


__all__ = ["AsyncClusterTransactionProducer", "ClusterTransactionProducer"]
