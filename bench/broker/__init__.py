"""txbroker broker-side benchmarks (tracker issue 2).

Modules:
  common.py    machine description, a broker run as a real subprocess, CPU accounting from /proc
  loadgen.py   the load generator / tailing reader, run as separate client processes
  network.py   the over-the-network workloads (transactions, batches, plain sends, commit-to-visible)
  checkscan.py the check-back scan and recovery benchmark with 1M finished transactions (store API)
  suite.py     runs everything, prints the table, writes bench/results/broker-*.json

Entry: `.venv/bin/python bench/run_all.py` (`make bench`); `--quick` for a smoke run.
These scripts print figures; they never pass or fail on timing.
"""
