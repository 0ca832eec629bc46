# `make demo` and `make test` bootstrap .venv from pyproject.toml on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
KAFKA_BOOTSTRAP_FILE := .effectlog/kafka/bootstrap

.PHONY: demo demo-kafka test lint typecheck unit bench soak chaos clean kafka-up kafka-down console-screenshots \
	docs docs-serve dist install

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

# `effectlog` on PATH: `. .venv/bin/activate` in this shell (after any target here), or
# `make install`: the wheel into its own venv under $(PREFIX)/share/effectlog, linked as
# $(PREFIX)/bin/effectlog (EXTRAS=langgraph,mcp adds extras; PIP_FLAGS go to pip install).
PREFIX    ?= $(HOME)/.local
EXTRAS    ?=
PIP_FLAGS ?=
APP_VENV  := $(PREFIX)/share/effectlog/venv

# The wheel, built from this tree alone in a throwaway venv (only python3 -m venv needed).
DIST ?= dist
dist:
	rm -rf build/dist-venv $(DIST)/effectlog-*.whl
	$(PYTHON) -m venv build/dist-venv
	build/dist-venv/bin/python -m pip wheel --quiet --no-deps --wheel-dir $(DIST) .
	rm -rf build/lib build/bdist.* effectlog.egg-info
	rm -rf build/dist-venv
	-@rmdir build 2>/dev/null
	@ls $(DIST)/effectlog-*.whl

install: dist
	$(PYTHON) -m venv $(APP_VENV)
	$(APP_VENV)/bin/python -m pip install --quiet $(PIP_FLAGS) --force-reinstall --no-deps $(DIST)/effectlog-*.whl
	$(APP_VENV)/bin/python -m pip install --quiet $(PIP_FLAGS) "$$(ls $(DIST)/effectlog-*.whl)$(if $(EXTRAS),[$(EXTRAS)])"
	mkdir -p $(PREFIX)/bin
	ln -sf $(APP_VENV)/bin/effectlog $(PREFIX)/bin/effectlog
	@case ":$$PATH:" in *":$(PREFIX)/bin:"*) echo "effectlog installed: $(PREFIX)/bin/effectlog";; \
	  *) echo "effectlog installed: $(PREFIX)/bin/effectlog; put it on PATH: export PATH=\"$(PREFIX)/bin:\$$PATH\"";; esac

demo: $(STAMP)
	$(VENV)/bin/effectlog --log sqlite:///.effectlog/demo/log.db --state .effectlog/demo/state demo
	@echo "effectlog is $(VENV)/bin/effectlog: '. $(VENV)/bin/activate' puts it on PATH"

# Apache Kafka 4.x from Maven Central jars (no Docker): KAFKA_PORT=9092 make kafka-up;
# BROKERS=3 starts a KRaft cluster of three nodes instead (the bootstrap list in the same file).
BROKERS ?= 1
kafka-up: $(STAMP)
	$(PY) -m tools.kafka up --brokers $(BROKERS)

kafka-down: $(STAMP)
	$(PY) -m tools.kafka down

# The demo names its own fresh topics (effects-demo-<ms>); `effectlog --log kafka://HOST:PORT
# topics delete --prefix effects-demo-` removes them all.
demo-kafka: kafka-up
	$(VENV)/bin/effectlog --log "kafka://$$(cat $(KAFKA_BOOTSTRAP_FILE))" \
		--state .effectlog/demo-kafka/state demo
	@echo "effectlog is $(VENV)/bin/effectlog: '. $(VENV)/bin/activate' puts it on PATH"

# The suite runs in two processes (each with the brokers of its own, a test file's tests kept
# together): about 10 minutes instead of 18, as most Kafka tests wait on restarts and
# timeouts, not on a core. TEST_WORKERS=0 runs it in this one process.
TEST_WORKERS ?= 2
test: $(STAMP) lint typecheck
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -ra --durations=30

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
