"""One sample of a broker's Prometheus metrics, as a test reads it."""

from __future__ import annotations

import re
import urllib.request


def metric(broker, name: str, **labels) -> float:
    """One sample of the broker's /metrics (0 if absent); `broker` a support.brokers.BrokerProcess."""
    with urllib.request.urlopen(broker.admin_url + "/metrics", timeout=5, context=broker.admin_tls) as r:
        text = r.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if want else "") + r" ([0-9.e+-]+)$"
    m = re.search(pattern, text, re.M)
    return float(m.group(1)) if m else 0.0
