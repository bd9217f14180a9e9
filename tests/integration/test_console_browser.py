"""The web console (`txbroker console`) in a real headless browser (Debian's chromium, driven by
Playwright) against a real master with authentication on: a transaction left UNKNOWN until parked is
found on the transactions page and resumed through the confirmation, then seen committed; a message
its consumer group fails until it lands in %DLQ% is re-sent through the page and consumed; an
unauthenticated request is refused; a read-only (monitor) user sees no action and cannot act; a job
(coordinated transaction) with a member is listed on the Jobs page, its page shows the member, and
it is committed through the confirmation. Over two broker groups (plain HTTP, no browser): a job
spanning them, its entry on the other group naming its home, the broker's refusal of a commit that
lacks the member list, and the commit once it is prepared.

Screenshots go to the test's tmp dir and to ${TXBROKER_ARTIFACTS:-/tmp/txbroker-artifacts}/console/.
Chromium comes from testbed/browser.sh (apt); without it this fails, naming the script."""

from __future__ import annotations

import asyncio
import base64
import html
import os
import re
import shutil
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from support.brokers import TXBROKER
from support.credentials import write_credentials
from support.groups import start_cluster
from support.waiting import wait_until
from txbroker.client import (
    ClusterJobCoordinator, ConsumeStatus, Credentials, JobCoordinator, LocalTransactionState as S, Message, Producer,
    PullConsumer, PushConsumer, TransactionListener, TransactionProducer,
)
from txbroker.client.admin import AdminClient

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
USERS = {
    "admin": {"admin": True},
    "watcher": {"monitor": True, "topics": ["*=SUB"], "consumer_groups": ["*"]},
    "app": {"topics": ["*=PUB|SUB"], "producer_groups": ["*"], "consumer_groups": ["*"]},
    "repl": {"replication": True},
}
FAST = dict(heartbeat_interval=0.5, rebalance_interval=1.0, offset_commit_interval=0.2, long_poll_ms=500)
ARTIFACTS = Path(os.environ.get("TXBROKER_ARTIFACTS", "/tmp/txbroker-artifacts")) / "console"


def creds(key: str) -> Credentials:
    return Credentials(key, f"{key}-secret")


class Console:
    def __init__(self, admin_urls: list[str], log_path: Path):
        # Port 0 and the console's own line saying where it bound: a port picked here could be taken
        # first by another test's process, whose /healthz would then pass for the console's.
        log = open(log_path, "ab")
        self.proc = subprocess.Popen([TXBROKER, "console", "--admin", ",".join(admin_urls),
                                      "--listen", "127.0.0.1:0"], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.log_path = log_path
        self.url = wait_until(self._bound, 20, what=f"the console to say where it listens (log: {log_path})")
        wait_until(self._up, 20, what=f"the console on {self.url} (log: {log_path})")

    def _bound(self) -> str | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"console exited {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
        m = re.search(r"txbroker console on (http://127\.0\.0\.1:\d+)/", self.log_path.read_text(errors="replace"))
        return m.group(1) if m else None

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"console exited {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def request(self, path: str, key: str | None = None, data: dict | None = None,
                headers: dict | None = None) -> tuple[int, str]:
        h = dict(headers or {})
        if key:
            h["Authorization"] = "Basic " + base64.b64encode(f"{key}:{key}-secret".encode()).decode()
        body = urllib.parse.urlencode(data).encode() if data is not None else None
        req = urllib.request.Request(self.url + path, data=body, headers=h, method="POST" if body else "GET")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:  # a loaded host: the console asks the brokers first
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


class ParkThenCommit(TransactionListener):
    """UNKNOWN (the transaction stays undecided, then parks) until `decide` is set; COMMIT after."""

    def __init__(self):
        self.decide = threading.Event()

    def execute_local_transaction(self, msg, arg):
        return S.UNKNOWN

    def check_local_transaction(self, msg):
        return S.COMMIT if self.decide.is_set() else S.UNKNOWN


class FailThenHeal:
    def __init__(self):
        self.healed = threading.Event()
        self.consumed: list[bytes] = []
        self.lock = threading.Lock()

    def __call__(self, msgs, ctx):
        if not self.healed.is_set():
            return ConsumeStatus.RECONSUME_LATER
        with self.lock:
            self.consumed.extend(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS


@pytest.fixture
def browser_context_factory(tmp_path):
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: run testbed/browser.sh as root (it installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    contexts = []

    def make(user: str | None):
        profile = tmp_path / f"chromium-profile-{user or 'anonymous'}"  # a fresh user-data-dir each
        ctx = pw.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            http_credentials={"username": user, "password": f"{user}-secret"} if user else None,
            viewport={"width": 1400, "height": 900})
        ctx.set_default_timeout(60_000)   # a loaded two-core host: each page asks the brokers before it answers
        contexts.append(ctx)
        return ctx.pages[0] if ctx.pages else ctx.new_page()

    yield make
    for ctx in contexts:
        ctx.close()
    pw.stop()


@pytest.fixture
def shots(tmp_path):
    folder = tmp_path / "screenshots"
    folder.mkdir()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def shot(page, name: str) -> Path:
        path = folder / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        shutil.copy(path, ARTIFACTS / path.name)
        return path

    return shot


@pytest.fixture
def setup(broker_factory, tmp_path):
    auth = write_credentials(tmp_path / "credentials.toml", USERS)
    b = broker_factory("--auth-file", str(auth), "--check-interval-ms", "300", "--transaction-timeout-ms", "200",
                       "--check-max", "2", "--message-delay-level", " ".join(["100ms"] * 18), name="master")
    secret = tmp_path / "repl-secret"
    secret.write_text("repl-secret\n")
    slave = broker_factory("--auth-file", str(auth), "--role", "slave", "--master", b.address,
                           "--replication-access-key", "repl", "--replication-secret-file", str(secret), name="slave")
    admin = AdminClient(b.admin_url, credentials=creds("admin"))
    wait_until(lambda: admin.broker_info().replication.slaves, what="the slave to subscribe")
    console = Console([slave.admin_url, b.admin_url], tmp_path / "console.log")  # it finds the master
    yield b, console
    console.stop()


def test_console_resumes_a_parked_transaction_and_resends_a_dead_letter(setup, browser_context_factory, shots):
    b, console = setup
    admin = AdminClient(b.admin_url, credentials=creds("admin"))

    # ---- a transaction left UNKNOWN until it is parked (check_max 2) ---------------------------------
    listener = ParkThenCommit()
    with TransactionProducer("orders-pg", b.address, listener, credentials=creds("app")) as producer:
        r = producer.send_message_in_transaction(Message("Orders", b"order 42", keys="order-42"), None)
        txid = r.transaction_id
        wait_until(lambda: admin.transaction(txid).state == "PARKED", 30, what="the transaction to park")

        page = browser_context_factory("admin")
        page.goto(console.url + "/transactions")
        row = page.locator("table.transactions tr", has_text=txid)
        assert "PARKED" in row.inner_text()
        shots(page, "before-resume")
        row.get_by_role("link", name="Resume…").click()
        assert "Resume transaction" in page.locator("h1").inner_text()
        assert "Check-back starts over" in page.content()
        shots(page, "confirm-resume")
        listener.decide.set()  # the producer now knows: the next check-back commits it
        page.get_by_role("button", name="Yes, resume").click()
        assert "Resume: done" in page.locator(".flash").inner_text()

        def committed_on_page():
            page.goto(f"{console.url}/transactions/{txid}")
            return "COMMITTED" in page.locator("table.transaction").inner_text()

        wait_until(committed_on_page, 30, what="the transaction committed on the console")
        shots(page, "after-resume")
        page.goto(console.url + "/transactions")
        assert txid not in page.locator("table.transactions").inner_text()  # no longer pending
        shots(page, "after-resume-list")
    assert admin.transaction(txid).by == "check"
    with PullConsumer(b.address, credentials=creds("app")) as c:
        assert [m.body for m in c.read_all("Orders")] == [b"order 42"]

    # ---- a message its group fails until it lands in %DLQ% ----------------------------------------------
    listen = FailThenHeal()
    with Producer("fragile-pg", b.address, credentials=creds("app")) as p:
        p.send(Message("Fragile", b"poison", keys="order-7"))
    with PushConsumer("fragile-cg", b.address, "Fragile", listen, max_reconsume_times=2, credentials=creds("app"),
                      **FAST):
        def dead_letter_listed():
            page.goto(console.url + "/groups/fragile-cg/dlq")
            return "poison" in page.locator("table.dlq").inner_text()

        wait_until(dead_letter_listed, 30, what="the dead letter on the console")
        listen.healed.set()
        shots(page, "dlq-before-resend")
        page.locator("table.dlq tr", has_text="poison").get_by_role("link", name="Re-send…").click()
        assert "Re-send this dead letter of fragile-cg to Fragile?" in page.content()
        page.get_by_role("button", name="Yes, re-send").click()
        assert re.search(r"re-sent \S+ to Fragile as \S+", page.locator(".flash").inner_text())
        shots(page, "dlq-after-resend")
        wait_until(lambda: listen.consumed == [b"poison"], 30, what="the re-sent message consumed by the group")

    # ---- the other pages answer for an admin --------------------------------------------------------
    for path, text in (("/", "in sync"), ("/", "slave"), ("/topics", "Orders"), ("/topics/Orders", "Max offset"),
                       ("/messages?topic=Orders&key=order-42", "order 42"), ("/groups", "fragile-cg"),
                       ("/events", "not in a cluster")):
        page.goto(console.url + path)
        assert text in page.content(), path
    page.goto(console.url + "/")
    shots(page, "brokers")


def test_console_refuses_strangers_and_read_only_users_act_on_nothing(setup, browser_context_factory, shots):
    b, console = setup
    listener = ParkThenCommit()
    with TransactionProducer("orders-pg", b.address, listener, credentials=creds("app")) as producer:
        txid = producer.send_message_in_transaction(Message("Orders", b"order 9"), None).transaction_id
        admin = AdminClient(b.admin_url, credentials=creds("admin"))
        wait_until(lambda: admin.transaction(txid).state == "PARKED", 30, what="the transaction to park")

        # no credentials, or wrong ones: nothing is served, not even a view
        for path in ("/", "/transactions", f"/transactions/{txid}/commit"):
            status, _ = console.request(path)
            assert status == 401, path
        status, _ = console.request(f"/transactions/{txid}/commit", data={"confirm": "yes"})
        assert status == 401
        status, _ = console.request("/transactions", key="mallory")
        assert status == 401
        from playwright.sync_api import Error as BrowserError
        stranger = browser_context_factory(None)  # headless: the browser cannot prompt, and gives up
        with pytest.raises(BrowserError, match="ERR_INVALID_AUTH_CREDENTIALS"):
            stranger.goto(console.url + "/transactions")

        # a read-only user sees the transaction but no action, and a forged POST is refused
        page = browser_context_factory("watcher")
        page.goto(console.url + "/transactions")
        row = page.locator("table.transactions tr", has_text=txid)
        assert "PARKED" in row.inner_text()
        assert page.get_by_role("link", name=re.compile("Resume|Commit|Roll back")).count() == 0
        assert page.get_by_role("button").filter(has_text=re.compile("Yes")).count() == 0
        assert "read-only" in page.locator("header").inner_text()
        shots(page, "read-only-transactions")
        assert page.goto(f"{console.url}/transactions/{txid}/commit").status == 403
        status, _ = console.request(f"/transactions/{txid}/commit", key="watcher", data={"confirm": "yes"})
        assert status == 403

        # an admin's POST without the CSRF token is refused too; with it (from the page) it acts
        status, body = console.request(f"/transactions/{txid}/rollback", key="admin", data={"confirm": "yes"})
        assert status == 403 and "CSRF" in body
        assert admin.transaction(txid).state == "PARKED"


def test_console_help():
    r = subprocess.run([TXBROKER, "console", "--help"], capture_output=True, text=True, timeout=30)
    text = " ".join(r.stdout.split())
    assert r.returncode == 0
    for name in ("--admin", "--listen", "--access-key", "--tls-ca", "HTTP Basic", "monitor"):
        assert name in text


def test_console_lists_a_job_shows_its_member_and_commits_it(setup, browser_context_factory, shots):
    b, console = setup
    admin = AdminClient(b.admin_url, credentials=creds("admin"))
    with JobCoordinator("nightly-pg", b.address, credentials=creds("app")) as c:
        job = c.open(timeout=600, name="nightly-console")
        member = c.send(job.job_id, Message("Nightly", b"job member", keys="run-1"))
        other = c.open(timeout=600, name="left-open")  # stays undecided: the read-only user sees it
        other_member = c.send(other.job_id, Message("Nightly", b"other member"))

    page = browser_context_factory("admin")
    page.goto(console.url + "/jobs?state=undecided")
    row = page.locator("table.jobs tr", has_text=job.job_id)
    cells = row.locator("td").all_inner_texts()
    assert cells[1:6] == ["nightly-console", "nightly-pg", "OPEN", "0", "1"], cells
    assert re.fullmatch(r"deadline \S+ \S+ UTC \(in (9|10) min \d+ s\)", cells[7]), cells
    assert page.locator("table.jobs tr", has_text=other.job_id).get_by_role("link", name="Abort…").count() == 1
    shots(page, "jobs")

    row.get_by_role("link", name=job.job_id).click()
    assert page.locator("h1").inner_text() == f"Job {job.job_id}"
    assert member in page.locator("table.members").inner_text()
    assert "Undecided: members may still join" in page.locator("p.decision").inner_text()
    shots(page, "job-before-commit")
    page.get_by_role("link", name="Commit…").click()
    assert page.locator("h1").inner_text() == f"Commit job {job.job_id}"
    assert "every member stored so far (1, listed below) is kept" in page.locator("main").inner_text()
    shots(page, "confirm-job-commit")
    page.get_by_role("button", name="Yes, commit").click()
    assert "Commit: done; the job is now COMMITTED" in page.locator(".flash").inner_text()
    assert "COMMITTED" in page.locator("table.job").inner_text()
    assert page.get_by_role("link", name=re.compile("Commit|Abort")).count() == 0  # decided: nothing left to do
    shots(page, "job-after-commit")
    assert (admin.job(job.job_id).state, admin.job(job.job_id).by) == ("COMMITTED", "admin")
    with PullConsumer(b.address, credentials=creds("app")) as consumer:
        wait_until(lambda: [m.body for m in consumer.read_all("Nightly")] == [b"job member"], 30,
                   what="the committed member visible, the other job's not")
    page.goto(console.url + "/jobs?state=committed")
    assert "admin, " in page.locator("table.jobs tr", has_text=job.job_id).inner_text()

    # a read-only user sees the undecided job and its member, and no action; its requests are refused
    watcher = browser_context_factory("watcher")
    watcher.goto(console.url + "/jobs")
    assert "OPEN" in watcher.locator("table.jobs tr", has_text=other.job_id).inner_text()
    assert watcher.get_by_role("link", name=re.compile("Commit|Abort")).count() == 0
    watcher.goto(f"{console.url}/jobs/{other.job_id}")
    assert other_member in watcher.locator("table.members").inner_text()
    assert watcher.get_by_role("link", name=re.compile("Commit|Abort")).count() == 0
    assert "read-only" in watcher.locator("header").inner_text()
    shots(watcher, "read-only-job")
    assert watcher.goto(f"{console.url}/jobs/{other.job_id}/abort").status == 403
    status, _ = console.request(f"/jobs/{other.job_id}/abort", key="watcher", data={"confirm": "yes"})
    assert status == 403
    assert admin.job(other.job_id).state == "OPEN"

    # the admin aborts it through its confirmation page: its member rolls back
    page.goto(console.url + "/jobs?state=undecided")
    page.locator("table.jobs tr", has_text=other.job_id).get_by_role("link", name="Abort…").click()
    assert page.locator("h1").inner_text() == f"Abort job {other.job_id}"
    page.get_by_role("button", name="Yes, abort").click()
    assert "Abort: done; the job is now ABORTED" in page.locator(".flash").inner_text()
    assert (admin.job(other.job_id).state, admin.job(other.job_id).by) == ("ABORTED", "admin")
    wait_until(lambda: admin.transaction(other_member).state == "ROLLED_BACK", 30, what="its member rolled back")

    # a PREPARED job shows its own, longer bound, not the OPEN deadline
    with JobCoordinator("nightly-pg", b.address, credentials=creds("app")) as c:
        prepared = c.open(timeout=60, name="prepared-console", prepared_timeout=7200)
        c.prepare(prepared.job_id, [c.send(prepared.job_id, Message("Nightly", b"prepared member"))])
    page.goto(f"{console.url}/jobs/{prepared.job_id}")
    text = page.locator("main").inner_text()
    assert "PREPARED" in text and re.search(r"prepared bound \S+ \S+ UTC \(in (1 h 59|2 h 0) min", text), text[:2000]


def shown(body: str) -> str:
    """The text a reader sees of a page: tags dropped, entities decoded, spaces collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", body)).split())


def test_console_jobs_spanning_broker_groups(tmp_path):
    cluster = start_cluster(tmp_path, groups=2, slaves=0, flags=("--check-interval-ms", "300"))
    console = None
    try:
        console = Console([g.master.admin_url for g in cluster.groups], tmp_path / "console.log")
        with ClusterJobCoordinator("span-pg", cluster.bootstrap) as c:
            job = c.open(timeout=600, name="spanning")
            other = job.groups[0]
            members = {g: [c.send(job, g, Message("Out", f"{g}-1".encode()))] for g in job.all_groups}

            status, body = console.request("/jobs")
            assert status == 200 and "Broker group: g0 g1" in shown(body)
            status, body = console.request(f"/jobs?at={job.home}")
            assert f"spans {other}" in shown(body) and f"broker group {job.home}" in shown(body)

            # its entry on the other group: names its home, links there ("decided there"), offers no action
            status, body = console.request(f"/jobs/{job.job_id}?at={other}")
            assert status == 200 and f"Decided by its home group {job.home}" in shown(body)
            assert f'<a href="/jobs/{job.job_id}?at={job.home}">See the job at its home: decided there</a>' in body
            assert members[other][0] in shown(body) and "Commit…" not in body and "Abort…" not in body
            status, body = console.request(f"/jobs/{job.job_id}/commit?at={other}")
            assert status == 409 and f"decided by its home group {job.home}: decide it there" in shown(body)

            # OPEN and spanning: the confirmation says the broker needs the member list, and the broker refuses
            status, body = console.request(f"/jobs/{job.job_id}/commit?at={job.home}")
            assert status == 200 and "the broker commits it only with the list of members to keep on every group, " \
                                     "which only its coordinator knows" in shown(body)
            csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', body).group(1)
            form = {"csrf": csrf, "confirm": "yes", "at": job.home}
            status, body = console.request(f"/jobs/{job.job_id}/commit", data=form)
            assert status == 400 and f"The broker refused to commit job {job.job_id}" in shown(body)
            assert "COMMIT needs the list of member transactions to keep on every group it spans" in shown(body)
            assert AdminClient(cluster.group(job.home).master.admin_url).job(job.job_id).state == "OPEN"

            # prepared by its coordinator: the home lists the members per group, and the console commits it
            c.prepare(job, members)
            status, body = console.request(f"/jobs/{job.job_id}?at={job.home}")
            assert f"{job.home} (home) 1 {members[job.home][0]} {other} 1 {members[other][0]}" in shown(body)
            status, body = console.request(f"/jobs/{job.job_id}/commit", data=form)
            assert status == 200 and "Commit: done; the job is now COMMITTED" in shown(body)

        def followed() -> bool:
            return f"{job.home} decided: COMMITTED" in shown(console.request(f"/jobs/{job.job_id}?at={other}")[1])

        wait_until(followed, 30, what="the entry on the other group to follow its home's decision")
    finally:
        if console is not None:
            console.stop()
        cluster.stop()


def test_console_ends_a_participant_only_by_force_and_says_what_it_tears(tmp_path):
    """Second review, also: ending a spanning transaction's participant by hand tears it unless its
    home ends it the same way. The console's confirmation says so and asks for the force; without
    it the broker refuses."""
    from support.listeners import NeverDecides
    from txbroker.client import AsyncClusterTransactionProducer

    cluster = start_cluster(tmp_path, groups=2, slaves=0, flags=("--check-interval-ms", "600000"))
    console = None
    try:
        console = Console([g.master.admin_url for g in cluster.groups], tmp_path / "console.log")

        async def begin():
            async with AsyncClusterTransactionProducer("span-pg", cluster.bootstrap, NeverDecides()) as p:
                msgs = [Message("Orders", b"a-console"), Message("Orders", b"b-console")]
                return await p.begin(await p.place(msgs, lambda n, m, arg: 0 if m.body[:1] == b"a" else n - 1, None),
                                     "span-console")

        begun = asyncio.run(begin())
        participant = next(iter(begun.participants))
        status, body = console.request(f"/transactions/span-console/commit?at={participant}")
        assert status == 200 and f"This is a participant: its home group {begun.home} decides it" in shown(body)
        assert "Ending it here by hand tears the transaction" in shown(body) and "Yes, commit by force" in body
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', body).group(1)
        form = {"csrf": csrf, "confirm": "yes", "at": participant}
        status, body = console.request("/transactions/span-console/commit", data=form)  # no force: refused
        assert status >= 400 and "force" in shown(body), shown(body)[-500:]
        participant_admin = AdminClient(cluster.group(participant).master.admin_url)
        assert participant_admin.transaction("span-console").state == "PREPARED"
        status, body = console.request("/transactions/span-console/commit", data={**form, "force": "yes"})
        assert status == 200 and "Commit: done; the transaction is now COMMITTED" in shown(body)
        assert participant_admin.transaction("span-console").state == "COMMITTED"
        home = AdminClient(cluster.group(begun.home).master.admin_url)
        assert home.transaction("span-console").state == "PREPARED"  # torn by hand, as the page said
    finally:
        if console is not None:
            console.stop()
        cluster.stop()
