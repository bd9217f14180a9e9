#!/usr/bin/env bash
# The broker's request path compiled by Cython as it is (pure-Python mode), against the source tree:
# bench/broker/inproc.py interleaved. Figures and what they say: bench/README.md, "the request path
# compiled by Cython (tried, slower, not kept)". Needs gcc and Python's headers; about 2 minutes.
#   bash bench/experiments/cython_hot_path.sh [binding: True|False]
set -euo pipefail
cd "$(dirname "$0")/../.."
BINDING="${1:-True}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
.venv/bin/python -m pip install -q --target "$WORK/lib" "cython==3.0.11"
cp -r broker_image/txbroker "$WORK/"
find "$WORK/txbroker" -name __pycache__ -prune -exec rm -rf {} +
cd "$WORK"
MODS="txbroker/broker/dispatch.py txbroker/broker/connection.py txbroker/protocol/framing.py
  txbroker/protocol/batched.py txbroker/broker/transaction/service.py txbroker/store/state.py
  txbroker/store/group_commit.py txbroker/store/derived/messages.py txbroker/store/derived/transactions.py
  txbroker/broker/processors/send.py txbroker/broker/processors/end_transaction.py txbroker/broker/replies.py
  txbroker/broker/loop_metrics.py txbroker/broker/role.py txbroker/broker/topics.py txbroker/store/db.py"
# (store/keys.py is left out: Cython refuses its bytes formatting.)
PYTHONPATH="$WORK/lib" "$OLDPWD/.venv/bin/python" - $MODS <<PY
import sys
from setuptools import setup
from Cython.Build import cythonize
setup(ext_modules=cythonize(sys.argv[1:], nthreads=2, quiet=True, force=True,
                            compiler_directives={"language_level": 3, "binding": $BINDING, "annotation_typing": False}),
      script_args=["build_ext", "--inplace"])
PY
cd "$OLDPWD"
for _ in 1 2 3; do
  printf 'compiled: '; PYTHONPATH="$WORK" .venv/bin/python bench/broker/inproc.py --seconds 4
  printf 'source:   '; PYTHONPATH=broker_image .venv/bin/python bench/broker/inproc.py --seconds 4
done
