"""The data source and the orders job against secured brokers (real processes): a broker with
`--auth-file` (SCRAM), and one with TLS requiring client certificates as well.

- credentials as options (accessKey + secretKeyFile) for a write whose crashed task attempt leaves
  half messages that the broker rolls back with the job's decision; a Spark read with the same
  options;
- no credentials, a wrong secret (file or option), credentials without the producer group, a reader
  without credentials: the job fails at planning, naming the option, and nothing is sent; no error
  shows the secret;
- TLS + credentials from the environment only (as the chart passes them), through the orders job
  (deferred commit); plaintext, an untrusted CA and a missing client certificate each fail naming
  the TLS option.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_helpers import GROUP, GROUP_SETTINGS, TxEnv, bodies_by_id

pytest.importorskip("pyspark.sql.datasource")

from txbroker.client import Credentials, TlsConfig  # noqa: E402
from txbroker.client.admin import AdminClient  # noqa: E402

ORDERS_JOB = Path(__file__).resolve().parents[2] / "spark" / "jobs" / "orders_job.py"
JOB_KEY, JOB_SECRET = "spark-job", "spark-job-secret-7f3a"  # the secret must never show in errors or logs
USERS = {
    JOB_KEY: {"secret": JOB_SECRET, "topics": ["Sec*=PUB|SUB"], "producer_groups": [GROUP]},
    "admin": {"secret": "admin-secret", "admin": True},
    "no-group": {"secret": "no-group-secret", "topics": ["Sec*=PUB|SUB"]},  # may not act for the producer group
}
ROWS = 90


def write_credentials(path: Path, users: dict) -> Path:
    """A broker --auth-file (as tests/conftest.py's write_credentials; that module is shadowed here)."""
    from txbroker.broker.auth import hash_secret
    from txbroker.cli.auth_cmd import _user_block

    blocks = []
    for key, fields in users.items():
        fields = dict(fields)
        scram = hash_secret(fields.pop("secret")).encode()
        blocks.append(_user_block({"access_key": key, "scram": scram, **fields}))
    path.write_text("\n".join(blocks))
    return path


class Certs:
    """A CA (trustme), the broker's certificate for 127.0.0.1, a client certificate with its key in a
    file of its own, and a CA nobody trusts."""

    def __init__(self, d: Path):
        import trustme

        self.ca = trustme.CA()
        self.ca_file = str(d / "ca.pem")
        self.ca.cert_pem.write_to_path(self.ca_file)
        self.server_file = str(d / "server.pem")
        self.ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(self.server_file)
        client = self.ca.issue_cert("spark-job.example")
        self.client_cert, self.client_key = str(d / "client.crt"), str(d / "client.key")
        with open(self.client_cert, "wb") as f:
            for blob in client.cert_chain_pems:
                f.write(blob.bytes())
        client.private_key_pem.write_to_path(self.client_key)
        self.other_ca_file = str(d / "other-ca.pem")
        trustme.CA().cert_pem.write_to_path(self.other_ca_file)

    def client_tls(self) -> TlsConfig:
        return TlsConfig(ca_file=self.ca_file, cert_file=self.client_cert, key_file=self.client_key)


def secured_env(broker_factory, tmp_path: Path, certs: Certs | None) -> TxEnv:
    """A broker requiring credentials (and TLS with client certificates, given certs), and the
    group's settings (it requires jobs)."""
    auth = write_credentials(tmp_path / "credentials.toml", USERS)
    args = ["--auth-file", str(auth), "--check-interval-ms", "300", "--transaction-timeout-ms", "200"]
    tls = None
    if certs is not None:
        args += ["--tls-cert", certs.server_file, "--tls-key", certs.server_file, "--tls-client-ca", certs.ca_file]
        tls = certs.client_tls()
    broker = broker_factory(*args, admin_tls=tls.context() if tls else None)
    admin = AdminClient(broker.admin_url, credentials=Credentials("admin", "admin-secret"), tls=tls)
    admin.put(f"/api/v1/groups/{GROUP}/transaction", GROUP_SETTINGS)
    return TxEnv(broker=broker, admin_client=admin,
                 client_kwargs={"credentials": Credentials(JOB_KEY, JOB_SECRET), "tls": tls})


@pytest.fixture
def secret_file(tmp_path) -> Path:
    path = tmp_path / "secret-key"  # as a mounted Secret: the secret, a trailing newline
    path.write_text(JOB_SECRET + "\n")
    return path


@pytest.fixture
def auth_env(broker_factory, tmp_path):
    """Credentials only."""
    return secured_env(broker_factory, tmp_path, None)


def orders(spark, n=ROWS, partitions=3):
    return spark.range(n, numPartitions=partitions).selectExpr("id", "concat('order-', id) AS order_id")


def failure(call) -> str:
    with pytest.raises(Exception) as e:
        call()
    return str(e.value)


def test_write_and_read_with_credentials_a_crashed_attempt_rolled_back_by_the_decision(spark, auth_env, secret_file,
                                                                                       tmp_path):
    creds = {"accessKey": JOB_KEY, "secretKeyFile": str(secret_file)}
    (orders(spark).write.format("txbroker")
     .options(**auth_env.options("SecOrders", batchSize=10, **creds, **{
         "inject.failPartition": 1, "inject.failMode": "crash", "inject.markerFile": str(tmp_path / "crash.json")}))
     .mode("append").save())
    events = auth_env.events("SecOrders")
    assert sorted(bodies_by_id(events).elements()) == list(range(ROWS))  # each row once
    job = auth_env.only_job()
    assert job["state"] == "COMMITTED" and {m.transaction_id for m in events} == set(job["member_ids"])
    # the crashed attempt's half messages: rolled back by the broker with the decision
    discarded = json.loads((tmp_path / "crash.json").read_text())["txids"]
    assert len(discarded) == 3 and not set(discarded) & set(job["member_ids"])  # 30 rows, 10 per transaction
    auth_env.wait_settled()
    assert {auth_env.transaction(t)["state"] for t in discarded} == {"ROLLED_BACK"}

    rows = (spark.read.format("txbroker").option("brokers", auth_env.brokers).option("topic", "SecOrders")
            .options(**creds).load().collect())
    assert sorted(json.loads(r.body)["id"] for r in rows) == list(range(ROWS))


def test_missing_or_wrong_credentials_fail_at_planning_naming_the_option(spark, auth_env, tmp_path):
    df = orders(spark, 10, 2)

    def save(**opts):
        df.write.format("txbroker").options(**auth_env.options("SecRefused", **opts)).mode("append").save()

    text = failure(save)
    assert "txbroker option 'accessKey'" in text and "requires credentials" in text, text[-3000:]
    wrong = tmp_path / "wrong-secret"
    wrong.write_text("not-the-secret\n")
    text = failure(lambda: save(accessKey=JOB_KEY, secretKeyFile=str(wrong)))
    assert "txbroker option 'secretKeyFile'" in text and f"refused the credentials of access key '{JOB_KEY}'" in text
    assert "not-the-secret" not in text
    text = failure(lambda: save(accessKey=JOB_KEY, secretKey="also-not-it"))
    assert "txbroker option 'secretKey'" in text and "refused the credentials" in text and "also-not-it" not in text
    text = failure(lambda: save(accessKey=JOB_KEY, secretKeyFile=str(tmp_path / "missing")))
    assert "txbroker option 'secretKeyFile'" in text and "cannot read" in text
    text = failure(lambda: save(accessKey="no-group", secretKey="no-group-secret"))
    assert "txbroker option 'accessKey'" in text and f"may not act for producer group '{GROUP}'" in text, text[-3000:]
    text = failure(lambda: spark.read.format("txbroker").option("brokers", auth_env.brokers)
                   .option("topic", "SecRefused").load().collect())
    assert "txbroker option 'accessKey'" in text and "requires credentials" in text
    # refused before anything was registered or sent
    assert auth_env.jobs() == [] and auth_env.pending() == []


@pytest.fixture
def tls_env(broker_factory, tmp_path):
    """TLS with client certificates and credentials."""
    certs = Certs(tmp_path)
    env = secured_env(broker_factory, tmp_path, certs)
    env.certs = certs
    return env


def test_orders_job_over_tls_with_settings_from_the_environment(spark, tls_env, tmp_path, secret_file):
    """The orders job as the chart runs it: no security flags, everything from TXBROKER_* (the access
    key, the secret as a file, the CA, the client certificate)."""
    certs = tls_env.certs
    env = {**os.environ, "TXBROKER_ACCESS_KEY": JOB_KEY, "TXBROKER_SECRET_KEY_FILE": str(secret_file),
           "TXBROKER_TLS_CA": certs.ca_file, "TXBROKER_TLS_CERT": certs.client_cert,
           "TXBROKER_TLS_KEY": certs.client_key}
    summary = tmp_path / "summary.json"
    r = subprocess.run([sys.executable, str(ORDERS_JOB), "--master", "local[2]", "--brokers", tls_env.brokers,
                        "--topic", "SecOrderEvents", "--group", GROUP,
                        "--input", str(tmp_path / "orders"), "--output", str(tmp_path / "result"),
                        "--orders", "120", "--partitions", "2", "--batch-size", "25",
                        "--summary-json", str(summary)], env=env, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert JOB_SECRET not in r.stdout + r.stderr
    s = json.loads(summary.read_text())
    assert (s["decision"], s["rows"], s["committed"]) == ("COMMITTED", 120, s["transactions"])
    assert (s["rolled_back"], s["discarded_attempts"]) == (0, 0)  # no attempt discarded: known without --admin-url
    tls_env.wait_settled()
    assert len(tls_env.events("SecOrderEvents")) == 120

    opts = {"brokers": tls_env.brokers, "topic": "SecOrderEvents", "accessKey": JOB_KEY,
            "secretKeyFile": str(secret_file), "tlsCaFile": certs.ca_file, "tlsCertFile": certs.client_cert,
            "tlsKeyFile": certs.client_key}
    rows = spark.read.format("txbroker").options(**opts).load().collect()
    assert sorted(json.loads(r.body)["order_id"] for r in rows) == [f"o-{i:08d}" for i in range(120)]

    def read(**change):
        o = {k: v for k, v in {**opts, **change}.items() if v is not None}
        return failure(lambda: spark.read.format("txbroker").options(**o).load().collect())

    text = read(tlsCaFile=None, tlsCertFile=None, tlsKeyFile=None)  # plaintext
    assert "txbroker option 'tlsCaFile'" in text and "accepts TLS connections only" in text, text[-3000:]
    text = read(tlsCaFile=certs.other_ca_file)
    assert "txbroker option 'tlsCaFile'" in text and "CERTIFICATE_VERIFY_FAILED" in text, text[-3000:]
    text = read(tlsCertFile=None, tlsKeyFile=None)
    assert "txbroker option 'tlsCertFile'" in text and "client certificate" in text, text[-3000:]
