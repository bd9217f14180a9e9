"""The console's routes. Views are GETs; every action (a transaction's commit, roll-back or resume, a
job's commit or abort, a dead letter's re-send) is a confirmation page (GET) whose form POSTs, with a
CSRF token, to the same path; the POST acts on the master with the visitor's own credentials and
redirects to the result. `?at=GROUP` (a form's hidden `at`) reads and acts on that broker group's
master, for a console given the brokers of several groups (jobs spanning them)."""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from txbroker import __version__
from txbroker.client.admin import AdminError
from txbroker.client.errors import ClientError
from txbroker.console.brokers import BrokerStatus, Cluster, is_system_topic
from txbroker.console.events import OperatorEvents
from txbroker.console.jobs import (
    JOB_ACTIONS, JOB_STATES, UNDECIDED, action_links, can_decide, consequence, decision, job_fields, job_href,
    jobs_table, members,
)
from txbroker.console.pages import Html, esc, flash, join, link, ms_time, page, post_form, seg, table, tag, url
from txbroker.console.security import Gate, Refused, Visitor

log = logging.getLogger(__name__)

TX_ACTIONS = {
    "commit": ("Commit", "go", "Its messages become visible to consumers. This is final."),
    "rollback": ("Roll back", "danger", "Its messages are never delivered. This is final."),
    "resume": ("Resume", "go", "Check-back starts over: the broker asks the producer group again."),
}
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")


class Console:
    def __init__(self, cluster: Cluster, *, service_credentials=None, events: OperatorEvents | None = None):
        self.cluster = cluster
        self.gate = Gate(cluster)
        self.service = service_credentials
        self.events = events if events is not None else OperatorEvents()
        app = self.app = web.Application(middlewares=[self._headers, self._auth, self._errors])
        r = app.router
        r.add_get("/healthz", self.healthz)
        r.add_get("/", self.brokers)
        r.add_get("/topics", self.topics)
        r.add_get("/topics/{topic}", self.topic)
        r.add_get("/messages", self.messages)
        r.add_get("/groups", self.groups)
        r.add_get("/groups/{group}/dlq", self.dead_letters)
        r.add_get("/groups/{group}/dlq/{msg_id}/resend", self.confirm_resend)
        r.add_post("/groups/{group}/dlq/{msg_id}/resend", self.resend)
        r.add_get("/transactions", self.transactions)
        r.add_get("/transactions/{txid}", self.transaction)
        r.add_get("/transactions/{txid}/{action:commit|rollback|resume}", self.confirm_tx)
        r.add_post("/transactions/{txid}/{action:commit|rollback|resume}", self.act_tx)
        r.add_get("/jobs", self.jobs)
        r.add_get("/jobs/{job_id}", self.job)
        r.add_get("/jobs/{job_id}/{action:commit|abort}", self.confirm_job)
        r.add_post("/jobs/{job_id}/{action:commit|abort}", self.act_job)
        r.add_get("/events", self.events_page)

    # ---- middlewares ------------------------------------------------------------------------------

    @web.middleware
    async def _headers(self, request, handler):
        try:
            resp = await handler(request)
        except web.HTTPException as e:
            resp = e
        for k, v in _HEADERS.items():
            resp.headers.setdefault(k, v)
        if isinstance(resp, web.HTTPException):
            raise resp
        return resp

    @web.middleware
    async def _auth(self, request, handler):
        if request.path == "/healthz":
            return await handler(request)
        try:
            visitor = await self.gate.visitor(request.headers.get("Authorization", ""))
        except Refused as e:
            resp = _html(page("Log in" if e.status == 401 else "Refused", flash("err", str(e))), e.status)
            if e.status == 401:
                resp.headers["WWW-Authenticate"] = 'Basic realm="txbroker console", charset="UTF-8"'
            return resp
        request["visitor"] = visitor
        if request.method == "POST":
            refusal = await self._post_refusal(request, visitor)
            if refusal is not None:
                return refusal
        return await handler(request)

    async def _post_refusal(self, request, visitor: Visitor) -> web.Response | None:
        if not visitor.can_write:
            return self._page(request, "Refused", flash("err", f"{visitor.access_key} is a read-only user: "
                                                               "the brokers allow it no actions"), status=403)
        origin = request.headers.get("Origin")
        if origin and origin != "null" and origin.split("://", 1)[-1] != request.host:
            return self._page(request, "Refused", flash("err", "cross-site request refused"), status=403)
        form = await request.post()
        if not self.gate.check_csrf(visitor, form.get("csrf", "")):
            return self._page(request, "Refused", flash("err", "missing or wrong CSRF token: reload the page "
                                                               "and try again"), status=403)
        return None

    @web.middleware
    async def _errors(self, request, handler):
        try:
            return await handler(request)
        except AdminError as e:
            status = e.status if 400 <= e.status < 500 else 502
            return self._page(request, "The broker refused", flash("err", str(e)), status=status)
        except (ClientError, ValueError) as e:
            return self._page(request, "Error", flash("err", str(e)), status=502)
        except web.HTTPException:
            raise
        except Exception:  # noqa: BLE001 - a page saying so, the trace in the console's log only
            log.exception("console: %s %s failed", request.method, request.path)
            return self._page(request, "Error", flash("err", "the console failed on this request (see its log)"),
                              status=500)

    # ---- helpers ----------------------------------------------------------------------------------

    def _page(self, request, title: str, body, *, active: str = "", status: int = 200, note=None) -> web.Response:
        v: Visitor | None = request.get("visitor")
        who = ""
        if v is not None:
            who = f"{v.label} ({'admin' if v.can_write else 'read-only'})"
        return _html(page(title, body, active=active, who=f"{who} · txbroker {__version__}", flash=note), status)

    def reads(self, request):
        """Credentials for views: the service account if given, else the visitor's."""
        v: Visitor = request["visitor"]
        return self.service or v.credentials

    def writes(self, request):
        """Credentials for actions: the visitor's own (the service account without a login)."""
        v: Visitor = request["visitor"]
        return v.credentials or self.service

    def csrf(self, request) -> str:
        return self.gate.csrf_token(request["visitor"])

    async def healthz(self, request):
        return web.Response(text="ok\n")

    # ---- brokers ----------------------------------------------------------------------------------

    async def brokers(self, request):
        rows = []
        for s in await self.cluster.statuses(self.reads(request)):
            i = s.info
            if i is None:
                rows.append([s.url, "", tag("span", "unreachable", class_="state-ROLLED_BACK"), "", "", "", "", "", "",
                             s.error])
                continue
            rep = i.replication
            if i.role == "master":
                slaves = join(Html(f"{esc(sl.name)} ({esc(sl.address)}): lag {sl.lag}, "
                                   f"{'in sync' if sl.in_sync else 'catching up'}<br>") for sl in rep.slaves)
                replication = join([f"{rep.mode} (sync replicas {rep.sync_replicas}) ", Html("<br>"),
                                    slaves or "no slave connected"])
            else:
                replication = (f"from {rep.master}: {'connected' if rep.connected else 'not connected'}, "
                               f"replicated to {rep.replicated_offset}" + (f"; {rep.last_error}" if rep.last_error else ""))
            role = tag("span", i.role + (f" (fenced by epoch {i.fenced_by})" if i.fenced_by else ""),
                       class_=f"role-{i.role}")
            rows.append([s.url, i.broker_name, role, i.epoch, i.master or "", f"{i.log_end_offset} / {i.durable_offset}",
                         i.pending_transactions, i.parked_transactions, replication,
                         f"version {i.version}, {i.topics} topics, {i.connections} connections"])
        body = table(["Admin URL", "Broker", "Role", "Epoch", "Master", "Log end / published", "Pending tx",
                      "Parked tx", "Replication", "Notes"], rows, "brokers")
        return self._page(request, "Brokers", body, active="/")

    # ---- topics and messages ----------------------------------------------------------------------

    async def topics(self, request):
        master = await self.cluster.master(self.reads(request))
        topics = (await self.cluster.call(master.url, self.reads(request), "topics")).topics
        rows = [[link(f"/topics/{seg(t.name)}", t.name), t.queues, "system" if is_system_topic(t.name) else ""]
                for t in topics]
        return self._page(request, "Topics", table(["Topic", "Queues", ""], rows, "topics"), active="/topics")

    async def topic(self, request):
        name = request.match_info["topic"]
        master = await self.cluster.master(self.reads(request))
        info = await self.cluster.call(master.url, self.reads(request), "topic", name)
        rows = [[q.queue_id, q.max_offset] for q in info.queues]
        body = join([table(["Queue", "Max offset (published)"], rows, "queues"),
                     link(url("/messages", topic=name), "find messages of this topic by key")])
        return self._page(request, f"Topic {name}", body, active="/topics")

    async def messages(self, request):
        q = request.query
        msg_id, topic, key = q.get("id", "").strip(), q.get("topic", "").strip(), q.get("key", "").strip()
        form = Html(
            '<form method="get" action="/messages">'
            f'<label>Message id <input type="text" name="id" size="34" value="{esc(msg_id)}"></label> '
            '<button type="submit">Show</button></form><p></p>'
            '<form method="get" action="/messages">'
            f'<label>Topic <input type="text" name="topic" value="{esc(topic)}"></label> '
            f'<label>Key <input type="text" name="key" value="{esc(key)}"></label> '
            '<button type="submit">Find by key</button></form>')
        out = [form]
        if msg_id:
            master = await self.cluster.master(self.reads(request))
            m = await self.cluster.call(master.url, self.reads(request), "message", msg_id)
            out.append(tag("h2", f"Message {m.msg_id}"))
            out.append(table(["Field", "Value"], [
                ["topic", m.topic], ["queue / offset", f"{m.queue_id} / {m.queue_offset}"], ["tags", m.tags],
                ["keys", m.keys], ["born", ms_time(m.born_timestamp)], ["transaction", m.transaction_id],
                ["transaction state", m.transaction_state], ["visible", "yes" if m.visible else "no"],
                ["properties", ", ".join(f"{k}={v}" for k, v in sorted(m.properties.items()))],
                ["body", tag("pre", m.body)], ["body size", m.body_size]], "message"))
        elif topic and key:
            found = await self.cluster.find_by_key(self.reads(request), topic, key)
            out.append(tag("h2", f"{len(found)} messages with key {key} in {topic}"))
            out.append(_message_table(found))
        return self._page(request, "Messages", join(out), active="/messages")

    # ---- consumer groups and dead letters ---------------------------------------------------------

    async def groups(self, request):
        creds = self.reads(request)
        master = await self.cluster.master(creds)
        groups = await self.cluster.consumer_groups(creds)
        rows = []
        for g in groups:
            lags = join(Html(f"{esc(gl.topic)}: lag {gl.lag}<br>") for gl in g.lags) or "no committed offsets"
            if g.errors:
                lags = join([lags, Html("<br>"), "not allowed: " + "; ".join(g.errors)])
            dlq = link(f"/groups/{seg(g.name)}/dlq", "dead letters") if g.dead_letters_topic else ""
            rows.append([g.name, ", ".join(g.clients) or "none online", lags, dlq])
        producers = [[g, n] for g, n in sorted(master.info.producer_groups.items())]
        settings = await self.cluster.call(master.url, creds, "groups")
        body = join([tag("h2", "Consumer groups"),
                     table(["Group", "Clients", "Lag by topic", ""], rows, "groups"),
                     tag("h2", "Producer groups"),
                     table(["Group", "Live producers"], producers, "producers"),
                     tag("h2", "Producer groups' check-back settings"),
                     table(["Group", "Check interval ms", "Timeout ms", "Check max", "Generation"],
                           [[g, s.check_interval_ms, s.transaction_timeout_ms, s.check_max, s.generation]
                            for g, s in sorted(settings.items())], "settings")])
        return self._page(request, "Consumer groups", body, active="/groups")

    async def dead_letters(self, request):
        group = request.match_info["group"]
        v: Visitor = request["visitor"]
        letters = await self.cluster.dead_letters(self.reads(request), group)
        rows = []
        for m in letters:
            action = (link(f"/groups/{seg(group)}/dlq/{seg(m.msg_id)}/resend", "Re-send…") if v.can_write else "")
            rows.append([m.msg_id, m.properties.get("RETRY_TOPIC", "?"), m.properties.get("RECONSUME_TIME", "?"),
                         m.keys, m.body[:80].decode("utf-8", "replace"), action])
        note = None
        q = request.query
        if q.get("resent"):
            note = flash("ok", f"re-sent {q['resent']} to {q.get('topic', '')} as {q.get('as', '')}")
        body = table(["Message id", "Original topic", "Tries", "Keys", "Body", ""], rows, "dlq")
        return self._page(request, f"Dead letters of {group}", body, active="/groups", note=note)

    async def confirm_resend(self, request):
        group, msg_id = request.match_info["group"], request.match_info["msg_id"]
        v: Visitor = request["visitor"]
        m = await self.cluster.dead_letter(self.reads(request), group, msg_id)
        topic = m.properties.get("RETRY_TOPIC", "?")
        details = table(["Field", "Value"], [["message id", m.msg_id], ["original topic", topic],
                                             ["keys", m.keys], ["body", tag("pre", m.body.decode("utf-8", "replace"))]],
                        "message")
        if not v.can_write:
            return self._page(request, "Re-send a dead letter", join([details, flash("err", "read-only user")]),
                              active="/groups", status=403)
        form = join([tag("p", f"Re-send this dead letter of {group} to {topic}? Consumers of {topic} receive it again."),
                     post_form(request.path, self.csrf(request), "Yes, re-send", "go", {"confirm": "yes"}), " ",
                     link(f"/groups/{seg(group)}/dlq", "Cancel")])
        return self._page(request, "Re-send a dead letter", join([details, form]), active="/groups")

    async def resend(self, request):
        group, msg_id = request.match_info["group"], request.match_info["msg_id"]
        topic, new_id = await self.cluster.resend(self.writes(request), group, msg_id)
        log.info("console: %s re-sent dead letter %s of %s to %s as %s", request["visitor"].label, msg_id,
                 group, topic, new_id)
        raise web.HTTPSeeOther(url(f"/groups/{seg(group)}/dlq", resent=msg_id, topic=topic, **{"as": new_id}))

    # ---- transactions -----------------------------------------------------------------------------

    async def transactions(self, request):
        creds = self.reads(request)
        v: Visitor = request["visitor"]
        state = request.query.get("state", "all")
        group = request.query.get("group") or None
        master = await self.cluster.master(creds)
        txs = await self.cluster.call(master.url, creds, "transactions", state, group, 500)
        now = time.time() * 1000
        rows = []
        for t in txs.transactions:
            actions = ""
            if v.can_write:
                names = ["resume", "commit", "rollback"] if t.state == "PARKED" else ["commit", "rollback"]
                actions = join(join([link(f"/transactions/{seg(t.transaction_id)}/{a}", TX_ACTIONS[a][0] + "…"), " "])
                               for a in names)
            rows.append([link(f"/transactions/{seg(t.transaction_id)}", t.transaction_id), t.producer_group,
                         tag("span", t.state, class_=f"state-{t.state}"), t.messages, t.checks,
                         f"{(now - t.born_ms) / 1000:.0f} s", t.job_id, actions])
        filters = Html('<form method="get" action="/transactions">'
                       + join(join([tag("a", s, href=url("/transactions", state=s, group=group)), " "])
                              for s in ("all", "pending", "parked"))
                       + f' <label>Producer group <input type="text" name="group" value="{esc(group or "")}"></label>'
                       f'<input type="hidden" name="state" value="{esc(state)}"> <button type="submit">Filter</button></form>')
        body = join([filters, tag("p", f"{txs.total} transactions ({state}) on master {master.info.broker_name} "
                                        f"(epoch {master.info.epoch})"),
                     table(["Transaction", "Producer group", "State", "Messages", "Checks", "Age", "Job", ""],
                           rows, "transactions")])
        return self._page(request, "Transactions", body, active="/transactions")

    async def _transaction_table(self, request, txid: str):
        creds = self.reads(request)
        master = await self.cluster.master(creds, request.query.get("at") or None)
        t = await self.cluster.call(master.url, creds, "transaction", txid)
        rows = [["transaction id", t.transaction_id], ["producer group", t.producer_group],
                ["state", tag("span", t.state, class_=f"state-{t.state}")], ["messages", t.messages],
                ["message ids", ", ".join(t.message_ids)], ["born", ms_time(t.born_ms)], ["checks", t.checks],
                ["last check", ms_time(t.last_check_ms)], ["job", t.job_id]]
        if t.home:
            rows.append(["home group", f"{t.home} (a participant: it ends as {t.home} ends it)"])
        if t.participants:
            rows.append(["participants on", ", ".join(t.participants)])
        if t.end_ms:
            rows += [["ended", ms_time(t.end_ms)], ["ended by", t.by], ["queue offsets", t.queue_offsets]]
        if t.first_message is not None:
            fm = t.first_message
            rows += [["first message", f"{fm.topic} queue {fm.queue_id}, tags {fm.tags!r}, keys {fm.keys!r}"],
                     ["body preview", tag("pre", fm.body_preview)]]
        return t, table(["Field", "Value"], rows, "transaction")

    async def transaction(self, request):
        txid = request.match_info["txid"]
        v: Visitor = request["visitor"]
        t, details = await self._transaction_table(request, txid)
        at = request.query.get("at", "")
        actions = ""
        if v.can_write and t.state in ("PREPARED", "PARKED"):
            names = ["resume", "commit", "rollback"] if t.state == "PARKED" else ["commit", "rollback"]
            actions = join([tag("h2", "Actions")] + [join([link(url(f"/transactions/{seg(txid)}/{a}", at=at),
                                                                     TX_ACTIONS[a][0] + "…"), " "]) for a in names])
        note = None
        done = request.query.get("done")
        if done in TX_ACTIONS:
            note = flash("ok", f"{TX_ACTIONS[done][0]}: done; the transaction is now {request.query.get('state', t.state)}"
                               + (" (it already was)" if request.query.get("already") else ""))
        body = join([details, actions, Html("<p>"), link("/transactions", "All transactions"), Html("</p>")])
        return self._page(request, f"Transaction {txid}", body, active="/transactions", note=note)

    async def confirm_tx(self, request):
        txid, action = request.match_info["txid"], request.match_info["action"]
        v: Visitor = request["visitor"]
        t, details = await self._transaction_table(request, txid)
        label, cls, consequence = TX_ACTIONS[action]
        if not v.can_write:
            return self._page(request, f"{label} transaction", join([details, flash("err", "read-only user")]),
                              active="/transactions", status=403)
        fields = {"confirm": "yes", **({"at": request.query["at"]} if request.query.get("at") else {})}
        tears = ""
        if t.home and action in ("commit", "rollback"):  # the broker refuses unless forced: say what it tears
            fields["force"] = "yes"
            tears = (f" This is a participant: its home group {t.home} decides it, and this broker ends it as "
                     f"{t.home} does by itself. Ending it here by hand tears the transaction unless {t.home} ends "
                     "it the same way.")
        ask = join([tag("p", Html(f"<strong>{esc(label)}</strong> transaction {esc(txid)} of producer group "
                                  f"{esc(t.producer_group)} (now {esc(t.state)})? {esc(consequence)}"
                                  + (f" <strong>{esc(tears)}</strong>" if tears else ""))),
                    post_form(request.path, self.csrf(request), f"Yes, {label.lower()}" + (" by force" if tears else ""),
                              cls, fields),
                    " ", link(url(f"/transactions/{seg(txid)}", at=request.query.get("at")), "Cancel")])
        return self._page(request, f"{label} transaction", join([details, ask]), active="/transactions")

    async def act_tx(self, request):
        txid, action = request.match_info["txid"], request.match_info["action"]
        form = await request.post()
        if form.get("confirm") != "yes":
            raise web.HTTPSeeOther(f"/transactions/{seg(txid)}/{action}")
        creds = self.writes(request)
        master = await self.cluster.master(creds, form.get("at") or None)
        r = await self.cluster.call(master.url, creds, "act_on_transaction", txid, action, form.get("force") == "yes")
        log.info("console: %s %s transaction %s: %s", request["visitor"].label, action, txid, r.state)
        raise web.HTTPSeeOther(url(f"/transactions/{seg(txid)}", at=form.get("at"), done=action, state=r.state,
                                   already="1" if r.already else None))

    # ---- jobs (coordinated transactions) -----------------------------------------------------------

    async def _jobs_master(self, creds, at: str) -> tuple[BrokerStatus, str, list[str]]:
        """The master a jobs page reads or acts on: broker group `at`'s, else the live master; with
        its broker group ("" outside a cluster of groups) and every group the console's brokers serve."""
        masters = await self.cluster.masters_by_group(creds)
        if at:
            master = self.cluster.group_master(masters, at)
        elif masters:
            master = max(masters.values(), key=lambda s: s.info.epoch)
        else:
            master = await self.cluster.master(creds)  # raises NoMaster, naming the brokers
        here = next((g for g, s in masters.items() if s is master), "")
        return master, here, sorted(masters)

    async def jobs(self, request):
        creds = self.reads(request)
        v: Visitor = request["visitor"]
        state = request.query.get("state", "all")
        group = request.query.get("group") or None
        master, here, groups = await self._jobs_master(creds, request.query.get("at", ""))
        r = await self.cluster.call(master.url, creds, "jobs", state, group, 500)
        filters = Html('<form method="get" action="/jobs">'
                       + join(join([tag("a", s, href=url("/jobs", state=s, group=group, at=here)), " "])
                              for s in JOB_STATES)
                       + f' <label>Producer group <input type="text" name="group" value="{esc(group or "")}"></label>'
                       f'<input type="hidden" name="state" value="{esc(state)}">'
                       + (f'<input type="hidden" name="at" value="{esc(here)}">' if here else "")
                       + ' <button type="submit">Filter</button></form>')
        parts = [filters]
        if len(groups) > 1:
            parts.append(tag("p", join(["Broker group: "] + [
                join([tag("strong", g) if g == here else link(url("/jobs", state=state, group=group, at=g), g), " "])
                for g in groups])))
        parts += [tag("p", f"{r.total} jobs ({state}) on master {master.info.broker_name} (epoch {master.info.epoch}"
                           + (f", broker group {here}" if here else "") + ")"),
                  jobs_table(r.jobs, time.time() * 1000, here, v.can_write),
                  tag("p", "A job is OPEN while members join it (aborted at its deadline unless decided), PREPARED "
                           "once its coordinator fixed its members (aborted at its own, longer bound unless decided), "
                           "then COMMITTED or ABORTED. A job spanning broker groups is decided at its home; its entry "
                           "on another group only follows it.", class_="note")]
        return self._page(request, "Jobs", join(parts), active="/jobs")

    async def _job(self, creds, job_id: str, at: str):
        master, here, _groups = await self._jobs_master(creds, at)
        return await self.cluster.call(master.url, creds, "job", job_id), here

    def _job_body(self, j, here: str, *extra) -> Html:
        now = time.time() * 1000
        return join([job_fields(j, now, here), tag("h2", "Decision"), decision(j, now), tag("h2", "Members"),
                     members(j, here, here), *extra, tag("p", link(url("/jobs", at=here), "All jobs"))])

    async def job(self, request):
        job_id = request.match_info["job_id"]
        v: Visitor = request["visitor"]
        j, here = await self._job(self.reads(request), job_id, request.query.get("at", ""))
        actions = ""
        if v.can_write and can_decide(j):
            actions = join([tag("h2", "Actions"), action_links(j, here)])
        note = None
        done = request.query.get("done")
        if done in JOB_ACTIONS:
            note = flash("ok", f"{JOB_ACTIONS[done][0]}: done; the job is now {request.query.get('state', j.state)}"
                               + (" (it already was)" if request.query.get("already") else ""))
        return self._page(request, f"Job {job_id}", self._job_body(j, here, actions), active="/jobs", note=note)

    async def confirm_job(self, request):
        job_id, action = request.match_info["job_id"], request.match_info["action"]
        v: Visitor = request["visitor"]
        j, here = await self._job(self.reads(request), job_id, request.query.get("at", ""))
        label, cls = JOB_ACTIONS[action]
        title = f"{label} job"
        if not v.can_write:
            return self._page(request, title, self._job_body(j, here), active="/jobs", status=403,
                              note=flash("err", "read-only user"))
        if j.home:
            return self._page(request, title, self._job_body(j, here), active="/jobs", status=409, note=flash(
                "err", f"job {job_id} here is the entry of a job decided by its home group {j.home}: decide it there"))
        if j.state not in UNDECIDED:
            return self._page(request, title, self._job_body(j, here), active="/jobs", status=409,
                              note=flash("err", f"job {job_id} is already {j.state}: nothing to decide"))
        what, refusal = consequence(j, action)
        ask = join([flash("err", refusal) if refusal else "",
                    tag("p", Html(f"<strong>{esc(label)}</strong> job {esc(job_id)} of producer group "
                                  f"{esc(j.producer_group)} (now {esc(j.state)})? {esc(what)}")),
                    post_form(request.path, self.csrf(request),
                              "Ask the broker anyway" if refusal else f"Yes, {action}", cls,
                              {"confirm": "yes", **({"at": here} if here else {})}),
                    " ", link(job_href(job_id, here), "Cancel")])
        return self._page(request, f"{title} {job_id}", join([ask, self._job_body(j, here)]), active="/jobs")

    async def act_job(self, request):
        job_id, action = request.match_info["job_id"], request.match_info["action"]
        form = await request.post()
        at = form.get("at", "")
        if form.get("confirm") != "yes":
            raise web.HTTPSeeOther(job_href(job_id, at, action))
        creds = self.writes(request)
        master = await self.cluster.master(creds, at or None)
        try:
            r = await self.cluster.call(master.url, creds, "decide_job", job_id, action)
        except AdminError as e:  # shown with the job, as it stands: the refusal names why
            log.warning("console: %s %s job %s refused: %s", request["visitor"].label, action, job_id, e)
            j, here = await self._job(self.reads(request), job_id, at)
            return self._page(request, f"{JOB_ACTIONS[action][0]} job {job_id}: refused", self._job_body(j, here),
                              active="/jobs", status=e.status if 400 <= e.status < 500 else 502,
                              note=flash("err", f"The broker refused to {action} job {job_id}: {e}"))
        log.info("console: %s %s job %s: %s", request["visitor"].label, action, job_id, r.state)
        raise web.HTTPSeeOther(job_href(job_id, at, done=action, state=r.state, already="1" if r.already else None))

    # ---- operator events --------------------------------------------------------------------------

    async def events_page(self, request):
        if not self.events.available:
            body = flash("note", f"Operator events: {self.events.why}.")
        else:
            try:
                evs = await asyncio.to_thread(self.events.recent)
            except OSError as e:
                return self._page(request, "Operator events", flash("err", f"the Kubernetes API: {e}"), status=502)
            body = join([tag("p", f"Events the operator posted in namespace {self.events.namespace}, newest first."),
                         table(["Time", "Type", "Reason", "Object", "Message", "Count"],
                               [[e.time, e.type, e.reason, e.object, e.message, e.count] for e in evs], "events")])
        return self._page(request, "Operator events", body, active="/events")


def _message_table(msgs) -> Html:
    return table(["Message id", "Topic", "Queue / offset", "Tags", "Keys", "Born", "Body"],
                 [[link(url("/messages", id=m.msg_id), m.msg_id), m.topic, f"{m.queue_id} / {m.queue_offset}",
                   m.tags, m.keys, ms_time(m.born_timestamp), m.body[:120].decode("utf-8", "replace")]
                  for m in msgs], "messages")


def build(admin_urls: list[str], *, credentials=None, tls=None, data_addresses=None,
          events: OperatorEvents | None = None) -> web.Application:
    return Console(Cluster(admin_urls, tls=tls, data_addresses=data_addresses), service_credentials=credentials,
                   events=events).app
