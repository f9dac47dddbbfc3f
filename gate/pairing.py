"""Pairing found from the curves themselves: which replicates saw the candidate's batches.

A step's training loss is mostly the difficulty of that step's batch: two runs that read the same
batches rise and fall together from step to step, however their weights differ (a fault, a
numerics change, nondeterminism), while runs on other data orders move independently. So, for
every two runs, without batch hashes:

  residual    each loss curve minus its centered moving average over SMOOTH steps (the trend
              removed; what is left is the batch-to-batch movement), divided by its moving RMS
              over SCALE steps (the early, noisier steps do not dominate)
  statistic   Pearson's r of two residual series over their common steps; Fisher's
              z = atanh(r) * sqrt(n_eff - 3), with Bartlett's effective sample size
              n_eff = n / (1 + 2 sum_k rho_a(k) rho_b(k)) (k = 1..MAX_LAG: the moving average makes
              the residuals autocorrelated, and independent autocorrelated series correlate by
              chance more often than white ones)
  rule        two runs share batches when z > Phi^-1(1 - ALPHA / m), m the number of pairs tested
              (Bonferroni: a false pairing anywhere with probability < ALPHA = 1e-3), and r >= R_MIN
              (0.5: the shared batch component is at least as large as what is not shared)

Measured on the outside trainer (benchmarks/outside_trainer.py, 300 steps): same-data runs
correlate at r >= 0.94 (faults included: a learning rate x1.3 at 0.994, warm-up dropped at 0.986,
10% of the tokens dropped at 0.948), runs on other orders at |r| <= 0.07; over 435 pairs of runs on
30 independent orders the null z has sd 0.99-1.02 at 12 to 300 steps, its largest value 3.38 (the
threshold for 5 runs is 3.72), so no pair was taken for a same-data pair. Replicates are grouped
by the relation (connected components); the candidate is paired with the replicates it shares
batches with, and the convergence check then compares it with those alone, its noise calibrated on
groups of two or more: the batch-to-batch variation cancels, as it does with recorded hashes.
Fewer than MIN_STEPS common steps: no pairing is inferred.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.stats import norm

SMOOTH = 9        # steps of the centered moving average that is the trend
SCALE = 25        # steps of the moving RMS that standardises the residuals
MAX_LAG = 10      # lags of Bartlett's effective sample size
ALPHA = 1e-3      # family-wise probability of pairing runs that do not share batches
R_MIN = 0.5       # and the correlation must be at least this
MIN_STEPS = 12    # fewer common steps: no pairing inferred


def _moving_mean(y: np.ndarray, window: int) -> np.ndarray:
    """Centered moving mean, the window shrinking at the ends."""
    half = window // 2
    c = np.concatenate([[0.0], np.cumsum(y)])
    i = np.arange(y.size)
    lo, hi = np.maximum(0, i - half), np.minimum(y.size, i + half + 1)
    return (c[hi] - c[lo]) / (hi - lo)


def residuals(y: np.ndarray) -> np.ndarray:
    """Batch-to-batch movement of one curve: the curve minus its trend, standardised locally."""
    y = np.asarray(y, float)
    kernel = np.ones(SMOOTH) / SMOOTH
    padded = np.pad(y, SMOOTH // 2, mode="reflect") if y.size > SMOOTH // 2 else np.pad(y, SMOOTH // 2, mode="edge")
    res = y - np.convolve(padded, kernel, mode="valid")
    rms = np.sqrt(_moving_mean(res ** 2, SCALE))
    scale = np.where(rms > 0, rms, 1.0)
    return np.where(rms > 0, res / scale, 0.0)


def _acf(x: np.ndarray, lags: int) -> np.ndarray:
    x = x - x.mean()
    den = float((x * x).sum())
    if den == 0:
        return np.zeros(lags)
    return np.array([float((x[:-k] * x[k:]).sum()) / den for k in range(1, lags + 1)])


def pair_statistic(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """(r, n_eff, z) of two residual series of equal length (module docstring)."""
    n = a.size
    da, db = a - a.mean(), b - b.mean()
    den = float(np.sqrt((da * da).sum() * (db * db).sum()))
    if n < 4 or den == 0:
        return 0.0, float(n), 0.0
    r = float((da * db).sum()) / den
    lags = min(MAX_LAG, n // 4)
    n_eff = n / max(1.0, 1.0 + 2.0 * float((_acf(a, lags) * _acf(b, lags)).sum())) if lags else float(n)
    z = float(np.arctanh(np.clip(r, -0.999999, 0.999999)) * np.sqrt(max(n_eff - 3.0, 1.0)))
    return r, float(n_eff), z


@dataclass
class Pairing:
    """What the curves say about shared batches. Run index k is the candidate."""
    steps: int
    threshold: float                       # z above which two runs share batches
    r: list[list[float]]                   # correlation of residuals, runs x runs (baselines, then candidate)
    z: list[list[float]]
    groups: list[list[int]] = field(default_factory=list)   # baselines grouped by shared batches
    mine: list[int] = field(default_factory=list)           # the baselines the candidate shares batches with

    def evidence(self, names: list[str]) -> dict:
        k = len(names) - 1
        return {"method": "correlation of batch-to-batch loss movements (Fisher z, Bartlett n_eff)",
                "steps": self.steps, "z_threshold": round(self.threshold, 3), "r_min": R_MIN, "alpha": ALPHA,
                "groups": [[names[i] for i in g] for g in self.groups],
                "paired_with": [names[i] for i in self.mine],
                "candidate_r": {names[i]: round(self.r[k][i], 4) for i in range(k)},
                "candidate_z": {names[i]: round(self.z[k][i], 2) for i in range(k)}}


def _shares(r: float, z: float, threshold: float) -> bool:
    return z > threshold and r >= R_MIN


def infer(losses: np.ndarray) -> Pairing | None:
    """Pairing of the candidate (last row) with the baselines (other rows), from [runs, T] losses;
    None with fewer than MIN_STEPS steps."""
    runs, T = losses.shape
    if T < MIN_STEPS:
        return None
    res = [residuals(row) for row in losses]
    tests = runs * (runs - 1) // 2
    threshold = float(norm.isf(ALPHA / tests))
    r = [[1.0] * runs for _ in range(runs)]
    z = [[float("inf")] * runs for _ in range(runs)]
    for i in range(runs):
        for j in range(i + 1, runs):
            rij, _, zij = pair_statistic(res[i], res[j])
            r[i][j] = r[j][i] = rij
            z[i][j] = z[j][i] = zij
    k = runs - 1
    parent = list(range(k))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(k):
        for j in range(i + 1, k):
            if _shares(r[i][j], z[i][j], threshold):
                parent[root(i)] = root(j)
    groups: dict[int, list[int]] = {}
    for i in range(k):
        groups.setdefault(root(i), []).append(i)
    matched = [i for i in range(k) if _shares(r[k][i], z[k][i], threshold)]
    mine: list[int] = []
    if matched:
        # the candidate's batches are those of one group: the one it correlates with most
        best = max(matched, key=lambda i: r[k][i])
        mine = [i for i in matched if root(i) == root(best)]
    return Pairing(steps=T, threshold=threshold, r=r, z=z, groups=sorted(groups.values()), mine=mine)
