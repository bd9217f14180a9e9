"""A Prometheus server's HTTP API, as the monitoring tests ask it (targets, queries, alerts)."""

from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def built(name: str) -> Path:
    """`prometheus` or `promtool` as testbed/prometheus.sh builds them (make test does, when missing)."""
    bin_dir = subprocess.run(["bash", str(REPO / "testbed" / "prometheus.sh"), "bin"], capture_output=True, text=True,
                             check=True).stdout.strip()
    path = Path(bin_dir) / name
    assert path.exists(), f"{path} is missing: run `bash testbed/prometheus.sh build` (make test does)"
    return path


class Prometheus:
    def __init__(self, url: str):
        self.url = url

    def api(self, path: str, **params) -> dict:
        q = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{q}", timeout=10) as r:
            doc = json.load(r)
        assert doc["status"] == "success", doc
        return doc["data"]

    def alerts(self, name: str) -> list[dict]:
        return [a for a in self.api("alerts")["alerts"] if a["labels"]["alertname"] == name]

    def value(self, query: str) -> list[dict]:
        return self.api("query", query=query)["result"]
