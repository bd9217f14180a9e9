"""The spark-submit Job's entry (spark.mode=sparkSubmit): run spark-submit, then end as the driver did.

    /opt/venv/bin/python spark-submit.py /opt/spark/bin/spark-submit --master k8s://... --deploy-mode cluster ...

spark-submit in cluster mode waits for the application (spark.kubernetes.submission.waitAppCompletion)
but exits 0 whatever became of the driver, so the Job would say Complete for a driver that failed.
Once spark-submit returns, this reads the driver pod (spark.kubernetes.driver.pod.name, from the
arguments) from the API server with the pod's ServiceAccount (the chart's Role grants get on pods),
prints one line with the driver container's exit code and reason, and exits with that code:
non-zero when the driver failed, was killed, or its pod is gone before its end was seen.

Python's standard library only (the Spark image has the job's Python, not a Kubernetes client).
Shipped by the chart (ConfigMap <run>-pod-templates), so an image built before it works the same.
"""

from __future__ import annotations

import json
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
END_WAIT_SECONDS = 120.0  # after spark-submit returned, how long the driver pod may take to show its end
SAY = "txbroker spark-submit:"

# spark-submit's options that take no value (SparkSubmitOptionParser's switches); every other option
# takes one, and the first argument that is neither is the application
SWITCHES = {"--help", "-h", "--supervise", "--usage-error", "--verbose", "-v", "--version"}


@dataclass(frozen=True)
class Submission:
    api: str  # the API server, from --master k8s://...
    namespace: str | None
    driver_pod: str | None
    container: str
    wait: bool  # spark.kubernetes.submission.waitAppCompletion


def parse(command: list[str]) -> Submission:
    """What the spark-submit command line says (a later --conf of a key wins, as in spark-submit)."""
    master, conf, i = "", {}, 1
    while i < len(command):
        arg = command[i]
        if arg in SWITCHES:
            i += 1
            continue
        if not arg.startswith("-"):
            break  # the application: what follows is its own
        name, eq, value = arg.partition("=")
        if not eq:
            value = command[i + 1] if i + 1 < len(command) else ""
            i += 1
        i += 1
        if name in ("--conf", "-c"):
            key, _, v = value.partition("=")
            conf[key] = v
        elif name == "--master":
            master = value
    api = master.removeprefix("k8s://")
    if "://" not in api:
        api = "https://" + api
    return Submission(api.rstrip("/"), conf.get("spark.kubernetes.namespace"),
                      conf.get("spark.kubernetes.driver.pod.name"),
                      conf.get("spark.kubernetes.driver.podTemplateContainerName", "spark-kubernetes-driver"),
                      conf.get("spark.kubernetes.submission.waitAppCompletion", "true").strip().lower() != "false")


@dataclass(frozen=True)
class Outcome:
    code: int  # what the Job's container exits with
    line: str


def exit_code(code: int) -> int:
    """A process exit code for the driver's (a non-zero one never becomes 0)."""
    return code if 0 <= code <= 255 else 1


def outcome(pod: dict | None, name: str, container: str, submit_rc: int) -> Outcome | None:
    """The Job's end from the driver pod as read (None: not found), or None while the driver has not ended."""
    if pod is None:
        return Outcome(exit_code(submit_rc) or 1,
                       f"{SAY} the Spark driver pod {name} is gone (deleted, or never created; spark-submit exited "
                       f"{submit_rc}): its exit code is unknown, the Job fails")
    status = pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    mine = next((c for c in statuses if c.get("name") == container),  # else the only one, never a sidecar
                statuses[0] if len(statuses) == 1 else {})
    ended = (mine.get("state") or {}).get("terminated")
    if ended:
        code = int(ended.get("exitCode", 1))
        reason = ended.get("reason") or "no reason given"
        message = (ended.get("message") or "").strip().splitlines()
        detail = f": {message[-1][:200]}" if message and code else ""
        verdict = "the Job succeeds" if code == 0 else "the Job fails"
        return Outcome(exit_code(code), f"{SAY} the Spark driver (pod {name}, container {mine.get('name')}) exited "
                                        f"with code {code} ({reason}{detail}): {verdict}")
    phase = status.get("phase")
    if phase in ("Failed", "Succeeded"):  # ended without a container state (evicted, say)
        code = 0 if phase == "Succeeded" else 1
        why = ": ".join(x for x in (status.get("reason"), status.get("message")) if x) or "no reason given"
        return Outcome(code, f"{SAY} the Spark driver pod {name} is {phase} without an exit code ({why}): "
                             f"{'the Job succeeds' if code == 0 else 'the Job fails'}")
    return None


def read_pod(api: str, namespace: str, name: str) -> dict | None:
    """GET the pod with this pod's ServiceAccount token; None if it does not exist."""
    with open(f"{SERVICE_ACCOUNT}/token") as f:  # read each time: the kubelet rotates it
        token = f.read().strip()
    context = ssl.create_default_context(cafile=f"{SERVICE_ACCOUNT}/ca.crt") if api.startswith("https:") else None
    req = urllib.request.Request(f"{api}/api/v1/namespaces/{namespace}/pods/{name}",
                                 headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=15, context=context) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


def driver_end(sub: Submission, submit_rc: int, read=None, wait: float = END_WAIT_SECONDS) -> Outcome:
    """Read the driver pod until it shows its end (at most `wait` seconds)."""
    read = read or read_pod
    namespace = sub.namespace
    if namespace is None:
        with open(f"{SERVICE_ACCOUNT}/namespace") as f:
            namespace = f.read().strip()
    deadline, last = time.monotonic() + wait, "not read yet"
    while True:
        try:
            found = outcome(read(sub.api, namespace, sub.driver_pod), sub.driver_pod, sub.container, submit_rc)
            if found is not None:
                return found
            last = "still running"
        except (OSError, ValueError) as e:  # the API server unreachable, refused (403: RBAC), or garbled
            last = f"could not be read: {e}"
        if time.monotonic() >= deadline:
            return Outcome(exit_code(submit_rc) or 1,
                           f"{SAY} the Spark driver pod {sub.driver_pod} {last} {wait:.0f}s after spark-submit "
                           f"returned (exit {submit_rc}): its end is unknown, the Job fails")
        time.sleep(1.0)


def main(command: list[str]) -> int:
    if not command:
        print(f"usage: {sys.argv[0]} /opt/spark/bin/spark-submit ARGS...", file=sys.stderr)
        return 2
    sub = parse(command)
    child = subprocess.Popen(command)
    stopping = []

    def forward(signum, _frame):  # the Job deleted, the node draining: spark-submit stops, and so do we
        stopping.append(signum)
        child.send_signal(signum)
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, forward)
    rc = child.wait()
    rc = 128 - rc if rc < 0 else rc  # killed by a signal: as a shell reports it
    sys.stdout.flush()
    if stopping:
        return 128 + stopping[0]
    if not sub.wait:
        print(f"{SAY} spark.kubernetes.submission.waitAppCompletion=false: the Job ends with the submission "
              f"(spark-submit exited {rc}), not with the driver", flush=True)
        return rc
    if not sub.driver_pod:
        print(f"{SAY} no spark.kubernetes.driver.pod.name among the arguments: the Job ends with spark-submit's "
              f"exit code {rc}, not the driver's", flush=True)
        return rc
    end = driver_end(sub, rc)
    print(end.line, flush=True)
    return end.code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
