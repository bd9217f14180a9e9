"""Coordinated transactions (jobs) of a cluster of broker groups: one job, atomic across every
group it spans. Its decision lives at its home group; the members stored on the other groups end
as the home decided (broker/transaction/job_groups.py).

    from txbroker.client import ClusterJobCoordinator, Message

    with ClusterJobCoordinator("orders-publisher", "txbroker-master:10911") as c:
        job = c.open(timeout=600, name="nightly-2026-11-26")        # at its home, and on every other active group
        t1 = c.send(job, "g0", Message("Orders", b"o1"))            # a member, on the group it goes to
        t2 = c.send(job, "g1", Message("Orders", b"o2"))
        c.commit(job, {"g0": [t1], "g1": [t2]})                     # one decision, at the home

A named job's home is the active group its name hashes to (so a re-run finds it), unless a job of
that name already exists on some group: then that one is answered, as OPEN_JOB by name does on one
group. Against a broker outside any cluster, the one group is the home and nothing spans.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from dataclasses import dataclass, field

from txbroker.client import background
from txbroker.client.cluster.members import PerGroup
from txbroker.client.cluster.route import RouteBook
from txbroker.client.errors import BrokerError, BrokerUnavailable, ClientError
from txbroker.client.job import AsyncJobCoordinator
from txbroker.client.producer import as_list
from txbroker.protocol.bodies import JOB_ABORTED, JOB_COMMITTED, JobInfo
from txbroker.protocol.cluster import ClusterRoute
from txbroker.protocol.codes import ResponseCode

__all__ = ["AsyncClusterJobCoordinator", "ClusterJob", "ClusterJobCoordinator"]


@dataclass
class ClusterJob:
    """A job of the cluster: its id (the same on every group), its home, the other groups it spans."""

    job_id: str
    home: str
    groups: list[str] = field(default_factory=list)
    info: JobInfo | None = None  # the home's answer to the last request

    @property
    def all_groups(self) -> list[str]:
        return [self.home, *self.groups]


class AsyncClusterJobCoordinator:
    def __init__(self, group: str, bootstrap=None, *, request_timeout: float = 30.0, route_refresh: float = 10.0,
                 decision_timeout: float | None = None, credentials=None, tls=None, route: ClusterRoute | None = None):
        """`bootstrap`: any broker of the cluster, whose route is followed; or `route`: a route taken
        earlier, kept as is (the tasks of one Spark write all place by the route its driver saw)."""
        if not group:
            raise ValueError("a job needs a producer group")
        self.group = group
        self._kwargs = dict(request_timeout=request_timeout, decision_timeout=decision_timeout,
                            credentials=credentials, tls=tls)
        self.groups = PerGroup(lambda g: AsyncJobCoordinator(group, g.addresses, **self._kwargs), _nothing,
                               lambda c: c.close())
        self._fixed = route
        self.routes = None
        if route is None:
            self.routes = RouteBook(bootstrap, refresh=route_refresh, request_timeout=request_timeout,
                                    credentials=credentials, tls=tls)
            self.routes.on_change(self.groups.follow)

    @property
    def route(self) -> ClusterRoute:
        return self._fixed if self.routes is None else self.routes.route

    async def start(self) -> "AsyncClusterJobCoordinator":
        if self.routes is None:
            await self.groups.follow(self._fixed)
        else:
            await self.routes.start()
        return self

    def _at(self, group: str) -> AsyncJobCoordinator:
        c = self.groups.members.get(group)
        if c is None:
            raise BrokerUnavailable(f"broker group {group!r} is not in the cluster route as this client knows it "
                                    f"(groups: {', '.join(self.groups.members) or 'none reachable'})")
        return c

    def home_for(self, name: str) -> str:
        """The active group a job name's home is (stable while the active groups are)."""
        active = self.groups.active
        if not active:
            raise ValueError("no broker group takes new work (every group in the route is draining)")
        return active[zlib.crc32(name.encode()) % len(active)] if name else active[0]

    async def find(self, name: str) -> ClusterJob | None:
        """The newest job of `name` on any group (only a job's home knows its name)."""
        for group in list(self.groups.members):
            try:
                info = await self._at(group).describe(name=name)
            except BrokerError as e:
                if e.code == ResponseCode.QUERY_NOT_FOUND:
                    continue
                raise
            return ClusterJob(info.job_id, group, list(info.groups), info)
        return None

    async def open(self, timeout: float, name: str = "", *, prepared_timeout: float = 0) -> ClusterJob:
        """A job spanning every active group (its home first). With `name`, the newest job of that
        name on any group unless aborted: its `info.already` says so and its state what became of it."""
        if name:
            found = await self.find(name)
            if found is not None and found.info.state != JOB_ABORTED:
                return await self._reopen(found, timeout, name, prepared_timeout)
        home = self.home_for(name)
        others = [g for g in self.groups.active if g != home]
        info = await self._at(home).open(timeout, name, prepared_timeout=prepared_timeout, groups=others)
        job = ClusterJob(info.job_id, home, list(info.groups), info)
        await self._open_entries(job)
        return job

    async def _reopen(self, found: ClusterJob, timeout: float, name: str, prepared_timeout: float) -> ClusterJob:
        info = await self._at(found.home).open(timeout, name, prepared_timeout=prepared_timeout, groups=found.groups)
        job = ClusterJob(info.job_id, found.home, list(info.groups), info)
        if info.state not in (JOB_COMMITTED, JOB_ABORTED):
            await self._open_entries(job)  # (a crash may have come between its home and the others)
        return job

    async def _open_entries(self, job: ClusterJob) -> None:
        async def one(group):
            await self._at(group).open(job.info.deadline_ms / 1000 - time.time(), home=job.home, job_id=job.job_id)
        await asyncio.gather(*(one(g) for g in job.groups))

    async def send(self, job: ClusterJob, group: str, msg_or_msgs, transaction_id: str | None = None,
                   properties: dict[str, str] | None = None) -> str:
        """Store messages on `group` as one member transaction of `job`; returns its id.
        `properties`: every message carries them (under its own), sent once for all."""
        if group not in job.all_groups:
            raise ValueError(f"job {job.job_id} spans groups {', '.join(job.all_groups)}, not {group!r}")
        return await self._at(group).send(job.job_id, as_list(msg_or_msgs), transaction_id, properties)

    def _split(self, job: ClusterJob, members: dict[str, list[str]]) -> tuple[list[str], dict[str, list[str]]]:
        unknown = set(members) - set(job.all_groups)
        if unknown:
            raise ValueError(f"job {job.job_id} spans groups {', '.join(job.all_groups)}; members named on "
                             f"{', '.join(sorted(unknown))}")
        return list(members.get(job.home, [])), {g: list(ids) for g, ids in members.items() if g != job.home and ids}

    async def prepare(self, job: ClusterJob, members: dict[str, list[str]]) -> JobInfo:
        """Fix the members on every group; `commit(job)` then keeps exactly these."""
        local, remote = self._split(job, members)
        job.info = await self._at(job.home).prepare(job.job_id, local, remote)
        return job.info

    async def commit(self, job: ClusterJob, members: dict[str, list[str]] | None = None, tell: bool = True) -> JobInfo:
        """The commit point: one DECIDE_JOB at the home keeping exactly `members` (by group; None: the
        prepared ones). Then every other group is told to follow its home now (each also asks by
        itself: a coordinator that dies here leaves nothing torn); `tell=False` leaves that to
        `tell(job)`."""
        if members is None:
            job.info = await self._at(job.home).commit(job.job_id)
        else:
            local, remote = self._split(job, members)
            job.info = await self._at(job.home).commit(job.job_id, local, remote)
        if tell:
            await self.tell(job)
        return job.info

    async def tell(self, job: ClusterJob) -> None:
        """Tell every other group the home's decision (`job.info`, as the home answered it)."""
        if job.info.state == "COMMITTED":
            await self._tell(job, lambda c: c.commit(job.job_id, []))
        elif job.info.state == "ABORTED":
            await self._tell(job, lambda c: c.abort(job.job_id))

    async def abort(self, job: ClusterJob) -> JobInfo:
        job.info = await self._at(job.home).abort(job.job_id)
        await self._tell(job, lambda c: c.abort(job.job_id))
        return job.info

    async def _tell(self, job: ClusterJob, call) -> None:
        async def one(group):
            try:
                await call(self._at(group))
            except ClientError:  # it asks its home by itself anyway
                pass
        await asyncio.gather(*(one(g) for g in job.groups))

    async def describe(self, job: ClusterJob) -> JobInfo:
        """The job at its home: `resolved` once every group has ended its members as decided."""
        job.info = await self._at(job.home).describe(job.job_id)
        return job.info

    async def wait_resolved(self, job: ClusterJob, timeout: float) -> JobInfo:
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            info = await self.describe(job)
            if info.resolved or time.monotonic() >= deadline:
                return info
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)

    async def close(self) -> None:
        await self.groups.close()
        if self.routes is not None:
            await self.routes.close()

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc):
        await self.close()


async def _nothing(_client) -> None:
    """A job coordinator connects on its first request."""


class ClusterJobCoordinator(background.Blocking):
    """Blocking form of AsyncClusterJobCoordinator."""

    def __init__(self, group: str, bootstrap, **kwargs):
        self._async = AsyncClusterJobCoordinator(group, bootstrap, **kwargs)

    @property
    def active(self) -> list[str]:
        return list(self._async.groups.active)

    @property
    def route(self) -> ClusterRoute:
        return self._async.route

    def open(self, timeout: float, name: str = "", **kwargs) -> ClusterJob:
        return background.run(self._async.open(timeout, name, **kwargs))

    def find(self, name: str) -> ClusterJob | None:
        return background.run(self._async.find(name))

    def send(self, job: ClusterJob, group: str, msg_or_msgs, transaction_id: str | None = None,
             properties: dict[str, str] | None = None) -> str:
        return background.run(self._async.send(job, group, msg_or_msgs, transaction_id, properties))

    def prepare(self, job: ClusterJob, members: dict[str, list[str]]) -> JobInfo:
        return background.run(self._async.prepare(job, members))

    def commit(self, job: ClusterJob, members: dict[str, list[str]] | None = None, tell: bool = True) -> JobInfo:
        return background.run(self._async.commit(job, members, tell))

    def tell(self, job: ClusterJob) -> None:
        background.run(self._async.tell(job))

    def abort(self, job: ClusterJob) -> JobInfo:
        return background.run(self._async.abort(job))

    def describe(self, job: ClusterJob) -> JobInfo:
        return background.run(self._async.describe(job))

    def wait_resolved(self, job: ClusterJob, timeout: float = 60.0) -> JobInfo:
        return background.run(self._async.wait_resolved(job, timeout))
