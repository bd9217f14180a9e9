"""`txbroker auth hash|add-user|remove-user|check`: making entries of the credentials file.

The file keeps only salted hashes (SCRAM-SHA-256). Secrets are read from standard input (one
line) or a prompt, or generated, never taken as a flag (command lines show up in `ps`).
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os
import secrets
import sys
import tempfile
import tomllib

from txbroker.broker.auth.credentials import CredentialsError, parse_credentials, parse_expiry
from txbroker.broker.auth.scram_secret import DEFAULT_ITERATIONS, hash_secret

_PERM_NAMES = {0: "DENY", 1: "PUB", 2: "SUB", 3: "PUB|SUB"}
_FIELDS = ("access_key", "scram", "expires", "disabled", "topics", "producer_groups", "consumer_groups", "admin",
           "replication", "monitor")


def register(sub) -> None:
    p = sub.add_parser("auth", help="make and check credentials file entries",
                       description="Make entries for the broker's --auth-file: hashed secrets (SCRAM-SHA-256) "
                                   "and permissions. Secrets come from standard input or a prompt, or --generate.")
    asub = p.add_subparsers(dest="auth_command", required=True, metavar="ACTION")
    h = asub.add_parser("hash", help="print the stored form of a secret read from standard input")
    h.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS,
                   help="PBKDF2 iterations (default %(default)s, at least 4096)")
    h.set_defaults(run=hash_cmd)

    a = asub.add_parser("add-user", help="add a user (or replace one with --replace) in a credentials file")
    a.add_argument("access_key", help="the user's access key (its name in ACLs and logs)")
    a.add_argument("--file", required=True, help="credentials file (TOML); created if missing")
    a.add_argument("--topic", action="append", default=[], metavar="PATTERN=PERMS",
                   help="topic rule, e.g. 'Orders=PUB', 'Billing*=PUB|SUB', 'Secret*=DENY' (repeat; first match wins)")
    a.add_argument("--producer-group", action="append", default=[], metavar="PATTERN",
                   help="producer group it may act for: half messages, END_TRANSACTION, check-backs (repeat)")
    a.add_argument("--consumer-group", action="append", default=[], metavar="PATTERN",
                   help="consumer group it may consume as (repeat)")
    a.add_argument("--admin", action="store_true", help="the admin API and every data-plane right")
    a.add_argument("--replication", action="store_true", help="may replicate from a master (slaves)")
    a.add_argument("--monitor", action="store_true",
                   help="may read the admin API (GET requests only): a read-only user of `txbroker console`")
    a.add_argument("--expires", help="expiry, RFC 3339 (e.g. 2027-01-01T00:00:00Z)")
    a.add_argument("--generate", action="store_true",
                   help="generate a random secret and print it once (otherwise read from standard input)")
    a.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS,
                   help="PBKDF2 iterations of the stored hash (default %(default)s)")
    a.add_argument("--replace", action="store_true", help="replace an existing user of that access key")
    a.set_defaults(run=add_user)

    r = asub.add_parser("remove-user", help="remove a user (revokes it: brokers reload the file)")
    r.add_argument("access_key", help="the user to remove")
    r.add_argument("--file", required=True, help="credentials file (TOML)")
    r.set_defaults(run=remove_user)

    c = asub.add_parser("check", help="validate a credentials file and list its users")
    c.add_argument("--file", required=True, help="credentials file (TOML)")
    c.set_defaults(run=check)


def _read_secret() -> str:
    if sys.stdin.isatty():
        secret = getpass.getpass("secret: ")
        if getpass.getpass("again: ") != secret:
            raise ValueError("the two secrets differ")
    else:
        secret = sys.stdin.readline().rstrip("\r\n")
    if not secret:
        raise ValueError("empty secret")
    return secret


def hash_cmd(args) -> int:
    print(hash_secret(_read_secret(), args.iterations).encode())
    return 0


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dt.datetime, dt.date)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, int):
        return str(v)
    return json.dumps(str(v))  # a JSON string is a valid TOML basic string


def _user_block(user: dict) -> str:
    lines = ["[[users]]"]
    for k in _FIELDS:
        if k in user and user[k] not in (None, [], False):
            lines.append(f"{k} = {_toml_value(user[k])}")
    return "\n".join(lines) + "\n"


def _load(path: str) -> tuple[str, list[dict]]:
    try:
        with open(path, "rb") as f:
            text = f.read().decode()
    except FileNotFoundError:
        return "", []
    return text, tomllib.loads(text).get("users", [])


def _write(path: str, text: str) -> None:
    """Atomically (a reloading broker never reads half a file), readable by the owner only."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".credentials-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def add_user(args) -> int:
    text, users = _load(args.file)
    exists = any(u.get("access_key") == args.access_key for u in users)
    if exists and not args.replace:
        raise ValueError(f"access key {args.access_key!r} is already in {args.file} (use --replace)")
    secret = secrets.token_urlsafe(32) if args.generate else _read_secret()
    user = {"access_key": args.access_key, "scram": hash_secret(secret, args.iterations).encode(),
            "topics": args.topic, "producer_groups": args.producer_group, "consumer_groups": args.consumer_group,
            "admin": args.admin, "replication": args.replication,
            "monitor": args.monitor}
    if args.expires:
        parse_expiry(args.expires)  # raises ValueError naming the problem
        user["expires"] = args.expires
    if exists:  # rewrite the file from its parsed form (comments are not kept)
        users = [user if u.get("access_key") == args.access_key else u for u in users]
        new_text = "\n".join(_user_block(u) for u in users)
    else:  # append: the rest of the file, comments included, stays as it was
        new_text = text + ("\n" if text and not text.endswith("\n\n") else "") + _user_block(user)
    try:
        parse_credentials(new_text.encode(), args.file)
    except CredentialsError as e:
        raise ValueError(str(e)) from None
    _write(args.file, new_text)
    print(f"{'replaced' if exists else 'added'} {args.access_key} in {args.file}", file=sys.stderr)
    if args.generate:
        print(secret)
    return 0


def remove_user(args) -> int:
    _text, users = _load(args.file)
    kept = [u for u in users if u.get("access_key") != args.access_key]
    if len(kept) == len(users):
        raise ValueError(f"access key {args.access_key!r} is not in {args.file}")
    if not kept:
        raise ValueError(f"{args.access_key} is the last user of {args.file}: a broker would refuse everyone; "
                         "stop the broker's --auth-file instead")
    _write(args.file, "\n".join(_user_block(u) for u in kept))
    print(f"removed {args.access_key} from {args.file}", file=sys.stderr)
    return 0


def check(args) -> int:
    with open(args.file, "rb") as f:
        principals = parse_credentials(f.read(), args.file)
    now = dt.datetime.now(dt.timezone.utc).timestamp()
    for key, p in principals.items():
        flags = [name for name, on in (("admin", p.perms.admin), ("replication", p.perms.replication),
                                       ("monitor", p.perms.monitor),
                                       ("disabled", p.disabled), ("expired", p.expired(now))) if on]
        topics = ", ".join(f"{r.pattern}={_PERM_NAMES[r.perms]}" for r in p.perms.topics)
        print(f"{key}: topics [{topics}] producer_groups {list(p.perms.producer_groups)} "
              f"consumer_groups {list(p.perms.consumer_groups)} {' '.join(flags)}".rstrip())
    print(f"{len(principals)} users, valid")
    return 0
