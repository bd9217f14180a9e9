"""`python -m txbroker_operator [kopf run options]`: run the operator (standalone, cluster-wide by default).

With TXBROKER_OPERATOR_LEASE_NAME set (the chart sets it), the replica first waits to hold that
Lease (leadership.py) and starts Kopf only then: a replica that does not lead runs nothing that
could change anything, and one that loses the Lease exits.
"""

import logging
import sys

from kopf.cli import main

from . import leadership, metrics


def run() -> None:
    args = sys.argv[1:] or ["--all-namespaces"]
    election = leadership.settings_from_env()
    if election is not None:
        # Kopf installs its own log handler when it starts; until then, this one (same format)
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(name)-20.20s [%(levelname)-8.8s] %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        try:   # a standby serves its metrics too (txbroker_operator_leader 0); Kopf's startup finds them served
            metrics.serve()
        except OSError as e:
            logging.getLogger(__name__).error("metrics endpoint: %s", e)
        leadership.lead(election, args)
        root.removeHandler(handler)
    else:
        leadership.set_leader_gauge(1)     # standalone: this process acts
    sys.argv = ["kopf", "run", "--standalone", "-m", "txbroker_operator.handlers", *args]
    main()


if __name__ == "__main__":
    run()
