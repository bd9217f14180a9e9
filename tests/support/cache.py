"""Where the tests keep what they build once, outside the clone (testbed/cluster.sh's rule too)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE = Path(os.environ.get("TXBROKER_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
             / "txbroker")
