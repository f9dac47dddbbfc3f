# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-all venv clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch is pinned to the CPU build that pip finds on this machine's disk (see README)
	$(BIN)/python -m pip install -q -e '.[test,torchtitan]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/attune sim predict recipes/public/llama3_8b.toml
	$(BIN)/attune sim oracle recipes/public/llama3_8b.toml

test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

test-all: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .attune .pytest_cache
