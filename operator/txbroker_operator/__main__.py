"""`python -m txbroker_operator [kopf run options]`: run the operator (standalone, cluster-wide by default)."""

import sys

from kopf.cli import main


def run() -> None:
    args = sys.argv[1:] or ["--all-namespaces"]
    sys.argv = ["kopf", "run", "--standalone", "-m", "txbroker_operator.handlers", *args]
    main()


if __name__ == "__main__":
    run()
