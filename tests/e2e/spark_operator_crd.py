#!/usr/bin/env python3
"""The Spark operator's SparkApplication CRD, for validating the chart's SparkApplication offline.

    python tests/e2e/spark_operator_crd.py          # prints the path of the cached CRD

The CRD comes from the kubeflow/spark-operator Go module at a pinned version, fetched through the Go
module proxy (`go mod download`, which checks the module against sum.golang.org and the pinned
go.sum line below), and is cached outside the clone:
~/.cache/txbroker/spark-operator/<version>/sparkoperator.k8s.io_sparkapplications.yaml (also checked
against a pinned SHA-256). The file is byte-identical in the module's config/crd/bases/ and in its
Helm chart's crds/, i.e. what `helm install spark-operator` installs.

Needs Go (`go` on PATH, /usr/local/go/bin/go, or GO=...) only the first time; GoMissing otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MODULE = "github.com/kubeflow/spark-operator/v2"
VERSION = "v2.5.0"                    # Spark operator 2.5.0 (chart 2.5.0; it submits with Spark 4.0.1)
MODULE_SUM = "h1:NNgTHgQMbrGZSFJtprjssdtCaL/qlYYQY1EyXuRaP78="   # go.sum line of MODULE@VERSION
CRD_PATH = "config/crd/bases/sparkoperator.k8s.io_sparkapplications.yaml"
CRD_SHA256 = "ecd9c14fcadb9d5f8ced4c4ee31920548ea53a892e0a69c3e43aa758bfca6d94"
CRD_NAME = "sparkapplications.sparkoperator.k8s.io"
API_VERSION = "sparkoperator.k8s.io/v1beta2/SparkApplication"   # for helm --api-versions

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "txbroker" / "spark-operator" / VERSION


class GoMissing(RuntimeError):
    pass


class FetchError(RuntimeError):
    pass


def find_go() -> str:
    for candidate in (os.environ.get("GO"), shutil.which("go"), "/usr/local/go/bin/go"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise GoMissing("Go is needed once to fetch the Spark operator's SparkApplication CRD through the Go module "
                    f"proxy ({MODULE}@{VERSION}); install Go (https://go.dev/dl/) or set GO=/path/to/go")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch() -> Path:
    """Path of the cached CRD; downloads the module (once) when it is not cached yet."""
    target = CACHE / Path(CRD_PATH).name
    if target.is_file() and _sha256(target.read_bytes()) == CRD_SHA256:
        return target
    go = find_go()
    with tempfile.TemporaryDirectory() as tmp:   # outside any module: `go mod download` of MODULE@VERSION only
        env = dict(os.environ, GOFLAGS="-mod=mod", GO111MODULE="on")
        r = subprocess.run([go, "mod", "download", "-json", f"{MODULE}@{VERSION}"], cwd=tmp, env=env,
                           capture_output=True, text=True, timeout=600)
    try:
        info = json.loads(r.stdout)
    except json.JSONDecodeError:
        raise FetchError(f"go mod download {MODULE}@{VERSION} failed:\n{r.stderr[-2000:]}") from None
    if info.get("Error") or r.returncode != 0:
        raise FetchError(f"go mod download {MODULE}@{VERSION}: {info.get('Error') or r.stderr[-2000:]}")
    if info.get("Sum") != MODULE_SUM:
        raise FetchError(f"{MODULE}@{VERSION}: module sum {info.get('Sum')}, expected {MODULE_SUM}")
    with zipfile.ZipFile(info["Zip"]) as z:
        data = z.read(f"{MODULE}@{VERSION}/{CRD_PATH}")
    if _sha256(data) != CRD_SHA256:
        raise FetchError(f"{CRD_PATH} in {MODULE}@{VERSION}: sha256 {_sha256(data)}, expected {CRD_SHA256}")
    CACHE.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=CACHE, prefix=".crd-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp_name, 0o644)
    os.replace(tmp_name, target)     # atomic: parallel callers (pytest-xdist workers) never see half a file
    return target


if __name__ == "__main__":
    try:
        print(fetch())
    except (GoMissing, FetchError) as e:
        print(e, file=sys.stderr)
        sys.exit(1)
