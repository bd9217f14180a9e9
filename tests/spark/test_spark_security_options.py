"""Credentials and TLS settings (txbroker_spark/security.py) without Spark or a broker: each problem
names the option (or the environment variable, or the orders job's flag), the environment is the
fallback per group, and the secret shows nowhere (repr, descriptions, errors)."""

from __future__ import annotations

import os
import pickle
import subprocess
from pathlib import Path
import sys

import pytest

from txbroker_spark.options import OptionError, parse_read_options, parse_write_options
from txbroker_spark.security import BrokerSecurity, parse_security

SECRET = "do-not-print-me-91c2"


def names(opts: dict, environ: dict | None = None) -> str:
    with pytest.raises(OptionError) as e:
        sec = parse_security(opts, environ or {})
        sec.check_files()
    assert SECRET not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("opts, environ, expected", [
    ({"secretKey": SECRET}, {}, "txbroker option 'accessKey': is required with secretKey"),
    ({"accessKey": "a b", "secretKey": SECRET}, {}, "txbroker option 'accessKey': must be 1-128 characters"),
    ({"accessKey": "k"}, {}, "txbroker option 'secretKeyFile': is required with accessKey"),
    ({"accessKey": "k", "secretKey": SECRET, "secretKeyFile": "/f"}, {}, "give either secretKey or secretKeyFile"),
    ({}, {"TXBROKER_ACCESS_KEY": "k"},
     "txbroker option 'secretKeyFile' (from $TXBROKER_SECRET_KEY_FILE): is required with TXBROKER_ACCESS_KEY"),
    ({"tls": "maybe"}, {}, "txbroker option 'tls': must be true or false, got 'maybe'"),
    ({"tls": "false", "tlsCaFile": "/ca"}, {}, "txbroker option 'tls': is false, but tlsCaFile is given"),
    ({"tlsKeyFile": "/k"}, {}, "txbroker option 'tlsCertFile': is required with tlsKeyFile"),
    ({"tlsServerName": "tx.example"}, {}, "txbroker option 'tlsServerName': is for TLS"),
    ({"tlsCaFile": "/nonexistent/ca.pem"}, {}, "txbroker option 'tlsCaFile': cannot read /nonexistent/ca.pem"),
    ({}, {"TXBROKER_TLS_CA": "/nonexistent/ca.pem"},
     "txbroker option 'tlsCaFile' (from $TXBROKER_TLS_CA): cannot read /nonexistent/ca.pem"),
])
def test_problems_name_the_option_or_variable(opts, environ, expected):
    assert expected in names(opts, environ)


def test_secret_file_and_certificate_files_are_checked(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    assert "txbroker option 'secretKeyFile': " + f"{empty} is empty" in names(
        {"accessKey": "k", "secretKeyFile": str(empty)})
    assert "cannot read" in names({"accessKey": "k", "secretKeyFile": str(tmp_path / "missing")})
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    assert "txbroker option 'tlsCaFile': " in names({"tlsCaFile": str(garbage)})
    assert "txbroker option 'tlsCertFile': cannot load the client certificate" in names({"tlsCertFile": str(garbage)})


def test_environment_is_the_fallback_per_group(tmp_path):
    secret = tmp_path / "secret-key"
    secret.write_text(SECRET + "\n")
    env = {"TXBROKER_ACCESS_KEY": "env-key", "TXBROKER_SECRET_KEY_FILE": str(secret), "TXBROKER_TLS_CA": "/ca.pem",
           "TXBROKER_TLS_SERVER_NAME": "tx-master.ns.svc"}
    sec = parse_security({}, env)
    assert (sec.access_key, sec.secret_key_file, sec.credentials_from_env) == ("env-key", str(secret), True)
    assert (sec.tls, sec.ca_file, sec.server_name, sec.tls_from_env) == (True, "/ca.pem", "tx-master.ns.svc", True)
    assert sec.credentials().secret_key == SECRET  # the file's content, without its newline
    # an option of a group replaces the whole group's environment, the other group still falls back
    sec = parse_security({"accessKey": "opt-key", "secretKey": SECRET}, env)
    assert (sec.access_key, sec.secret_key_file, sec.credentials_from_env) == ("opt-key", None, False)
    assert sec.ca_file == "/ca.pem"
    sec = parse_security({"tls": "false"}, env)
    assert not sec.tls and sec.access_key == "env-key"
    # as Credentials.from_env: without TXBROKER_ACCESS_KEY the environment gives no credentials
    assert parse_security({}, {"TXBROKER_SECRET_KEY": SECRET}).credentials() is None
    assert parse_security({}, {}) == BrokerSecurity()


def test_the_secret_shows_nowhere(tmp_path):
    from pyspark.sql.types import LongType, StructField, StructType

    opts = {"brokers": "127.0.0.1:10911", "topic": "T", "producerGroup": "g",
            "accessKey": "k", "secretKey": SECRET, "tlsServerName": "x", "tls": "true"}
    w = parse_write_options(opts, StructType([StructField("id", LongType())]), streaming=False)
    r = parse_read_options(opts)
    for o in (w, r, w.security):
        assert SECRET not in repr(o) and SECRET not in str(o)
    assert SECRET not in w.security.describe()
    assert w.security.describe() == "access key 'k' (secret from the options), TLS (the system's CAs, server name x)"
    again = pickle.loads(pickle.dumps(w))  # what the executors get
    assert again.security.credentials().secret_key == SECRET and again.security.tls_config().server_hostname == "x"
    e = pickle.loads(pickle.dumps(OptionError("secretKeyFile", "cannot read", source="TXBROKER_SECRET_KEY_FILE")))
    assert str(e) == "txbroker option 'secretKeyFile' (from $TXBROKER_SECRET_KEY_FILE): cannot read"


ORDERS_JOB = Path(__file__).resolve().parents[2] / "spark" / "jobs" / "orders_job.py"


def orders_job(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TXBROKER_")}
    return subprocess.run([sys.executable, str(ORDERS_JOB), "--brokers", "127.0.0.1:1", "--group", "g", *args],
                          capture_output=True, text=True, timeout=60, env={**clean, **(env or {})})


def test_the_orders_jobs_flags_and_environment_are_checked_at_start(tmp_path):
    where = ("--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"))
    r = orders_job(*where, "--access-key", "k", "--secret-key-file", str(tmp_path / "missing"))
    assert r.returncode == 2 and "--secret-key-file" in r.stderr and "cannot read" in r.stderr, r.stderr
    r = orders_job(*where, env={"TXBROKER_ACCESS_KEY": "k"})
    assert r.returncode == 2 and "TXBROKER_SECRET_KEY_FILE" in r.stderr and "TXBROKER_ACCESS_KEY" in r.stderr, r.stderr
    r = orders_job(*where, "--tls-key", "/k")
    assert r.returncode == 2 and "--tls-cert" in r.stderr and "is required with" in r.stderr, r.stderr
    help_text = orders_job("--help").stdout
    for flag in ("--access-key", "--secret-key-file", "--tls-ca", "--tls-cert", "--tls-key", "--tls-server-name"):
        assert flag in help_text
