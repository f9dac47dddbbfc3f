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

# The main job on the embedded default: a campaign on a simulated cluster (a sibling of the reference
# cluster in the realistic world, so the estimator is off and the planner must learn the cluster),
# the ephemeral Prefect API and MLflow on .attune/mlflow.db; then the oracle, to see how close it came.
demo: $(STAMP)
	$(BIN)/attune tune recipes/public/llama3_8b.toml --cluster h100:64 --cluster-seed 1 --budget-gpu-hours 40
	$(BIN)/attune sim oracle recipes/public/llama3_8b.toml --cluster h100:64 --cluster-seed 1
	$(BIN)/attune leaderboard

test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" --durations=20

test-all: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .attune .pytest_cache
