"""The operator's leader election (operator/txbroker_operator/leadership.py): client-go's Lease rules on
an injected clock and an in-memory Lease with the API server's conditional writes."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest
from txbroker_operator import leadership as le
from txbroker_operator.leadership import Conflict, Elector, Observation, Record, Timing


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def wall(self) -> dt.datetime:
        return dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=self.t)


class FakeLeases:
    """One Lease, as the API server keeps it: a resourceVersion per write, 409 on a stale one."""

    def __init__(self):
        self.lease: dict | None = None
        self.versions = itertools.count(1)
        self.down = False          # the API server unreachable (for everyone)
        self.writes: list[tuple[str, dict]] = []

    def _store(self, spec: dict) -> dict:
        self.lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                      "metadata": {"name": "op", "namespace": "ns", "resourceVersion": str(next(self.versions))},
                      "spec": dict(spec)}
        self.writes.append((spec.get("holderIdentity", ""), spec))
        return self.lease

    def client(self, *, cut_off: callable = lambda: False):
        leases = self

        class Api:
            def check(self):
                if leases.down or cut_off():
                    raise OSError("connection refused")

            def get(self):
                self.check()
                return None if leases.lease is None else dict(leases.lease)

            def create(self, spec):
                self.check()
                if leases.lease is not None:
                    raise Conflict("exists")
                return leases._store(spec)

            def replace(self, spec, resource_version):
                self.check()
                if leases.lease is None or leases.lease["metadata"]["resourceVersion"] != resource_version:
                    raise Conflict("stale")
                return leases._store(spec)
        return Api()

    @property
    def holder(self) -> str:
        return (self.lease or {}).get("spec", {}).get("holderIdentity", "")


def elector(leases: FakeLeases, clock: Clock, identity: str, timing: Timing = Timing(), **kw) -> Elector:
    e = Elector(leases.client(**kw), identity, timing, clock=clock, wall=clock.wall, rand=lambda: 0.0)
    e.lost_calls = []
    e.on_lost = lambda: e.lost_calls.append(clock())
    return e


def test_timing_refuses_a_renew_deadline_that_is_not_shorter_than_the_lease():
    Timing(15, 10, 2).check()
    with pytest.raises(ValueError, match="shorter than the lease"):
        Timing(10, 10, 2).check()
    with pytest.raises(ValueError, match="retry"):
        Timing(15, 2, 2).check()      # 2 <= 1.2 * 2
    with pytest.raises(ValueError, match="whole number"):
        Timing(7.5, 5, 1).check()


def test_expiry_counts_from_when_this_replica_first_saw_the_record_unchanged():
    held = Record(holder="a", lease_duration=15, renew_time="t1", resource_version="1")
    obs = le.observe(None, held, 100.0)
    assert not le.may_acquire(obs, "b", 114.9)
    # the same record read again later: the clock keeps running from the first sight
    obs = le.observe(obs, Record(holder="a", lease_duration=15, renew_time="t1", resource_version="1"), 110.0)
    assert obs.since == 100.0 and le.may_acquire(obs, "b", 115.0)
    # a renewal (a new renewTime) starts the count again
    obs = le.observe(obs, Record(holder="a", lease_duration=15, renew_time="t2", resource_version="2"), 116.0)
    assert obs.since == 116.0 and not le.may_acquire(obs, "b", 130.0)
    # no Lease, a released one, or our own: at once
    assert le.may_acquire(Observation(None, 0.0), "b", 0.0)
    assert le.may_acquire(Observation(Record(holder="", lease_duration=1), 50.0), "b", 50.0)
    assert le.may_acquire(Observation(held, 100.0), "a", 100.0)


def test_claim_counts_a_transition_only_when_the_holder_changes():
    clock = Clock()
    first = le.claim(None, "a", clock.wall(), Timing())
    assert (first["holderIdentity"], first["leaseTransitions"], first["leaseDurationSeconds"]) == ("a", 0, 15)
    assert first["renewTime"].endswith("Z") and len(first["renewTime"].split(".")[1]) == 7   # MicroTime
    rec = Record.from_lease({"spec": first, "metadata": {"resourceVersion": "1"}})
    clock.t += 2
    renewed = le.claim(rec, "a", clock.wall(), Timing())
    assert renewed["leaseTransitions"] == 0 and renewed["acquireTime"] == first["acquireTime"]
    assert renewed["renewTime"] > first["renewTime"]
    taken = le.claim(rec, "b", clock.wall(), Timing())
    assert taken["leaseTransitions"] == 1 and taken["acquireTime"] == taken["renewTime"]
    after_release = le.claim(Record(holder="", transitions=1), "b", clock.wall(), Timing())
    assert after_release["leaseTransitions"] == 1       # released: nobody held it to transition from


def test_one_leader_the_other_waits_until_the_lease_expires():
    leases, clock = FakeLeases(), Clock()
    a, b = elector(leases, clock, "a"), elector(leases, clock, "b")
    assert a.try_acquire_or_renew() and a.leader and leases.holder == "a"
    dead_at = None
    # a renews every 2 s for a minute: b never gets it
    for _ in range(30):
        clock.t += 1
        assert not b.try_acquire_or_renew()
        clock.t += 1
        assert a.try_acquire_or_renew()
    # a dies (no renewal, no release); b takes over a full lease duration after it last saw a renewal
    dead_at = clock.t
    taken_at = None
    while taken_at is None:
        clock.t += 0.5
        if b.try_acquire_or_renew():
            taken_at = clock.t
    assert leases.holder == "b" and b.leader
    assert leases.lease["spec"]["leaseTransitions"] == 1
    assert 15 <= taken_at - dead_at <= 15 + 2   # b's first sight of a's last renewal, then the lease


def test_a_leader_cut_off_from_the_api_steps_down_before_anyone_can_take_over():
    leases, clock = FakeLeases(), Clock()
    cut = {"a": False}
    a = elector(leases, clock, "a", cut_off=lambda: cut["a"])
    b = elector(leases, clock, "b")
    assert a.try_acquire_or_renew()
    clock.t += 1
    assert not b.try_acquire_or_renew()
    clock.t += 1
    assert a.try_acquire_or_renew()       # last renewal that gets through
    cut["a"] = True
    steps, b_took, a_stopped = 0, None, None
    while b_took is None:
        clock.t += 0.25
        steps += 1
        if steps % 8 == 0:                # every 2 s: a tries to renew, b tries to acquire
            a.try_acquire_or_renew()
            if b.try_acquire_or_renew():
                b_took = clock.t
        if a.check_fence() and a_stopped is None:    # the fence thread's check
            a_stopped = clock.t
    assert a_stopped is not None and a.lost_calls == [a_stopped] and not a.leader
    assert a_stopped < b_took                        # never two leaders
    assert b_took - a_stopped >= Timing().lease_duration - Timing().renew_deadline - 2


def test_a_leader_that_sees_another_holder_stops_at_once():
    leases, clock = FakeLeases(), Clock()
    a = elector(leases, clock, "a")
    assert a.try_acquire_or_renew()
    leases._store({"holderIdentity": "intruder", "leaseDurationSeconds": 15, "leaseTransitions": 1})
    clock.t += 2
    assert not a.try_acquire_or_renew()
    assert a.lost_calls == [clock.t] and not a.leader


def test_a_restarted_process_in_the_same_pod_is_another_candidate():
    leases, clock = FakeLeases(), Clock()
    old = elector(leases, clock, "op-0_aaaa")
    assert old.try_acquire_or_renew()
    restarted = elector(leases, clock, "op-0_bbbb")    # same pod, new process: new suffix
    assert not restarted.try_acquire_or_renew()
    clock.t += 14
    assert not restarted.try_acquire_or_renew()
    clock.t += 1
    assert restarted.try_acquire_or_renew() and leases.lease["spec"]["leaseTransitions"] == 1


def test_release_lets_a_standby_take_over_at_its_next_try():
    leases, clock = FakeLeases(), Clock()
    a, b = elector(leases, clock, "a"), elector(leases, clock, "b")
    assert a.try_acquire_or_renew()
    clock.t += 1
    assert not b.try_acquire_or_renew()
    assert a.release() and not a.leader and leases.holder == ""
    clock.t += 2
    assert b.try_acquire_or_renew() and leases.holder == "b"
    assert not a.release()                  # not ours any more: nothing written
    assert [h for h, _ in leases.writes] == ["a", "", "b"]


def test_release_does_not_overwrite_a_lease_someone_else_took():
    leases, clock = FakeLeases(), Clock()
    a = elector(leases, clock, "a")
    assert a.try_acquire_or_renew()
    leases._store({"holderIdentity": "b", "leaseDurationSeconds": 15, "leaseTransitions": 1})
    assert not a.release() and leases.holder == "b"


def test_release_wins_over_a_renewal_that_landed_while_it_ran():
    # a graceful stop while the renew thread's write is in flight: the API server has that renewal,
    # the elector has not seen its answer yet, so the release's write is stale. It must still release.
    leases, clock = FakeLeases(), Clock()
    a = elector(leases, clock, "a")
    assert a.try_acquire_or_renew()
    leases._store(dict(leases.lease["spec"]))          # a's own renewal, its answer not yet read
    assert a.release() and leases.holder == ""


def test_a_renewal_in_flight_does_not_take_back_a_released_lease():
    # the renew thread read the Lease just after the release: no holder; it must not claim it again
    leases, clock = FakeLeases(), Clock()
    a = elector(leases, clock, "a")
    assert a.try_acquire_or_renew()
    assert a.release() and leases.holder == ""
    assert not a.try_acquire_or_renew() and leases.holder == "" and not a.leader


def test_two_candidates_racing_for_a_free_lease_get_one_leader():
    leases, clock = FakeLeases(), Clock()
    a, b = elector(leases, clock, "a"), elector(leases, clock, "b")
    # both read "no Lease"; a creates it first, b's create conflicts
    real_get = b.api.get
    b.api.get = lambda: None
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew() and not b.leader
    b.api.get = real_get
    assert leases.holder == "a"


def test_an_unreachable_api_server_is_a_failed_attempt_not_a_crash():
    leases, clock = FakeLeases(), Clock()
    leases.down = True
    a = elector(leases, clock, "a")
    assert not a.try_acquire_or_renew() and not a.leader and a.last_attempt == clock.t
    waits = []
    leases_up_after = 3

    def wait(seconds):
        waits.append(seconds)
        clock.t += seconds
        if len(waits) == leases_up_after:
            leases.down = False
        return False
    assert a.acquire(wait) and a.leader
    assert waits == [2.0] * leases_up_after           # the retry period (no jitter with rand = 0)


def test_settings_from_the_environment():
    assert le.settings_from_env({}) is None           # standalone (a workstation's run)
    s = le.settings_from_env({"TXBROKER_OPERATOR_LEASE_NAME": "rel-leader", "POD_NAMESPACE": "sys",
                              "POD_NAME": "rel-op-7d9-x2", "TXBROKER_OPERATOR_LEASE_DURATION_SECONDS": "8",
                              "TXBROKER_OPERATOR_RENEW_DEADLINE_SECONDS": "5",
                              "TXBROKER_OPERATOR_RETRY_PERIOD_SECONDS": "1"})
    assert (s.namespace, s.name, s.timing) == ("sys", "rel-leader", Timing(8, 5, 1))
    pod, suffix = s.identity.rsplit("_", 1)
    assert pod == "rel-op-7d9-x2" and len(suffix) == 8
    with pytest.raises(ValueError):
        le.settings_from_env({"TXBROKER_OPERATOR_LEASE_NAME": "x", "POD_NAMESPACE": "sys",
                              "TXBROKER_OPERATOR_RENEW_DEADLINE_SECONDS": "20"})


def test_liveness_address_from_kopf_arguments():
    assert le.liveness_address(["--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz"]) == (
        "0.0.0.0", 8080, "/healthz")
    assert le.liveness_address(["--liveness", "http://:9090/live"]) == ("0.0.0.0", 9090, "/live")
    assert le.liveness_address(["--namespace=x"]) is None


def test_the_standby_answers_its_liveness_probe_while_the_election_runs():
    import threading
    import urllib.error
    import urllib.request
    leases, clock = FakeLeases(), Clock()
    e = elector(leases, clock, "b")
    server = le._StandbyHealth(("127.0.0.1", 0), "/healthz", e)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"

    def status(path="/healthz"):
        try:
            with urllib.request.urlopen(url + path, timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as err:
            return err.code
    try:
        assert status() == 503                       # not attempted yet
        e.try_acquire_or_renew()
        assert status() == 200
        clock.t += 60                                # the election loop stalled
        assert status() == 503
        assert status("/other") == 404
    finally:
        server.shutdown()
        server.server_close()


def test_the_leader_gauge_follows_leadership():
    from prometheus_client import REGISTRY
    leases, clock = FakeLeases(), Clock()
    a = elector(leases, clock, "a")
    assert a.try_acquire_or_renew()
    le.set_leader_gauge(1)           # lead() sets it once the Lease is held
    assert REGISTRY.get_sample_value("txbroker_operator_leader") == 1
    assert a.release()
    assert REGISTRY.get_sample_value("txbroker_operator_leader") == 0


def test_metrics_served_before_kopf_are_not_served_twice(monkeypatch):
    """__main__ serves the metrics before the election (a standby shows txbroker_operator_leader 0);
    the Kopf startup handler's serve() then finds them served instead of failing to bind."""
    import socket
    import urllib.request
    from prometheus_client import CollectorRegistry
    from txbroker_operator import metrics
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv(metrics.PORT_ENV, str(port))
    registry = CollectorRegistry()
    assert metrics.serve(registry) == port
    assert metrics.serve(registry) == port         # the startup handler's call: no second bind
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.status == 200
