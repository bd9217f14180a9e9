"""Leader election through a coordination.k8s.io/v1 Lease, with client-go's rules: one operator
replica acts, the others wait, and a replica that lost the Lease stops before another can take it.

How the operator uses it (`__main__`): a replica blocks in `lead()` until it holds the Lease, serving
its liveness endpoint meanwhile, and only then starts Kopf (watches, handlers, the periodic pass). A
replica that is not the leader therefore changes nothing, because it runs nothing. While it leads, a
thread renews the Lease every `retry_period`; if no renewal has succeeded for `renew_deadline`, or
the Lease shows another holder, the process exits at once (`os._exit`: no handler thread outlives
it) and the kubelet restarts it as a standby. Since renew_deadline < lease_duration, and another
replica takes the Lease only after seeing the same record unchanged for lease_duration on its own
clock, the old leader is gone before the new one acts (fencing by exit). On a graceful exit (SIGTERM,
a rolling update) the Lease is released after every handler thread has finished (atexit runs after
the interpreter joined them), so a standby takes over within `retry_period` instead of waiting for
the Lease to expire.

The rules are pure functions on an injected clock (`observe`, `may_acquire`, `must_step_down`,
`claim`, `released`), and `Elector` runs them on any object with the `LeaseApi` methods;
tests/unit/test_leadership.py checks them without a cluster.

Settings (the chart sets them; without TXBROKER_OPERATOR_LEASE_NAME the operator runs standalone, as
`python -m txbroker_operator` on a workstation does):
TXBROKER_OPERATOR_LEASE_NAME, POD_NAMESPACE (else the ServiceAccount's namespace), POD_NAME (the
identity's prefix), TXBROKER_OPERATOR_LEASE_DURATION_SECONDS (15), ..._RENEW_DEADLINE_SECONDS (10),
..._RETRY_PERIOD_SECONDS (2).
"""

from __future__ import annotations

import atexit
import datetime as dt
import http.server
import logging
import os
import random
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Protocol
from urllib.parse import quote, urlsplit

log = logging.getLogger("txbroker_operator.leadership")

JITTER = 1.2          # client-go's JitterFactor: a candidate waits retry_period * (1 + rand * JITTER)


@dataclass(frozen=True)
class Timing:
    """client-go's defaults: lease 15 s, renew deadline 10 s, retry 2 s."""
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def check(self) -> "Timing":
        # client-go: leaseDuration > renewDeadline > JitterFactor * retryPeriod
        if not self.lease_duration > self.renew_deadline:
            raise ValueError(f"the renew deadline ({self.renew_deadline}s) must be shorter than the lease "
                             f"({self.lease_duration}s): a leader that cannot renew must stop before another may take over")
        if not self.renew_deadline > JITTER * self.retry_period > 0:
            raise ValueError(f"the renew deadline ({self.renew_deadline}s) must exceed {JITTER} x the retry "
                             f"period ({self.retry_period}s), which must be positive")
        if self.lease_duration != int(self.lease_duration) or self.lease_duration < 1:
            raise ValueError("the lease duration is a whole number of seconds (Lease.spec.leaseDurationSeconds)")
        return self

    @property
    def request_timeout(self) -> float:
        """One API request's timeout: a few of them fit in the renew deadline."""
        return max(0.5, self.renew_deadline / 3)


@dataclass(frozen=True)
class Record:
    """A Lease's spec as read, and the resourceVersion that makes an update conditional."""
    holder: str = ""
    lease_duration: float = 0.0
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0
    resource_version: str = ""

    @classmethod
    def from_lease(cls, lease: dict) -> "Record":
        spec = lease.get("spec") or {}
        return cls(holder=spec.get("holderIdentity") or "", lease_duration=float(spec.get("leaseDurationSeconds") or 0),
                   acquire_time=spec.get("acquireTime"), renew_time=spec.get("renewTime"),
                   transitions=int(spec.get("leaseTransitions") or 0),
                   resource_version=(lease.get("metadata") or {}).get("resourceVersion", ""))

    def same_as(self, other: "Record") -> bool:
        """The record has not moved (client-go compares the raw record): nobody renewed it."""
        return (self.holder, self.lease_duration, self.acquire_time, self.renew_time, self.transitions) == (
            other.holder, other.lease_duration, other.acquire_time, other.renew_time, other.transitions)


@dataclass(frozen=True)
class Observation:
    """The Lease record last seen, and when (local monotonic clock) it was first seen as it is."""
    record: Record | None
    since: float


def observe(prev: Observation | None, record: Record | None, now: float) -> Observation:
    """Expiry is judged by how long *this* replica has seen the record unchanged, never by the
    renewTime written with another machine's clock."""
    if prev is not None and prev.record is not None and record is not None and prev.record.same_as(record):
        return prev
    return Observation(record, now)


def may_acquire(obs: Observation, identity: str, now: float) -> bool:
    """No Lease yet, released (no holder), ours, or unchanged for its whole duration."""
    r = obs.record
    if r is None or not r.holder or r.holder == identity:
        return True
    return now - obs.since >= r.lease_duration


def must_step_down(last_renewed: float, now: float, timing: Timing) -> bool:
    """The leader stops acting when no renewal started after `last_renewed` (the start of the last
    one that succeeded) has succeeded within the renew deadline."""
    return now - last_renewed >= timing.renew_deadline


def micro_time(t: dt.datetime) -> str:
    """A Lease's MicroTime: RFC 3339, microseconds, UTC."""
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def claim(record: Record | None, identity: str, wall: dt.datetime, timing: Timing) -> dict:
    """The spec to write to take or renew the Lease: a new holder counts a transition and sets
    acquireTime; a renewal keeps them."""
    ts = micro_time(wall)
    if record is not None and record.holder == identity:
        return {"holderIdentity": identity, "leaseDurationSeconds": int(timing.lease_duration),
                "acquireTime": record.acquire_time or ts, "renewTime": ts, "leaseTransitions": record.transitions}
    transitions = 0 if record is None else record.transitions + (1 if record.holder else 0)
    return {"holderIdentity": identity, "leaseDurationSeconds": int(timing.lease_duration),
            "acquireTime": ts, "renewTime": ts, "leaseTransitions": transitions}


def released(record: Record, wall: dt.datetime) -> dict:
    """client-go's release: no holder, a one-second lease (a standby may take it at its next try)."""
    ts = micro_time(wall)
    return {"leaseDurationSeconds": 1, "acquireTime": ts, "renewTime": ts, "leaseTransitions": record.transitions}


class Conflict(Exception):
    """The Lease changed (or appeared) since it was read: someone else wrote it first."""


class LeaseApi(Protocol):
    def get(self) -> dict | None: ...
    def create(self, spec: dict) -> dict: ...
    def replace(self, spec: dict, resource_version: str) -> dict: ...


class KubeLeaseApi:
    """The Lease through the operator's REST client (kube.rest()): GET, POST, and PUT conditioned on
    the resourceVersion read (a stale write is a 409, never an overwrite)."""

    def __init__(self, namespace: str, name: str, timeout: float):
        self.namespace, self.name, self.timeout = namespace, name, timeout
        self.base = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases"

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        from . import kube
        try:
            return kube.rest().request(method, path, body, timeout=self.timeout)
        except kube.ApiError as e:
            if e.status == 409:
                raise Conflict(str(e)) from None
            if e.status == 404 and method == "GET":
                return None
            raise

    def get(self) -> dict | None:
        return self._request("GET", f"{self.base}/{quote(self.name)}")

    def create(self, spec: dict) -> dict:
        return self._request("POST", self.base, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                                 "metadata": {"name": self.name, "namespace": self.namespace},
                                                 "spec": spec})

    def replace(self, spec: dict, resource_version: str) -> dict:
        return self._request("PUT", f"{self.base}/{quote(self.name)}", {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace, "resourceVersion": resource_version},
            "spec": spec})


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class Elector:
    """client-go's LeaderElector on a LeaseApi, with injected clocks. `try_acquire_or_renew` is one
    step; `acquire` loops until leader; `keep` renews in a thread and calls `on_lost` (once) when the
    renew deadline passes or another holder shows up."""

    def __init__(self, api: LeaseApi, identity: str, timing: Timing = Timing(), *,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], dt.datetime] = _utcnow,
                 rand: Callable[[], float] = random.random):
        self.api, self.identity, self.timing = api, identity, timing.check()
        self.clock, self.wall, self.rand = clock, wall, rand
        self.observation: Observation | None = None
        self.leader = False
        self.last_renewed: float | None = None    # local time the last successful renewal started
        self.last_attempt: float | None = None    # local time of the last attempt (liveness)
        self.lease: dict | None = None            # the Lease as last written by us
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._lost_once = threading.Lock()

    def try_acquire_or_renew(self) -> bool:
        started = self.clock()
        self.last_attempt = started
        try:
            lease = self.api.get()
        except Exception as e:   # noqa: BLE001 - an unreachable API server is a failed attempt, not a crash
            log.warning("leader election: reading the Lease failed: %s", e)
            return False
        record = Record.from_lease(lease) if lease is not None else None
        # seen as of the read's end: a candidate counts the Lease's duration from no earlier than that
        self.observation = observe(self.observation, record, self.clock())
        if self.leader and record is not None and record.holder != self.identity:
            self._lose(f"the Lease is held by {record.holder or 'nobody'} now")
            return False
        if not may_acquire(self.observation, self.identity, started):
            return False
        if self._stop.is_set():   # released or stopping: a renewal in flight must not claim it back
            return False
        spec = claim(record, self.identity, self.wall(), self.timing)
        try:
            written = self.api.create(spec) if record is None else self.api.replace(spec, record.resource_version)
        except Conflict:
            return False
        except Exception as e:   # noqa: BLE001
            log.warning("leader election: writing the Lease failed: %s", e)
            return False
        self.lease = written
        self.observation = Observation(Record.from_lease(written), started)
        self.last_renewed = started
        if not self.leader:
            self.leader = True
            held = record.holder if record is not None else ""
            log.warning("leader election: %s acquired the Lease (previous holder: %s, transitions: %d); acting",
                        self.identity, held or "none", spec["leaseTransitions"])
        return True

    def acquire(self, wait: Callable[[float], bool] | None = None) -> bool:
        """Block until leader (True), or until stopped (False). `wait(seconds)` returns True to stop."""
        wait = wait or self._stop.wait
        logged = None
        while True:
            if self.try_acquire_or_renew():
                return True
            holder = self.observation.record.holder if self.observation and self.observation.record else None
            if holder != logged:
                log.info("leader election: standby; %s holds the Lease", holder)
                logged = holder
            if wait(self.timing.retry_period * (1 + self.rand() * JITTER)):
                return False

    def check_fence(self) -> bool:
        """True (and on_lost called) when the renew deadline has passed without a renewal."""
        if self.leader and self.last_renewed is not None and must_step_down(self.last_renewed, self.clock(), self.timing):
            self._lose(f"no renewal for {self.timing.renew_deadline:g}s (renew deadline)")
            return True
        return False

    def _lose(self, why: str) -> None:
        with self._lost_once:
            if not self.leader:
                return
            self.leader = False
        log.critical("leader election: %s lost the Lease: %s; stopping", self.identity, why)
        set_leader_gauge(0)
        self.lost.set()
        self.on_lost()

    def on_lost(self) -> None:
        """Overridden or replaced by the runner; the process's default is to exit at once."""
        _exit_now()

    def keep(self) -> None:
        """Renew every retry period on one thread; check the fence on another, so a hung request
        cannot delay the step-down."""
        def renew() -> None:
            while not self._stop.wait(self.timing.retry_period) and self.leader:
                self.try_acquire_or_renew()

        def fence() -> None:
            while not self._stop.wait(min(0.25, self.timing.retry_period / 4)) and self.leader:
                self.check_fence()
        for fn, name in ((renew, "lease-renew"), (fence, "lease-fence")):
            threading.Thread(target=fn, name=name, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def release(self) -> bool:
        """Give the Lease up if it is still ours: a conditional PUT on the Lease as read now, since a
        renewal in flight may have written a newer version than the one we last saw."""
        self.stop()
        if not self.leader or self.lease is None:
            return False
        self.leader = False
        for _ in range(3):
            try:
                lease = self.api.get()
                record = Record.from_lease(lease) if lease is not None else None
                if record is None or record.holder != self.identity:
                    return False
                self.api.replace(released(record, self.wall()), record.resource_version)
                break
            except Conflict:
                continue          # a renewal landed between our read and write: read again
            except Exception as e:   # noqa: BLE001 - it will expire instead
                log.warning("leader election: releasing the Lease failed (it expires instead): %s", e)
                return False
        else:
            log.warning("leader election: releasing the Lease kept conflicting (it expires instead)")
            return False
        set_leader_gauge(0)
        log.warning("leader election: %s released the Lease", self.identity)
        return True


def _exit_now() -> None:
    for h in logging.getLogger().handlers:
        try:
            h.flush()
        except Exception:   # noqa: BLE001
            pass
    os._exit(1)


# ---- the process side: settings, the standby's liveness endpoint, the LeaderElected Event ----

@dataclass(frozen=True)
class Settings:
    namespace: str
    name: str
    identity: str
    timing: Timing


def settings_from_env(env: dict[str, str] | None = None) -> Settings | None:
    env = dict(os.environ if env is None else env)
    name = env.get("TXBROKER_OPERATOR_LEASE_NAME", "").strip()
    if not name:
        return None
    namespace = env.get("POD_NAMESPACE") or env.get("TXBROKER_OPERATOR_NAMESPACE")
    if not namespace:
        from . import kube
        namespace = kube.own_namespace()
    # the pod's name, and a suffix per process: a container restarted in the same pod is another
    # candidate, which must wait for its predecessor's Lease to expire like anyone else
    pod = env.get("POD_NAME") or socket.gethostname()
    timing = Timing(float(env.get("TXBROKER_OPERATOR_LEASE_DURATION_SECONDS", "15")),
                    float(env.get("TXBROKER_OPERATOR_RENEW_DEADLINE_SECONDS", "10")),
                    float(env.get("TXBROKER_OPERATOR_RETRY_PERIOD_SECONDS", "2"))).check()
    return Settings(namespace, name, f"{pod}_{uuid.uuid4().hex[:8]}", timing)


def liveness_address(args: list[str]) -> tuple[str, int, str] | None:
    """(host, port, path) of Kopf's --liveness URL among the operator's arguments."""
    for i, a in enumerate(args):
        url = a.split("=", 1)[1] if a.startswith("--liveness=") else (
            args[i + 1] if a == "--liveness" and i + 1 < len(args) else None)
        if url:
            u = urlsplit(url)
            return u.hostname or "0.0.0.0", u.port or 80, u.path or "/healthz"
    return None


class _StandbyHealth(http.server.ThreadingHTTPServer):
    """The liveness endpoint while waiting: 200 while the election loop is attempting, 503 if it
    stalled. Kopf serves the same URL once this replica leads."""
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], path: str, elector: Elector):
        self.path, self.elector = path, elector

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(inner) -> None:   # noqa: N805
                e, t = self.elector, self.elector.timing
                fresh = e.last_attempt is not None and e.clock() - e.last_attempt < 3 * (
                    t.retry_period * (1 + JITTER) + 2 * t.request_timeout)
                if inner.path.split("?")[0] != self.path:
                    code, body = 404, b"not found\n"
                else:
                    code, body = (200, b"standby\n") if fresh else (503, b"election stalled\n")
                inner.send_response(code)
                inner.send_header("Content-Type", "text/plain")
                inner.send_header("Content-Length", str(len(body)))
                inner.end_headers()
                inner.wfile.write(body)

            def log_message(inner, *a: Any) -> None:   # noqa: N805 - probes every 20 s: not worth a line
                pass
        super().__init__(addr, Handler)


def _post_elected(elector: Elector, settings: Settings) -> None:
    if elector.lease is None:
        return
    try:
        from . import events
        held = elector.lease.get("spec", {})
        events.post(elector.lease, events.NORMAL, "LeaderElected",
                    f"{settings.identity} is the leader (lease {settings.timing.lease_duration:g}s, "
                    f"transitions {held.get('leaseTransitions', 0)})")
    except Exception as e:   # noqa: BLE001 - an Event is worth less than leading
        log.error("could not post LeaderElected: %s", e)


def set_leader_gauge(value: int) -> None:
    """txbroker_operator_leader (metrics.py): 1 while this process acts."""
    try:
        from . import metrics
        metrics.leader.set(value)
    except Exception as e:   # noqa: BLE001 - a metric is worth less than leading
        log.error("could not set the leader gauge: %s", e)


def lead(settings: Settings, args: list[str]) -> Elector:
    """Block until this replica holds the Lease (serving the liveness URL of `args` meanwhile), then
    keep renewing it in the background and return; exit the process at once if it is lost, and
    release it at a normal exit, after every other thread has finished."""
    api = KubeLeaseApi(settings.namespace, settings.name, settings.timing.request_timeout)
    elector = Elector(api, settings.identity, settings.timing)
    log.warning("leader election: %s waits for Lease %s/%s (lease %gs, renew deadline %gs, retry %gs)",
                settings.identity, settings.namespace, settings.name, settings.timing.lease_duration,
                settings.timing.renew_deadline, settings.timing.retry_period)
    set_leader_gauge(0)
    server = None
    addr = liveness_address(args)
    if addr is not None:
        host, port, path = addr
        try:
            server = _StandbyHealth((host, port), path, elector)
            threading.Thread(target=server.serve_forever, name="standby-health", daemon=True).start()
        except OSError as e:
            log.error("standby liveness endpoint on %s:%d: %s", host, port, e)
    elector.acquire()
    if server is not None:      # Kopf binds the same port next
        server.shutdown()
        server.server_close()
    elector.keep()
    atexit.register(elector.release)
    set_leader_gauge(1)
    _post_elected(elector, settings)
    return elector
