"""Orchestration cost of a campaign: Prefect + MLflow overhead per trial, and a 40-trial sim
campaign end to end. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_campaign.py

Runs in a temporary ATTUNE_HOME/PREFECT_HOME (the ephemeral Prefect API and MLflow on SQLite,
the defaults). Trials on the sim stack cost no real time, so the per-trial wall time measured
here IS the orchestration overhead (task runs, state persistence, diagnosis, MLflow runs).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="attune-bench-campaign-"))
    os.environ.update(ATTUNE_HOME=str(home / ".attune"), PREFECT_HOME=str(home / ".prefect"),
                      PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_LOGGING_LEVEL="CRITICAL",
                      PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120", MPLBACKEND="Agg")
    from attune.campaign.state import CampaignState
    from attune.campaign.context import CampaignSettings
    from attune.flows.campaign import tune_campaign

    recipe = str(REPO / "recipes" / "public" / "llama3_8b.toml")
    started = time.perf_counter()
    # random search spends the budget on many trials: 40 trials of ~2 GPU-h on 64 GPUs
    result = tune_campaign(recipe, CampaignSettings(budget_gpu_hours=90.0, planner="random", seed=1, replicates=3), quiet=True)
    total = time.perf_counter() - started
    state = CampaignState.load(next(home.glob(".attune/campaigns/*/state.json")))
    gate_s = float((state.gate or {}).get("seconds", 0.0) or 0.0)
    print(json.dumps({"trials": result["trials"], "end_to_end_s": round(total, 1),
                      "gate_s (proxy training, in end_to_end_s)": round(gate_s, 1), "shipped": result["shipped"]}))

    # steady-state overhead: a second campaign in the same process (the API server is up)
    started = time.perf_counter()
    result2 = tune_campaign(recipe, CampaignSettings(budget_gpu_hours=90.0, planner="random", seed=2, replicates=3), quiet=True)
    total2 = time.perf_counter() - started
    state2 = CampaignState.load(sorted(home.glob(".attune/campaigns/*/state.json"), key=os.path.getmtime)[-1])
    gate2 = float((state2.gate or {}).get("seconds", 0.0) or 0.0)
    per_trial = (total2 - gate2) / max(1, result2["trials"])
    print(f"campaign of {result2['trials']} trials: {total2:.1f} s end to end (gate {gate2:.1f} s); "
          f"orchestration overhead per trial {per_trial:.2f} s (Prefect task runs + MLflow nested run + state)")

    # the same with the trials tagged gpu-pool:sim, as trials on a GPU pool are: each tagged task run
    # also asks the server for a concurrency slot
    started = time.perf_counter()
    result3 = tune_campaign(recipe, CampaignSettings(budget_gpu_hours=90.0, planner="random", seed=3, replicates=3), quiet=True,
                            gpu_pool="sim")
    total3 = time.perf_counter() - started
    state3 = CampaignState.load(sorted(home.glob(".attune/campaigns/*/state.json"), key=os.path.getmtime)[-1])
    gate3 = float((state3.gate or {}).get("seconds", 0.0) or 0.0)
    print(f"campaign of {result3['trials']} trials tagged gpu-pool:sim: {total3:.1f} s end to end (gate {gate3:.1f} s); "
          f"orchestration overhead per trial {(total3 - gate3) / max(1, result3['trials']):.2f} s")


if __name__ == "__main__":
    main()
