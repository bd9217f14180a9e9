"""The admin plane (aiohttp): health, readiness, Prometheus metrics, and a JSON API for role,
configuration, topics, transactions and messages. The operator and the CLI use it.

Security: /healthz, /readyz and /metrics stay open (kubelet probes and Prometheus scrapers carry no
credentials; they reveal no message data). Everything under /api/ needs, when the broker has
--auth-file, HTTP Basic credentials (access key:secret, checked against the same hashed store as
the data plane) of a user with the admin permission (or, for GET requests only, the monitor
permission, except a backup's files; /api/v1/whoami answers any authenticated user): 401 without or with wrong credentials,
403 without the permission; and, when the broker has --tls-client-ca, a verified client certificate.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import inspect
import json
import logging
import time

import msgspec
from aiohttp import web

from txbroker import __version__
from txbroker.store.records import READABLE_FORMATS, STORE_FORMAT_VERSION
from txbroker.broker.auth.handshake import AuthFailure
from txbroker.broker.backup import BackupRefused
from txbroker.broker.drain import drain_status
from txbroker.protocol import admin as answers
from txbroker.protocol.admin import SettingsError
from txbroker.broker.replies import Reply, RequestError
from txbroker.protocol.bodies import DecideJobRequest, EndTransactionRequest, QueryJobRequest
from txbroker.protocol.codes import ResponseCode, TransactionState
from txbroker.store import keys
from txbroker.store.records import JOB_OPEN, JOB_PREPARED, PARKED, PREPARED

log = logging.getLogger(__name__)

_HTTP_STATUS = {
    ResponseCode.QUERY_NOT_FOUND: 404,
    ResponseCode.TOPIC_NOT_EXIST: 404,
    ResponseCode.TRANSACTION_SHOULD_COMMIT: 409,
    ResponseCode.TRANSACTION_SHOULD_ROLLBACK: 409,
    ResponseCode.ILLEGAL_OPERATION: 409,
    ResponseCode.SLAVE_NOT_AVAILABLE: 503,
    ResponseCode.SERVICE_NOT_AVAILABLE: 503,
    ResponseCode.NO_PERMISSION: 403,
    ResponseCode.UNAUTHORIZED: 401,
}


def _answer(answer, status: int = 200) -> web.Response:
    """A typed answer (protocol/admin.py) as JSON."""
    return web.Response(body=answers.encode(answer), status=status, content_type="application/json")


def _error(status: int, message: str, code: str = "") -> web.Response:
    return _answer(answers.ErrorAnswer(message, code), status)


def _unauthorized(message: str) -> web.Response:
    r = _error(401, message, ResponseCode.UNAUTHORIZED.name)
    r.headers["WWW-Authenticate"] = 'Basic realm="txbroker", charset="UTF-8"'
    return r


def _names(value) -> bool:
    return isinstance(value, list) and all(isinstance(n, str) and n for n in value)


def _from_reply(reply: Reply, body=None) -> web.Response:
    if reply.code == ResponseCode.SUCCESS:
        return _answer(body) if body is not None else web.json_response({"ok": True})
    code = ResponseCode(reply.code)
    return _error(_HTTP_STATUS.get(code, 400), reply.remark, code.name)


async def _settled(reply) -> Reply:
    """A handler's reply as the data plane would send it: once its change is durable (a refusal
    of the kind a write gets now raises RequestError)."""
    if inspect.isawaitable(reply):
        reply = await reply
    if reply.durable is not None:
        await reply.durable
    return reply


def _pending(p) -> answers.PendingTransaction:
    return answers.PendingTransaction(p.transaction_id, p.producer_group, p.state, p.half_lsn, p.born_ms,
                                      p.message_count, p.checks, p.last_check_ms, p.immunity_ms, p.job_id,
                                      p.home, p.participants)


def _job(info) -> answers.Job:
    return answers.Job(**msgspec.structs.asdict(info))


def _group_settings(settings, generation: int) -> answers.GroupSettings:
    return answers.GroupSettings(**msgspec.structs.asdict(settings), generation=generation)


class AdminApp:
    def __init__(self, broker):
        self.b = broker
        app = self.app = web.Application(middlewares=[self._errors, self._guard])
        r = app.router
        r.add_get("/healthz", self.healthz)
        r.add_get("/readyz", self.readyz)
        r.add_get("/metrics", self.metrics)
        r.add_get("/api/v1/broker", self.broker_info)
        r.add_post("/api/v1/role", self.change_role)
        r.add_post("/api/v1/handover", self.handover)
        r.add_delete("/api/v1/replication/slaves/{name}", self.forget_slave)
        r.add_put("/api/v1/replication/sync-set", self.put_sync_set)
        r.add_post("/api/v1/backups", self.create_backup)
        r.add_get("/api/v1/backups/{backup_id}/files/{name}", self.backup_file)
        r.add_delete("/api/v1/backups/{backup_id}", self.drop_backup)
        r.add_get("/api/v1/config", self.get_config)
        r.add_put("/api/v1/config/transaction", self.put_transaction_defaults)
        r.add_get("/api/v1/groups", self.list_groups)
        r.add_put("/api/v1/groups/{group}/transaction", self.put_group_settings)
        r.add_delete("/api/v1/groups/{group}/transaction", self.delete_group_settings)
        r.add_get("/api/v1/topics", self.list_topics)
        r.add_post("/api/v1/topics", self.create_topic)
        r.add_get("/api/v1/topics/{topic}", self.get_topic)
        r.add_get("/api/v1/transactions", self.list_transactions)
        r.add_get("/api/v1/transactions/{txid}", self.get_transaction)
        r.add_post("/api/v1/transactions/{txid}/{action:commit|rollback|resume}", self.act_on_transaction)
        r.add_post("/api/v1/check-scan", self.check_scan)
        r.add_get("/api/v1/jobs", self.list_jobs)
        r.add_get("/api/v1/jobs/{job_id}", self.get_job)
        r.add_post("/api/v1/jobs/{job_id}/{action:commit|abort}", self.decide_job)
        r.add_get("/api/v1/messages/{msg_id}", self.get_message)
        r.add_get("/api/v1/connections", self.list_connections)
        r.add_get("/api/v1/whoami", self.whoami)
        r.add_get("/api/v1/cluster", self.cluster_info)
        r.add_get("/api/v1/drain", self.drain)

    @web.middleware
    async def _guard(self, request, handler):
        if not request.path.startswith("/api/"):
            return await handler(request)  # health, readiness, metrics: open
        if self.b.config.tls_client_ca and not request.transport.get_extra_info("peercert"):
            return _error(403, "a client certificate signed by the broker's client CA is required under /api/",
                          "CLIENT_CERTIFICATE_REQUIRED")
        auth = self.b.auth
        if auth is None:
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "basic" or not token:
            auth.failed("no_credentials")
            return _unauthorized("authentication required: HTTP Basic with an access key and secret")
        try:
            access_key, sep, secret = base64.b64decode(token, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            sep = ""
        if not sep:
            auth.failed("malformed")
            return _unauthorized("malformed HTTP Basic credentials: expected base64 of ACCESS_KEY:SECRET")
        got = auth.verify_basic(access_key, secret)
        if isinstance(got, AuthFailure):
            auth.failed(got.reason)
            return _unauthorized(got.remark)
        request["principal"] = got
        try:
            if request.path == "/api/v1/whoami":
                pass  # any authenticated user may ask who it is
            elif request.method in ("GET", "HEAD") and not request.path.startswith("/api/v1/backups/"):
                got.require_admin_read()  # (a backup's files are the whole store: admin only)
            else:
                got.require_admin()
        except RequestError as e:
            return _error(403, e.remark, ResponseCode(e.code).name)
        return await handler(request)

    @web.middleware
    async def _errors(self, request, handler):
        try:
            return await handler(request)
        except RequestError as e:
            return _error(_HTTP_STATUS.get(e.code, 400), e.remark, ResponseCode(e.code).name)
        except SettingsError as e:  # ConfigError too
            return _error(400, str(e), "INVALID_CONFIG")
        except json.JSONDecodeError as e:
            return _error(400, f"request body is not valid JSON: {e}", "MALFORMED")

    async def healthz(self, request):
        return web.Response(text="ok\n")

    async def readyz(self, request):
        if not self.b.ready:
            return web.Response(status=503, text="not ready\n")
        return web.Response(text="ready\n")

    async def metrics(self, request):
        pending, parked = self.b.transactions.counts()
        self.b.metrics.pending.set(pending)
        self.b.metrics.parked.set(parked)
        jobs = self.b.jobs.counts()
        for state in ("open", "prepared"):
            self.b.metrics.jobs_undecided.labels(state).set(jobs[state])
        # a PREPARED job at its home is aborted at its own bound unless decided (a member group's entry has none)
        bounds = [j.prepared_deadline_ms for j in self.b.state.jobs.values()
                  if j.state == JOB_PREPARED and not j.home and j.prepared_deadline_ms]
        self.b.metrics.jobs_prepared_nearest_bound.set(
            max(0.0, (min(bounds) - time.time() * 1000) / 1000) if bounds else None)
        return web.Response(body=self.b.metrics.render(), content_type="text/plain", charset="utf-8")

    def info(self) -> answers.BrokerInfo:
        b = self.b
        pending, parked = b.transactions.counts()
        return answers.BrokerInfo(
            broker_name=b.config.broker_name, version=__version__, role=b.role.role, epoch=b.role.epoch,
            master=b.role.master_address, log_end_offset=b.state.next_lsn - 1, durable_offset=b.state.durable_lsn,
            local_durable_offset=b.state.local_durable_lsn, log_start_offset=b.state.log_complete_from,
            flush_disk_type=b.config.flush_disk_type, pending_transactions=pending, parked_transactions=parked,
            topics=len(b.state.topics), connections=len(b.connections), producer_groups=b.producers.counts(),
            consumer_groups=b.consumers.groups(), recovery_seconds=round(b.state.recovery_seconds, 4),
            fenced_by=b.role.fenced_by, replication=b.replication_status(),
            security=answers.Security(b.auth.status() if b.auth is not None else None, b.tls.data is not None,
                                      bool(b.config.tls_client_ca)),
            limits=answers.Limits(b.config.max_connections, b.config.max_unacked_bytes, b.unacked.used,
                                  b.config.idle_timeout_ms, b.config.max_inflight_per_connection),
            retention_mark_offset=b.retention.newest_mark_lsn, synced_offset=b.wal_sync.synced_lsn,
            probation=b.role.probation, unconfirmed=b.role.unconfirmed, stepped_down=b.role.stepped_down,
            store_format=STORE_FORMAT_VERSION, readable_formats=sorted(READABLE_FORMATS), handover=b.role.handover,
        )

    async def broker_info(self, request):
        return _answer(self.info())

    async def cluster_info(self, request):
        c = self.b.cluster
        return _answer(answers.ClusterInfo(c.group, c.route.as_dict() if c.route is not None else None, c.draining))

    async def drain(self, request):
        self.b.role.require_master()  # a slave's offsets lag its master's
        return _answer(drain_status(self.b))

    async def whoami(self, request):
        p = request.get("principal")
        if p is None:  # no authentication on this broker: everyone may do everything
            return _answer(answers.Identity("", False, True, False))
        return _answer(answers.Identity(p.access_key, True, p.perms.admin, p.perms.monitor))

    async def list_connections(self, request):
        """Every data-plane connection: who, how much in flight, whether the broker stopped reading it."""
        now = asyncio.get_running_loop().time()
        return _answer(answers.ConnectionList([c.describe(now) for c in list(self.b.connections)]))

    async def change_role(self, request):
        """{"role": "master", "epoch": E} promotes (E above this broker's epoch) or, at a master's own
        epoch, confirms it (a restarted master awaiting its controller's word); {"role": "slave",
        "master": ADDR, "epoch": E} demotes."""
        doc = await request.json()
        if not isinstance(doc, dict) or doc.get("role") not in ("master", "slave") or not isinstance(doc.get("epoch"), int):
            return _error(400, 'body must be {"role": "master"|"slave", "epoch": N[, "master": "HOST:PORT"]'
                               '[, "sync_set": [SLAVE, ...]]}', "MALFORMED")
        sync_set = doc.get("sync_set")
        if sync_set is not None and not _names(sync_set):
            return _error(400, f"sync_set must be a list of slave names, got {sync_set!r}", "MALFORMED")
        if doc["role"] == "master" and self.b.role.is_master and doc["epoch"] <= self.b.state.epoch:
            self.b.roles.confirm(doc["epoch"], sync_set)
        elif doc["role"] == "master":
            await self.b.roles.promote(doc["epoch"], sync_set)
        else:
            if not isinstance(doc.get("master"), str) or ":" not in doc["master"]:
                return _error(400, "demotion needs the new master's address as master: HOST:PORT", "MALFORMED")
            await self.b.roles.demote(doc["master"], doc["epoch"])
        return await self.broker_info(request)

    async def put_sync_set(self, request):
        """{"epoch": E, "slaves": [NAME, ...]}: under a controller, the slaves whose acknowledgements
        count for a SYNC write (the controller records them first: failover knows every slave that
        may hold an acknowledged write). Only at this master's own epoch: a controller that missed a
        promotion is refused."""
        doc = await request.json()
        if not isinstance(doc, dict) or not isinstance(doc.get("epoch"), int) or not _names(doc.get("slaves")):
            return _error(400, 'body must be {"epoch": N, "slaves": [SLAVE, ...]}', "MALFORMED")
        if not self.b.role.is_master or self.b.role.stepped_down:
            return _error(409, f"only a master counts slaves; this broker is "
                               f"{self.b.role.stepped_down or self.b.role.role}", "NOT_MASTER")
        if self.b.leader.approved is None:
            return _error(409, "this broker is not run under a controller (--await-role-confirmation): every "
                               "subscribed slave counts", "NOT_CONTROLLED")
        if doc["epoch"] != self.b.state.epoch:
            return _error(409, f"this master is at epoch {self.b.state.epoch}, not {doc['epoch']}", "EPOCH")
        self.b.leader.approve(doc["slaves"])
        return await self.broker_info(request)

    async def forget_slave(self, request):
        """A slave of this master gone for good (its store lost, the group scaled down): a restarted
        master's probation no longer waits for it. What only that slave held is lost with it."""
        if not self.b.role.is_master:
            return _error(409, f"only a master records its slaves; this broker is a {self.b.role.role}", "NOT_MASTER")
        name = request.match_info["name"]
        if not self.b.roles.forget_slave(name):
            return _error(404, f"no slave {name!r} is recorded at this master's epoch {self.b.state.epoch} "
                               f"(recorded: {', '.join(sorted(self.b.leader.slaves.of_epoch(self.b.state.epoch))) or 'none'})",
                          "NOT_FOUND")
        return await self.broker_info(request)

    async def handover(self, request):
        """{"successor": NAME or HOST:PORT, "epoch": E[, "timeout_ms": T]}: a planned switchover. This
        master takes no write until the successor (one of its slaves) holds its log to the end, then
        becomes its slave; the caller then promotes the successor at E (failover.py, hand_over)."""
        doc = await request.json()
        if not isinstance(doc, dict) or not isinstance(doc.get("successor"), str) or not doc["successor"] \
                or not isinstance(doc.get("epoch"), int) or not isinstance(doc.get("timeout_ms", 0), int):
            return _error(400, 'body must be {"successor": "<slave name or HOST:PORT>", "epoch": N'
                               '[, "timeout_ms": N]}', "MALFORMED")
        timeout_ms = doc.get("timeout_ms", 5000)
        if not 1 <= timeout_ms <= 120_000:
            return _error(400, f"timeout_ms must be between 1 and 120000, got {timeout_ms}", "MALFORMED")
        end = await self.b.roles.hand_over(doc["successor"], doc["epoch"], timeout_ms / 1000)
        return _answer(answers.Handover(successor=doc["successor"], epoch=doc["epoch"], offset=end,
                                        broker=self.info()))

    async def create_backup(self, request):
        """A slave in sync makes a consistent copy of its store and answers its manifest (broker/backup.py);
        the caller fetches the files, then DELETEs it. A master, or a slave not in sync, refuses (409)."""
        try:
            return _answer(await self.b.backups.create(), 201)
        except BackupRefused as e:
            return _error(e.status, str(e), e.code)

    async def backup_file(self, request):
        try:
            path = self.b.backups.file(request.match_info["backup_id"], request.match_info["name"])
        except BackupRefused as e:
            return _error(e.status, str(e), e.code)
        except ValueError as e:  # a name that is a path
            return _error(400, str(e), "MALFORMED")
        return web.FileResponse(path, headers={"Content-Type": "application/octet-stream"})

    async def drop_backup(self, request):
        try:
            self.b.backups.drop(request.match_info["backup_id"])
        except BackupRefused as e:
            return _error(e.status, str(e), e.code)
        return web.json_response({"ok": True})

    async def get_config(self, request):
        b = self.b
        doc = msgspec.to_builtins(b.config)
        doc["transaction"] = msgspec.to_builtins(b.settings.defaults)
        doc["groups"] = {g: _group_settings(s, b.settings.generations.get(g, 0))
                         for g, s in b.settings.groups.items()}
        doc["reject_transaction_message"] = b.transactions.reject_transaction_message
        return _answer(doc)

    async def put_transaction_defaults(self, request):
        merged = self.b.settings.update_defaults(await request.json())
        log.info("transaction defaults changed: %s", msgspec.to_builtins(merged))
        return _answer(merged)

    async def list_groups(self, request):
        s = self.b.settings
        return _answer({g: _group_settings(v, s.generations.get(g, 0)) for g, v in s.groups.items()})

    async def put_group_settings(self, request):
        group = request.match_info["group"]
        doc = await request.json()
        if not isinstance(doc, dict):
            raise SettingsError(f"groups.{group}: expected an object of settings")
        generation = doc.pop("generation", 0)
        if not isinstance(generation, int):
            raise SettingsError(f"groups.{group}.generation must be an integer")
        # Settings are log records: the master writes them, its slaves replicate them.
        self.b.role.require_master()
        merged, durable = self.b.settings.update_group(group, doc, generation)
        await durable
        log.info("transaction settings for group %s (generation %d): %s", group, generation, msgspec.to_builtins(merged))
        return _answer(_group_settings(merged, generation))

    async def delete_group_settings(self, request):
        group = request.match_info["group"]
        self.b.role.require_master()
        durable = self.b.settings.remove_group(group)
        if durable is None:
            return _error(404, f"group {group} has no settings of its own", "QUERY_NOT_FOUND")
        await durable
        return web.json_response({"ok": True})

    async def list_topics(self, request):
        return _answer(answers.TopicList([answers.TopicSummary(t, n) for t, n in sorted(self.b.state.topics.items())]))

    async def create_topic(self, request):
        doc = await request.json()
        name = doc.get("name") if isinstance(doc, dict) else None
        if not isinstance(name, str):
            return _error(400, "body must be {\"name\": TOPIC, \"queues\": N}", "MALFORMED")
        queues = doc.get("queues", 0)
        if not isinstance(queues, int):
            return _error(400, "queues must be an integer", "MALFORMED")
        self.b.role.require_master()
        created = self.b.topics.create(name, queues)
        await self.b.state.drain()
        return _answer(answers.TopicCreated(name, self.b.state.topics[name], created), 201 if created else 200)

    async def get_topic(self, request):
        name = request.match_info["topic"]
        count = self.b.topics.queue_count(name)
        if count is None:
            return _error(404, f"topic {name} does not exist", "TOPIC_NOT_EXIST")
        queues = [answers.QueueInfo(q, self.b.state.readable_end(name, q)) for q in range(count)]
        return _answer(answers.TopicInfo(name, queues))

    async def list_transactions(self, request):
        want = request.query.get("state", "all").upper()
        group = request.query.get("group")
        limit = int(request.query.get("limit", "1000"))
        states = {"ALL": (PREPARED, PARKED), "PENDING": (PREPARED,), "PREPARED": (PREPARED,), "PARKED": (PARKED,)}.get(want)
        if states is None:
            return _error(400, f"state must be pending, parked or all, got {want.lower()!r}", "MALFORMED")
        items = [p for p in self.b.state.pending_transactions() if p.state in states and (group is None or p.producer_group == group)]
        items.sort(key=lambda p: p.born_ms)
        return _answer(answers.TransactionList(len(items), [_pending(p) for p in items[:limit]]))

    async def get_transaction(self, request):
        txid = request.match_info["txid"]
        p = self.b.state.pending_transaction(txid)
        if p is not None:
            tx = answers.Transaction(**msgspec.structs.asdict(_pending(p)), message_ids=[])
        else:
            f = self.b.state.finished(txid)
            if f is None:
                return _error(404, f"no transaction {txid!r} on this broker", "QUERY_NOT_FOUND")
            tx = answers.Transaction(
                transaction_id=f.transaction_id, producer_group=f.producer_group, state=f.state,
                commit_log_offset=f.half_lsn, messages=f.message_count, message_ids=[], checks=f.checks,
                job_id=f.job_id, end_lsn=f.end_lsn, end_ms=f.end_ms, queue_offsets=f.queue_offsets, by=f.by,
                participants=f.participants)
        tx.message_ids = keys.msg_ids(tx.commit_log_offset, tx.messages)
        first = self.b.reader.half_message(tx.commit_log_offset)
        if first is not None:
            m = first[0]
            tx.first_message = answers.MessagePreview(m.topic, m.queue_id, m.tags, m.keys, m.properties,
                                                      m.body[:200].decode("utf-8", "replace"))
        return _answer(tx)

    async def act_on_transaction(self, request):
        """?force=true: end a participant of a spanning transaction against its home (it tears it)."""
        txid = request.match_info["txid"]
        action = request.match_info["action"]
        force = request.query.get("force", "").lower() in ("1", "true", "yes")
        warning = ""
        if action == "resume":
            reply = self.b.transactions.resume(txid)
        else:
            state = TransactionState.COMMIT if action == "commit" else TransactionState.ROLLBACK
            p = self.b.state.pending_transaction(txid)
            if force and p is not None and p.home:
                warning = (f"transaction {txid} is a participant whose home group {p.home} decides it: ended here by "
                           f"force, it tears the transaction unless {p.home} ends it the same way")
            reply = self.b.transactions.end(EndTransactionRequest("", txid, state), by="admin", force=force)
        reply = await _settled(reply)
        log.warning("operator %s of transaction %s%s: %s", action, txid, " (forced)" if force else "",
                    ResponseCode(reply.code).name)
        if warning and reply.code == ResponseCode.SUCCESS:
            log.warning("%s", warning)
        state_name = {"commit": "COMMITTED", "rollback": "ROLLED_BACK", "resume": "PREPARED"}[action]
        already = getattr(reply.body, "already", False)
        return _from_reply(reply, answers.TransactionAction(txid, state_name, already, warning))

    async def list_jobs(self, request):
        """Jobs, newest first: ?state=open|prepared|committed|aborted|undecided|all, ?group=, ?name= (the jobs
        of that name: the first is its newest), ?limit= (100)."""
        want = request.query.get("state", "all").upper()
        group = request.query.get("group")
        name = request.query.get("name")
        limit = int(request.query.get("limit", "100"))
        states = {"ALL": None, "UNDECIDED": ("OPEN", "PREPARED")}.get(want, (want,))
        if states is not None and not set(states) <= {"OPEN", "PREPARED", "COMMITTED", "ABORTED"}:
            return _error(400, f"state must be open, prepared, committed, aborted, undecided or all, got "
                               f"{want.lower()!r}", "MALFORMED")
        # as published (JobService.info): a decision no slave holds yet lists as the state before it
        shown = [(j.open_lsn, self.b.jobs.info(j)) for j in self.b.state.iter_jobs()
                 if (group is None or j.producer_group == group) and (name is None or j.name == name)]
        items = [info for _lsn, info in sorted(shown, key=lambda x: x[0], reverse=True)
                 if states is None or info.state in states]
        return _answer(answers.JobList(len(items), [_job(info) for info in items[:limit]]))

    async def get_job(self, request):
        reply = self.b.jobs.query(QueryJobRequest("", request.match_info["job_id"]))
        if reply.code != ResponseCode.SUCCESS:
            return _from_reply(reply)
        j = self.b.state.job(reply.body.job_id)
        members = list(j.members) if j.members else sorted(self.b.state.job_members.get(j.job_id, ()))
        # at the home: the members on other groups, as prepared or decided (as published, like the state)
        remote = {g: list(ids) for g, ids in j.remote.items()} if reply.body.state != JOB_OPEN else {}
        return _answer(answers.JobDetail(**msgspec.structs.asdict(reply.body), member_ids=members,
                                         remote_member_ids=remote))

    async def decide_job(self, request):
        """An operator's decision: commit keeps the prepared list (or, for an OPEN job, every member
        pending now; a JSON body {"members": [...]} names them), abort rolls every member back."""
        job_id, action = request.match_info["job_id"], request.match_info["action"]
        members = None
        if request.can_read_body:
            body = await request.json()
            members = body.get("members") if isinstance(body, dict) else body
            if members is not None and not (isinstance(members, list) and all(isinstance(t, str) for t in members)):
                return _error(400, 'body must be {"members": ["TRANSACTION_ID", ...]} (or none: the prepared list, '
                                   'or for an OPEN job every member stored so far)', "MALFORMED")
        state = TransactionState.COMMIT if action == "commit" else TransactionState.ROLLBACK
        reply = await _settled(self.b.jobs.decide(DecideJobRequest("", job_id, int(state), members), by="admin"))
        log.warning("operator %s of job %s: %s", action, job_id, ResponseCode(reply.code).name)
        return _from_reply(reply, _job(reply.body) if reply.body is not None else None)

    async def check_scan(self, request):
        self.b.role.require_master()
        r = self.b.check_service.scan()
        return _answer(answers.ScanResult(r.pending, r.checked, r.parked, r.without_producer, r.seconds))

    async def get_message(self, request):
        msg_id = request.match_info["msg_id"]
        try:
            got = self.b.reader.by_id(msg_id)
        except ValueError as e:
            return _error(400, str(e), "MESSAGE_ILLEGAL")
        if got is None:
            return _error(404, f"no message with id {msg_id}", "QUERY_NOT_FOUND")
        m, _rec = got
        txid = m.transaction_id
        visible = True
        state = ""
        if txid:
            p = self.b.state.pending_transaction(txid)
            f = None if p else self.b.state.finished(txid)
            state = p.state if p else (f.state if f else "")
            visible = state == "COMMITTED"
            if f is not None and visible:
                idx = int(msg_id[16:], 16)
                m.queue_offset = f.queue_offsets[idx]
        return _answer(answers.StoredMessage(
            m.msg_id, m.topic, m.queue_id, m.queue_offset, m.tags, m.keys, m.properties, m.born_timestamp, txid,
            state, visible, m.body.decode("utf-8", "replace"), len(m.body)))
