"""The credentials file: one TOML file (a Kubernetes Secret mounts it) listing users.

    [[users]]
    access_key = "order-service"                  # letters, digits, . _ - @ (1-128)
    scram = "SCRAM-SHA-256$4096:...$...:..."       # from `txbroker auth hash` / `auth add-user`
    expires = 2027-01-01T00:00:00Z                 # optional: TOML date-time or RFC 3339 string
    disabled = false                               # optional: true revokes without deleting
    topics = ["Orders=PUB", "Billing*=PUB|SUB"]    # first matching rule decides; no match: no access
    producer_groups = ["order-service"]            # may send half messages / END_TRANSACTION, get check-backs
    consumer_groups = ["billing-*"]                # may consume as (and read %RETRY%/%DLQ% of) these groups
    admin = false                                  # the admin API, and every data-plane right
    monitor = false                                # the admin API's reads only (GET): read-only consoles
    replication = false                            # may replicate the log (slaves)

Only the salted hash is stored; a file without a single valid user, or with a mistake, is refused
whole with an error naming the user and the field (a reload keeps the previous users then).
"""

from __future__ import annotations

import datetime as dt
import tomllib
from typing import Any

import msgspec
from msgspec import Struct, field

from txbroker.broker.auth.acl import Permissions, Principal, parse_topic_rule
from txbroker.broker.auth.scram_secret import ScramSecret
from txbroker.protocol.names import ACCESS_KEY, ACCESS_KEY_RULE



class CredentialsError(ValueError):
    """The credentials file is unusable; the message names the entry and the field."""


class UserEntry(Struct, forbid_unknown_fields=True):
    access_key: str
    scram: str
    expires: Any = None
    disabled: bool = False
    topics: list[str] = field(default_factory=list)
    producer_groups: list[str] = field(default_factory=list)
    consumer_groups: list[str] = field(default_factory=list)
    admin: bool = False
    replication: bool = False
    monitor: bool = False


class CredentialsFile(Struct, forbid_unknown_fields=True):
    users: list[UserEntry] = field(default_factory=list)


def parse_expiry(value: Any) -> float:
    """Epoch seconds from a TOML date-time, a date, or an RFC 3339 string; 0 for none."""
    if value is None or value == "":
        return 0.0
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"expires {value!r} is not an RFC 3339 date-time (e.g. 2027-01-01T00:00:00Z)") from None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise ValueError("expires needs a time zone (e.g. 2027-01-01T00:00:00Z)")
        return value.timestamp()
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day, tzinfo=dt.timezone.utc).timestamp()
    raise ValueError(f"expires must be a date-time, got {type(value).__name__}")


def principal_from(entry: UserEntry) -> Principal:
    if not ACCESS_KEY.match(entry.access_key):
        raise ValueError(f"access_key must be {ACCESS_KEY_RULE}")
    secret = ScramSecret.parse(entry.scram)
    rules = []
    for i, text in enumerate(entry.topics):
        try:
            rules.append(parse_topic_rule(text))
        except ValueError as e:
            raise ValueError(f"topics[{i}]: {e}") from None
    for name in ("producer_groups", "consumer_groups"):
        for i, pattern in enumerate(getattr(entry, name)):
            if not pattern:
                raise ValueError(f"{name}[{i}] is empty")
    perms = Permissions(tuple(rules), tuple(entry.producer_groups), tuple(entry.consumer_groups),
                        entry.admin, entry.replication, entry.monitor)
    return Principal(entry.access_key, secret, perms, parse_expiry(entry.expires), entry.disabled)


def parse_credentials(data: bytes, source: str = "credentials file") -> dict[str, Principal]:
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise CredentialsError(f"{source} is not valid TOML: {e}") from None
    try:
        doc = msgspec.convert(raw, CredentialsFile)
    except msgspec.ValidationError as e:
        raise CredentialsError(f"{source}: {e}") from None
    out: dict[str, Principal] = {}
    for i, entry in enumerate(doc.users):
        where = f"{source}: users[{i}] ({entry.access_key!r})"
        if entry.access_key in out:
            raise CredentialsError(f"{where}: access key listed twice")
        try:
            out[entry.access_key] = principal_from(entry)
        except ValueError as e:
            raise CredentialsError(f"{where}: {e}") from None
    if not out:
        raise CredentialsError(f"{source} lists no users: nobody could connect")
    return out


def load_credentials(path: str) -> dict[str, Principal]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CredentialsError(f"cannot read credentials file {path}: {e.strerror or e}") from None
    return parse_credentials(data, f"credentials file {path}")
