"""The previous release, for upgrade tests: this repository's source at a pinned commit, run from a
copy of it (`git archive`, cached outside the clone), beside the current code.

PREVIOUS_COMMIT is txbroker 0.1.0 as it stood just before store format 5 (commit 7e77c56): its
brokers write store format 4 and send no versions when they replicate. Its Python dependencies are
this venv's (constraints.txt did not change since), so its broker runs as
`python -m txbroker.cli.main` with the copy first on PYTHONPATH. The e2e upgrade test builds its
images from the same copy (testbed/images.sh --source).
"""

from __future__ import annotations

import fcntl
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from support import cache
from support.brokers import BrokerProcess

REPO = Path(__file__).resolve().parents[2]
PREVIOUS_COMMIT = "65d4c508b4f0b26c1694afa6147298bc2e3d6427"
PREVIOUS_VERSION = "0.1.0"
PREVIOUS_STORE_FORMAT = 4
CACHE = cache.CACHE / "previous"


def source(commit: str = PREVIOUS_COMMIT) -> Path:
    """The repository's tree at `commit`, extracted once (concurrent callers wait for the first)."""
    target = CACHE / commit
    if (target / ".complete").exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{commit}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return target
        r = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit], capture_output=True)
        if r.returncode != 0:
            raise RuntimeError(f"cannot read the previous release (commit {commit}) from {REPO}: "
                               f"{r.stderr.decode(errors='replace').strip()} (a shallow clone lacks it: "
                               "`git fetch --unshallow`)")
        tmp = Path(tempfile.mkdtemp(dir=CACHE))
        with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tar:
            tar.extractall(tmp, filter="data")
        (tmp / ".complete").write_text(commit + "\n")
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return target


class PreviousBroker(BrokerProcess):
    """A broker of the previous release (PREVIOUS_COMMIT) on its own data dir."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.command = [sys.executable, "-m", "txbroker.cli.main"]
        self.env = dict(os.environ, PYTHONPATH=str(source() / "broker_image"))


def run_previous_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The previous release's `txbroker` command."""
    return subprocess.run([sys.executable, "-m", "txbroker.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONPATH=str(source() / "broker_image")))
