"""Versions users can read (issue 32, item 1): one version in every place that states it, the
replication compatibility rule, and what the operator shows of them (the Version column, the
ReplicationCompatible condition, the ReplicationIncompatible Event)."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import yaml
from txbroker import __version__
from txbroker.broker.replication import compat
from txbroker.protocol.bodies import ReplicaSubscribe, ReplicaWelcome
from txbroker.store.records import READABLE_FORMATS, STORE_FORMAT_VERSION
from txbroker_operator import __version__ as operator_version, broker_group, events, status

from test_operator_decisions import info, member

ROOT = Path(__file__).resolve().parents[2]


def test_every_place_that_states_the_version_states_the_same_one():
    pyproject = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    chart = yaml.safe_load((ROOT / "helm/txbroker/Chart.yaml").read_text())
    assert pyproject == __version__ == operator_version == chart["appVersion"] == chart["version"]
    out = subprocess.run([str(Path(sys.executable).parent / "txbroker"), "--version"], capture_output=True, text=True)
    assert out.stdout.strip() == f"txbroker {__version__} (store format {STORE_FORMAT_VERSION}; opens formats 1-6)"


def test_the_chart_runs_the_broker_image_of_its_own_version_unless_told_otherwise():
    values = yaml.safe_load((ROOT / "helm/txbroker/values.yaml").read_text())
    assert values["txbroker"]["image"] == ""
    assert 'default (printf "txbroker/broker:%s" .Chart.AppVersion)' in \
        (ROOT / "helm/txbroker/templates/txbroker.yaml").read_text()


def subscribe(version="", store_format=0, reads=()) -> ReplicaSubscribe:
    return ReplicaSubscribe("b-1", 10, 1, "10.0.0.2:10911", [], version, store_format, list(reads))


def test_a_master_takes_a_slave_that_reads_its_store_format_and_refuses_one_that_does_not():
    assert compat.slave_refusal(subscribe(__version__, STORE_FORMAT_VERSION, READABLE_FORMATS)) == ""
    older = compat.slave_refusal(subscribe("0.1.5", 4, [1, 2, 3, 4]))
    assert older.startswith("slave b-1 runs txbroker 0.1.5 (store format 4, reads 1-4) and cannot read the store "
                            f"format {STORE_FORMAT_VERSION} records of this master, txbroker {__version__}")
    assert "docs/upgrading.md" in older
    # a slave from before 0.2.0 says nothing: it may read only up to format 4
    assert "a txbroker before 0.2.0 (it sends no version)" in compat.slave_refusal(subscribe())
    # any ints a peer sends are named, not expanded (the fuzz test's REPLICATION_SUBSCRIBE with
    # reads [28, 0, 2**63 - 1, 2**31 - 1] was answered SYSTEM_ERROR: OverflowError)
    huge = compat.slave_refusal(subscribe("9.9", 28, [28, 0, 2 ** 63 - 1, 2 ** 31 - 1]))
    assert f"reads 0, 28, 2147483647, {2 ** 63 - 1})" in huge


def test_a_slave_follows_an_older_master_and_refuses_one_whose_records_it_cannot_read():
    assert compat.master_refusal("m:1", ReplicaWelcome(3)) == ""   # before 0.2.0: format 5 at most
    assert compat.master_refusal("m:1", ReplicaWelcome(3, -1, "0.1.9", 4)) == ""
    newer = compat.master_refusal("m:1", ReplicaWelcome(3, -1, "0.3.0", STORE_FORMAT_VERSION + 1))
    assert newer.startswith(f"master m:1 runs txbroker 0.3.0 (store format {STORE_FORMAT_VERSION + 1}), whose "
                            f"records this broker, txbroker {__version__}")


def test_status_shows_each_brokers_version_the_version_column_and_a_refused_pair():
    refusal = "slave b-1 runs a txbroker before 0.2.0 (it sends no version) and cannot read ..."
    members = {
        "b-0": member("b-0", 0, replace(info("master", slaves=()), version="0.2.0", store_format=5,
                                        incompatible=refusal)),
        "b-1": member("b-1", 1, replace(info(), version="0.1.0")),
        "b-2": member("b-2", 2, replace(info(), version="0.2.0", store_format=5)),
    }
    body = {"metadata": {"name": "b", "generation": 1}, "spec": {"replicas": 3}, "status": {"master": "b-0"}}
    st = status.compute(body, members, "b-0", 2, {})
    assert st["version"] == "0.1.0,0.2.0" and st["operatorVersion"] == operator_version
    assert [(b["name"], b["version"], b.get("storeFormat")) for b in st["brokers"]] == [
        ("b-0", "0.2.0", 5), ("b-1", "0.1.0", None), ("b-2", "0.2.0", 5)]
    (cond,) = [x for x in st["conditions"] if x["type"] == "ReplicationCompatible"]
    assert (cond["status"], cond["reason"]) == ("False", "IncompatibleVersions")
    assert f"b-0: {refusal}" in cond["message"]
    members["b-0"].info = replace(members["b-0"].info, incompatible="")
    (cond,) = [x for x in status.compute(body, members, "b-0", 2, {})["conditions"]
               if x["type"] == "ReplicationCompatible"]
    assert (cond["status"], cond["reason"]) == ("True", "AsExpected")


def test_the_crd_has_the_version_column_and_condition():
    crd = yaml.safe_load((ROOT / "crds/txbroker.yaml").read_text())
    version = crd["spec"]["versions"][0]
    assert {"name": "Version", "jsonPath": ".status.version"}.items() <= \
        next(c for c in version["additionalPrinterColumns"] if c["name"] == "Version").items()
    schema = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert "ReplicationCompatible" in schema["conditions"]["items"]["properties"]["type"]["enum"]
    assert {"version", "storeFormat"} <= schema["brokers"]["items"]["properties"].keys()


def test_a_refused_pair_is_an_event(monkeypatch):
    posted = []
    monkeypatch.setattr(events, "post", lambda obj, type_, reason, message: posted.append((type_, reason, message)))

    class Parent:
        body = {"metadata": {"name": "b", "namespace": "ns", "uid": "u-versions"}}
        name, multi = "b", False
        members = {"b-1": member("b-1", 1, replace(info(), version="0.2.0", incompatible="master m refused it: ..."))}
        spec: dict = {}
        log = None

    g = broker_group.GroupPass(Parent(), 0, "active", {})
    g.report_incompatible()
    g.report_incompatible()   # a standing problem is said once
    assert posted == [("Warning", "ReplicationIncompatible",
                       "replication stopped (docs/upgrading.md): b-1: master m refused it: ...")]
