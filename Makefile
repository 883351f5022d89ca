# One entry point.  `make run` starts the log host on the embedded local store; `make test` runs
# the whole suite.  Both create the virtualenv and install whatever is missing first.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
STORE  ?= ./data/loghost
LISTEN ?= 127.0.0.1:8080

.PHONY: run test test-fast lint bench reliability mutation deps redis promtool clean sim sim-long

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[server,compactor,dev,bench]'
	@rm -f $(VENV)/.installed-*
	@touch $@

deps: $(STAMP)

# redis-server backs the leader-hint tests; installed from the distribution when missing.
redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  SUDO=$$(command -v sudo >/dev/null 2>&1 && [ "$$(id -u)" != 0 ] && echo sudo); \
	  $$SUDO apt-get update -qq >/dev/null && $$SUDO apt-get install -y -qq redis-server >/dev/null; }

# promtool runs the Helm chart's alert rules against synthetic series (tests/helm/test_alerts.py).
# Only the binary is taken from Debian's prometheus package (unpacked into the venv), so no
# Prometheus server is installed or started.
promtool: $(STAMP)
	@command -v promtool >/dev/null 2>&1 || test -x $(VENV)/bin/promtool || { \
	  SUDO=$$(command -v sudo >/dev/null 2>&1 && [ "$$(id -u)" != 0 ] && echo sudo); \
	  $$SUDO apt-get update -qq >/dev/null; \
	  tmp=$$(mktemp -d) && (cd $$tmp && apt-get download -qq prometheus >/dev/null) && \
	  dpkg-deb -x $$tmp/prometheus_*.deb $$tmp/x && cp $$tmp/x/usr/bin/promtool $(VENV)/bin/promtool; \
	  rc=$$?; rm -rf $$tmp; exit $$rc; }

run: $(STAMP)
	$(VENV)/bin/loghost serve --dev --store $(STORE) --listen $(LISTEN)

# Two workers, one per core (CI has 2); a test file stays on one worker (its module fixtures,
# its servers).  `pytest -q` alone runs the same suite in one process.  Lint and types first.
# The 30 slowest tests are listed at the end: the suite's length is watched (15 minutes on CI).
test: lint redis promtool
	$(VENV)/bin/pytest -q -n 2 --dist loadfile --durations=30

# Lint and types, as configured in pyproject.toml: ruff (rules and format) over the tree, mypy over
# the packages and tools (wal3 strict).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: $(STAMP) redis
	$(PY) -m bench

reliability: $(STAMP) redis
	$(PY) -m verify.reliability

# A cluster in a box (issue 17): 3 hosts over one store behind HAProxy (apt-get when missing), 2
# compactors; prints where everything is, Ctrl-C stops it all.  CLUSTER_ARGS="--hosts 4 --redis
# --engine local --store s3://bucket/prefix"; python -m verify.cluster --help lists the rest.
.PHONY: cluster
CLUSTER_ARGS ?=
cluster: $(STAMP)
	$(PY) -m verify.cluster $(CLUSTER_ARGS)

# Long: mutmut over the critical modules, one scratch worktree each; rewrites docs/RELIABILITY.md.
mutation: $(STAMP) redis
	$(PY) -m verify.mutation --write-docs

# Deterministic simulation of the wal3 engine (verify/sim): the short form runs in `make test` too;
# the long form writes its summary into docs/RELIABILITY.md.  One seed: python -m verify.sim --seed N
SIM_SEEDS ?= 0:300
sim: $(STAMP)
	$(PY) -m verify.sim --seeds $(SIM_SEEDS) --jobs 2

# Its ledger is committed (docs/sim-long.ledger.jsonl): a run spans sessions, and resumes as long
# as wal3/ and verify/sim/ are unchanged (a change of either makes the ledger refuse: delete it).
sim-long: $(STAMP)
	$(PY) -m verify.sim --seeds 0:100000 --jobs 2 --write-docs --ledger docs/sim-long.ledger.jsonl

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis spark-warehouse metastore_db derby.log
