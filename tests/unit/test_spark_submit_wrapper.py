"""The chart's spark-submit wrapper (helm/txbroker/files/spark-submit.py): the spark-submit Job ends as
the Spark driver ended, since spark-submit in cluster mode exits 0 whatever the driver did.

Its reading of spark-submit's command line, what it makes of a driver pod, and a whole run against a
stand-in spark-submit and a stand-in API server (HTTP, checking the ServiceAccount's token). On the
real node: tests/e2e/test_k8s_spark_groups.py (a driver exiting 17 fails the Job) and
test_k8s_spark_on_node.py (a driver that succeeds completes it)."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "helm" / "txbroker" / "files" / "spark-submit.py"


def load():
    spec = importlib.util.spec_from_file_location("chart_spark_submit", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (dataclasses look their module up)
    spec.loader.exec_module(mod)
    return mod


w = load()

COMMAND = ["/opt/spark/bin/spark-submit", "--master", "k8s://https://kubernetes.default.svc", "--deploy-mode",
           "cluster", "--name", "rel-spark-1", "--conf", "spark.kubernetes.namespace=ns1", "--verbose",
           "--conf", "spark.kubernetes.submission.waitAppCompletion=true",
           "--conf", "spark.kubernetes.driver.pod.name=rel-spark-1-submit-x7k2p-driver",
           "--conf", "spark.kubernetes.driver.podTemplateContainerName=spark-kubernetes-driver",
           "local:///opt/txbroker/jobs/orders_job.py", "--brokers", "rel-master.ns1.svc:10911",
           "--conf", "spark.kubernetes.driver.pod.name=not-an-option-of-spark-submit"]


def pod(phase: str, state: dict | None = None, name: str = "spark-kubernetes-driver", **status) -> dict:
    containers = [{"name": "sidecar", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]
    if state is not None:
        containers.append({"name": name, "state": state})
    return {"metadata": {"name": "d"}, "status": {"phase": phase, "containerStatuses": containers, **status}}


def test_reads_the_submission_from_spark_submits_arguments():
    s = w.parse(COMMAND)
    assert s == w.Submission("https://kubernetes.default.svc", "ns1", "rel-spark-1-submit-x7k2p-driver",
                             "spark-kubernetes-driver", True)
    # the application's own arguments are not spark-submit's; a later --conf of a key wins; --conf=k=v
    s = w.parse(["spark-submit", "--master=k8s://10.0.0.1:6443", "--conf", "spark.kubernetes.driver.pod.name=a",
                 "--conf=spark.kubernetes.driver.pod.name=b", "-c", "spark.kubernetes.submission.waitAppCompletion=False",
                 "app.py"])
    assert (s.api, s.namespace, s.driver_pod, s.container, s.wait) == (
        "https://10.0.0.1:6443", None, "b", "spark-kubernetes-driver", False)


@pytest.mark.parametrize("state, code, words", [
    ({"terminated": {"exitCode": 17, "reason": "Error"}}, 17, "exited with code 17 (Error): the Job fails"),
    ({"terminated": {"exitCode": 0, "reason": "Completed"}}, 0, "exited with code 0 (Completed): the Job succeeds"),
    ({"terminated": {"exitCode": 137, "reason": "OOMKilled"}}, 137, "exited with code 137 (OOMKilled)"),
    ({"terminated": {"exitCode": 256, "reason": "Error", "message": "java.lang.Exception\nboom"}}, 1,
     "exited with code 256 (Error: boom): the Job fails"),
])
def test_the_job_ends_with_the_drivers_exit_code(state, code, words):
    end = w.outcome(pod("Failed" if code else "Succeeded", state), "d", "spark-kubernetes-driver", 0)
    assert end.code == code and words in end.line and "(pod d, container spark-kubernetes-driver)" in end.line


def test_a_driver_gone_or_ended_without_an_exit_code_fails_the_job():
    gone = w.outcome(None, "d", "spark-kubernetes-driver", 0)
    assert gone.code == 1 and "the Spark driver pod d is gone" in gone.line and "the Job fails" in gone.line
    assert w.outcome(None, "d", "spark-kubernetes-driver", 3).code == 3   # spark-submit's own failure, then
    evicted = w.outcome(pod("Failed", {"waiting": {"reason": "ContainerCreating"}}, reason="Evicted",
                            message="low on memory"), "d", "spark-kubernetes-driver", 0)
    assert evicted.code == 1 and "Failed without an exit code (Evicted: low on memory)" in evicted.line
    assert w.outcome(pod("Running", {"running": {}}), "d", "spark-kubernetes-driver", 0) is None
    # a sidecar's end is never taken for the driver's
    assert w.outcome(pod("Running", {"running": {}}, name="spark-kubernetes-driver"), "d", "other", 0) is None


def test_waits_for_the_driver_to_show_its_end_and_gives_up_failing():
    sub = w.parse(COMMAND)
    answers = [pod("Running", {"running": {}}), pod("Failed", {"terminated": {"exitCode": 17, "reason": "Error"}})]
    asked = []

    def read(api, namespace, name):
        asked.append((api, namespace, name))
        return answers.pop(0)
    end = w.driver_end(sub, 0, read=read, wait=5)
    assert end.code == 17 and asked[0] == ("https://kubernetes.default.svc", "ns1", "rel-spark-1-submit-x7k2p-driver")

    def refused(*_):
        raise OSError("HTTP Error 403: Forbidden")
    end = w.driver_end(sub, 0, read=refused, wait=0)
    assert end.code == 1 and "could not be read: HTTP Error 403: Forbidden" in end.line and "the Job fails" in end.line


class FakeApi(BaseHTTPRequestHandler):
    pods: dict[str, dict] = {}
    seen: list[tuple[str, str]] = []

    def do_GET(self):  # noqa: N802
        self.seen.append((self.path, self.headers.get("Authorization")))
        body = self.pods.get(self.path)
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(body or {"kind": "Status", "code": 404}).encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def api(tmp_path, monkeypatch):
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text("t0ken\n")
    monkeypatch.setattr(w, "SERVICE_ACCOUNT", str(sa))
    FakeApi.pods, FakeApi.seen = {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def fake_spark_submit(tmp_path: Path, rc: int) -> str:
    path = tmp_path / "spark-submit"
    path.write_text(f"#!/bin/sh\necho \"submitted: $*\"\nexit {rc}\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("driver, rc, code, words", [
    ({"terminated": {"exitCode": 17, "reason": "Error"}}, 0, 17, "exited with code 17 (Error): the Job fails"),
    ({"terminated": {"exitCode": 0, "reason": "Completed"}}, 0, 0, "exited with code 0 (Completed): the Job succeeds"),
    (None, 0, 1, "is gone (deleted, or never created; spark-submit exited 0)"),
])
def test_a_whole_run(api, tmp_path, capfd, driver, rc, code, words):
    if driver is not None:
        FakeApi.pods["/api/v1/namespaces/ns1/pods/run-1-submit-abcde-driver"] = pod("Failed", driver)
    command = [fake_spark_submit(tmp_path, rc), "--master", f"k8s://{api}", "--conf", "spark.kubernetes.namespace=ns1",
               "--conf", "spark.kubernetes.driver.pod.name=run-1-submit-abcde-driver", "local:///app.py"]
    assert w.main(command) == code
    out = capfd.readouterr().out.splitlines()
    assert out[0].startswith("submitted: --master") and len(out) == 2 and words in out[1], out
    assert FakeApi.seen == [("/api/v1/namespaces/ns1/pods/run-1-submit-abcde-driver", "Bearer t0ken")]


def test_without_waiting_or_a_driver_name_the_job_ends_with_spark_submit(tmp_path, capfd):
    submit = fake_spark_submit(tmp_path, 4)
    assert w.main([submit, "--conf", "spark.kubernetes.submission.waitAppCompletion=false", "app.py"]) == 4
    assert "waitAppCompletion=false" in capfd.readouterr().out
    assert w.main([submit, "app.py"]) == 4
    assert "no spark.kubernetes.driver.pod.name" in capfd.readouterr().out
