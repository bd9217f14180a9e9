#!/bin/bash
# Second pass (added after the first: load from other work was high), same commands, continuing the alternation.
# before = 65d4c50 (worktree /tmp/main-old), after = 2451795 (worktree /tmp/main-new, detached HEAD).
set -u
OUT=/work/main/bench/results/hotpath-issue29
PY=/work/main/.venv/bin/python
run() {  # label side args...
  local label=$1 side=$2; shift 2
  local dir=/tmp/main-$side tmp; tmp=$(mktemp -d /tmp/hp29-XXXX)
  {
    echo "# $label  side=$side  commit=$(git -C $dir rev-parse --short HEAD)  $(date -Is)"
    echo "# cmd: cd $dir && PYTHONPATH=$dir/broker_image $PY bench/broker/suite.py $* --results <tmp>"
    echo "# loadavg before: $(cat /proc/loadavg)"
  } > $OUT/$label.log
  (cd $dir && PYTHONPATH=$dir/broker_image $PY bench/broker/suite.py "$@" --results $tmp) >> $OUT/$label.log 2>&1
  echo "# exit $?" >> $OUT/$label.log
  echo "# loadavg after: $(cat /proc/loadavg)  $(date -Is)" >> $OUT/$label.log
  cp $tmp/broker-2*.json $OUT/$label.json && rm -rf $tmp
}
TX="--only tx --repeats 1 --duration 6"
CHK="--only check --repeats 1 --duration 6"
run check-before-2 old $CHK
run check-after-2  new $CHK
run tx-before-4 old $TX
run tx-after-4  new $TX
echo done
