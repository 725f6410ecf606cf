# kvscope — two commands for a newcomer: `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Debian packages the tests start for real (Prometheus, promtool, Alertmanager,
# PostgreSQL 15, docker-compose for `config -q`, headless Chromium for the HTML report).
APT_PACKAGES := prometheus prometheus-alertmanager postgresql-15 docker-compose chromium
APT_BINARIES := /usr/bin/prometheus /usr/bin/promtool /usr/bin/prometheus-alertmanager \
                /usr/lib/postgresql/15/bin/initdb /usr/bin/docker-compose /usr/bin/chromium

.PHONY: demo test test-fast test-slow lint bench apt-deps install clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

# Installs the Debian packages the tests need when any binary is missing (root, as CI runs).
apt-deps:
	@missing=0; for b in $(APT_BINARIES); do test -x $$b || missing=1; done; \
	if [ $$missing = 1 ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "make test: need root to apt-get install $(APT_PACKAGES)" >&2; exit 1; fi; \
	  echo "installing Debian packages: $(APT_PACKAGES)" >&2; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(APT_PACKAGES) >/dev/null; \
	fi

demo: $(STAMP)
	$(BIN)/kvscope demo

test: apt-deps $(STAMP) lint
	$(BIN)/pytest -m "not slow" -q

test-fast: $(STAMP)
	$(BIN)/pytest -m "not slow and not postgres and not prometheus" -q

test-slow: apt-deps $(STAMP)
	$(BIN)/pytest -m slow -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy core collector store planner dashboards api kvscope tests benchmarks

bench: $(STAMP) apt-deps
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) out kvscope.db .pytest_cache .mypy_cache .ruff_cache
