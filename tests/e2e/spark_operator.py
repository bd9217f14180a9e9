"""The kubeflow Spark operator on the node, for the chart's SparkApplication form.

testbed/cluster.sh builds it from the pinned Go module (testbed/go/spark-operator): the controller
binary in an image made as upstream's is (the Spark image plus the binary), and the module's Helm
chart and CRDs, unchanged, under CHART. The tests install that chart as a user would, with the
webhook off: the chart's SparkApplication carries its pod settings in pod templates, which Spark
applies itself.
"""

from __future__ import annotations

from pathlib import Path

from cluster import CACHE, Cluster
from support.waiting import wait_until

VERSION = "2.5.0"                       # testbed/go/spark-operator/go.mod; it submits with our Spark image's Spark
CHART = CACHE / "spark-operator" / f"v{VERSION}" / "chart"
IMAGE = ("docker.io", "kubeflow/spark-operator", VERSION)   # registry, repository, tag: the chart's image values
API_VERSION = "sparkoperator.k8s.io/v1beta2/SparkApplication"   # for helm --api-versions
CRDS = ("sparkapplications.sparkoperator.k8s.io", "scheduledsparkapplications.sparkoperator.k8s.io",
        "sparkconnects.sparkoperator.k8s.io")


def chart() -> Path:
    if not (CHART / "Chart.yaml").is_file():
        raise FileNotFoundError(f"no Spark operator chart at {CHART}: testbed/cluster.sh up (or build) extracts it "
                                "from the Go module testbed/go/spark-operator")
    return CHART


def apply_crds(tb: Cluster) -> None:
    """The operator's CRDs from its chart, applied once per run and Established."""
    with tb.exclusive("spark-operator-crds"):
        # 800 kB each: too big for client-side apply's last-applied annotation, so server-side apply
        tb.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(chart() / "crds"))

    def established() -> bool:   # (`kubectl wait` fails outright while a CRD has no conditions yet)
        return all(any(c["type"] == "Established" and c["status"] == "True"
                       for c in ((tb.get("crd", name) or {}).get("status") or {}).get("conditions") or [])
                   for name in CRDS)

    wait_until(established, 60, "the Spark operator's CRDs Established")


def install(tb: Cluster, namespace: str, release: str) -> tuple[str, str]:
    """`helm install` of the operator's own chart into `namespace`, watching only it; returns the
    controller Deployment's name and its ServiceAccount once it is available."""
    registry, repository, tag = IMAGE
    tb.helm("install", release, str(chart()), "-n", namespace, "--skip-crds",
            "--set", "webhook.enable=false",
            "--set", f"image.registry={registry}", "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
            "--set", f"spark.jobNamespaces={{{namespace}}}",
            # the job's own ServiceAccount and Role come with our chart (spark.serviceAccount)
            "--set", "spark.serviceAccount.create=false", "--set", "spark.rbac.create=false",
            "--set", "controller.leaderElection.enable=false", "--set", "prometheus.metrics.enable=false",
            "--wait", "--timeout", "180s", timeout=240)
    controller = tb.list("deployments", namespace, f"app.kubernetes.io/instance={release}")[0]
    return controller["metadata"]["name"], controller["spec"]["template"]["spec"]["serviceAccountName"]
