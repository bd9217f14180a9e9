"""Decoy secrets for access keys that are not in the credentials file.

The first SCRAM step hands the client its salt and iteration count; refusing an unknown key there
(or answering with a random salt) tells anyone which access keys exist. So an unknown key gets a
decoy, as RFC 5802 §9 advises and PostgreSQL's mock authentication does: a salt and keys derived by
HMAC from a broker secret and the access key, with the iteration count and salt length most users
have. The answer looks like a real user's and is the same on every attempt; the proof then fails
as a wrong secret does.

The broker secret is derived from the stored ServerKeys of the whole table (secret, and the same on
a master and its slaves and across restarts, since they read the same file): a random secret per
process would give away unknown keys to anyone comparing two brokers, or one broker across a restart.
It changes when the set of stored secrets changes (a user added, removed or re-keyed).
"""

from __future__ import annotations

import hashlib
import hmac
from collections import Counter
from typing import Iterable

from txbroker.broker.auth.scram_secret import DEFAULT_ITERATIONS, ScramSecret

_SALT_LEN = 32  # scramp's default salt length


class Decoys:
    def __init__(self, secrets: Iterable[ScramSecret]):
        secrets = list(secrets)
        self._key = hashlib.sha256(b"txbroker scram decoy\0" + b"".join(sorted(s.server_key for s in secrets))).digest()
        shapes = Counter((len(s.salt), s.iterations) for s in secrets).most_common(1)
        self._salt_len, self._iterations = shapes[0][0] if shapes else (_SALT_LEN, DEFAULT_ITERATIONS)

    def secret(self, access_key: str) -> ScramSecret:
        """The stand-in stored secret of `access_key` (no secret of anyone's matches it)."""
        key = access_key.encode()
        salt = b"".join(self._mac(b"salt", i, key) for i in range(-(-self._salt_len // 32)))[:self._salt_len]
        return ScramSecret(salt, self._mac(b"stored", 0, key), self._mac(b"server", 0, key), self._iterations)

    def _mac(self, label: bytes, i: int, access_key: bytes) -> bytes:
        return hmac.digest(self._key, b"%s\0%d\0%s" % (label, i, access_key), "sha256")
