"""The stored form of a secret: what SCRAM-SHA-256 needs to check a client, and nothing that would
let anyone log in with it.

Text form, as PostgreSQL stores SCRAM verifiers (so existing tooling and eyes recognise it):

    SCRAM-SHA-256$<iterations>:<salt, base64>$<StoredKey, base64>:<ServerKey, base64>

StoredKey = SHA-256(HMAC(SaltedPassword, "Client Key")), ServerKey = HMAC(SaltedPassword,
"Server Key"), SaltedPassword = PBKDF2-HMAC-SHA-256(secret, salt, iterations). The derivation is
scramp's (`ScramMechanism.make_auth_info`).
"""

from __future__ import annotations

import base64
import binascii
import hmac
from dataclasses import dataclass

from scramp import ScramException, ScramMechanism

MECHANISM = "SCRAM-SHA-256"
DEFAULT_ITERATIONS = 4096  # RFC 7677's minimum, Kafka's and PostgreSQL's default
_mechanism = ScramMechanism(MECHANISM)


@dataclass(frozen=True, slots=True)
class ScramSecret:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def encode(self) -> str:
        b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
        return f"{MECHANISM}${self.iterations}:{b64(self.salt)}${b64(self.stored_key)}:{b64(self.server_key)}"

    @classmethod
    def parse(cls, text: str) -> "ScramSecret":
        """Raises ValueError saying what is wrong with `text` (never echoing it: it is sensitive)."""
        try:
            mech, params, keys = text.split("$")
            iterations, salt = params.split(":")
            stored, server = keys.split(":")
        except ValueError:
            raise ValueError(f"not a {MECHANISM} secret: expected "
                             f"'{MECHANISM}$ITERATIONS:SALT$STOREDKEY:SERVERKEY' (txbroker auth hash makes one)") from None
        if mech != MECHANISM:
            raise ValueError(f"unsupported mechanism {mech!r}: only {MECHANISM}")
        if not iterations.isdigit() or not 4096 <= int(iterations) <= 10_000_000:
            raise ValueError("iterations must be a number between 4096 and 10000000")
        try:
            s = cls(base64.b64decode(salt, validate=True), base64.b64decode(stored, validate=True),
                    base64.b64decode(server, validate=True), int(iterations))
        except binascii.Error:
            raise ValueError("salt and keys must be base64") from None
        if len(s.stored_key) != 32 or len(s.server_key) != 32 or not s.salt:
            raise ValueError("StoredKey and ServerKey must be 32 bytes and the salt not empty")
        return s

    def verify(self, secret: str) -> bool:
        """Whether `secret` is the one this was made from (for HTTP Basic on the admin plane)."""
        try:
            _salt, stored, _server, _i = _mechanism.make_auth_info(secret, self.iterations, self.salt)
        except ScramException:
            return False
        return hmac.compare_digest(stored, self.stored_key)


def hash_secret(secret: str, iterations: int = DEFAULT_ITERATIONS) -> ScramSecret:
    """A new random salt and the keys derived from `secret`."""
    if not secret:
        raise ValueError("the secret must not be empty")
    salt, stored, server, i = _mechanism.make_auth_info(secret, iterations)
    return ScramSecret(salt, stored, server, i)
