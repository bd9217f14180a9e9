"""Credentials and TLS towards a secured broker: the data source's options, the orders job's
flags, and the environment, resolved into one `BrokerSecurity`.

    option          flag (orders job)            environment
    accessKey       --access-key                 TXBROKER_ACCESS_KEY        the access key (SCRAM-SHA-256)
    secretKeyFile   --secret-key-file            TXBROKER_SECRET_KEY_FILE   a file holding the secret, readable
                                                                            on the driver and every executor
    secretKey       (none: never a flag)         TXBROKER_SECRET_KEY        the secret itself
    tls             --tls                        TXBROKER_TLS=1             TLS trusting the system's CAs
    tlsCaFile       --tls-ca                     TXBROKER_TLS_CA            CA bundle for the broker's
                                                                            certificate (turns TLS on)
    tlsCertFile     --tls-cert                   TXBROKER_TLS_CERT          client certificate
    tlsKeyFile      --tls-key                    TXBROKER_TLS_KEY           its key (if not in tlsCertFile)
    tlsServerName   --tls-server-name            TXBROKER_TLS_SERVER_NAME   the name the certificate must carry
                                                                            (default: the broker's host)

The environment is a fallback per group: when none of accessKey / secretKey / secretKeyFile is given,
all three come from the environment; likewise for the TLS settings. Spark checks a Python data
source's options in a Python worker that the driver's JVM starts, so that is the environment of the
driver's JVM (the pod's, or the driver program's when it started the session: a variable set in the
driver's Python after the session started does not reach it). The secret is
read where a connection is made: a secretKeyFile on the driver when the options are checked and when
it commits, and on each executor by its tasks (so the path must exist there too: a mounted Secret),
which also picks up a rotated secret. Nothing here prints a secret: the dataclass leaves it out of
its repr, errors name the option and the file, never the content.
"""

from __future__ import annotations

import os
import socket
import ssl
from dataclasses import dataclass, field

from txbroker.client.errors import AuthenticationError, BrokerError, TlsHandshakeError, TlsRequired
from txbroker.client.security import Credentials, TlsConfig
from txbroker.protocol.codes import ResponseCode
from txbroker.protocol.names import ACCESS_KEY, ACCESS_KEY_RULE

from txbroker_spark.option_values import OptionError, option_value

CREDENTIAL_OPTIONS = ("accessKey", "secretKey", "secretKeyFile")
TLS_OPTIONS = ("tls", "tlsCaFile", "tlsCertFile", "tlsKeyFile", "tlsServerName")
ENV = {"accessKey": "TXBROKER_ACCESS_KEY", "secretKey": "TXBROKER_SECRET_KEY",
       "secretKeyFile": "TXBROKER_SECRET_KEY_FILE", "tls": "TXBROKER_TLS", "tlsCaFile": "TXBROKER_TLS_CA",
       "tlsCertFile": "TXBROKER_TLS_CERT", "tlsKeyFile": "TXBROKER_TLS_KEY",
       "tlsServerName": "TXBROKER_TLS_SERVER_NAME"}
FLAGS = {"accessKey": "--access-key", "secretKeyFile": "--secret-key-file", "tls": "--tls", "tlsCaFile": "--tls-ca",
         "tlsCertFile": "--tls-cert", "tlsKeyFile": "--tls-key", "tlsServerName": "--tls-server-name"}
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


@dataclass(frozen=True)
class BrokerSecurity:
    """How to reach a broker: credentials (a secret, or a file holding it) and TLS. Picklable (it
    travels to the executors with the write options); its repr never shows the secret."""

    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    secret_key_file: str | None = None
    credentials_from_env: bool = False
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None
    tls_from_env: bool = False

    @property
    def secret_option(self) -> str:
        return "secretKeyFile" if self.secret_key_file else "secretKey"

    def error(self, option: str, problem: str) -> OptionError:
        """An OptionError naming the option, or the environment variable it came from."""
        from_env = self.tls_from_env if option in TLS_OPTIONS else self.credentials_from_env
        return OptionError(option, problem, source=ENV[option] if from_env else None)

    # ---- what the client library takes -------------------------------------------------------

    def credentials(self) -> Credentials | None:
        """The credentials, the secret read now (from the file, on the host that connects)."""
        if not self.access_key:
            return None
        secret = self.secret_key
        if self.secret_key_file:
            secret = read_secret_file(self.secret_key_file, lambda p: self.error("secretKeyFile", p))
        return Credentials(self.access_key, secret)

    def tls_config(self) -> TlsConfig | None:
        if not self.tls:
            return None
        return TlsConfig(ca_file=self.ca_file, cert_file=self.cert_file, key_file=self.key_file,
                         server_hostname=self.server_name)

    def client_kwargs(self) -> dict:
        """credentials= and tls= for the txbroker client classes."""
        return {"credentials": self.credentials(), "tls": self.tls_config()}

    def describe(self) -> str:
        """For logs: who and how, never the secret."""
        who = "no credentials"
        if self.access_key:
            origin = "the environment" if self.credentials_from_env else "the options"
            who = f"access key {self.access_key!r} (secret from {self.secret_key_file or origin})"
        how = "plaintext"
        if self.tls:
            how = "TLS (" + ", ".join(x for x in (
                f"CA {self.ca_file}" if self.ca_file else "the system's CAs",
                f"client certificate {self.cert_file}" if self.cert_file else "",
                f"server name {self.server_name}" if self.server_name else "") if x) + ")"
        return f"{who}, {how}"

    # ---- checks on the driver ----------------------------------------------------------------

    def check_files(self) -> None:
        """Read the secret file and load the TLS files now, so that a wrong path or a broken
        certificate fails before any task runs, naming the option."""
        self.credentials()
        if not self.tls:
            return
        if self.ca_file:
            _readable(self, "tlsCaFile", self.ca_file)
            try:
                ssl.create_default_context(cafile=self.ca_file)
            except (ssl.SSLError, ValueError) as e:
                raise self.error("tlsCaFile", f"{self.ca_file} is not a PEM CA bundle: {e}") from None
        if self.cert_file:
            _readable(self, "tlsCertFile", self.cert_file)
            if self.key_file:
                _readable(self, "tlsKeyFile", self.key_file)
            try:
                ssl.create_default_context().load_cert_chain(self.cert_file, self.key_file)
            except (ssl.SSLError, ValueError) as e:
                option = "tlsKeyFile" if self.key_file else "tlsCertFile"
                raise self.error(option, f"cannot load the client certificate {self.cert_file} with the key "
                                         f"{self.key_file or '(in the same file)'}: {e}") from None

    # ---- the broker said no ------------------------------------------------------------------

    def refusal(self, e: Exception) -> OptionError | None:
        """An OptionError that says which setting to fix when the broker refused these credentials
        or this TLS setup (None for other errors)."""
        where = getattr(e, "broker", None) or "the broker"
        if isinstance(e, AuthenticationError):
            if not self.access_key:
                return self.error("accessKey", (
                    f"the broker at {where} requires credentials ({e.remark}); set accessKey with "
                    "secretKeyFile (or secretKey); flags --access-key with --secret-key-file; or the environment, "
                    "TXBROKER_ACCESS_KEY with TXBROKER_SECRET_KEY_FILE (or TXBROKER_SECRET_KEY)"))
            return self.error(self.secret_option, (
                f"the broker at {where} refused the credentials of access key {self.access_key!r}: {e.remark} "
                "(a wrong secret and an unknown access key get the same answer)"))
        if isinstance(e, TlsRequired):
            return self.error("tlsCaFile", f"the broker at {where} accepts TLS connections only: set tlsCaFile to "
                                           "the CA that signed its certificate (or tls=true for the system's CAs)")
        if isinstance(e, TlsHandshakeError):
            text = str(e)
            upper = text.upper()
            if "MISMATCH" in upper or "HOSTNAME" in upper:
                option = "tlsServerName"
            elif "CLIENT CERTIFICATE" in upper or "CERTIFICATE_REQUIRED" in upper:
                option = "tlsCertFile"
            elif "SPEAK TLS" in upper or "WRONG_VERSION_NUMBER" in upper:
                option = "tls"
            else:
                option = "tlsCaFile"
            return self.error(option, text)
        if isinstance(e, BrokerError) and e.code == ResponseCode.NO_PERMISSION:
            return self.error("accessKey", f"the broker at {where} refused access key {self.access_key!r}: "
                                           f"{e.remark} (its rights are in the broker's credentials file)")
        return None


def read_secret_file(path: str, error) -> str:
    """The secret in `path` (one line; a trailing newline is not part of it). `error(problem)` makes
    the exception; the problem names the file and host, never the content."""
    try:
        with open(path, encoding="utf-8") as f:
            secret = f.read().rstrip("\r\n")
    except OSError as e:
        raise error(f"cannot read {path} on {socket.gethostname()}: {e.strerror or e} (a Spark job needs it readable "
                    "on the driver and on every executor, e.g. a Secret mounted in both)") from None
    except UnicodeDecodeError:
        raise error(f"{path} is not UTF-8 text") from None
    if not secret:
        raise error(f"{path} is empty")
    return secret


def _readable(sec: BrokerSecurity, option: str, path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise sec.error(option, f"cannot read {path} on {socket.gethostname()}: {e.strerror or e}") from None


def _flag(value: str, option: str, source: str | None) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise OptionError(option, f"must be true or false, got {value!r}", source=source)


def parse_security(options, environ=None) -> BrokerSecurity:
    """Credentials and TLS from the options (a dict or Spark's case-insensitive options), or, per
    group, from the environment. Raises OptionError naming the option (or variable)."""
    environ = os.environ if environ is None else environ
    given = {name: option_value(options, name) for name in CREDENTIAL_OPTIONS + TLS_OPTIONS}

    cred_env = not any(given[n] is not None for n in CREDENTIAL_OPTIONS)
    if cred_env:
        for n in CREDENTIAL_OPTIONS:
            given[n] = (environ.get(ENV[n]) or "").strip() or None
    src = (lambda n: ENV[n]) if cred_env else (lambda n: None)
    key, secret, secret_file = given["accessKey"], given["secretKey"], given["secretKeyFile"]
    if cred_env and key is None:  # as the client library's Credentials.from_env: the access key decides
        secret = secret_file = None
    if key is not None and not ACCESS_KEY.match(key):
        raise OptionError("accessKey", f"must be {ACCESS_KEY_RULE}, got {key!r}", source=src("accessKey"))
    if secret is not None and secret_file is not None:
        raise OptionError("secretKey", "give either secretKey or secretKeyFile, not both (secretKeyFile keeps the "
                                       "secret out of Spark's plans and logs)", source=src("secretKey"))
    if key is None and (secret is not None or secret_file is not None):
        n = "secretKey" if secret is not None else "secretKeyFile"
        raise OptionError("accessKey", f"is required with {src(n) or n}: the access key the secret belongs to",
                          source=src("accessKey"))
    if key is not None and secret is None and secret_file is None:
        raise OptionError("secretKeyFile", f"is required with {src('accessKey') or 'accessKey'}: a file holding the "
                                           "secret (or secretKey, or TXBROKER_SECRET_KEY_FILE / TXBROKER_SECRET_KEY)",
                          source=src("secretKeyFile"))

    tls_env = not any(given[n] is not None for n in TLS_OPTIONS)
    if tls_env:
        for n in TLS_OPTIONS:
            given[n] = (environ.get(ENV[n]) or "").strip() or None
    tsrc = (lambda n: ENV[n]) if tls_env else (lambda n: None)
    files = {n: given[n] for n in ("tlsCaFile", "tlsCertFile", "tlsKeyFile")}
    tls_flag = _flag(given["tls"], "tls", tsrc("tls")) if given["tls"] is not None else None
    if tls_flag is False and any(files.values()):
        n = next(n for n, v in files.items() if v)
        raise OptionError("tls", f"is false, but {tsrc(n) or n} is given (which turns TLS on)", source=tsrc("tls"))
    if files["tlsKeyFile"] and not files["tlsCertFile"]:
        raise OptionError("tlsCertFile", "is required with tlsKeyFile: the client certificate the key belongs to",
                          source=tsrc("tlsCertFile"))
    tls_on = bool(tls_flag) or bool(files["tlsCaFile"] or files["tlsCertFile"])
    if given["tlsServerName"] is not None and not tls_on:
        raise OptionError("tlsServerName", "is for TLS: give tlsCaFile (or tls=true) too", source=tsrc("tlsServerName"))

    def path(n):
        v = files[n]
        return os.path.abspath(os.path.expanduser(v)) if v else None

    return BrokerSecurity(
        access_key=key, secret_key=secret,
        secret_key_file=os.path.abspath(os.path.expanduser(secret_file)) if secret_file else None,
        credentials_from_env=cred_env and key is not None,
        tls=tls_on, ca_file=path("tlsCaFile"), cert_file=path("tlsCertFile"), key_file=path("tlsKeyFile"),
        server_name=given["tlsServerName"], tls_from_env=tls_env and tls_on)


# ---- the same settings as command-line flags (the orders job) ------------------------

def add_arguments(p) -> None:
    g = p.add_argument_group("credentials and TLS, for a broker that requires them (default: the environment, "
                             "TXBROKER_ACCESS_KEY, TXBROKER_SECRET_KEY_FILE or TXBROKER_SECRET_KEY, TXBROKER_TLS_CA, "
                             "TXBROKER_TLS_CERT, TXBROKER_TLS_KEY, TXBROKER_TLS_SERVER_NAME, TXBROKER_TLS=1)")
    g.add_argument("--access-key", help="access key; the secret from --secret-key-file (or TXBROKER_SECRET_KEY)")
    g.add_argument("--secret-key-file", "--secret-file", dest="secret_key_file",
                   help="file holding the secret of --access-key (a secret is never a flag)")
    g.add_argument("--tls", action="store_const", const="true", default=None, help="TLS with the system's CAs")
    g.add_argument("--tls-ca", help="CA bundle to check the broker's certificate with (turns TLS on)")
    g.add_argument("--tls-cert", help="client certificate, for brokers that require one")
    g.add_argument("--tls-key", help="key of --tls-cert (if not in the same file)")
    g.add_argument("--tls-server-name", help="name the broker's certificate must carry (default: its host)")


_ARG_OF = {"accessKey": "access_key", "secretKeyFile": "secret_key_file", "tls": "tls", "tlsCaFile": "tls_ca",
           "tlsCertFile": "tls_cert", "tlsKeyFile": "tls_key", "tlsServerName": "tls_server_name"}


def options_from_args(args) -> dict[str, str]:
    """The flags that were given, as data source options (the rest falls back to the environment)."""
    return {opt: str(getattr(args, attr)) for opt, attr in _ARG_OF.items() if getattr(args, attr, None)}


def flag_message(e: OptionError) -> str:
    """An OptionError said in terms of the command line: the flag, or the environment variable."""
    name = e.source or FLAGS.get(e.option, e.option)
    return f"{name}: {e.problem}"


def from_args(args, parser=None, environ=None) -> BrokerSecurity:
    """Resolve and check the flags (and the environment); a problem exits through parser.error."""
    try:
        sec = parse_security(options_from_args(args), environ)
        sec.check_files()
        return sec
    except OptionError as e:
        if parser is None:
            raise
        parser.error(flag_message(e))
        raise  # pragma: no cover - parser.error exits
