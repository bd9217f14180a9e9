"""A broker that answers the operator in a form it cannot read (a rolling upgrade that renamed a
field of GET /api/v1/broker) is alive and incompatible, never a dead master: before, the operator
took such an answer for silence and failed the master over."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgspec
import pytest
import yaml
from txbroker.protocol import admin as answers
from txbroker_operator import brokers, failover, observe, status
from txbroker_operator import constants as c

from tests.conftest import REPO

IP = "127.0.0.77"  # a loopback address of its own: the operator always asks port 10912
# GET /api/v1/broker as a master answers it (the shared answer type), but from a version that renamed "role"
ANSWER = answers.BrokerInfo(
    broker_name="b-0", version="9.9.9", role="master", epoch=3, master="", log_end_offset=120, durable_offset=120,
    local_durable_offset=120, log_start_offset=1, flush_disk_type="SYNC", pending_transactions=0,
    parked_transactions=0, topics=1, connections=0, producer_groups={}, consumer_groups={}, recovery_seconds=0.1,
    fenced_by=0, replication=answers.Replication(mode="SYNC", sync_replicas=1),
    security=answers.Security(None, False, False), limits=answers.Limits(1000, 1 << 26, 0, 0, 1000))
RENAMED = msgspec.to_builtins(ANSWER)
RENAMED["broker_role"] = RENAMED.pop("role")


@pytest.fixture
def newer_broker():
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(RENAMED).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer((IP, c.ADMIN_PORT), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def master_pod():
    return {"metadata": {"name": "b-0", "uid": "b-0", "labels": {c.LABEL_INDEX: "0", c.LABEL_ROLE: c.ROLE_MASTER}},
            "status": {"podIP": IP, "conditions": [{"type": "Ready", "status": "True"}]}}


def test_the_answer_as_the_broker_gives_it_reads():
    info = brokers.BrokerInfo.from_api(msgspec.json.decode(msgspec.json.encode(ANSWER), type=answers.BrokerInfo))
    assert (info.role, info.epoch, info.log_end_offset, info.sync_replicas) == ("master", 3, 120, 1)


def test_an_answer_the_operator_cannot_read_is_incompatible_not_a_dead_master(newer_broker):
    members = observe.observe([master_pod()], brokers.PLAIN)
    m = members["b-0"]
    assert m.info is None
    assert "cannot read" in m.incompatible and "`role`" in m.incompatible, m.incompatible
    assert failover.master_down_reason(members, "b-0") == ""
    body = {"metadata": {"name": "txb", "generation": 1}, "spec": {"replicas": 1},
            "status": {"master": "b-0", "epoch": 3}}
    (cond,) = [x for x in status.compute(body, members, "b-0", 3, {})["conditions"]
               if x["type"] == "BrokersCompatible"]
    assert cond["status"] == "False" and cond["reason"] == "IncompatibleAnswer" and "b-0" in cond["message"]


def test_a_master_that_does_not_answer_is_still_down():
    members = observe.observe([master_pod()], brokers.PLAIN)
    assert members["b-0"].incompatible == ""
    assert failover.master_down_reason(members, "b-0") == "its admin API does not answer"
    body = {"metadata": {"name": "txb", "generation": 1}, "spec": {"replicas": 1}, "status": {}}
    (cond,) = [x for x in status.compute(body, members, "b-0", 3, {})["conditions"]
               if x["type"] == "BrokersCompatible"]
    assert cond["status"] == "True"


def test_every_condition_the_operator_writes_is_one_the_resource_accepts(newer_broker):
    """The API server refuses a status whose condition type the CRD does not list: the whole
    status write would fail, not just the new condition."""
    crd = yaml.safe_load((REPO / "crds" / "txbroker.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    allowed = set(schema["conditions"]["items"]["properties"]["type"]["enum"])
    members = observe.observe([master_pod()], brokers.PLAIN)
    body = {"metadata": {"name": "txb", "generation": 1}, "spec": {"replicas": 1},
            "status": {"master": "b-0", "epoch": 3}}
    written = status.compute(body, members, "b-0", 3, {"lastFailover": {"message": "m", "time": status.now()}})
    assert {x["type"] for x in written["conditions"]} <= allowed
