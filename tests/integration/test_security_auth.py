"""Authentication and authorisation against real brokers: every refusal path answers with a clear
code and remark and is counted; a producer of group A can neither commit nor receive check-backs
for group B's transactions; credentials reload without a restart."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import signal
import socket
import threading

import pytest
from scramp import ScramClient

from support.cli import run_cli
from support.credentials import write_credentials
from support.metrics import metric
from support.waiting import wait_until
from txbroker.client import (
    AuthenticationError, BrokerError, Credentials, LocalTransactionState as S, Message, Producer, PullConsumer,
    TransactionListener, TransactionProducer,
)
from txbroker.client.admin import AdminClient, AdminError
from txbroker.client.connection import BrokerClient
from txbroker.protocol.bodies import (
    EndTransactionRequest, EndTransactionResponse, ErrorBody, HeartbeatRequest, SaslRequest, SaslResponse, SendRequest,
    SendResponse, decode, encode,
)
from txbroker.protocol.codes import RequestCode, ResponseCode
from txbroker.protocol.framing import FrameDecoder, encode_frame

USERS = {
    "alice": {"topics": ["Orders=PUB|SUB", "A*=PUB|SUB"], "producer_groups": ["pg-a"], "consumer_groups": ["cg-a"]},
    "bob": {"topics": ["Orders=PUB", "B*=PUB|SUB"], "producer_groups": ["pg-b"]},
    "reader": {"topics": ["Orders=SUB"], "consumer_groups": ["cg-*"]},
    "admin": {"admin": True},
    "repl": {"replication": True},
    "old": {"topics": ["*=PUB|SUB"], "expires": "2020-01-01T00:00:00Z"},
    "off": {"topics": ["*=PUB|SUB"], "disabled": True},
    "retired-admin": {"admin": True, "expires": "2020-01-01T00:00:00Z"},
}


def creds(key: str, secret: str | None = None) -> Credentials:
    return Credentials(key, secret or f"{key}-secret")


@pytest.fixture
def auth_file(tmp_path):
    return write_credentials(tmp_path / "credentials.toml", USERS)


@pytest.fixture
def secured(broker_factory, auth_file):
    return broker_factory("--auth-file", str(auth_file), "--check-interval-ms", "300", "--transaction-timeout-ms", "200")


def admin(broker, key="admin") -> AdminClient:
    return AdminClient(broker.admin_url, credentials=creds(key))


class RawClient:
    def __init__(self, address):
        host, port = address.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.dec = FrameDecoder(64 << 20)

    def call(self, code, body, opaque=1):
        self.sock.sendall(encode_frame(0, code, opaque, encode(body)))
        return self.answer()

    def answer(self):
        while True:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed before an answer")
            frames = self.dec.feed(data)
            if frames:
                return frames[0]

    def closed_by_peer(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, socket.timeout):
            return True


# ---- authentication refusals ----------------------------------------------------------------------

def test_no_credentials_is_refused_clearly_and_the_connection_closed(secured):
    with pytest.raises(AuthenticationError) as e:
        Producer("g", secured.address).start()
    assert e.value.code_name == "UNAUTHORIZED" and "authentication required" in e.value.remark
    raw = RawClient(secured.address)
    f = raw.call(RequestCode.HEARTBEAT, HeartbeatRequest("raw", ["pg-a"]), opaque=9)
    assert (f.code, f.opaque) == (ResponseCode.UNAUTHORIZED, 9)
    assert "SCRAM-SHA-256" in decode(ErrorBody, f.body).remark
    assert raw.closed_by_peer()
    assert metric(secured, "txbroker_auth_failures_total", reason="no_credentials") >= 2


@pytest.mark.parametrize("key,secret,reason,remark", [
    ("alice", "not-alices-secret", "wrong_secret", "unknown access key or wrong secret"),
    ("mallory", "anything", "unknown_key", "unknown access key or wrong secret"),
    ("old", None, "expired", "expired"),
    ("off", None, "revoked", "revoked"),
    # without the secret, revoked and expired keys are not told apart from unknown ones
    ("old", "guess", "expired", "unknown access key or wrong secret"),
    ("off", "guess", "revoked", "unknown access key or wrong secret"),
])
def test_bad_credentials_are_refused_with_the_reason(secured, key, secret, reason, remark):
    with pytest.raises(AuthenticationError) as e:
        Producer("pg-a", secured.address, credentials=creds(key, secret)).start()
    assert e.value.code_name == "UNAUTHORIZED" and remark in e.value.remark
    assert metric(secured, "txbroker_auth_failures_total", reason=reason) == 1


def test_unknown_key_and_wrong_secret_look_the_same_to_a_client(secured):
    # step 1 answers an unknown key as a known one (a salt, the same iteration count): nothing to probe
    firsts = []
    for key in ("alice", "mallory"):
        raw = RawClient(secured.address)
        f = raw.call(RequestCode.SASL_AUTHENTICATE,
                     SaslRequest("SCRAM-SHA-256", ScramClient(["SCRAM-SHA-256"], key, "x").get_client_first()))
        raw.sock.close()
        assert f.code == ResponseCode.SUCCESS
        attrs = dict(a.split("=", 1) for a in decode(SaslResponse, f.body).payload.split(","))
        firsts.append((sorted(attrs), len(attrs["s"]), attrs["i"]))
    assert firsts[0] == firsts[1]
    # and the refusal is the same, key aside
    errors = []
    for key, secret in (("alice", "not-alices-secret"), ("mallory", "alice-secret")):
        with pytest.raises(AuthenticationError) as e:
            Producer("pg-a", secured.address, credentials=creds(key, secret)).start()
        errors.append((type(e.value), str(e.value).replace(repr(key), "KEY")))
    assert errors[0] == errors[1]
    assert "UNAUTHORIZED" in errors[0][1] and "unknown access key or wrong secret" in errors[0][1]
    # the operator still sees which it was
    assert metric(secured, "txbroker_auth_failures_total", reason="unknown_key") == 1
    assert metric(secured, "txbroker_auth_failures_total", reason="wrong_secret") == 1


def test_unauthenticated_connection_is_closed_after_the_auth_timeout(broker_factory, auth_file):
    b = broker_factory("--auth-file", str(auth_file), "--auth-timeout-ms", "300")
    raw = RawClient(b.address)
    f = raw.answer()  # says nothing, gets told why it is closed
    assert (f.code, f.opaque) == (ResponseCode.UNAUTHORIZED, 0)
    assert "auth_timeout_ms" in decode(ErrorBody, f.body).remark
    assert raw.closed_by_peer()
    assert metric(b, "txbroker_connections_closed_by_broker_total", reason="auth_timeout") >= 1


# ---- authorisation refusals -------------------------------------------------------------------------

def test_wrong_topic_is_refused_and_the_connection_goes_on(secured):
    with Producer("pg-a", secured.address, credentials=creds("alice")) as p:
        with pytest.raises(BrokerError) as e:
            p.send(Message("Secret", b"x"))
        assert e.value.code_name == "NO_PERMISSION"
        assert "'alice' may not publish to topic 'Secret'" in e.value.remark
        assert p.send(Message("Orders", b"ok")).msg_ids  # same connection
    with PullConsumer(secured.address, credentials=creds("bob")) as c:
        with pytest.raises(BrokerError) as e:
            c.pull("Orders", 0, 0)  # bob may publish to Orders, not read it
        assert "'bob' may not subscribe to topic 'Orders'" in e.value.remark
    with PullConsumer(secured.address, credentials=creds("reader")) as c:
        assert [m.body for m in c.read_all("Orders")] == [b"ok"]
    assert metric(secured, "txbroker_access_denied_total", right="pub") == 1
    assert metric(secured, "txbroker_access_denied_total", right="sub") == 1


def test_wrong_consumer_group_is_refused(secured):
    with Producer("pg-a", secured.address, credentials=creds("alice")) as p:
        p.send(Message("Orders", b"x", queue_id=0))
    with PullConsumer(secured.address, credentials=creds("reader")) as c:
        assert c.committed_offsets("cg-anything", "Orders")[1][0] == 1  # cg-* matches
        c.commit_offsets("cg-anything", {("Orders", 0): 1})
    with PullConsumer(secured.address, credentials=creds("alice")) as c:
        with pytest.raises(BrokerError) as e:
            c.commit_offsets("cg-other", {("Orders", 0): 1})
        assert e.value.code_name == "NO_PERMISSION" and "may not consume as group 'cg-other'" in e.value.remark


def test_half_message_for_another_producer_group_is_refused(secured):
    async def half(group: str, txid: str) -> SendResponse:  # a raw SEND with a transaction id
        c = BrokerClient(secured.address, credentials=creds("alice"))
        try:
            return await c.request(RequestCode.SEND_MESSAGE, SendRequest(group, [Message("Orders", b"x")], txid),
                                   SendResponse, retry=False)
        finally:
            await c.close()

    with pytest.raises(BrokerError) as e:
        asyncio.run(half("pg-b", "tx-for-b"))
    assert e.value.code_name == "NO_PERMISSION" and "'alice' may not act for producer group 'pg-b'" in e.value.remark
    with pytest.raises(AdminError) as e:  # nothing was stored for pg-b to be checked back or committed
        admin(secured).get("/api/v1/transactions/tx-for-b")
    assert e.value.status == 404
    assert metric(secured, "txbroker_access_denied_total", right="producer_group") == 1
    assert asyncio.run(half("pg-a", "tx-for-a")).transaction_id == "tx-for-a"  # her own group: stored
    assert admin(secured).get("/api/v1/transactions/tx-for-a")["state"] == "PREPARED"


class Recording(TransactionListener):
    def __init__(self, local=S.UNKNOWN):
        self.local = local
        self.answer = S.UNKNOWN
        self.checked: list[str] = []
        self.lock = threading.Lock()

    def execute_local_transaction(self, msg, arg):
        return self.local

    def check_local_transaction(self, msg):
        with self.lock:
            self.checked.append(msg.transaction_id)
        return self.answer


def test_producer_of_group_a_can_neither_commit_nor_get_checkbacks_of_group_b(secured):
    with pytest.raises(BrokerError) as e:  # registering as a producer of pg-b is what brings its check-backs
        TransactionProducer("pg-b", secured.address, Recording(), credentials=creds("alice")).start()
    assert e.value.code_name == "NO_PERMISSION" and "'alice' may not act for producer group 'pg-b'" in e.value.remark

    alice_l, bob_l = Recording(), Recording()
    with TransactionProducer("pg-a", secured.address, alice_l, credentials=creds("alice")) as alice, \
            TransactionProducer("pg-b", secured.address, bob_l, credentials=creds("bob")) as bob:
        r = bob.send_message_in_transaction(Message("Orders", b"bob's"))
        txid = r.transaction_id
        assert r.local_state is S.UNKNOWN  # left to check-back

        with pytest.raises(BrokerError) as e:  # alice claims pg-b: not hers
            async def claim():
                c = BrokerClient(secured.address, credentials=creds("alice"))
                try:
                    await c.request(RequestCode.END_TRANSACTION, EndTransactionRequest("pg-b", txid, S.COMMIT.value),
                                    EndTransactionResponse)
                finally:
                    await c.close()
            asyncio.run(claim())
        assert e.value.code_name == "NO_PERMISSION"
        with pytest.raises(BrokerError) as e:  # alice as pg-a: the transaction is pg-b's
            alice.end(txid, S.COMMIT)
        assert e.value.code_name == "TRANSACTION_STATE_GROUP_WRONG"

        wait_until(lambda: bob_l.checked.count(txid) >= 2, what="check-backs of pg-b's transaction reaching bob")
        assert alice_l.checked == []
        bob_l.answer = S.COMMIT
        wait_until(lambda: AdminClient(secured.admin_url, credentials=creds("admin"))
                   .get(f"/api/v1/transactions/{txid}")["state"] == "COMMITTED", what="bob's check-back commit")
    assert alice_l.checked == []


# ---- reload: add, change, revoke, expire ----------------------------------------------------------

def test_reload_adds_changes_and_revokes_users_without_restart(broker_factory, tmp_path):
    # Kubernetes mounts a Secret as dir/credentials.toml -> ..data/credentials.toml, ..data -> a
    # timestamped directory, and updates it by swapping the ..data symlink.
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir()

    def publish(version: str, users: dict) -> None:
        d = secret_dir / version
        d.mkdir()
        write_credentials(d / "credentials.toml", users)
        tmp_link = secret_dir / "..data_tmp"
        tmp_link.symlink_to(version)
        os.replace(tmp_link, secret_dir / "..data")

    publish("v1", {"alice": USERS["alice"], "admin": USERS["admin"]})
    (secret_dir / "credentials.toml").symlink_to("..data/credentials.toml")
    b = broker_factory("--auth-file", str(secret_dir / "credentials.toml"))

    with pytest.raises(AuthenticationError):
        Producer("pg-c", b.address, credentials=creds("carol")).start()
    carol = {"topics": ["Orders=PUB"], "producer_groups": ["pg-c"]}
    publish("v2", {"alice": USERS["alice"], "admin": USERS["admin"], "carol": carol})

    def carol_gets_in():
        try:
            Producer("pg-c", b.address, credentials=creds("carol")).start().shutdown()
            return True
        except AuthenticationError:
            return False
    wait_until(carol_gets_in, what="the new user to be accepted")

    with Producer("pg-c", b.address, credentials=creds("carol")) as p_carol, \
            Producer("pg-a", b.address, credentials=creds("alice")) as p_alice:
        assert p_carol.send(Message("Orders", b"1")).msg_ids and p_alice.send(Message("Orders", b"2")).msg_ids
        # carol revoked, alice loses Orders: both existing connections feel it on their next request
        publish("v3", {"alice": {**USERS["alice"], "topics": ["A*=PUB|SUB"]}, "admin": USERS["admin"]})
        wait_until(lambda: admin(b).get("/api/v1/broker")["security"]["auth"]["reloads"] >= 2, what="the reload")
        with pytest.raises(AuthenticationError) as e:
            p_carol.send(Message("Orders", b"3"))
        assert "'carol' were revoked or changed" in e.value.remark
        with pytest.raises(BrokerError) as e:
            p_alice.send(Message("Orders", b"4"))
        assert e.value.code_name == "NO_PERMISSION"
        assert p_alice.send(Message("Abc", b"5")).msg_ids  # same connection, new permissions
    assert metric(b, "txbroker_auth_failures_total", reason="revoked") >= 1

    # a broken file is refused and the users in force are kept
    publish("v4", {"alice": USERS["alice"]})
    (secret_dir / "v4" / "credentials.toml").write_text("[[users]]\naccess_key = 'x'\n")  # no secret
    publish_dir = secret_dir / "..data"
    os.utime(publish_dir / "credentials.toml")
    wait_until(lambda: "users[0]" in admin(b).get("/api/v1/broker")["security"]["auth"]["last_error"],
               what="the broken file to be reported")
    with Producer("pg-a", b.address, credentials=creds("alice")) as p:
        assert p.send(Message("Abc", b"still in")).msg_ids


def test_sighup_reloads(broker_factory, tmp_path):
    cfg = tmp_path / "broker.toml"
    cfg.write_text("auth_reload_interval_ms = 3600000\n")  # only SIGHUP can reload
    f = write_credentials(tmp_path / "c.toml", {"admin": USERS["admin"]})
    b = broker_factory("--config", str(cfg), "--auth-file", str(f))
    write_credentials(f, {"admin": USERS["admin"], "dave": {"topics": ["*=PUB"]}})
    b.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: admin(b).get("/api/v1/broker")["security"]["auth"]["users"] == 2, what="SIGHUP reload")
    with Producer("g", b.address, credentials=creds("dave")) as p:
        assert p.send(Message("T", b"x")).msg_ids


def test_credentials_expire_on_an_open_connection(broker_factory, tmp_path):
    later = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)).isoformat()
    f = write_credentials(tmp_path / "c.toml", {"temp": {"topics": ["*=PUB"], "expires": later},
                                                  "admin": USERS["admin"]})
    b = broker_factory("--auth-file", str(f))
    with Producer("g", b.address, credentials=creds("temp")) as p:
        assert p.send(Message("T", b"before")).msg_ids
        soon = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1)).isoformat()
        write_credentials(f, {"temp": {"topics": ["*=PUB"], "expires": soon}, "admin": USERS["admin"]})

        def refused():
            try:
                p.send(Message("T", b"after"))
                return False
            except AuthenticationError as e:
                return "expired" in e.remark
        wait_until(refused, what="the expired credentials to be refused")
    assert metric(b, "txbroker_auth_failures_total", reason="expired") >= 1


# ---- admin plane -----------------------------------------------------------------------------------

def test_admin_api_needs_admin_credentials_except_health_and_metrics(secured):
    import urllib.request
    for path in ("/healthz", "/readyz", "/metrics"):
        with urllib.request.urlopen(secured.admin_url + path, timeout=5) as r:
            assert r.status == 200
    with pytest.raises(AdminError) as e:
        AdminClient(secured.admin_url).get("/api/v1/broker")
    assert e.value.status == 401 and "authentication required" in str(e.value)
    with pytest.raises(AdminError) as e:
        AdminClient(secured.admin_url, credentials=creds("admin", "wrong")).get("/api/v1/broker")
    assert e.value.status == 401 and "wrong secret" in str(e.value)
    with pytest.raises(AdminError) as e:
        AdminClient(secured.admin_url, credentials=creds("alice")).post("/api/v1/topics", {"name": "X"})
    assert e.value.status == 403 and "'alice' is not an administrator" in str(e.value)
    doc = admin(secured).get("/api/v1/broker")
    assert doc["security"]["auth"]["users"] == len(USERS)
    assert admin(secured).post("/api/v1/topics", {"name": "Made", "queues": 2})["created"]
    env = {"TXBROKER_ACCESS_KEY": "admin", "TXBROKER_SECRET_KEY": "admin-secret"}
    out = run_cli_env(env, "topic", "list", "--admin", secured.admin_url)
    assert "Made" in out.stdout


@pytest.mark.parametrize("key,reason,told", [("retired-admin", "expired", "'retired-admin' expired"),
                                              ("off", "revoked", "'off' are revoked")])
def test_admin_api_refuses_expired_and_revoked_credentials(secured, key, reason, told):
    with pytest.raises(AdminError) as e:
        admin(secured, key).get("/api/v1/broker")
    assert e.value.status == 401 and told in str(e.value)
    with pytest.raises(AdminError) as e:  # without the secret: the same answer as an unknown key
        AdminClient(secured.admin_url, credentials=creds(key, "guess")).get("/api/v1/broker")
    assert e.value.status == 401 and "unknown access key or wrong secret" in str(e.value)
    assert metric(secured, "txbroker_auth_failures_total", reason=reason) == 2


def run_cli_env(env: dict, *args):
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return run_cli(*args)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_cli_takes_credentials_from_the_environment(secured):
    r = run_cli("send", "--broker", secured.address, "--topic", "Orders", "--group", "pg-a", "hi", check=False)
    assert r.returncode == 1 and "authentication required" in r.stderr
    r = run_cli_env({"TXBROKER_ACCESS_KEY": "alice", "TXBROKER_SECRET_KEY": "alice-secret"},
                    "send", "--broker", secured.address, "--topic", "Orders", "--group", "pg-a", "hi")
    assert "SEND_OK" in r.stdout


# ---- replication -----------------------------------------------------------------------------------

def test_slave_replicates_only_with_the_replication_permission(broker_factory, auth_file, tmp_path):
    master = broker_factory("--auth-file", str(auth_file), name="master")
    secret = tmp_path / "repl-secret"
    secret.write_text("repl-secret\n")
    slave = broker_factory("--auth-file", str(auth_file), "--role", "slave", "--master", master.address,
                           "--replication-access-key", "repl", "--replication-secret-file", str(secret),
                           "--slave-read-enable", name="slave")
    wait_until(lambda: admin(master).get("/api/v1/broker")["replication"]["slaves"], what="the slave to subscribe")
    with Producer("pg-a", master.address, credentials=creds("alice")) as p:
        p.send(Message("Orders", b"replicated", queue_id=0))
    end = admin(master).get("/api/v1/broker")["log_end_offset"]
    wait_until(lambda: admin(slave).get("/api/v1/broker")["replication"]["replicated_offset"] >= end,
               what="the slave to catch up")
    with PullConsumer(slave.address, credentials=creds("reader"), require_master=False) as c:
        assert [m.body for m in c.read_all("Orders")] == [b"replicated"]

    wrong = tmp_path / "alice-secret"
    wrong.write_text("alice-secret")
    intruder = broker_factory("--auth-file", str(auth_file), "--role", "slave", "--master", master.address,
                              "--replication-access-key", "alice", "--replication-secret-file", str(wrong),
                              name="intruder")
    wait_until(lambda: "may not replicate" in admin(intruder).get("/api/v1/broker")["replication"]["last_error"],
               what="the master to refuse a slave without the replication permission")
    nobody = broker_factory("--auth-file", str(auth_file), "--role", "slave", "--master", master.address,
                            name="nobody")
    wait_until(lambda: "authentication required" in admin(nobody).get("/api/v1/broker")["replication"]["last_error"],
               what="the master to refuse a slave without credentials")
    assert len(admin(master).get("/api/v1/broker")["replication"]["slaves"]) == 1


def test_transaction_states_answer_only_for_the_askers_producer_group(secured):
    """Second review, suspected and reproduced: QUERY_TRANSACTION_STATES (how a participant asks its
    home) answered about any transaction, whoever asked: a producer of group A learned group B's
    outcomes. It answers for the named group's transactions only (UNKNOWN for others)."""
    from txbroker.protocol.bodies import TransactionStatesRequest, TransactionStatesResponse

    with TransactionProducer("pg-b", secured.address, Recording(), credentials=creds("bob")) as bob:
        r = bob.send_message_in_transaction(Message("Orders", b"bob's"))
        bob.end(r.transaction_id, S.COMMIT)

    async def ask(key, group):
        c = BrokerClient(secured.address, credentials=creds(key))
        try:
            return (await c.request(RequestCode.QUERY_TRANSACTION_STATES,
                                    TransactionStatesRequest(group, [r.transaction_id]), TransactionStatesResponse)).states
        finally:
            await c.close()

    assert asyncio.run(ask("alice", "pg-a")) == ["UNKNOWN"]  # alice names her own group: not hers to learn
    with pytest.raises(BrokerError) as e:
        asyncio.run(ask("alice", "pg-b"))
    assert e.value.code_name == "NO_PERMISSION"
    assert asyncio.run(ask("bob", "pg-b")) == ["COMMITTED"]
    assert asyncio.run(ask("repl", "pg-b")) == ["COMMITTED"]  # another group's broker asking for pg-b
