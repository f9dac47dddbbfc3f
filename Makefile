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

# Two test processes, each taking whole files (module fixtures such as the Slurm cluster stay in one
# process): most of the suite's time is spent waiting on servers, subprocesses and signals, so two
# processes on two cores take 11 min where one took 17 (README, "Tests").
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -n $(TEST_WORKERS) --dist loadfile --durations=20

test-all: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .attune .pytest_cache
