"""The chart's Spark job (spark.* values): both forms rendered and checked by a real API server.

- sparkApplication: a SparkApplication (sparkoperator.k8s.io/v1beta2), validated by the Spark
  operator's real CRD (from its pinned Go module, as testbed/cluster.sh extracts it: spark_operator.py);
- sparkSubmit: a Job running spark-submit in cluster mode, pod templates in a ConfigMap;
- both: the driver's ServiceAccount, Role and RoleBinding, the data PVC, a TxProducerGroup in ledger
  mode (its transactions join broker jobs: no checker process, no ledger volume);
- a secured broker (spark.brokerCredentialsSecret, spark.brokerTlsSecret): the driver and the
  executors get the access key from the Secret and the secret and certificates as mounted files,
  named by the TXBROKER_* variables txbroker_spark reads.

Everything is checked with `kubectl apply --dry-run=server` (strict field validation), the pod
templates as Pods of their own, the RBAC with `kubectl auth can-i` after a real `helm install`.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import subprocess
import sys

import pytest
import yaml
from cluster import ROOT

import spark_operator

pytestmark = pytest.mark.e2e

CHART = str(ROOT / "helm" / "txbroker")
API = spark_operator.API_VERSION          # sparkoperator.k8s.io/v1beta2/SparkApplication
SPARK = ["--set", "spark.enabled=true"]
SPARK_NAME = "app.kubernetes.io/name"


def docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def spark_objects(text: str) -> list[dict]:
    return [d for d in docs(text) if d["metadata"].get("labels", {}).get(SPARK_NAME) == "txbroker-spark"]


def kinds(objs: list[dict]) -> list[tuple[str, str]]:
    return sorted((d["kind"], d["metadata"]["name"]) for d in objs)


def one(objs: list[dict], kind: str) -> dict:
    found = [d for d in objs if d["kind"] == kind]
    assert len(found) == 1, kinds(objs)
    return found[0]


def render(testbed, *args: str, namespace: str = "ns1", **kw) -> subprocess.CompletedProcess:
    return testbed.helm("template", "rel", CHART, "-n", namespace, *args, **kw)


def as_pod(spec: dict, metadata: dict, name: str) -> dict:
    """A pod template (what Spark starts the driver or an executor from) as a Pod of its own."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {**metadata, "name": name}, "spec": spec}


def dry_run(testbed, namespace: str, objs: list[dict], check: bool = True) -> subprocess.CompletedProcess:
    # a pod is admitted only if its ServiceAccount exists (the ServiceAccount admission plugin, as
    # in any cluster); the chart's own ServiceAccount would be made by the same install, which a dry
    # run does not do: make the ones the pods name first
    for sa in {o["spec"].get("serviceAccountName") for o in objs if o.get("kind") == "Pod"} - {None, "default"}:
        testbed.kubectl("-n", namespace, "create", "serviceaccount", sa, check=False)
    text = "\n---\n".join(json.dumps(o) for o in objs)
    return testbed.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=text, check=check)


@pytest.fixture(scope="session")
def spark_crd(testbed):
    """The Spark operator's CRDs (pinned version), applied and Established."""
    spark_operator.apply_crds(testbed)
    return testbed


# -- what renders ---------------------------------------------------------------------------------------

def test_spark_is_off_by_default(testbed):
    assert spark_objects(render(testbed).stdout) == []


def test_lint_strict_with_spark(testbed):
    testbed.helm("lint", "--strict", CHART, *SPARK)
    testbed.helm("lint", "--strict", CHART, *SPARK, "--set", "spark.mode=sparkSubmit",
                 "--set", "spark.data.existingClaim=shared", "--set", "spark.data.enabled=false",
                 "--set", "spark.driver.coreLimit=1200m", "--set", "spark.imagePullSecrets[0].name=regcred",
                 "--set", "spark.job.extraArgs={--fail-partition,1}",
                 "--set", "spark.txProducerGroup.create=false", "--set", "spark.nodeSelector.pool=spark")
    testbed.helm("lint", "--strict", CHART, *SPARK, *SECURED)


def test_auto_picks_the_spark_submit_job_without_the_api(testbed):
    objs = spark_objects(render(testbed, *SPARK).stdout)
    assert kinds(objs) == [
        ("ConfigMap", "rel-spark-1-pod-templates"), ("Job", "rel-spark-1-submit"),
        ("PersistentVolumeClaim", "rel-spark-data"),
        ("Role", "rel-spark-driver"), ("RoleBinding", "rel-spark-driver"), ("ServiceAccount", "rel-spark"),
        ("TxProducerGroup", "orders-publisher")]


def test_auto_picks_the_spark_application_with_the_api(testbed):
    objs = spark_objects(render(testbed, *SPARK, "--api-versions", API).stdout)
    assert kinds(objs) == [
        ("PersistentVolumeClaim", "rel-spark-data"),
        ("Role", "rel-spark-driver"), ("RoleBinding", "rel-spark-driver"), ("ServiceAccount", "rel-spark"),
        ("SparkApplication", "rel-spark-1"), ("TxProducerGroup", "orders-publisher")]


def test_forced_modes(testbed):
    objs = spark_objects(render(testbed, *SPARK, "--set", "spark.mode=sparkSubmit", "--api-versions", API).stdout)
    assert {"Job", "ConfigMap"} <= {d["kind"] for d in objs} and "SparkApplication" not in {d["kind"] for d in objs}
    r = render(testbed, *SPARK, "--set", "spark.mode=sparkApplication", check=False)
    assert r.returncode != 0
    assert "spark.mode=sparkApplication needs the SparkApplication API (sparkoperator.k8s.io/v1beta2)" in r.stderr


def test_the_spark_operators_service_account_may_apply_the_network_policy(testbed):
    """spark.sparkOperatorServiceAccount: a Role for networkpolicies in the release namespace, bound
    to the operator's controller (which runs spark-submit); a value that is not <namespace>/<name> is
    refused naming the setting."""
    objs = spark_objects(render(testbed, *SPARK, "--set", "spark.sparkOperatorServiceAccount=ops/so-controller",
                                "--api-versions", API).stdout)
    role = next(d for d in objs if d["kind"] == "Role" and d["metadata"]["name"] == "rel-spark-spark-operator")
    assert role["rules"] == [{"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
                              "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]
    binding = next(d for d in objs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == "rel-spark-spark-operator")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "so-controller", "namespace": "ops"}]
    assert binding["metadata"]["namespace"] == "ns1"
    assert not [d for d in spark_objects(render(testbed, *SPARK, "--api-versions", API).stdout)
                if d["metadata"]["name"] == "rel-spark-spark-operator"]
    r = render(testbed, *SPARK, "--set", "spark.sparkOperatorServiceAccount=so-controller", check=False)
    assert r.returncode != 0 and "spark.sparkOperatorServiceAccount must be <namespace>/<name>" in r.stderr


def test_spark_submit_job(testbed):
    objs = spark_objects(render(testbed, *SPARK, "--set", "spark.executor.coreLimit=1500m",
                                "--set", "spark.imagePullSecrets[0].name=regcred",
                                "--set", "spark.job.sparkConf.spark\\.task\\.maxFailures=8").stdout)
    job, cm = one(objs, "Job"), one(objs, "ConfigMap")
    pod = job["spec"]["template"]["spec"]
    assert job["spec"]["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
    assert pod["serviceAccountName"] == one(objs, "ServiceAccount")["metadata"]["name"] == "rel-spark"
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 185
    c = pod["containers"][0]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    args = c["args"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "pod-templates")
    # spark-submit under the chart's wrapper (test_spark_submit_job_ends_as_its_driver_did)
    assert args[:8] == ["/opt/venv/bin/python", f"{mount['mountPath']}/spark-submit.py", "/opt/spark/bin/spark-submit",
                        "--master", "k8s://https://kubernetes.default.svc", "--deploy-mode", "cluster", "--name"]
    conf = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--conf")
    assert next(v for v in pod["volumes"] if v["name"] == "pod-templates")["configMap"]["name"] == \
        cm["metadata"]["name"]
    assert conf["spark.kubernetes.driver.podTemplateFile"] == f"{mount['mountPath']}/driver.yaml"
    assert conf["spark.kubernetes.executor.podTemplateFile"] == f"{mount['mountPath']}/executor.yaml"
    assert set(cm["data"]) == {"driver.yaml", "executor.yaml", "spark-submit.py"}
    assert conf["spark.kubernetes.authenticate.driver.serviceAccountName"] == "rel-spark"
    assert conf["spark.kubernetes.namespace"] == "ns1"
    assert conf["spark.kubernetes.container.image"] == "txbroker/spark:0.2.0"
    assert conf["spark.kubernetes.container.image.pullSecrets"] == "regcred"
    assert conf["spark.executor.instances"] == "2" and conf["spark.executor.memory"] == "1g"
    assert conf["spark.kubernetes.executor.limit.cores"] == "1500m"
    assert conf["spark.task.maxFailures"] == "8"
    assert conf["spark.pyspark.python"] == "/opt/venv/bin/python"
    app = args.index("local:///opt/txbroker/jobs/orders_job.py")
    # the pod templates: the data volume in both; the executors' mount no token
    driver, executor = yaml.safe_load(cm["data"]["driver.yaml"]), yaml.safe_load(cm["data"]["executor.yaml"])
    assert {v["name"] for v in driver["spec"]["volumes"]} == {"txbroker-data"}
    assert {v["name"] for v in executor["spec"]["volumes"]} == {"txbroker-data"}
    assert executor["spec"]["automountServiceAccountToken"] is False
    assert driver["spec"]["containers"][0]["name"] == conf["spark.kubernetes.driver.podTemplateContainerName"]
    assert executor["spec"]["containers"][0]["name"] == conf["spark.kubernetes.executor.podTemplateContainerName"]
    assert args[app + 1:app + 3] == ["--brokers", "rel-master.ns1.svc:10911"]


def _chart_spark_submit():
    path = ROOT / "helm" / "txbroker" / "files" / "spark-submit.py"
    spec = importlib.util.spec_from_file_location("chart_spark_submit_for_chart_test", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (dataclasses look their module up)
    spec.loader.exec_module(mod)
    return mod


def test_spark_submit_job_ends_as_its_driver_did(testbed):
    """spark-submit in cluster mode exits 0 whatever the driver did: the Job runs it under
    files/spark-submit.py (shipped in the ConfigMap, run by the image's Python), which then reads the
    driver pod, named after the Job's pod (unique to each attempt), and exits with the driver's exit
    code (its logic: tests/unit/test_spark_submit_wrapper.py). The ServiceAccount may get pods."""
    objs = spark_objects(render(testbed, *SPARK).stdout)
    job, cm = one(objs, "Job"), one(objs, "ConfigMap")
    c = job["spec"]["template"]["spec"]["containers"][0]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "pod-templates")
    wrapper = (ROOT / "helm" / "txbroker" / "files" / "spark-submit.py").read_text()
    assert cm["data"]["spark-submit.py"] == wrapper
    assert c["args"][:3] == ["/opt/venv/bin/python", f"{mount['mountPath']}/spark-submit.py", "/opt/spark/bin/spark-submit"]
    assert "command" not in c   # through the image's entrypoint (pass-through), as before
    # the driver pod's name: the Job pod's (the API server expands $(...) from the container's env)
    env = {e["name"]: e for e in c["env"]}
    assert env["TXBROKER_SUBMIT_POD"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    sub = _chart_spark_submit().parse(c["args"][2:])
    assert (sub.api, sub.namespace, sub.driver_pod, sub.container, sub.wait) == (
        "https://kubernetes.default.svc", "ns1", "$(TXBROKER_SUBMIT_POD)-driver", "spark-kubernetes-driver", True)
    driver_tpl = yaml.safe_load(cm["data"]["driver.yaml"])
    assert driver_tpl["spec"]["containers"][0]["name"] == sub.container
    # a name of the user's own (spark.job.sparkConf) is what both spark-submit and the wrapper use
    objs = spark_objects(render(testbed, *SPARK, "--set-string",
                                "spark.job.sparkConf.spark\\.kubernetes\\.driver\\.pod\\.name=my-driver").stdout)
    args = one(objs, "Job")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert _chart_spark_submit().parse(args[2:]).driver_pod == "my-driver"
    # the submitter's ServiceAccount may read the driver pod
    role = next(d for d in objs if d["kind"] == "Role" and d["metadata"]["name"] == "rel-spark-driver")
    assert any("pods" in r["resources"] and "get" in r["verbs"] for r in role["rules"] if r["apiGroups"] == [""])


def _orders_job():
    path = ROOT / "spark" / "jobs" / "orders_job.py"
    spec = importlib.util.spec_from_file_location("orders_job_for_chart_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_application_arguments_are_the_orders_jobs(testbed):
    """The rendered arguments parse with the job's own argument parser, in both forms."""
    settings = ["--set", "txbroker.name=orders-broker", "--set", "spark.topic=Orders",
                "--set", "spark.producerGroup=orders-pub", "--set", "spark.deadlineSeconds=800",
                "--set", "spark.job.orders=1000000", "--set", "spark.job.extraArgs={--fail-partition,1}"]
    parse = _orders_job().parse_args
    sub = spark_objects(render(testbed, *SPARK, *settings).stdout)
    args = one(sub, "Job")["spec"]["template"]["spec"]["containers"][0]["args"]
    job_args = args[args.index("local:///opt/txbroker/jobs/orders_job.py") + 1:]
    app = one(spark_objects(render(testbed, *SPARK, *settings, "--api-versions", API).stdout), "SparkApplication")
    assert app["spec"]["arguments"] == job_args
    a = parse(job_args)
    assert (a.brokers, a.topic, a.group) == ("orders-broker-master.ns1.svc:10911", "Orders", "orders-pub")
    assert (a.input, a.output, a.orders, a.partitions, a.batch_size, a.deadline_seconds, a.fail_partition) == \
        ("/data/orders", "/data/orders-result", 1000000, 4, 500, 800.0, 1)
    # the TxProducerGroup: the job's group on the job's broker, ledger mode
    pg = one(sub, "TxProducerGroup")
    assert pg["metadata"]["name"] == "orders-pub"
    assert pg["spec"] == {"brokerRef": {"name": "orders-broker"}, "checkMode": "ledger", "checkIntervalSeconds": 60,
                          "timeoutSeconds": 6, "checkMax": 15}


def test_broker_address_override(testbed):
    objs = spark_objects(render(testbed, *SPARK,
                                "--set", "spark.broker.address=tx-0.example:10911\\,tx-1.example:10911").stdout)
    args = one(objs, "Job")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--brokers") + 1] == "tx-0.example:10911,tx-1.example:10911"


def test_existing_claims_and_no_data_volume(testbed):
    objs = spark_objects(render(testbed, *SPARK, "--set", "spark.data.existingClaim=team-data",
                                "--set", "spark.data.subPath=orders").stdout)
    assert "PersistentVolumeClaim" not in {d["kind"] for d in objs}
    cm = one(objs, "ConfigMap")
    for key in ("driver.yaml", "executor.yaml"):
        pod = yaml.safe_load(cm["data"][key])
        assert pod["spec"]["volumes"] == [
            {"name": "txbroker-data", "persistentVolumeClaim": {"claimName": "team-data"}}], key
        assert pod["spec"]["containers"][0]["volumeMounts"] == [
            {"name": "txbroker-data", "mountPath": "/data", "subPath": "orders"}], key
    objs = spark_objects(render(testbed, *SPARK, "--set", "spark.data.enabled=false",
                                "--set", "spark.job.input=s3a://bucket/orders").stdout)
    assert "PersistentVolumeClaim" not in {d["kind"] for d in objs}
    cm = one(objs, "ConfigMap")
    for key in ("driver.yaml", "executor.yaml"):
        pod = yaml.safe_load(cm["data"][key])
        assert "volumes" not in pod["spec"] and "volumeMounts" not in pod["spec"]["containers"][0], key


def test_dockerfile_matches_the_templates(testbed):
    """spark/Dockerfile provides what the templates assume: user, paths, Python, Spark version."""
    dockerfile = (ROOT / "spark" / "Dockerfile").read_text()
    values = yaml.safe_load((ROOT / "helm" / "txbroker" / "values.yaml").read_text())["spark"]
    user = re.findall(r"^USER\s+(\S+)", dockerfile, re.M)[-1]
    assert user == str(values["podSecurityContext"]["runAsUser"]) == "185"    # numeric: runAsNonRoot is checkable
    assert "PYSPARK_PYTHON=/opt/venv/bin/python" in dockerfile
    jobs_dir = re.search(r"cp -r spark/jobs (\S+);", dockerfile).group(1)
    app = values["job"]["mainApplicationFile"]
    assert app.startswith(f"local://{jobs_dir}/") and (ROOT / "spark" / "jobs" / app.rsplit("/", 1)[1]).is_file()
    spark_image = re.search(r"^ARG SPARK_IMAGE=(\S+)", dockerfile, re.M).group(1)
    assert spark_image.split(":")[1].startswith(values["sparkVersion"] + "-"), (spark_image, values["sparkVersion"])
    assert "ENTRYPOINT" not in dockerfile and "CMD" not in re.sub(r"#.*", "", dockerfile)   # Spark's entrypoint
    objs = spark_objects(render(testbed, *SPARK).stdout)
    assert one(objs, "Job")["spec"]["template"]["spec"]["containers"][0]["image"] == "txbroker/spark:0.2.0"


# -- a secured broker: credentials and TLS from Secrets ------------------------------------------------

CREDS, CA = "orders-publisher-creds", "txb-client-tls"
SECURED = ["--set", f"spark.brokerCredentialsSecret={CREDS}", "--set", f"spark.brokerTlsSecret={CA}",
           "--set", "spark.brokerTlsClientCertificate=true"]


def secured_pod_specs(objs: list[dict]) -> dict[str, dict]:
    """role -> pod spec: the driver's and executors' templates (either form)."""
    out = {}
    apps = [d for d in objs if d["kind"] == "SparkApplication"]
    for role in ("driver", "executor"):
        if apps:
            out[role] = apps[0]["spec"][role]["template"]["spec"]
        else:
            out[role] = yaml.safe_load(one(objs, "ConfigMap")["data"][f"{role}.yaml"])["spec"]
    return out


def assert_reads_the_broker_secrets(spec: dict, client_certificate: bool = True) -> dict:
    """The access key from the Secret, the secret and the certificates as files of mounted Secrets,
    exactly where the TXBROKER_* variables point; returns the variables."""
    c = spec["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    assert env["TXBROKER_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {"name": CREDS, "key": "access-key"}
    # the secret itself is never an environment variable (nor an argument): only a file
    assert "TXBROKER_SECRET_KEY" not in env
    assert all(e.get("valueFrom", {}).get("secretKeyRef", {}).get("key") != "secret-key" for e in c["env"])
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}

    def mounted(path: str, secret: str, key: str) -> None:
        m = next(m for m in mounts.values() if path.startswith(m["mountPath"] + "/"))
        v = volumes[m["name"]]["secret"]
        assert m.get("readOnly") is True and v["secretName"] == secret and v["defaultMode"] == 0o440
        assert {"key": key, "path": path[len(m["mountPath"]) + 1:]} in v["items"]

    mounted(env["TXBROKER_SECRET_KEY_FILE"]["value"], CREDS, "secret-key")
    mounted(env["TXBROKER_TLS_CA"]["value"], CA, "ca.crt")
    tls_keys = {i["key"] for v in volumes.values() if v.get("secret", {}).get("secretName") == CA
                for i in v["secret"]["items"]}
    if client_certificate:
        mounted(env["TXBROKER_TLS_CERT"]["value"], CA, "tls.crt")
        mounted(env["TXBROKER_TLS_KEY"]["value"], CA, "tls.key")
        assert tls_keys == {"ca.crt", "tls.crt", "tls.key"}
    else:
        assert "TXBROKER_TLS_CERT" not in env and tls_keys == {"ca.crt"}  # the key of a broker's Secret stays out
    return {k: e.get("value", "from-the-secret") for k, e in env.items()}


def without_broker_secrets(spec: dict) -> dict:
    spec = copy.deepcopy(spec)
    c = spec["containers"][0]
    c["env"] = [e for e in c.get("env", []) if not e["name"].startswith("TXBROKER_")]
    c["volumeMounts"] = [m for m in c.get("volumeMounts", []) if not m["name"].startswith("txbroker-broker-")]
    spec["volumes"] = [v for v in spec.get("volumes", []) if not v["name"].startswith("txbroker-broker-")]
    for d, key in ((c, "env"), (c, "volumeMounts"), (spec, "volumes")):
        if not d[key]:
            del d[key]
    return spec


def container_args(objs: list[dict]) -> list:
    out = [c.get("args") for d in objs if d["kind"] == "Job"
           for c in d["spec"]["template"]["spec"]["containers"]]
    return out + [d["spec"]["arguments"] for d in objs if d["kind"] == "SparkApplication"]


def test_broker_secrets_reach_the_driver_and_the_executors(testbed):
    from txbroker_spark.security import parse_security

    for api in ([], ["--api-versions", API]):
        plain = spark_objects(render(testbed, *SPARK, *api).stdout)
        objs = spark_objects(render(testbed, *SPARK, *SECURED, *api).stdout)
        for role, spec in secured_pod_specs(objs).items():
            env = assert_reads_the_broker_secrets(spec)
            # what txbroker_spark makes of these variables (the data source, the job)
            sec = parse_security({}, env)
            assert (sec.access_key, sec.secret_key_file, sec.ca_file, sec.cert_file, sec.key_file) == (
                "from-the-secret", env["TXBROKER_SECRET_KEY_FILE"], env["TXBROKER_TLS_CA"],
                env["TXBROKER_TLS_CERT"], env["TXBROKER_TLS_KEY"]), role
            # nothing else of the pod changes
            assert without_broker_secrets(spec) == without_broker_secrets(secured_pod_specs(plain)[role]), role
        # nor the arguments: the settings travel as variables and files only
        assert container_args(objs) == container_args(plain)
    # only the CA: the client certificate's keys are not mounted
    objs = spark_objects(render(testbed, *SPARK, "--set", f"spark.brokerCredentialsSecret={CREDS}",
                                "--set", f"spark.brokerTlsSecret={CA}").stdout)
    for spec in secured_pod_specs(objs).values():
        assert_reads_the_broker_secrets(spec, client_certificate=False)
    # off by default
    for spec in secured_pod_specs(spark_objects(render(testbed, *SPARK).stdout)).values():
        assert not [e for e in spec["containers"][0].get("env", []) if e["name"].startswith("TXBROKER_")]
    r = render(testbed, *SPARK, "--set", "spark.brokerTlsClientCertificate=true", check=False)
    assert r.returncode != 0 and "spark.brokerTlsClientCertificate=true needs spark.brokerTlsSecret" in r.stderr


EXTRAS = {"spark": {
    "imagePullSecrets": [{"name": "regcred"}], "nodeSelector": {"pool": "spark"},
    "tolerations": [{"key": "spark", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}]}},
    "serviceAccount": {"annotations": {"example.com/role": "spark"}},
    "data": {"subPath": "orders", "storageClassName": "nfs"}, "executor": {"coreLimit": 1},
    "job": {"extraArgs": ["--fail-partition", 1]}}}


# -- the real API server: server-side dry run ----------------------------------------------------------

def test_spark_application_passes_the_spark_operators_crd(crds, spark_crd, namespace, tmp_path):
    extras = tmp_path / "extras.yaml"
    extras.write_text(yaml.safe_dump(EXTRAS))
    objs = spark_objects(render(crds, *SPARK, "--api-versions", API, "--set", "spark.driver.coreLimit=1200m",
                                "-f", str(extras), namespace=namespace).stdout)
    r = dry_run(crds, namespace, objs)
    for kind, name in [("sparkapplication.sparkoperator.k8s.io", "rel-spark-1"),
                       ("txproducergroup.txbroker.dev", "orders-publisher"),
                       ("serviceaccount", "rel-spark"), ("role.rbac.authorization.k8s.io", "rel-spark-driver"),
                       ("rolebinding.rbac.authorization.k8s.io", "rel-spark-driver"),
                       ("persistentvolumeclaim", "rel-spark-data")]:
        assert f"{kind}/{name} created (server dry run)" in r.stdout, r.stdout
    # the pod templates inside it (the CRD keeps them as they are) are valid Pods
    app = one(objs, "SparkApplication")
    pods = [as_pod(app["spec"][role]["template"]["spec"], app["spec"][role]["template"]["metadata"], f"tpl-{role}")
            for role in ("driver", "executor")]
    r = dry_run(crds, namespace, pods)
    assert all(f"pod/tpl-{role} created (server dry run)" in r.stdout for role in ("driver", "executor")), r.stdout
    # and the CRD's schema is really in force: a value it forbids and a field it does not know are refused
    bad = copy.deepcopy(app)
    bad["spec"]["executor"]["instances"] = 0
    r = dry_run(crds, namespace, [bad], check=False)
    assert r.returncode != 0 and "spec.executor.instances" in r.stderr, r.stderr
    bad = copy.deepcopy(app)
    bad["spec"]["driver"]["coreCount"] = 1
    r = dry_run(crds, namespace, [bad], check=False)
    assert r.returncode != 0 and "coreCount" in r.stderr, r.stderr


def test_spark_submit_form_passes_server_side_validation(crds, namespace, tmp_path):
    extras = tmp_path / "extras.yaml"
    extras.write_text(yaml.safe_dump(EXTRAS))
    objs = spark_objects(render(crds, *SPARK, "--set", "spark.mode=sparkSubmit", "-f", str(extras),
                                namespace=namespace).stdout)
    r = dry_run(crds, namespace, objs)
    for kind, name in [("job.batch", "rel-spark-1-submit"), ("configmap", "rel-spark-1-pod-templates"),
                       ("serviceaccount", "rel-spark"),
                       ("role.rbac.authorization.k8s.io", "rel-spark-driver"),
                       ("rolebinding.rbac.authorization.k8s.io", "rel-spark-driver"),
                       ("txproducergroup.txbroker.dev", "orders-publisher"),
                       ("persistentvolumeclaim", "rel-spark-data")]:
        assert f"{kind}/{name} created (server dry run)" in r.stdout, r.stdout
    cm = one(objs, "ConfigMap")
    pods = []
    for key in ("driver.yaml", "executor.yaml"):
        pod = yaml.safe_load(cm["data"][key])
        assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
        pods.append(as_pod(pod["spec"], pod["metadata"], f"tpl-{key.split('.')[0]}"))
    r = dry_run(crds, namespace, pods)
    assert all(f"pod/tpl-{role} created (server dry run)" in r.stdout for role in ("driver", "executor")), r.stdout


@pytest.mark.parametrize("form", ["sparkApplication", "sparkSubmit"])
def test_secured_form_passes_server_side_validation(crds, spark_crd, namespace, tmp_path, form):
    """With the broker's Secrets wired in: every object, and the pod templates as Pods of their own."""
    extras = tmp_path / "extras.yaml"
    extras.write_text(yaml.safe_dump(EXTRAS))
    objs = spark_objects(render(crds, *SPARK, *SECURED, "--set", f"spark.mode={form}", "--api-versions", API,
                                "-f", str(extras), namespace=namespace).stdout)
    assert (form == "sparkApplication") == any(d["kind"] == "SparkApplication" for d in objs)
    r = dry_run(crds, namespace, objs)
    assert r.stdout.count("created (server dry run)") == len(objs), r.stdout
    specs = secured_pod_specs(objs)
    for spec in specs.values():
        assert_reads_the_broker_secrets(spec)
    pods = [as_pod(specs[role], {"labels": {"role": role}}, f"tpl-{role}") for role in ("driver", "executor")]
    r = dry_run(crds, namespace, pods)
    assert all(f"pod/tpl-{role} created (server dry run)" in r.stdout for role in ("driver", "executor")), r.stdout


# -- real installs ------------------------------------------------------------------------------------

def _can(testbed, namespace: str, sa: str, *args: str) -> str:
    return testbed.kubectl("auth", "can-i", *args, "--as", f"system:serviceaccount:{namespace}:{sa}",
                           check=False).stdout.strip()


def test_install_spark_submit_and_the_drivers_rbac(crds, namespace):
    release = "orders"
    r = crds.helm("install", release, CHART, "-n", namespace, *SPARK, "--set", "spark.mode=sparkSubmit",
                  "--set", "operator.replicas=0")
    assert "STATUS: deployed" in r.stdout
    job = crds.get("job", "orders-spark-1-submit", namespace)
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "orders-spark"
    assert crds.get("configmap", "orders-spark-1-pod-templates", namespace) is not None
    assert crds.get("txpg", "orders-publisher", namespace)["spec"]["checkMode"] == "ledger"
    sa = "orders-spark"
    # what the driver does with its executors (and spark-submit with the driver)
    for verb, res in [("create", "pods"), ("watch", "pods"), ("get", "pods"), ("deletecollection", "pods"),
                      ("create", "services"),
                      ("create", "configmaps"), ("deletecollection", "configmaps"),
                      ("create", "persistentvolumeclaims")]:
        assert _can(crds, namespace, sa, verb, res, "-n", namespace) == "yes", (verb, res)
    # and nothing more
    assert _can(crds, namespace, sa, "get", "secrets", "-n", namespace) == "no"
    assert _can(crds, namespace, sa, "create", "deployments", "-n", namespace) == "no"
    assert _can(crds, namespace, sa, "create", "pods", "-n", "default") == "no"
    # a new run: a new Job (the old one goes), nothing else changes
    r = crds.helm("upgrade", release, CHART, "-n", namespace, "--reuse-values", "--set", "spark.runId=2")
    assert "STATUS: deployed" in r.stdout
    assert crds.get("job", "orders-spark-2-submit", namespace) is not None
    assert crds.get("job", "orders-spark-1-submit", namespace) is None
    crds.helm("uninstall", release, "-n", namespace, "--wait")
    assert crds.get("serviceaccount", "orders-spark", namespace) is None
    # the data (the job's input and output) outlives the release
    assert crds.get("pvc", "orders-spark-data", namespace) is not None


def test_install_with_the_spark_operator_api(crds, spark_crd, namespace):
    """With the CRD served, helm (asking the real API server) picks the SparkApplication, which the CRD accepts."""
    r = crds.helm("install", "orders", CHART, "-n", namespace, *SPARK, "--set", "operator.replicas=0")
    assert "STATUS: deployed" in r.stdout
    app = crds.get("sparkapplication", "orders-spark-1", namespace)
    assert app["spec"]["driver"]["serviceAccount"] == "orders-spark"
    assert app["spec"]["mainApplicationFile"] == "local:///opt/txbroker/jobs/orders_job.py"
    assert crds.get("job", "orders-spark-1-submit", namespace) is None
    crds.helm("uninstall", "orders", "-n", namespace, "--wait")
    assert crds.get("sparkapplication", "orders-spark-1", namespace) is None


# -- values that are refused --------------------------------------------------------------------------

@pytest.mark.parametrize("setting, words", [
    ("spark.mode=yarn", "/spark/mode"),
    ("spark.executor.instances=0", "/spark/executor/instances"),
    ("spark.driver.memory=lots", "/spark/driver/memory"),
    ("spark.topic=bad topic", "/spark/topic"),
    ("spark.producerGroup=orders.publisher", "/spark/producerGroup"),   # RocketMQ's characters only
    ("spark.data.mountPath=data", "/spark/data/mountPath"),
    ("spark.data.accessModes={ReadWriteSometimes}", "/spark/data/accessModes"),
    ("spark.deadlineSeconds=604801", "/spark/deadlineSeconds"),        # the broker's longest job: 7 days
    ("spark.ledger.mountPath=/ledger", "ledger"),                      # gone with the checker
    ("spark.runId=Run_1", "/spark/runId"),
    ("spark.broker.address=no-port", "/spark/broker/address"),
    ("spark.sparkVersion=3.5.1", "/spark/sparkVersion"),
    ("spark.job.batchSize=0", "/spark/job/batchSize"),
    ("spark.brokerCredentialsSecret=Orders_Creds", "/spark/brokerCredentialsSecret"),
    ("spark.brokerTlsClientCertificate=maybe", "/spark/brokerTlsClientCertificate"),
    ("spark.bogus=1", "bogus"),
])
def test_values_schema_refuses_bad_spark_values(testbed, setting, words):
    r = render(testbed, *SPARK, "--set", setting, check=False)
    assert r.returncode != 0 and "values don't meet the specifications of the schema" in r.stderr, r.stderr
    assert words in r.stderr, r.stderr


def test_group_names_outside_kubernetes_names(crds, namespace):
    """The TxProducerGroup is named after the group as Kubernetes allows; spec.groupName keeps the exact name."""
    objs = spark_objects(render(crds, *SPARK, "--set", "spark.producerGroup=Orders_Publisher|EU",
                                namespace=namespace).stdout)
    pg = one(objs, "TxProducerGroup")
    assert pg["metadata"]["name"] == "orders-publisher-eu" and pg["spec"]["groupName"] == "Orders_Publisher|EU"
    args = one(objs, "Job")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--group") + 1] == "Orders_Publisher|EU"
    r = dry_run(crds, namespace, [pg])
    assert "txproducergroup.txbroker.dev/orders-publisher-eu created (server dry run)" in r.stdout
    objs = spark_objects(render(crds, *SPARK, "--set", "spark.txProducerGroup.create=false").stdout)
    assert "TxProducerGroup" not in {d["kind"] for d in objs}


def test_a_deadline_longer_than_the_check_backs_renders(testbed):
    """The job's transactions are never checked back (the broker ends them by the job's decision or
    deadline), so the group's check-back settings need not outlast the deadline any more."""
    objs = spark_objects(render(testbed, *SPARK, "--set", "spark.deadlineSeconds=3600").stdout)
    assert one(objs, "TxProducerGroup")["spec"]["checkMax"] == 15
    args = one(objs, "Job")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--deadline-seconds") + 1] == "3600"
