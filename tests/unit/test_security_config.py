"""Security and limit settings: validation that names the setting, and the `txbroker auth` commands."""

import io

import pytest

from txbroker.broker.auth.credentials import parse_credentials
from txbroker.broker.config import ConfigError, load_config
from txbroker.cli.main import main


@pytest.mark.parametrize("overrides,needle", [
    ({"tls_cert": "c.pem"}, "tls_cert and tls_key go together"),
    ({"tls_client_ca": "ca.pem"}, "tls_client_ca needs tls_cert"),
    ({"max_unacked_bytes": 1000}, "max_unacked_bytes"),
    ({"max_connections": 0}, "max_connections"),
    ({"idle_timeout_ms": 5}, "idle_timeout_ms"),
    ({"replication_access_key": "repl"}, "replication_secret_file"),
    ({"max_inflight_per_connection": 0}, "max_inflight_per_connection"),
])
def test_bad_security_settings_name_the_setting(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(None, {"data_dir": "/d", **overrides})


def test_defaults_keep_security_off():
    cfg = load_config(None, {"data_dir": "/d"})
    assert (cfg.auth_file, cfg.tls_cert, cfg.tls_client_ca) == ("", "", "")
    assert cfg.max_unacked_bytes >= cfg.max_frame_size and cfg.idle_timeout_ms == 600_000


def test_replication_secret_is_read_from_its_file(tmp_path):
    f = tmp_path / "s"
    f.write_text("the-secret\n")
    cfg = load_config(None, {"data_dir": "/d", "replication_access_key": "repl", "replication_secret_file": str(f)})
    assert cfg.replication_secret() == "the-secret"
    f.write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        cfg.replication_secret()


def test_auth_cli_adds_replaces_checks_and_removes_users(tmp_path, monkeypatch, capsys):
    f = tmp_path / "credentials.toml"
    f.write_text("# kept: a comment at the top\n")
    monkeypatch.setattr("sys.stdin", io.StringIO("alice-secret\n"))
    assert main(["auth", "add-user", "alice", "--file", str(f), "--topic", "Orders=PUB",
                 "--producer-group", "pg-a", "--expires", "2030-01-01T00:00:00Z"]) == 0
    assert main(["auth", "add-user", "ops", "--file", str(f), "--admin", "--generate"]) == 0
    generated = capsys.readouterr().out.strip().splitlines()[-1]
    text = f.read_text()
    assert text.startswith("# kept") and "alice-secret" not in text and generated not in text
    users = parse_credentials(text.encode())
    assert users["alice"].secret.verify("alice-secret") and users["ops"].secret.verify(generated)
    assert users["ops"].is_admin and users["alice"].expires_at
    assert oct(f.stat().st_mode & 0o777) == "0o600"
    assert main(["auth", "add-user", "alice", "--file", str(f), "--generate"]) == 1
    assert "already in" in capsys.readouterr().err
    assert main(["auth", "add-user", "alice", "--file", str(f), "--generate", "--replace",
                 "--consumer-group", "cg"]) == 0
    assert parse_credentials(f.read_bytes())["alice"].perms.consumer_groups == ("cg",)
    assert main(["auth", "check", "--file", str(f)]) == 0
    assert "2 users, valid" in capsys.readouterr().out
    assert main(["auth", "remove-user", "alice", "--file", str(f)]) == 0
    assert list(parse_credentials(f.read_bytes())) == ["ops"]
    assert main(["auth", "remove-user", "ops", "--file", str(f)]) == 1
    assert "last user" in capsys.readouterr().err


def test_auth_hash_prints_the_stored_form(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("pw\n"))
    assert main(["auth", "hash"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("SCRAM-SHA-256$4096:")
    assert parse_credentials(f'[[users]]\naccess_key = "a"\nscram = "{out}"\n'.encode())["a"].secret.verify("pw")
