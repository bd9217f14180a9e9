"""The `txbroker` command, as an operator on call would use it."""

import argparse
import json
import time
import urllib.request

import pytest

from support.cli import run_cli
from support.pairs import SYNC_FLAGS
from support.waiting import wait_until
from txbroker.client import (
    JobCoordinator, LocalTransactionState as S, Message, TransactionListener, TransactionProducer,
)
from txbroker.cli.job_cmd import bound_ms, duration, where
from txbroker.cli.main import build_parser
from txbroker.protocol.admin import Job
from txbroker.client.admin import AdminClient


class Unknown(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return S.UNKNOWN

    def check_local_transaction(self, msg):
        return S.UNKNOWN


def test_help_explains_every_command():
    out = run_cli("--help").stdout
    for cmd in ("broker", "topic", "send", "tail", "tx"):
        assert cmd in out
    assert "SIGTERM" in run_cli("broker", "--help").stdout
    assert "resume" in run_cli("tx", "--help").stdout


# Every leaf command, and what its help must name: its main arguments and options.
HELP_NAMES = {
    "broker": ("--data-dir", "--check-max"),
    "topic create": ("--queues", "1-127 characters"),
    "topic list": ("--admin",),
    "send": ("--topic", "BODY"),
    "tail": ("--follow", "--from-end"),
    "msg show": ("msg_id", "--broker"),
    "msg find": ("--topic", "--key"),
    "dlq list": ("--group", "--broker"),
    "dlq resend": ("--group", "msg_id"),
    "tx list": ("--state", "--group"),
    "tx show": ("transaction_id", "--admin"),
    "tx commit": ("transaction_id", "--admin"),
    "tx rollback": ("transaction_id", "--admin"),
    "tx resume": ("transaction_id", "--admin"),
    "job list": ("--state", "BOUND IN", "HOME/GROUPS", "PREPARED", "prepared bound"),
    "job show": ("job_id", "--name", "prepared_deadline_ms", "home", "remote_member_ids"),
    "job commit": ("job_id", "--admin"),
    "job abort": ("job_id", "--admin"),
    "auth hash": ("--iterations",),
    "auth add-user": ("access_key", "--file", "--topic"),
    "auth remove-user": ("access_key", "--file"),
    "auth check": ("--file",),
    "replication show": ("--admin", "--json", "recorded"),
    "replication forget-slave": ("name", "--admin", "will not come back"),
}


@pytest.mark.parametrize("command", list(HELP_NAMES))
def test_every_command_has_help(command):
    """`txbroker <command> --help` works without a broker and names the command's arguments."""
    r = run_cli(*command.split(), "--help")
    assert r.returncode == 0 and r.stderr == ""
    assert f"usage: txbroker {command} " in r.stdout
    text = " ".join(r.stdout.split())  # argparse wraps lines to the terminal's width
    for name in HELP_NAMES[command]:
        assert name in text, f"{command} --help does not mention {name}"
    # a paragraph saying what the command does, between the usage and the first section
    description = r.stdout.split("\n\n")[1]
    assert description.strip() and not description.startswith(("options:", "positional arguments:")), r.stdout


def test_every_command_and_option_explains_itself():
    """Walking the real parser: each command has a description, each argument a help text."""
    unexplained = []

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{path} {name}")
            elif not action.help and not isinstance(action, argparse._HelpAction):
                unexplained.append(f"{path}: {action.dest}")
        if path != "txbroker" and not parser.description:
            unexplained.append(f"{path}: no description")

    walk(build_parser(), "txbroker")
    assert unexplained == []


def test_broken_config_is_a_clear_error(tmp_path):
    cfg = tmp_path / "b.toml"
    cfg.write_text('data_dir = "x"\nflush_disk_type = "SOMETIMES"\n')
    r = run_cli("broker", "--config", str(cfg), check=False)
    assert r.returncode == 2 and "flush_disk_type" in r.stderr


def test_topics_send_and_tail(broker):
    admin = ["--admin", broker.admin_url]
    assert "Payments: 2 queues" in run_cli("topic", "create", "Payments", "--queues", "2", *admin).stdout
    assert "Payments" in run_cli("topic", "list", *admin).stdout
    out = run_cli("send", "--broker", broker.address, "--topic", "Payments", "--tags", "eu", "one", "two").stdout
    assert out.count("SEND_OK") == 2
    tail = run_cli("tail", "--broker", broker.address, "--topic", "Payments").stdout
    assert "one" in tail and "two" in tail and "tags=eu" in tail
    r = run_cli("send", "--broker", broker.address, "--topic", "bad topic", "x", check=False)
    assert r.returncode == 1 and "invalid topic name" in r.stderr


def test_a_client_polling_setting_is_checked_and_a_bad_one_sends_nothing(broker):
    """TXBROKER_IDLE_POLL_US (a client's loop polling before it sleeps): a value that is not a whole
    number of microseconds in range stops the command before it sends, naming the variable and the
    value; a good one sends as usual, its loop polling."""
    run_cli("topic", "create", "Polled", "--admin", broker.admin_url)
    send = ("send", "--broker", broker.address, "--topic", "Polled")
    for bad in ("abc", "-5", "10000000"):
        r = run_cli(*send, f"refused-{bad}", check=False, env={"TXBROKER_IDLE_POLL_US": bad})
        assert r.returncode == 1 and "SEND_OK" not in r.stdout
        assert "TXBROKER_IDLE_POLL_US" in r.stderr and bad in r.stderr, r.stderr
    assert run_cli(*send, "polled", env={"TXBROKER_IDLE_POLL_US": "500"}).stdout.count("SEND_OK") == 1
    assert run_cli(*send, "slept", env={"TXBROKER_IDLE_POLL_US": "0"}).stdout.count("SEND_OK") == 1
    tail = run_cli("tail", "--broker", broker.address, "--topic", "Polled").stdout
    assert "polled" in tail and "slept" in tail and "refused" not in tail


def test_topic_create_refuses_invalid_names(broker):
    """A topic name with a space or of more than 127 characters is refused with the naming rule,
    and no topic is made; 127 characters is still fine."""
    admin = ["--admin", broker.admin_url]
    for name in ("bad topic", "x" * 200):
        r = run_cli("topic", "create", name, *admin, check=False)
        assert r.returncode == 1 and r.stdout == ""
        assert r.stderr.startswith("txbroker topic: invalid topic name") and "1-127 characters" in r.stderr
    assert run_cli("topic", "create", "y" * 127, *admin).returncode == 0
    listing = run_cli("topic", "list", *admin).stdout
    assert "y" * 127 in listing
    assert "bad" not in listing and "x" * 100 not in listing


def test_tx_list_show_commit_rollback(broker_factory):
    broker = broker_factory("--check-interval-ms", "60000")  # no check-back parks them mid-test
    admin = ["--admin", broker.admin_url]
    with TransactionProducer("cli-pg", broker.address, Unknown()) as p:
        keep = p.send_message_in_transaction(Message("Stuck", b"keep-me"), None).transaction_id
        drop = p.send_message_in_transaction(Message("Stuck", b"drop-me"), None).transaction_id
    listing = run_cli("tx", "list", *admin).stdout
    assert keep in listing and drop in listing and "2 transactions" in listing
    shown = json.loads(run_cli("tx", "show", keep, *admin).stdout)
    assert shown["state"] == "PREPARED" and shown["first_message"]["body_preview"] == "keep-me"
    assert "COMMITTED" in run_cli("tx", "commit", keep, *admin).stdout
    assert "(already)" in run_cli("tx", "commit", keep, *admin).stdout
    assert "ROLLED_BACK" in run_cli("tx", "rollback", drop, *admin).stdout
    r = run_cli("tx", "commit", drop, *admin, check=False)
    assert r.returncode == 1 and "already rolled back" in r.stderr
    r = run_cli("tx", "resume", keep, *admin, check=False)
    assert r.returncode == 1 and "already COMMITTED" in r.stderr
    tail = run_cli("tail", "--broker", broker.address, "--topic", "Stuck").stdout
    assert "keep-me" in tail and "drop-me" not in tail


def test_tx_resume_then_commit_a_parked_transaction(broker_factory):
    """A transaction parked after checkMax is resumed with `tx resume`: PREPARED again, its checks
    start over; `tx commit` then makes its message readable."""
    broker = broker_factory("--check-interval-ms", "2000", "--transaction-timeout-ms", "100", "--check-max", "1")
    api, admin = AdminClient(broker.admin_url), ["--admin", broker.admin_url]
    with TransactionProducer("cli-park", broker.address, Unknown()) as p:
        txid = p.send_message_in_transaction(Message("Parked", b"held-back"), None).transaction_id
        path = f"/api/v1/transactions/{txid}"
        wait_until(lambda: api.get(path)["state"] == "PARKED", what="the transaction to be parked after 1 check")
    assert api.get(path)["checks"] == 1
    assert txid in run_cli("tx", "list", "--state", "parked", *admin).stdout
    r = run_cli("tx", "resume", txid, *admin)
    assert r.returncode == 0 and f"transaction {txid}: PREPARED" in r.stdout
    tx = api.get(path)  # the next check is 2 s after the resume: nothing has counted since
    assert tx["state"] == "PREPARED" and tx["checks"] == 0
    assert txid in run_cli("tx", "list", "--state", "pending", *admin).stdout
    assert "held-back" not in run_cli("tail", "--broker", broker.address, "--topic", "Parked").stdout
    assert f"transaction {txid}: COMMITTED" in run_cli("tx", "commit", txid, *admin).stdout
    assert "held-back" in run_cli("tail", "--broker", broker.address, "--topic", "Parked").stdout


def test_metrics_and_broker_info(broker):
    with TransactionProducer("m-pg", broker.address, Unknown()) as p:
        txid = p.send_message_in_transaction(Message("Metered", b"x"), None).transaction_id
        p.end(txid, S.COMMIT)
    import urllib.request
    text = urllib.request.urlopen(broker.admin_url + "/metrics").read().decode()
    assert 'txbroker_transactions_total{outcome="commit"} 1.0' in text
    assert 'txbroker_messages_sent_total{kind="half"} 1.0' in text
    assert "txbroker_request_latency_seconds_bucket" in text
    wait_until(lambda: "txbroker_pending_half_messages 0.0" in
               urllib.request.urlopen(broker.admin_url + "/metrics").read().decode(), what="pending gauge")


def test_job_columns_read_as_an_operator_needs():
    now = 1_800_000_000_000
    job = Job("j.e1.2", "pg", "OPEN", now, now + 600_000)
    assert bound_ms(job) == now + 600_000 and where(job) == "-"
    prepared = Job("j.e1.2", "pg", "PREPARED", now, now + 600_000, prepared_deadline_ms=now + 86_400_000, groups=["g1"])
    assert bound_ms(prepared) == now + 86_400_000 and where(prepared) == "g1"  # its own bound, not the OPEN deadline
    entry = Job("j.g0.e1.2", "pg", "OPEN", now, 0, home="g0")
    assert bound_ms(entry) == 0 and where(entry) == "home g0"
    assert bound_ms(Job("j", "pg", "COMMITTED", now, now + 1)) == 0
    assert [duration(s) for s in (42, 750, 86_400, -3)] == ["42s", "12m30s", "24h00m", "-3s"]


def test_job_show_by_name_finds_its_newest_job_and_list_shows_the_prepared_bound(broker):
    admin = ["--admin", broker.admin_url]

    def metric() -> list[str]:
        text = urllib.request.urlopen(broker.admin_url + "/metrics").read().decode()
        return [line for line in text.splitlines() if line.startswith("txbroker_jobs_prepared_nearest_bound_seconds")]

    with JobCoordinator("cli-jobs", broker.address) as c:
        first = c.open(timeout=60, name="nightly")
        c.abort(first.job_id)
        newest = c.open(timeout=60, name="nightly", prepared_timeout=7200)  # the name's first job was aborted
        assert newest.job_id != first.job_id
        member = c.send(newest.job_id, Message("Nightly", b"run 2"))
        assert metric() == []  # nothing prepared: no bound to alert on
        c.prepare(newest.job_id, [member])
        later = c.open(timeout=60, name="hourly")  # the newest job of all is another name's

    shown = json.loads(run_cli("job", "show", "--name", "nightly", *admin).stdout)
    assert (shown["job_id"], shown["state"], shown["member_ids"]) == (newest.job_id, "PREPARED", [member])
    assert shown["prepared_deadline_ms"] - time.time() * 1000 > 7100_000  # its own bound, past the OPEN deadline
    assert shown["prepared_deadline_ms"] > shown["deadline_ms"]
    assert shown["home"] == "" and shown["groups"] == [] and shown["remote_member_ids"] == {}
    assert json.loads(run_cli("job", "show", first.job_id, *admin).stdout)["state"] == "ABORTED"
    (gauge,) = metric()
    assert 7000 < float(gauge.split()[1]) <= 7200

    listing = run_cli("job", "list", "--state", "prepared", *admin).stdout.splitlines()
    assert listing[0].split()[6:9] == ["BOUND", "IN", "HOME/GROUPS"]
    (row,) = [line for line in listing if newest.job_id in line]
    assert row.split()[2] == "PREPARED" and row.split()[6] in ("1h59m", "2h00m")  # the prepared bound, not 60 s
    assert first.job_id not in "\n".join(listing) and later.job_id not in "\n".join(listing)
    assert listing[-1] == "1 jobs"

    r = run_cli("job", "show", "--name", "weekly", *admin, check=False)
    assert r.returncode == 1 and "no job named 'weekly'" in r.stderr
    assert "COMMITTED" in run_cli("job", "commit", newest.job_id, *admin).stdout
    assert metric() == []

    # by name, from any broker of the cluster (spark/README.md's recipe), wherever the job's home is
    by_name = ["--name", "hourly", "--broker", broker.address, "--group", "cli-jobs"]
    assert f"job {later.job_id}: ABORTED" in run_cli("job", "abort", *by_name).stdout
    r = run_cli("job", "commit", *by_name, check=False)  # the first decision wins
    assert r.returncode == 1 and "TRANSACTION_SHOULD_ROLLBACK" in r.stderr and later.job_id in r.stderr, r.stderr
    r = run_cli("job", "commit", "--name", "weekly", "--broker", broker.address, "--group", "cli-jobs", check=False)
    assert r.returncode == 1 and "no job named 'weekly' of producer group 'cli-jobs'" in r.stderr, r.stderr
    r = run_cli("job", "commit", "--name", "hourly", "--broker", broker.address, check=False)
    assert r.returncode == 1 and "--name, --broker and --group go together" in r.stderr, r.stderr


def test_replication_show_and_forgetting_a_slave_gone_for_good(broker_factory):
    """A master's slaves and the slaves it recorded; a slave gone for good forgotten by name, and
    the refusals that keep acknowledged writes: a slave still subscribed, a name never recorded."""
    m = broker_factory(*SYNC_FLAGS, "--broker-name", "m", name="m")
    s1 = broker_factory("--role", "slave", "--master", m.address, "--broker-name", "s1", *SYNC_FLAGS, name="s1")
    on_m = ["--admin", m.admin_url]
    wait_until(lambda: "yes" in run_cli("replication", "show", *on_m).stdout, what="s1 in sync, as the master shows it")
    shown = run_cli("replication", "show", *on_m).stdout
    assert "m: master at epoch" in shown and "recorded slaves: s1" in shown, shown
    assert [line.split()[0] for line in shown.splitlines() if line.startswith("s1 ")] == ["s1"], shown
    as_json = json.loads(run_cli("replication", "show", "--json", *on_m).stdout)
    assert as_json["replication"]["recorded_slaves"] == ["s1"]
    slave = run_cli("replication", "show", "--admin", s1.admin_url).stdout
    assert f"master {m.address}: connected" in slave, slave

    refused = run_cli("replication", "forget-slave", "s1", *on_m, check=False)
    assert refused.returncode == 1 and "subscribed" in refused.stderr, refused.stderr
    refused = run_cli("replication", "forget-slave", "s1", "--admin", s1.admin_url, check=False)
    assert refused.returncode == 1 and "only a master" in refused.stderr, refused.stderr
    s1.stop()
    wait_until(lambda: "no slave subscribed" in run_cli("replication", "show", *on_m).stdout, what="s1 gone")
    unknown = run_cli("replication", "forget-slave", "s9", *on_m, check=False)
    assert unknown.returncode == 1 and "recorded: s1" in unknown.stderr, unknown.stderr
    out = run_cli("replication", "forget-slave", "s1", *on_m).stdout
    assert "m forgot slave s1" in out and "recorded slaves: none" in out, out
