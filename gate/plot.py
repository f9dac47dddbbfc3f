"""The verdict's PNG: each metric's curves with the calibrated band, and the standardised difference."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from attune.gate.stats import LIMITS

_LABEL = {"loss": "train loss", "eval_loss": "eval loss (fixed batch)", "grad_norm": "log grad norm",
          "expert_imbalance": "MoE expert imbalance (CV)"}


def plot_verdict(curves, zs: dict, verdict, path: Path) -> Path:
    import matplotlib  # imported here: pyplot costs seconds, and only a verdict with curves needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    metrics = list(zs)
    fig, axes = plt.subplots(2, max(1, len(metrics)), figsize=(4.2 * max(1, len(metrics)), 6.4), squeeze=False)
    steps = np.asarray(curves.candidate.steps)
    for col, metric in enumerate(metrics):
        top, bottom = axes[0][col], axes[1][col]
        r = zs[metric]
        for b in curves.baselines:
            y = np.asarray(b.columns[metric], float)
            top.plot(steps, np.log(y) if metric == "grad_norm" else y, color="0.6", lw=0.8)
        y = np.asarray(curves.candidate.columns[metric], float)
        top.plot(steps, np.log(y) if metric == "grad_norm" else y, color="C3", lw=1.2, label="candidate")
        half = LIMITS["level"] * r["sd"]
        top.fill_between(steps, r["center"] - half, r["center"] + half, color="C0", alpha=0.25,
                         label=f"band ±{LIMITS['level']:g} sd")
        top.set_title(_LABEL[metric], fontsize=9)
        top.legend(fontsize=7)
        bottom.plot(steps, r["z"], color="C3", lw=1.0)
        for lim in (LIMITS["level"], -LIMITS["level"]):
            bottom.axhline(lim, color="C0", ls="--", lw=0.8)
        bottom.axhline(0, color="0.5", lw=0.5)
        bottom.set_ylabel("z = diff / sd", fontsize=8)
        bottom.set_xlabel("step", fontsize=8)
    state = {"passed": "PASS", "failed": "FAIL", "inconclusive": "INCONCLUSIVE"}[verdict.verdict]
    fig.suptitle(f"{state} ({verdict.mode}, {verdict.steps_used} steps, {verdict.replicates} replicates): "
                 f"{verdict.statistic.get('name', '')}", fontsize=9)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.png")
    fig.savefig(tmp, dpi=80)
    plt.close(fig)
    tmp.replace(path)
    return path
