# Two commands matter on a fresh clone: `make demo` and `make test`. Each builds .venv first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast check format bench clean native

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,dev]'
	@touch $(STAMP)

# The emulator's hot modules compiled with mypyc (emulator/native.py) and the OTLP receiver's C
# decoder (collectors/traces/otlp_native.py), kept outside the tree and keyed by the sources: a
# no-op when current; a failed build leaves that part pure Python.
native: $(STAMP)
	@$(BIN)/python -m servewatch.emulator native build || true
	@$(BIN)/python -m servewatch.collectors.traces native build || true

demo: native
	$(BIN)/servewatch demo --out demo-out

test: native
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: native
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

check: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: native
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) demo-out .mypy_cache .ruff_cache .pytest_cache
