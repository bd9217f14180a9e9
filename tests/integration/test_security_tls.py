"""TLS on both planes (certificates from trustme): handshake and transactions over TLS, plaintext
refused with a clear answer, client certificates required, untrusted certificates refused,
replication over TLS with authentication, certificate rotation without restart."""

from __future__ import annotations

import socket
import ssl
import urllib.error
import urllib.request

import pytest
import trustme

from support.credentials import write_credentials
from support.metrics import metric
from support.waiting import wait_until
from txbroker.client import (
    Credentials, LocalTransactionState as S, Message, Producer, PullConsumer, TlsConfig, TlsHandshakeError,
    TlsRequired, TransactionListener, TransactionProducer,
)
from txbroker.client.admin import AdminClient, AdminError
from txbroker.protocol.bodies import ErrorBody, HeartbeatRequest, decode, encode
from txbroker.protocol.codes import RequestCode, ResponseCode
from txbroker.protocol.framing import FrameDecoder, encode_frame


class Certs:
    def __init__(self, d):
        self.dir = d
        self.ca = trustme.CA()
        self.ca_file = self._write("ca.pem", self.ca.cert_pem)
        self.server_file = self._write("server.pem", self.ca.issue_cert("127.0.0.1", "localhost")
                                       .private_key_and_cert_chain_pem)
        self.client_file = self._write("client.pem", self.ca.issue_cert("client.example")
                                       .private_key_and_cert_chain_pem)
        self.rogue_file = self._write("rogue.pem", trustme.CA().issue_cert("client.example")
                                      .private_key_and_cert_chain_pem)

    def _write(self, name, blob) -> str:
        path = self.dir / name
        blob.write_to_path(str(path))
        return str(path)

    def server_args(self, client_certs: bool = False) -> list[str]:
        args = ["--tls-cert", self.server_file, "--tls-key", self.server_file]
        return args + (["--tls-client-ca", self.ca_file] if client_certs else [])

    def tls(self, client: bool = False) -> TlsConfig:
        return TlsConfig(ca_file=self.ca_file, cert_file=self.client_file if client else None,
                         key_file=self.client_file if client else None)

    def admin_context(self, client: bool = False) -> ssl.SSLContext:
        return self.tls(client).context()


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return Certs(tmp_path_factory.mktemp("certs"))


class Commit(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return S.COMMIT

    def check_local_transaction(self, msg):
        return S.COMMIT


def test_transactions_over_tls_and_plaintext_refused_clearly(broker_factory, certs):
    b = broker_factory(*certs.server_args(), admin_tls=certs.admin_context())
    with TransactionProducer("pg", b.address, Commit(), tls=certs.tls()) as p:
        r = p.send_message_in_transaction(Message("Orders", b"over tls", queue_id=0))
        assert r.local_state is S.COMMIT and not r.end_error
    with PullConsumer(b.address, tls=certs.tls()) as c:
        assert [m.body for m in c.read_all("Orders")] == [b"over tls"]

    with pytest.raises(TlsRequired) as e:  # the client library: a clear error, not a reset
        Producer("g", b.address).start()
    assert e.value.code_name == "TLS_REQUIRED" and "accepts TLS connections only" in e.value.remark
    with socket.create_connection(("127.0.0.1", b.port), timeout=10) as raw:  # any plaintext client
        raw.sendall(encode_frame(0, RequestCode.HEARTBEAT, 1, encode(HeartbeatRequest("raw"))))
        frames = []
        dec = FrameDecoder(1 << 20)
        while not frames:
            frames = dec.feed(raw.recv(4096))
        assert frames[0].code == ResponseCode.TLS_REQUIRED
        assert "TLS connections only" in decode(ErrorBody, frames[0].body).remark
    assert metric(b, "txbroker_plaintext_refused_total", plane="data") >= 2

    # the admin plane: HTTPS, and plain HTTP answered with a readable 400
    assert AdminClient(b.admin_url, tls=certs.tls()).get("/api/v1/topics")["topics"]
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{b.admin_port}/healthz", timeout=5)
    assert e.value.code == 400 and b"accepts HTTPS only" in e.value.read()


def test_untrusted_broker_certificate_is_refused(broker_factory, certs, tmp_path):
    b = broker_factory(*certs.server_args(), admin_tls=certs.admin_context())
    other_ca = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other_ca))
    with pytest.raises(TlsHandshakeError) as e:
        Producer("g", b.address, tls=TlsConfig(ca_file=str(other_ca))).start()
    assert "CERTIFICATE_VERIFY_FAILED" in str(e.value)
    with pytest.raises(TlsHandshakeError):  # the same from the admin client
        AdminClient(b.admin_url, tls=TlsConfig(ca_file=str(other_ca))).get("/healthz")


def test_tls_client_to_a_plaintext_broker_gets_a_clear_error(broker):
    with pytest.raises(TlsHandshakeError) as e:
        Producer("g", broker.address, tls=TlsConfig()).start()
    assert "TLS with" in str(e.value)


def test_client_certificate_required(broker_factory, certs):
    b = broker_factory(*certs.server_args(client_certs=True), admin_tls=certs.admin_context())
    with pytest.raises(TlsHandshakeError) as e:
        Producer("g", b.address, tls=certs.tls()).start()
    assert "client certificate" in str(e.value)
    rogue = TlsConfig(ca_file=certs.ca_file, cert_file=certs.rogue_file, key_file=certs.rogue_file)
    with pytest.raises(TlsHandshakeError):
        Producer("g", b.address, tls=rogue).start()
    with Producer("g", b.address, tls=certs.tls(client=True)) as p:
        assert p.send(Message("T", b"with a client certificate")).msg_ids
    wait_until(lambda: metric(b, "txbroker_tls_handshake_failures_total", plane="data") >= 2,
               what="the failed handshakes to be counted")

    # admin plane: probes and scrapers carry no certificate and still get health and metrics ...
    with urllib.request.urlopen(b.admin_url + "/readyz", context=certs.admin_context(), timeout=5) as r:
        assert r.status == 200
    with pytest.raises(AdminError) as e:  # ... the API needs one
        AdminClient(b.admin_url, tls=certs.tls()).get("/api/v1/broker")
    assert e.value.status == 403 and e.value.code == "CLIENT_CERTIFICATE_REQUIRED"
    assert AdminClient(b.admin_url, tls=certs.tls(client=True)).get("/api/v1/broker")["security"]["tls"]


def test_replication_over_tls_with_authentication(broker_factory, certs, tmp_path):
    creds_file = write_credentials(tmp_path / "c.toml", {
        "app": {"topics": ["*=PUB|SUB"], "producer_groups": ["pg"]}, "repl": {"replication": True},
        "admin": {"admin": True}})
    secret = tmp_path / "repl-secret"
    secret.write_text("repl-secret")
    common = certs.server_args(client_certs=True) + ["--auth-file", str(creds_file)]
    admin_ctx = certs.admin_context(client=True)
    master = broker_factory(*common, "--replication-mode", "SYNC", name="master", admin_tls=admin_ctx)
    slave = broker_factory(*common, "--role", "slave", "--master", master.address, "--tls-ca", certs.ca_file,
                           "--replication-access-key", "repl", "--replication-secret-file", str(secret),
                           name="slave", admin_tls=admin_ctx)
    admin = AdminClient(master.admin_url, credentials=Credentials("admin", "admin-secret"), tls=certs.tls(client=True))
    wait_until(lambda: any(s["in_sync"] for s in admin.get("/api/v1/broker")["replication"]["slaves"]),
               what="the slave to be in sync over TLS")
    app = dict(credentials=Credentials("app", "app-secret"), tls=certs.tls(client=True))
    with TransactionProducer("pg", master.address, Commit(), **app) as p:
        r = p.send_message_in_transaction(Message("Orders", b"sync-replicated over TLS"))
        assert r.send_status == "SEND_OK" and not r.end_error  # SYNC: the slave acknowledged it
    slave_admin = AdminClient(slave.admin_url, credentials=Credentials("admin", "admin-secret"),
                              tls=certs.tls(client=True))
    end = admin.get("/api/v1/broker")["log_end_offset"]
    wait_until(lambda: slave_admin.get("/api/v1/broker")["replication"]["replicated_offset"] >= end,
               what="the slave to hold the commit")


def test_certificate_rotation_without_restart(broker_factory, certs, tmp_path):
    server = tmp_path / "server.pem"
    server.write_bytes(open(certs.server_file, "rb").read())
    b = broker_factory("--tls-cert", str(server), "--tls-key", str(server), admin_tls=certs.admin_context())
    with Producer("g", b.address, tls=certs.tls()) as p:
        assert p.send(Message("T", b"old certificate")).msg_ids
    new_ca = trustme.CA()
    new_ca_file = tmp_path / "new-ca.pem"
    new_ca.cert_pem.write_to_path(str(new_ca_file))
    tmp = tmp_path / "server.pem.tmp"
    new_ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(tmp))
    tmp.replace(server)

    def new_certificate_served():
        try:
            with Producer("g", b.address, tls=TlsConfig(ca_file=str(new_ca_file))) as p:
                return bool(p.send(Message("T", b"new certificate")).msg_ids)
        except TlsHandshakeError:
            return False
    wait_until(new_certificate_served, what="the broker to serve the rotated certificate")


def test_slave_checks_the_master_certificate_against_tls_server_name(broker_factory, certs, tmp_path):
    """On Kubernetes a slave reaches its master by pod IP while the certificate names the Service."""
    named = tmp_path / "named.pem"
    certs.ca.issue_cert("tx.ns.svc", "*.tx.ns.svc").private_key_and_cert_chain_pem.write_to_path(str(named))
    tls = ["--tls-cert", str(named), "--tls-key", str(named)]
    client_tls = TlsConfig(ca_file=certs.ca_file, check_hostname=False)   # the test reaches the admin API by IP
    ctx = client_tls.context()
    master = broker_factory(*tls, name="master", admin_tls=ctx)
    slave = broker_factory(*tls, "--role", "slave", "--master", master.address, "--tls-ca", certs.ca_file,
                           "--tls-server-name", "tx.ns.svc", name="slave", admin_tls=ctx)
    admin = AdminClient(master.admin_url, tls=client_tls)
    wait_until(lambda: any(s["in_sync"] for s in admin.get("/api/v1/broker")["replication"]["slaves"]),
               what="the slave in sync, having checked the master's certificate against tx.ns.svc")
    assert AdminClient(slave.admin_url, tls=client_tls).get("/api/v1/broker")["replication"]["connected"]
