"""The benchmark's summary in MLflow: one run per benchmark, its table as metrics, its files as artifacts."""

from __future__ import annotations

import re
import time
from pathlib import Path

EXPERIMENT = "attune-bench"
METRICS = ("mean_gain", "best_gain", "oracle_share", "gpu_hours_used", "gpu_hours_to_95", "gate_pass_rate",
           "payback_hours")


def _key(*parts: str) -> str:
    # MLflow keys allow letters, digits, _ - . / and spaces: "h100:64" becomes "h100_64".
    return "/".join(re.sub(r"[^A-Za-z0-9_\-. ]", "_", p) for p in parts)


def log_benchmark(uri: str | None, rows: list[dict], checks: list[dict], params: dict, files: list[Path],
                  seconds: float) -> str:
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    from attune.tracking import default_uri

    uri = uri or default_uri()
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(EXPERIMENT)
    if found is None:
        artifacts = None
        if uri.startswith("sqlite:///"):
            artifacts = (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
        experiment_id = client.create_experiment(EXPERIMENT, artifact_location=artifacts)
    else:
        experiment_id = found.experiment_id
    run = client.create_run(experiment_id, run_name=f"bench-{time.strftime('%Y%m%d-%H%M%S')}",
                            tags={"attune.simulated": "true", "attune.kind": "benchmark"})
    run_id = run.info.run_id
    now = int(time.time() * 1000)
    metrics = [Metric(_key(name, r["recipe"], r["planner"]), float(r[name]), now, 0)
               for r in rows for name in METRICS if isinstance(r.get(name), (int, float))]
    metrics.append(Metric("wall_seconds", float(seconds), now, 0))
    metrics.append(Metric("targets_held", float(sum(c["holds"] for c in checks)), now, 0))
    metrics.append(Metric("targets_checked", float(len(checks)), now, 0))
    for i in range(0, len(metrics), 900):   # MLflow takes at most 1000 metrics per batch
        client.log_batch(run_id, metrics=metrics[i:i + 900],
                         params=[Param(k, str(v)[:500]) for k, v in params.items()] if i == 0 else [],
                         tags=[RunTag("attune.recipes", ",".join(dict.fromkeys(r["recipe"] for r in rows))[:500])]
                         if i == 0 else [])
    for path in files:
        if path.is_file():
            client.log_artifact(run_id, str(path))
    client.set_terminated(run_id, "FINISHED")
    return run_id
