"""Credentials files for the brokers under test (broker --auth-file)."""

from __future__ import annotations

import os
from pathlib import Path

_HASHES: dict[tuple[str, str], str] = {}


def write_credentials(path: Path, users: dict[str, dict]) -> Path:
    """Write a credentials file (broker --auth-file): access key -> fields, with "secret" hashed.
    The secret of each user is `<access key>-secret` unless a "secret" is given; its hash is made
    once per test process, so rewriting a file changes only what the test changes (a new salt
    would count as new credentials). Written atomically, as `txbroker auth` and Kubernetes do."""
    from txbroker.cli.auth_cmd import _user_block
    from txbroker.broker.auth import hash_secret

    blocks = []
    for key, fields in users.items():
        fields = dict(fields)
        secret = fields.pop("secret", f"{key}-secret")
        scram = _HASHES.get((key, secret))
        if scram is None:
            scram = _HASHES[(key, secret)] = hash_secret(secret).encode()
        blocks.append(_user_block({"access_key": key, "scram": scram, **fields}))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(blocks))
    os.replace(tmp, path)
    return path
