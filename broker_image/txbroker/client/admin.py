"""A small blocking client for the broker's admin API, the one every part uses (the CLI, Spark, the
chaos harness, the bench, tests). Its typed methods decode the answers into protocol/admin.py's
Structs; an answer that does not decode (a broker of another version) raises AdminIncompatible.

With `credentials` it sends HTTP Basic (access key and secret; the broker checks them against the
same hashed store as the data plane, and wants the admin permission under /api/). With `tls` it
speaks HTTPS, verifying the broker with the CA given and presenting a client certificate if one is
given (the broker may require one under /api/).
"""

from __future__ import annotations

import base64
import json
import shutil
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import TypeVar

import msgspec

from txbroker.client.errors import BrokerUnavailable, ClientError
from txbroker.client.security import as_credentials, as_tls, tls_error
from txbroker.protocol import admin as answers
from txbroker.protocol.bodies import typed_decoder
from txbroker.store.backup import Manifest

T = TypeVar("T")

# one JSON decoder per answer type, made before any thread uses it (bodies.typed_decoder says why:
# the console and the operator call this client from several threads at once)
_json_decoders: dict = {}


def _json_decoder(answer_type):
    return _json_decoders.get(answer_type) or typed_decoder(_json_decoders, msgspec.json.Decoder, answer_type)


class AdminError(ClientError):
    def __init__(self, status: int, code: str, message: str):
        self.status = status
        self.code = code
        super().__init__(f"{message} ({code or status})")


class AdminIncompatible(AdminError):
    """The broker answered, in a form this client cannot read: a broker of another version."""

    def __init__(self, url: str, path: str, error: Exception):
        super().__init__(200, "INCOMPATIBLE", f"{url}{path} answered in a form this client cannot read ({error}); "
                                              f"are the broker and this client of different versions?")


class AdminClient:
    def __init__(self, url: str, timeout: float = 10.0, *, credentials=None, tls=None):
        self.tls = as_tls(tls)
        if "://" not in url:
            url = ("https://" if self.tls is not None else "http://") + url
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._ssl = self.tls.context() if self.tls is not None else None
        creds = as_credentials(credentials)
        self._auth = None
        if creds is not None:
            token = base64.b64encode(f"{creds.access_key}:{creds.secret_key}".encode()).decode()
            self._auth = f"Basic {token}"

    def request(self, method: str, path: str, body=None):
        """The answer as plain JSON (dicts and lists), or text for a non-JSON answer (metrics)."""
        raw, ctype = self._exchange(method, path, body)
        return json.loads(raw) if "json" in ctype else raw.decode()

    def answer(self, method: str, path: str, answer_type: type[T], body=None) -> T:
        """The answer decoded as `answer_type` (a protocol/admin.py Struct, or a dict or list of them)."""
        raw, _ctype = self._exchange(method, path, body)
        try:
            return _json_decoder(answer_type).decode(raw)
        except msgspec.ValidationError as e:
            raise AdminIncompatible(self.url, path, e) from None

    def _exchange(self, method: str, path: str, body, sink=None) -> tuple[bytes, str]:
        """The answer's body and content type; with `sink` (a binary file) a success's body is
        written there as it arrives instead (a backup's files: larger than memory should hold)."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data else {}
        if self._auth is not None:
            headers["Authorization"] = self._auth
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._ssl) as resp:
                ctype = resp.headers.get("Content-Type", "")
                if sink is None:
                    raw = resp.read()
                else:
                    raw = b""
                    shutil.copyfileobj(resp, sink, 1 << 20)
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                doc = json.loads(raw)
                raise AdminError(e.code, doc.get("code", ""), doc.get("error", raw.decode())) from None
            except ValueError:
                raise AdminError(e.code, "", raw.decode(errors="replace")) from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, ssl.SSLError):
                raise tls_error(self.url, e.reason) from None
            raise BrokerUnavailable(f"admin API at {self.url} unreachable: {e.reason}") from None
        except ssl.SSLError as e:
            raise tls_error(self.url, e) from None
        except OSError as e:
            raise BrokerUnavailable(f"admin API at {self.url} unreachable: {getattr(e, 'reason', e)}") from None
        return raw, ctype

    def get(self, path: str):
        return self.request("GET", path)

    def post(self, path: str, body=None):
        return self.request("POST", path, body if body is not None else {})

    def put(self, path: str, body):
        return self.request("PUT", path, body)

    # ---- typed: one method per admin answer (protocol/admin.py) ----------------------------------

    def broker_info(self) -> answers.BrokerInfo:
        return self.answer("GET", "/api/v1/broker", answers.BrokerInfo)

    def change_role(self, role: str, epoch: int, master: str = "") -> answers.BrokerInfo:
        body = {"role": role, "epoch": epoch, **({"master": master} if master else {})}
        return self.answer("POST", "/api/v1/role", answers.BrokerInfo, body)

    def forget_slave(self, name: str) -> answers.BrokerInfo:
        """Tell this master that its slave `name` is gone for good (store lost, group scaled down):
        a restart's probation no longer waits for it; what only it held is lost."""
        return self.answer("DELETE", f"/api/v1/replication/slaves/{name}", answers.BrokerInfo)

    def handover(self, successor: str, epoch: int, timeout_ms: int = 5000) -> answers.Handover:
        """A planned switchover: this (master) broker stops taking writes, waits until `successor`
        (one of its slaves, by name or HOST:PORT) holds its log to the end, and becomes its slave;
        then promote the successor at `epoch` (change_role)."""
        return self.answer("POST", "/api/v1/handover", answers.Handover,
                           {"successor": successor, "epoch": epoch, "timeout_ms": timeout_ms})

    def groups(self) -> dict[str, answers.GroupSettings]:
        return self.answer("GET", "/api/v1/groups", dict[str, answers.GroupSettings])

    def put_group(self, group: str, settings: dict, generation: int = 0) -> answers.GroupSettings:
        return self.answer("PUT", f"/api/v1/groups/{_quote(group)}/transaction", answers.GroupSettings,
                           {**settings, "generation": generation})

    def put_transaction_defaults(self, settings: dict) -> answers.TransactionSettings:
        return self.answer("PUT", "/api/v1/config/transaction", answers.TransactionSettings, settings)

    def topics(self) -> answers.TopicList:
        return self.answer("GET", "/api/v1/topics", answers.TopicList)

    def topic(self, name: str) -> answers.TopicInfo:
        return self.answer("GET", f"/api/v1/topics/{_quote(name)}", answers.TopicInfo)

    def create_topic(self, name: str, queues: int = 0) -> answers.TopicCreated:
        return self.answer("POST", "/api/v1/topics", answers.TopicCreated, {"name": name, "queues": queues})

    def transactions(self, state: str = "all", group: str | None = None, limit: int | None = None
                     ) -> answers.TransactionList:
        query = {"state": state, **({"group": group} if group else {}), **({"limit": limit} if limit is not None else {})}
        return self.answer("GET", "/api/v1/transactions?" + urllib.parse.urlencode(query), answers.TransactionList)

    def transaction(self, transaction_id: str) -> answers.Transaction:
        return self.answer("GET", f"/api/v1/transactions/{_quote(transaction_id)}", answers.Transaction)

    def act_on_transaction(self, transaction_id: str, action: str, force: bool = False) -> answers.TransactionAction:
        """`action`: commit, rollback or resume (a parked one). `force`: end a participant of a
        spanning transaction against its home group (it tears the transaction: the answer says so)."""
        return self.answer("POST", f"/api/v1/transactions/{_quote(transaction_id)}/{action}"
                           + ("?force=true" if force else ""), answers.TransactionAction, {})

    def jobs(self, state: str = "all", group: str | None = None, limit: int | None = None) -> answers.JobList:
        query = {"state": state, **({"group": group} if group else {}), **({"limit": limit} if limit is not None else {})}
        return self.answer("GET", "/api/v1/jobs?" + urllib.parse.urlencode(query), answers.JobList)

    def job(self, job_id: str) -> answers.JobDetail:
        return self.answer("GET", f"/api/v1/jobs/{_quote(job_id)}", answers.JobDetail)

    def job_named(self, name: str) -> answers.JobDetail:
        """The newest job of this name on the broker (a name belongs to a job at its home group), or
        AdminError 404 QUERY_NOT_FOUND."""
        found = self.answer("GET", "/api/v1/jobs?" + urllib.parse.urlencode({"name": name, "limit": 1}),
                            answers.JobList)
        if not found.jobs:
            raise AdminError(404, "QUERY_NOT_FOUND", f"no job named {name!r} at {self.url}")
        return self.job(found.jobs[0].job_id)

    def cluster_info(self) -> answers.ClusterInfo:
        """The broker's group and the cluster route it serves ("" and none outside a cluster of groups)."""
        return self.answer("GET", "/api/v1/cluster", answers.ClusterInfo)

    def decide_job(self, job_id: str, action: str, members: list[str] | None = None) -> answers.Job:
        """`action`: commit (the prepared list, or `members`) or abort."""
        return self.answer("POST", f"/api/v1/jobs/{_quote(job_id)}/{action}", answers.Job,
                           {"members": members} if members is not None else {})

    def message(self, msg_id: str) -> answers.StoredMessage:
        return self.answer("GET", f"/api/v1/messages/{_quote(msg_id)}", answers.StoredMessage)

    def check_scan(self) -> answers.ScanResult:
        return self.answer("POST", "/api/v1/check-scan", answers.ScanResult, {})

    def connections(self) -> answers.ConnectionList:
        return self.answer("GET", "/api/v1/connections", answers.ConnectionList)

    def create_backup(self) -> Manifest:
        """A slave in sync makes a consistent copy of its store (a master, or a slave not in sync,
        refuses: AdminError 409 NOT_IN_SYNC, naming why); fetch its files, then drop_backup."""
        return self.answer("POST", "/api/v1/backups", Manifest, {})

    def fetch_backup_file(self, backup_id: str, name: str, sink) -> None:
        """One file of a backup, written into the binary file `sink`."""
        self._exchange("GET", f"/api/v1/backups/{_quote(backup_id)}/files/{_quote(name)}", None, sink)

    def drop_backup(self, backup_id: str) -> None:
        self.request("DELETE", f"/api/v1/backups/{_quote(backup_id)}")

    def whoami(self) -> answers.Identity:
        """Who these credentials are on the broker, and whether they may write (admin) or only read (monitor)."""
        return self.answer("GET", "/api/v1/whoami", answers.Identity)


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")
