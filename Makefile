# `make demo` and `make test` bootstrap .venv from pyproject.toml on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
KAFKA_BOOTSTRAP_FILE := .effectlog/kafka/bootstrap

.PHONY: demo demo-kafka test lint typecheck unit bench soak chaos clean kafka-up kafka-down console-screenshots \
	docs docs-serve

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/effectlog --log sqlite:///.effectlog/demo/log.db --state .effectlog/demo/state demo

# Apache Kafka 4.x from Maven Central jars (no Docker): KAFKA_PORT=9092 make kafka-up;
# BROKERS=3 starts a KRaft cluster of three nodes instead (the bootstrap list in the same file).
BROKERS ?= 1
kafka-up: $(STAMP)
	$(PY) -m tools.kafka up --brokers $(BROKERS)

kafka-down: $(STAMP)
	$(PY) -m tools.kafka down

demo-kafka: kafka-up
	$(VENV)/bin/effectlog --log "kafka://$$(cat $(KAFKA_BOOTSTRAP_FILE))?prefix=demo$$(date +%s)" \
		--state .effectlog/demo-kafka/state demo

test: $(STAMP) lint typecheck
	$(PY) -m pytest -ra

lint: $(STAMP)
	$(PY) -m ruff check .

typecheck: $(STAMP)
	$(PY) -m mypy

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

bench: $(STAMP)
	$(PY) bench/append.py
	$(PY) bench/project.py
	$(PY) bench/redact.py
	$(PY) bench/cluster_restore.py
	$(PY) bench/cluster_api.py
	$(PY) bench/cluster_failover.py
	$(PY) bench/mcp_proxy.py

# The documentation site (mkdocs.yml, docs/): strict, so a broken link or a missing page fails
# the build. NO_MKDOCS_2_WARNING silences the theme's banner about MkDocs 2.0 (we pin mkdocs<2).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve --strict --dev-addr 127.0.0.1:8000

# The web console's screenshots in docs/ (the console page), taken by the browser test in Chromium.
console-screenshots: $(STAMP)
	EFFECTLOG_CONSOLE_SCREENSHOTS=docs $(PY) -m pytest -q tests/browser

# The soak (bench/soak.py): OPS operations by WORKERS worker processes, workers and `serve`
# SIGKILLed (LOG=kafka: two serve instances and its own broker too; BROKERS=3: its own
# three-node cluster, a partition leader SIGKILLed every 20-40 s), recovery until quiet;
# the last line gives kills, duplicates and lost events.
OPS     ?= 10000
WORKERS ?= 4
LOG     ?= sqlite
soak: $(STAMP)
	$(PY) bench/soak.py --ops $(OPS) --workers $(WORKERS) --log $(LOG) --brokers $(BROKERS)

clean:
	rm -rf .effectlog build dist site *.egg-info .pytest_cache .mypy_cache .ruff_cache

# The chaos run (tests/chaos): serve members killed, rebuilt, joining and leaving while six
# worker processes race on shared keys; the last line gives the duplicate keys (0 to pass).
CHAOS_S ?= 300
chaos: $(STAMP)
	$(PY) -m tests.chaos.driver --seconds $(CHAOS_S)
