"""The auth pieces on their own: stored secrets, the credentials file, permissions, the SCRAM
exchange against scramp's client, admission and reload, and the file watcher."""

from __future__ import annotations

import asyncio
import base64
import os

import pytest
from scramp import ScramClient

from txbroker.broker.auth import AuthService, CredentialsError, ScramSecret, hash_secret
from txbroker.broker.auth.acl import PUB, SUB, Permissions, Principal, parse_topic_rule
from txbroker.broker.auth.credentials import parse_credentials
from txbroker.broker.auth.handshake import AuthFailure, invalid_credentials
from txbroker.broker.file_watch import FileWatcher
from txbroker.broker.metrics import BrokerMetrics
from txbroker.broker.replies import RequestError
from txbroker.client.security import Credentials, TlsConfig
from txbroker.protocol.codes import ResponseCode

SECRET = hash_secret("s3cret")


def entry(key="alice", **fields) -> str:
    lines = ["[[users]]", f'access_key = "{key}"', f'scram = "{fields.pop("scram", SECRET.encode())}"']
    for k, v in fields.items():
        lines.append(f"{k} = {v}")
    return "\n".join(lines) + "\n"


# ---- stored secrets ---------------------------------------------------------------------------

def test_secret_round_trip_and_verify():
    s = ScramSecret.parse(SECRET.encode())
    assert s == SECRET and s.iterations == 4096
    assert s.verify("s3cret") and not s.verify("s3cret ") and not s.verify("")
    assert "s3cret" not in SECRET.encode()


@pytest.mark.parametrize("text,needle", [
    ("plain-password", "not a SCRAM-SHA-256 secret"),
    ("SCRAM-SHA-1$4096:c2FsdA==$a:b", "unsupported mechanism"),
    ("SCRAM-SHA-256$10:c2FsdA==$a:b", "iterations"),
    ("SCRAM-SHA-256$4096:!!!$a:b", "base64"),
    ("SCRAM-SHA-256$4096:c2FsdA==$c2hvcnQ=:c2hvcnQ=", "32 bytes"),
])
def test_bad_secrets_say_what_is_wrong(text, needle):
    with pytest.raises(ValueError, match=needle):
        ScramSecret.parse(text)


# ---- the credentials file -----------------------------------------------------------------------

def test_credentials_file_parses_permissions_and_expiry():
    users = parse_credentials((entry(topics='["Orders=PUB", "Bill*=PUB|SUB", "*=DENY"]',
                                     producer_groups='["pg-*"]', expires="2030-01-01T00:00:00Z")
                               + entry("root", admin="true")).encode())
    a = users["alice"]
    assert a.may_topic("Orders", PUB) and not a.may_topic("Orders", SUB)
    assert a.may_topic("Billing", PUB | SUB) and not a.may_topic("Other", PUB)
    assert a.expires_at == 1893456000.0 and not a.expired(now=1893455999.0) and a.expired(now=1893456000.0)
    assert users["root"].is_admin and users["root"].may_topic("Anything", PUB | SUB)


@pytest.mark.parametrize("text,needle", [
    ("", "lists no users"),
    ("[[users]]\naccess_key = 'a'\n", "scram"),
    (entry(colour='"blue"'), "colour"),
    (entry("bad key!"), "access_key must be"),
    (entry() + entry(), "listed twice"),
    (entry(topics='["Orders"]'), "topics\\[0\\]"),
    (entry(expires='"tomorrow"'), "RFC 3339"),
    (entry(expires="2030-01-01T00:00:00"), "time zone"),
    (entry(scram="nope"), "users\\[0\\] \\('alice'\\)"),
    ("users = [", "not valid TOML"),
])
def test_broken_credentials_name_the_entry(text, needle):
    with pytest.raises(CredentialsError, match=needle):
        parse_credentials(text.encode())


# ---- permissions ----------------------------------------------------------------------------------

def principal(**perms) -> Principal:
    return Principal("alice", SECRET, Permissions(**perms))


def test_first_matching_topic_rule_decides_and_no_match_denies():
    p = principal(topics=(parse_topic_rule("Secret*=DENY"), parse_topic_rule("S*=PUB|SUB")))
    assert not p.may_topic("SecretPlans", PUB) and p.may_topic("Sales", SUB) and not p.may_topic("Other", SUB)
    with pytest.raises(RequestError) as e:
        p.require_topic("SecretPlans", PUB)
    assert e.value.code == ResponseCode.NO_PERMISSION and "'alice' may not publish to topic 'SecretPlans'" in e.value.remark


def test_consumer_group_grants_its_retry_and_dead_letter_topics():
    p = principal(consumer_groups=("billing",))
    assert p.may_topic("%RETRY%billing", SUB) and p.may_topic("%DLQ%billing", SUB)
    assert not p.may_topic("%RETRY%other", SUB) and not p.may_topic("%RETRY%billing", PUB)


def test_groups_need_a_name_and_a_matching_pattern():
    p = principal(producer_groups=("*",))
    p.require_producer_group("anything")
    with pytest.raises(RequestError, match="producer group ''"):
        p.require_producer_group("")  # an empty group never matches, even "*"
    with pytest.raises(RequestError, match="consume as group 'g'"):
        p.require_consumer_group("g")
    with pytest.raises(RequestError, match="replicate"):
        p.require_replication()
    with pytest.raises(RequestError, match="not an administrator"):
        p.require_admin()


def test_denials_are_reported_to_the_metrics_hook():
    seen = []
    p = principal()
    p.on_denied = seen.append
    for check in (lambda: p.require_topic("T", SUB), lambda: p.require_producer_group("g"), p.require_admin):
        with pytest.raises(RequestError):
            check()
    assert seen == ["sub", "producer_group", "admin"]


# ---- the SCRAM exchange ---------------------------------------------------------------------------

def exchange(service: AuthService, key: str, secret: str):
    client = ScramClient(["SCRAM-SHA-256"], key, secret)
    hs = service.handshake()
    server_first = hs.first("SCRAM-SHA-256", client.get_client_first())
    client.set_server_first(server_first)
    principal, server_final = hs.final(client.get_client_final())
    client.set_server_final(server_final)  # the client checks the broker knew the stored key
    return principal


@pytest.fixture
def service(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text(entry(topics='["*=PUB"]') + entry("old", expires="2020-01-01T00:00:00Z")
                 + entry("off", disabled="true"))
    return AuthService(str(f), BrokerMetrics())


def test_scram_exchange_authenticates(service):
    assert exchange(service, "alice", "s3cret") is service.lookup("alice")


@pytest.mark.parametrize("key,secret,reason", [
    ("alice", "wrong", "wrong_secret"), ("nobody", "s3cret", "unknown_key"), ("old", "s3cret", "expired"),
    ("off", "s3cret", "revoked"),
])
def test_scram_refusals_have_reasons(service, key, secret, reason):
    with pytest.raises(AuthFailure) as e:
        exchange(service, key, secret)
    assert e.value.reason == reason


def test_unknown_key_and_wrong_secret_answer_alike(service):
    remarks = []
    for key, secret in (("alice", "wrong"), ("alicf", "s3cret")):
        with pytest.raises(AuthFailure) as e:
            exchange(service, key, secret)
        remarks.append(e.value.remark.replace(key, "KEY"))
    assert remarks[0] == remarks[1]


def server_first(service: AuthService, key: str) -> dict[str, str]:
    """The attributes of the broker's answer to step 1 (r nonce, s salt, i iterations)."""
    client = ScramClient(["SCRAM-SHA-256"], key, "whatever")
    text = service.handshake().first("SCRAM-SHA-256", client.get_client_first())
    return dict(attr.split("=", 1) for attr in text.split(","))


def test_unknown_key_gets_a_server_first_shaped_like_a_real_one(service, tmp_path):
    real, unknown = server_first(service, "alice"), server_first(service, "nobody")
    assert unknown.keys() == real.keys() == {"r", "s", "i"}
    assert unknown["i"] == real["i"] == "4096"
    assert len(base64.b64decode(unknown["s"])) == len(base64.b64decode(real["s"]))
    assert len(unknown["r"]) == len(real["r"])
    # a decoy salt is stable, as a real one is: across attempts, and on another broker (or after a
    # restart) reading the same file; yet each unknown key has its own
    assert server_first(service, "nobody")["s"] == unknown["s"]
    assert server_first(AuthService(service.path, BrokerMetrics()), "nobody")["s"] == unknown["s"]
    assert server_first(service, "nobody2")["s"] != unknown["s"] != real["s"]


def test_decoy_follows_the_iterations_most_users_have(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text(entry("a", scram=hash_secret("x", 8192).encode()) + entry("b", scram=hash_secret("y", 8192).encode())
                 + entry("c"))
    assert server_first(AuthService(str(f), BrokerMetrics()), "nobody")["i"] == "8192"


@pytest.mark.parametrize("key,reason,told", [("old", "expired", "expired"), ("off", "revoked", "are revoked")])
def test_barred_keys_are_refused_at_the_final_step_and_told_why_only_with_the_secret(service, key, reason, told):
    server_first(service, key)  # step 1 answers as for any key
    with pytest.raises(AuthFailure) as wrong:
        exchange(service, key, "wrong")
    assert (wrong.value.reason, wrong.value.remark) == (reason, invalid_credentials(key))
    with pytest.raises(AuthFailure) as right:
        exchange(service, key, "s3cret")
    assert right.value.reason == reason and f"access key {key!r} {told}" in right.value.remark


@pytest.mark.parametrize("mechanism,message,reason", [
    ("PLAIN", "n,,n=alice,r=abc", "mechanism"), ("SCRAM-SHA-256", "garbage", "malformed"),
    ("SCRAM-SHA-256", "", "malformed"), ("SCRAM-SHA-256", "n,,n=alice", "malformed"),
])
def test_malformed_first_messages(service, mechanism, message, reason):
    with pytest.raises(AuthFailure) as e:
        service.handshake().first(mechanism, message)
    assert e.value.reason == reason


def test_basic_credentials_for_the_admin_plane(service):
    assert service.verify_basic("alice", "s3cret") is service.lookup("alice")
    assert service.verify_basic("alice", "s3cret") is service.lookup("alice")  # cached
    assert service.verify_basic("alice", "nope").reason == "wrong_secret"
    assert service.verify_basic("zed", "s3cret").reason == "unknown_key"
    assert service.verify_basic("off", "s3cret").reason == "revoked"
    expired = service.verify_basic("old", "s3cret")
    assert expired.reason == "expired" and "'old' expired" in expired.remark
    guessed = service.verify_basic("old", "guess")  # no secret, no telling whether the key exists
    assert (guessed.reason, guessed.remark) == ("expired", invalid_credentials("old"))
    assert service.verify_basic("zed", "s3cret").remark == invalid_credentials("zed")


# ---- admission and reload -------------------------------------------------------------------------

class Conn:
    def __init__(self, principal=None):
        self.principal = principal
        self.access = principal

    def authenticated(self, p):
        self.principal = self.access = p


def test_admission_follows_reloads(service, tmp_path):
    conn = Conn(service.lookup("alice"))
    assert service.admit(conn) is None
    assert service.admit(Conn()).code == ResponseCode.UNAUTHORIZED
    before = service.lookup("alice")
    path = service.path
    with open(path, "a") as f:
        f.write(entry("bob"))
    assert service.reload()
    assert service.lookup("alice") is before  # unchanged entries keep their object (and caches)
    text = open(path).read().replace('topics = ["*=PUB"]', 'topics = ["*=SUB"]')
    open(path, "w").write(text)
    assert service.reload()
    assert service.admit(conn) is None and conn.principal.may_topic("X", SUB)  # new permissions adopted
    open(path, "w").write(entry("bob"))
    assert service.reload()
    refusal = service.admit(conn)
    assert refusal.code == ResponseCode.UNAUTHORIZED and "revoked" in refusal.remark
    assert not service.valid(conn.principal)
    open(path, "w").write("broken = [")
    assert not service.reload() and service.lookup("bob") is not None
    assert "not valid TOML" in service.status().last_error


def test_watcher_sees_a_kubernetes_style_symlink_swap(tmp_path):
    for v in ("v1", "v2"):
        (tmp_path / v).mkdir()
        (tmp_path / v / "credentials.toml").write_text(v)
    (tmp_path / "..data").symlink_to("v1")
    (tmp_path / "credentials.toml").symlink_to("..data/credentials.toml")
    w = FileWatcher([str(tmp_path / "credentials.toml")], lambda: None)
    assert not w.changed()
    (tmp_path / "..data_tmp").symlink_to("v2")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    assert w.changed() and not w.changed()


def test_watcher_calls_back_on_change(tmp_path):
    f = tmp_path / "f"
    f.write_text("1")
    calls = []

    async def run():
        w = FileWatcher([str(f)], lambda: calls.append(1), interval=0.01)
        w.start()
        f.write_text("22")
        for _ in range(500):
            if calls:
                break
            await asyncio.sleep(0.01)
        await w.stop()
    asyncio.run(run())
    assert calls


# ---- client options ---------------------------------------------------------------------------------

def test_client_options_from_the_environment():
    assert Credentials.from_env({}) is None
    c = Credentials.from_env({"TXBROKER_ACCESS_KEY": "a", "TXBROKER_SECRET_KEY": "b"})
    assert c == Credentials("a", "b") and "b" not in repr(c)
    with pytest.raises(ValueError, match="TXBROKER_SECRET_KEY"):
        Credentials.from_env({"TXBROKER_ACCESS_KEY": "a"})
    assert TlsConfig.from_env({}) is None
    assert TlsConfig.from_env({"TXBROKER_TLS_CA": "/ca.pem"}).ca_file == "/ca.pem"
    assert TlsConfig.from_env({"TXBROKER_TLS": "1"}) == TlsConfig()
