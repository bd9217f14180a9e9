"""Authentication and authorisation of the data plane and the admin plane.

Why SCRAM-SHA-256 (RFC 5802/7677, as Kafka's SASL/SCRAM) and not RocketMQ's signed requests:
RocketMQ's ACL has the client sign every request with HMAC(secret), so the broker must hold the
secret itself to check the signature; "stored hashed" would then be false. SCRAM stores only a
salted, iterated hash (StoredKey and ServerKey, never the secret), the secret never crosses the
wire, and the server proves it knows the stored key too (the client checks the server's
signature). It authenticates a connection once; every request after that is authorised against the
connection's identity by one dict lookup and cached pattern matches, so the send/commit hot path
pays no cryptography. The SCRAM state machine is the `scramp` library's, not ours.

The pieces, one job each:
  scram_secret.py  the stored form of a secret ("SCRAM-SHA-256$iterations:salt$StoredKey:ServerKey")
  acl.py           permissions (topic patterns PUB/SUB, producer and consumer groups, admin,
                   replication) and the Principal a connection acts as
  credentials.py   the credentials file (TOML) -> principals, with errors naming the entry
  handshake.py     the server side of one SCRAM exchange
  decoy.py         stand-in salts for unknown access keys, so step 1 does not tell which keys exist
  service.py       the current principals, reload, per-request admission, HTTP Basic checks
"""

from txbroker.broker.auth.acl import OPEN_ACCESS, Principal
from txbroker.broker.auth.credentials import CredentialsError, load_credentials
from txbroker.broker.auth.scram_secret import ScramSecret, hash_secret
from txbroker.broker.auth.service import AuthService

__all__ = ["OPEN_ACCESS", "AuthService", "CredentialsError", "Principal", "ScramSecret", "hash_secret",
           "load_credentials"]
