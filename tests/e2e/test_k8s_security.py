"""Security on Kubernetes (#9): a TxBroker's credentials and TLS come from Secrets, the operator uses
them too, rotating either needs no restart, and the NetworkPolicy the operator writes admits only
labelled clients (enforced on the node by kube-network-policies, testbed/README.md)."""

from __future__ import annotations

import base64
import json
import socket
import ssl

import pytest
import trustme
from support.waiting import wait_until
from operator_env import IMAGE, addresses, condition, events_for, start_operator, txbroker, wait_broker

from txbroker.broker.auth import hash_secret
from txbroker.client import (
    AuthenticationError, ClientError, Credentials, LocalTransactionState as S, Message, Producer, TlsConfig,
    TransactionListener, TransactionProducer,
)
from txbroker.client.admin import AdminClient

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def operator(crds, worker_id):
    yield from start_operator(crds, f"txbroker-sec-{worker_id}")


def credentials_toml(users: dict[str, dict]) -> str:
    blocks = []
    for key, u in users.items():
        lines = ["[[users]]", f'access_key = "{key}"', f'scram = "{hash_secret(u["secret"]).encode()}"']
        lines += [f"{k} = {json.dumps(u[k])}" for k in ("topics", "producer_groups", "consumer_groups") if k in u]
        lines += [f"{k} = true" for k in ("admin", "replication") if u.get(k)]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def secret(name: str, data: dict[str, str | bytes], type_: str = "Opaque") -> dict:
    enc = {k: base64.b64encode(v if isinstance(v, bytes) else v.encode()).decode() for k, v in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": type_, "data": enc}


def auth_secret(orders_secret: str) -> dict:
    users = {"operator": {"secret": "op-secret", "admin": True},
             "replicator": {"secret": "repl-secret", "replication": True},
             "orders": {"secret": orders_secret, "topics": ["Orders=PUB|SUB"], "producer_groups": ["orders-pg"]}}
    return secret("secure-auth", {"credentials.toml": credentials_toml(users),
                                  "operator-access-key": "operator", "operator-secret": "op-secret",
                                  "replication-access-key": "replicator", "replication-secret": "repl-secret"})


def tls_secret(ca: trustme.CA, namespace: str) -> tuple[dict, trustme.LeafCert]:
    leaf = ca.issue_cert(f"secure.{namespace}.svc", f"*.secure.{namespace}.svc", f"secure-master.{namespace}.svc")
    chain = b"".join(b.bytes() for b in leaf.cert_chain_pems)
    return secret("secure-tls", {"tls.crt": chain, "tls.key": leaf.private_key_pem.bytes(),
                                 "ca.crt": ca.cert_pem.bytes()}, "kubernetes.io/tls"), leaf


def served_certificate(address: str, ca_file: str, hostname: str) -> bytes:
    """The certificate a new TLS handshake with the broker at `address` gets."""
    host, port = address.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=ca_file)
    with socket.create_connection((host, int(port)), timeout=3) as raw, \
            ctx.wrap_socket(raw, server_hostname=hostname) as tls:
        return tls.getpeercert(binary_form=True)


class Commit(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return S.COMMIT

    def check_local_transaction(self, msg):
        return S.COMMIT


def test_credentials_and_tls_from_secrets_rotate_without_restarts(operator, tmp_path):
    tb, ns = operator.testbed, operator.namespace
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    tls, leaf = tls_secret(ca, ns)
    tb.apply(tls, ns)
    tb.apply(auth_secret("orders-secret-1"), ns)
    tb.apply(txbroker("secure", replicas=2, authSecretRef={"name": "secure-auth"},
                      tls={"secretRef": {"name": "secure-tls"}}), ns)
    wait_broker(operator, ns, "secure", timeout=120)

    # the operator reached both brokers' admin API over TLS with its credentials, the slave its master
    def replicating():
        brokers = tb.get("txb", "secure", ns)["status"]["brokers"]
        return all("offset" in b for b in brokers) and any(b.get("inSync") for b in brokers) and brokers
    wait_until(replicating, 60, "status with offsets and an in-sync slave")
    everyone = addresses(tb, ns, "secure", 2)
    hostname = f"secure-master.{ns}.svc"
    tls_cfg = TlsConfig(ca_file=str(ca_file), server_hostname=hostname)
    with TransactionProducer("orders-pg", everyone, Commit(), credentials=Credentials("orders", "orders-secret-1"),
                             tls=tls_cfg) as p:
        for i in range(5):
            r = p.send_message_in_transaction(Message("Orders", f"order-{i}".encode()), None)
            assert r.local_state is S.COMMIT and not r.end_error

    with pytest.raises(AuthenticationError):           # TLS but no credentials
        Producer("orders-pg", everyone[0], tls=tls_cfg).start()
    with pytest.raises(ClientError):                     # plaintext to a TLS-only broker
        Producer("orders-pg", everyone[0], credentials=Credentials("orders", "orders-secret-1")).start()
    with pytest.raises(Exception):                       # the admin API wants credentials too
        AdminClient(f"https://{everyone[0].split(':')[0]}:10912", tls=TlsConfig(ca_file=str(ca_file),
                    server_hostname=hostname)).get("/api/v1/broker")

    pids = {f"secure-{i}": tb.pod_pids(f"secure-{i}", ns) for i in range(2)}

    # rotate the client's secret: the brokers reload the mounted file; the old secret stops working
    tb.apply(auth_secret("orders-secret-2"), ns)

    def rotated():
        try:
            Producer("orders-pg", everyone[0], credentials=Credentials("orders", "orders-secret-1"), tls=tls_cfg).start()
            return False
        except AuthenticationError:
            return True
    wait_until(rotated, 60, "the old secret refused")
    with Producer("orders-pg", everyone[0], credentials=Credentials("orders", "orders-secret-2"), tls=tls_cfg) as p:
        p.send(Message("Orders", b"after-rotation"))

    # rotate the certificate: new handshakes get the new one
    new_tls, new_leaf = tls_secret(ca, ns)
    tb.apply(new_tls, ns)
    new_der = ssl.PEM_cert_to_DER_cert(new_leaf.cert_chain_pems[0].bytes().decode())
    for address in everyone:
        wait_until(lambda: served_certificate(address, str(ca_file), hostname) == new_der, 60,
                 f"{address} serving the new certificate")
    assert {f"secure-{i}": tb.pod_pids(f"secure-{i}", ns) for i in range(2)} == pids, "a broker was restarted"
    assert all(tb.get("pod", f"secure-{i}", ns)["status"]["containerStatuses"][0]["restartCount"] == 0
               for i in range(2))
    # and the operator still reaches them (it re-reads the Secrets every pass)
    before = tb.get("txb", "secure", ns)["status"]["brokers"][0]["offset"]
    with Producer("orders-pg", everyone, credentials=Credentials("orders", "orders-secret-2"), tls=tls_cfg) as p:
        p.send(Message("Orders", b"seen-by-the-operator"))
    wait_until(lambda: tb.get("txb", "secure", ns)["status"]["brokers"][0]["offset"] > before, 30,
             "status offsets moving after the rotations")


def connects(tb, ns: str, name: str, address: str, labels: dict[str, str]) -> bool:
    """Whether a pod with `labels` opens a TCP connection to `address` (HOST:PORT) within 5 s."""
    host, port = address.rsplit(":", 1)
    probe = (f"import socket\ntry:\n    socket.create_connection(({host!r}, {port}), timeout=5).close()\n"
             "    print('connected')\nexcept OSError as e:\n    print('refused', e)")
    tb.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
              "spec": {"restartPolicy": "Never", "containers": [{"name": "probe", "image": IMAGE,
                                                                 "command": ["python", "-c", probe]}]}}, ns)
    wait_until(lambda: tb.get("pod", name, ns)["status"].get("phase") in ("Succeeded", "Failed"), 60, f"{name} to finish")
    out = tb.pod_log(name, ns)
    assert out.startswith(("connected", "refused")), out
    return out.startswith("connected")


def test_network_policy_admits_labelled_clients(operator):
    tb, ns = operator.testbed, operator.namespace
    tb.apply(txbroker("fenced", replicas=2, networkPolicy={"enabled": True}), ns)
    wait_broker(operator, ns, "fenced")
    policy = tb.get("networkpolicy", "fenced", ns)
    assert policy["metadata"]["ownerReferences"][0]["name"] == "fenced"
    data, admin_rule = policy["spec"]["ingress"]
    assert data["ports"] == [{"protocol": "TCP", "port": 10911}]
    assert {"podSelector": {"matchLabels": {"txbroker.dev/client": "fenced"}}} in data["from"]
    assert admin_rule["from"][1] == {"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "txbroker-system"}}}
    # enforced: a pod without the client label cannot reach a broker, one with it can, through the
    # master's Service as by pod address; the slave still replicates and the operator still manages
    service = f"fenced-master.{ns}.svc.cluster.local:10911"
    assert not connects(tb, ns, "stranger", service, {"app": "stranger"})
    assert not connects(tb, ns, "stranger-direct", addresses(tb, ns, "fenced", 1)[0], {"app": "stranger"})
    assert connects(tb, ns, "client", service, {"txbroker.dev/client": "fenced"})
    wait_until(lambda: all(b.get("inSync") for b in tb.get("txb", "fenced", ns)["status"]["brokers"]
                         if b["role"] == "slave"), 60, "the slave in sync under the policy")
    tb.kubectl("-n", ns, "patch", "txb", "fenced", "--type=merge", "-p", '{"spec": {"networkPolicy": {"enabled": false}}}')
    wait_until(lambda: tb.get("networkpolicy", "fenced", ns) is None, 30, "the NetworkPolicy removed")
    assert connects(tb, ns, "stranger-after", service, {"app": "stranger"})


def test_a_missing_secret_is_reported_and_nothing_is_promoted(operator):
    tb, ns = operator.testbed, operator.namespace
    tb.apply(txbroker("nosecret", replicas=1, authSecretRef={"name": "does-not-exist"}), ns)
    event = wait_until(lambda: next((e for e in events_for(tb, ns, "nosecret") if e["reason"] == "SecretInvalid"), None),
                     60, "a SecretInvalid event")
    assert "Secret does-not-exist (spec.authSecretRef) does not exist" in event["message"]
    txb = tb.get("txb", "nosecret", ns)
    # (the Event can come before the first status is written: no status is not Running either)
    assert (txb.get("status") or {}).get("phase") != "Running" and (condition(txb, "Ready") or {}).get("status") != "True"


def test_producer_group_credentials_are_checked(operator):
    tb, ns = operator.testbed, operator.namespace
    tb.apply(txbroker("pgsec", replicas=1), ns)
    tb.apply({"apiVersion": "txbroker.dev/v1alpha1", "kind": "TxProducerGroup", "metadata": {"name": "billing"},
              "spec": {"brokerRef": {"name": "pgsec"}, "credentialsSecretRef": {"name": "billing-creds"}}}, ns)

    def found(value):
        return lambda: (c := condition(tb.get("txpg", "billing", ns), "CredentialsFound")) and c["status"] == value and c
    missing = wait_until(found("False"), 60, "CredentialsFound False")
    assert "Secret billing-creds (credentialsSecretRef) does not exist" in missing["message"]
    tb.apply(secret("billing-creds", {"access-key": "billing", "secret-key": "s3cret"}), ns)
    wait_until(found("True"), 60, "CredentialsFound True once the Secret exists")
