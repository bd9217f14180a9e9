# Everything a fresh machine needs is set up from here: `make demo` and `make test`.
# The virtualenv lives at .venv/ (pinned by constraints.txt); pip's cache and any built test
# binaries live outside the clone (~/.cache), so a second run is quick.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# One worker a core. With twice that the stage before e2e took 16-20 min instead of 34 on 2 cores,
# but three timing-sensitive tests failed under that load in four runs (fixed since): more
# workers wait for runs that show none.
PYTEST_WORKERS ?= auto

.PHONY: venv test test-unit test-e2e demo demo-broker bench chaos chaos-k8s clean help

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

venv: $(STAMP)  ## create .venv with the pinned packages and the txbroker command

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "txbroker needs Python 3.11+, found " + sys.version' 
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade 'pip>=24'
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,operator,spark]'
	touch $(STAMP)

test: venv  ## run every test: unit, integration with real brokers, Spark local mode, fixed-seed fault schedules, then e2e on a real node
	bash chaos/setup.sh
	bash testbed/browser.sh             # Debian's chromium for the console's browser test
	bash testbed/prometheus.sh build   # promtool and prometheus for the monitoring tests (cached; ~5 min cold)
	cd tests && $(abspath $(PY)) -m support.spark_cds   # Spark's classes for the tests' driver JVMs (cached; ~40 s cold)
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist worksteal --durations=25 tests --ignore=tests/e2e
	$(MAKE) test-e2e

# The real node (testbed/cluster.sh): built and started here, the tests run inside its network,
# and it is stopped whatever the outcome. It never skips: if it cannot start, this fails saying why.
test-e2e: venv  ## the e2e tests on a real one-node cluster: our images under containerd, the operator in a pod
	bash testbed/prometheus.sh build
	bash testbed/cluster.sh up
	bash testbed/cluster.sh exec $(PY) -m pytest -n 2 --dist worksteal --durations=25 -p no:cacheprovider tests/e2e; \
		rc=$$?; bash testbed/cluster.sh down; exit $$rc

test-unit: venv
	bash testbed/prometheus.sh build
	$(PY) -m pytest -n $(PYTEST_WORKERS) tests/unit

demo: venv  ## run the main job on the embedded default: Spark local mode, a local master+slave pair
	$(PY) -m txbroker_spark.demo

demo-broker: venv  ## the broker-only demo: transactional orders, kill -9, check-back, verification
	$(PY) -m txbroker.demo

bench: venv  ## run the benchmarks, then txbroker beside Apache RocketMQ (writes bench/results/; BENCH_ARGS=--quick)
	$(PY) -m pip install --quiet -r bench/requirements.txt
	$(PY) bench/run_all.py $(BENCH_ARGS)

SEEDS ?= 1-3
CHAOS_ARGS ?=
CHAOS_K8S_ARGS ?=
chaos: venv  ## randomized fault schedules with the history checker (root; SEEDS=1-100 CHAOS_ARGS=--mode ASYNC, chaos/README.md)
	bash chaos/setup.sh
	$(PY) -m chaos --seeds $(SEEDS) $(CHAOS_ARGS)

chaos-k8s: venv  ## fault schedules on the real node: an operator-deployed TxBroker, clients in a pod, the same checker (root; SEEDS=1-20, chaos/k8s/README.md)
	bash chaos/setup.sh
	$(PY) -m chaos.k8s --seeds $(SEEDS) $(CHAOS_K8S_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
