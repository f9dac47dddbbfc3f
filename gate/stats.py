"""Curve statistics of the convergence check (pure numpy; no files, no plots).

The null model: a run's curve is the common trajectory plus run-to-run noise whose size s(t)
depends on the step. s(t) is estimated from the baseline replicates only:
  paired    runs that saw the same batches (equal batch hashes) form groups; s(t) is the
            within-group spread, i.e. nondeterminism alone, and the candidate is compared with
            the replicates of its own group (batch-to-batch noise cancels)
  unpaired  all replicates together; s(t) then includes batch-to-batch (data-order) variation
The per-step variance is noisy with few replicates, so log s^2(t) is fitted by a quadratic in
log t over the whole curve (noise grows roughly geometrically, then saturates), bias-corrected
for the log of a chi-square, and floored by the metric's precision.

The candidate's standardised difference z(t) = (c(t) - ref(t)) / sd(t) is summarised over the
whole curve: level (mean z), slope (late half minus early half), final window (last quarter)
and sup (largest block mean). Differences between chaotic trajectories are strongly
autocorrelated, so a mean of z has a null spread of up to 1, not 1/sqrt(T): the limits below
treat z as fully correlated, which is conservative.

How correlated the null really is, is measured on the replicates themselves (`persistence`): the
replicates' standardised deviations e(t) from their group mean are modelled as a white part plus a
persistent part (an offset that does not average out), and the persistent share rho of their
variance is 1 - (mean semivariogram at lags 1..PERSIST_LAGS) / (mean square). A mean of z over n
steps then has null spread sqrt((1 - rho) / n + rho): 1 for chaotic runs that drift apart (rho
near 1: the limits as above), down to 1/sqrt(n) for replicates that differ by step-to-step noise
only. The estimate is used only where it is consistent with white noise: above the 99.5% quantile
of its white-noise distribution, PERSIST_MARGIN / sqrt(T x independent deviations), the noise has a
persistent part, whose size a pair of replicates measures in about one draw (a drift that happens
to be small looks white), so rho is taken as 1; so it is when the means over windows of T/10, T/4
and T/2 steps vary more than white noise lets them (chi-square, at PERSIST_ALPHA): a slow drift
that the short lags miss. Otherwise rho is the estimate plus that margin.
rho is 1 as well where the replicates differ by less than the metric's precision floor (nothing to
measure). A statistic is never judged tighter than the replicates show.
"""

from __future__ import annotations

import numpy as np
from scipy.special import digamma
from scipy.stats import chi2

# Limits in units of the calibrated spread (two-sided): the tolerance is LIMIT x sd(t).
LIMITS = {"level": 3.0, "slope": 3.5, "final": 3.5, "sup": 4.5}
# Pairing with a single replicate: the noise on the candidate's batches is only known from other
# batches, and sensitivity is batch-specific (measured on the proxy: 5/5 benign runs paired with one
# replicate exceeded the sup limit); the spread is inflated by this factor.
INFLATE_SINGLE = 2.5
EDGE = 0.6          # |stat| / limit above this, but within the limit: ask for more steps
# Precision floors of a metric's spread: relative for losses, absolute for log grad-norm and imbalance.
FLOORS = {"loss": 2e-5, "eval_loss": 2e-5, "grad_norm": 1e-4, "expert_imbalance": 2e-3}
RELATIVE_FLOOR = {"loss", "eval_loss"}
LOCAL_WINDOW = 5    # steps: the local spread keeps batch-specific bursts the smooth fit averages away
PERSIST_LAGS = 5    # semivariogram lags of the persistence estimate
PERSIST_MARGIN = 1.5   # upper bound of rho: + PERSIST_MARGIN / sqrt(T x deviations) (white noise: ~99.5%)
PERSIST_MIN_STEPS = 100  # fewer steps: rho = 1 (fully correlated; one pair says too little of a drift)
PERSIST_ALPHA = 0.005  # window means (T/10, T/4, T/2 steps) past this white-noise quantile: rho = 1
PERSIST_MIN_SCALE = 0.25   # replicates' mean square in sd units below this (under the floor): rho = 1


def group_spread(groups: list[np.ndarray]) -> tuple[np.ndarray, int]:
    """Pooled per-run standard deviation over groups of runs ([n_g, T] each) and its degrees of freedom."""
    num, df = None, 0
    for g in groups:
        if g.shape[0] < 2:
            continue
        dev = ((g - g.mean(0)) ** 2).sum(0)
        num = dev if num is None else num + dev
        df += g.shape[0] - 1
    if num is None:
        raise ValueError("no group with two or more runs to calibrate the spread")
    return np.sqrt(num / df), df


def fit_spread(sd: np.ndarray, df: int, floor: np.ndarray) -> np.ndarray:
    """Smooth a per-step spread: quadratic fit of log variance in log step, then the floor."""
    t = np.arange(1, sd.size + 1, dtype=float)
    var = np.maximum(sd ** 2, floor ** 2)
    y = np.log(var) - (digamma(df / 2) - np.log(df / 2))   # E[log(chi2_df / df)] correction
    u = np.log(t)
    degree = 2 if sd.size >= 8 else (1 if sd.size >= 3 else 0)
    coef = np.polyfit(u, y, degree)
    fitted = np.sqrt(np.exp(np.polyval(coef, u)))
    return np.maximum(fitted, floor)


def local_spread(sd: np.ndarray, window: int = LOCAL_WINDOW) -> np.ndarray:
    """Centered moving RMS of a per-step spread."""
    kernel = np.ones(window) / window
    padded = np.pad(sd ** 2, window // 2, mode="edge")
    return np.sqrt(np.convolve(padded, kernel, mode="valid"))


def blocks(z: np.ndarray, n: int = 10) -> np.ndarray:
    size = max(1, z.size // n)
    k = z.size // size
    return z[: k * size].reshape(k, size).mean(1)


def persistence(groups: list[np.ndarray], sd: np.ndarray) -> float:
    """Persistent share rho of the replicates' run-to-run noise (module docstring), at its upper bound.

    groups: replicate groups [n_g, T] (the null groups); sd: the per-run spread s(t) they calibrated.
    """
    return persistence_detail(groups, sd)["rho"]


def persistence_detail(groups: list[np.ndarray], sd: np.ndarray) -> dict:
    """rho (as used), and where it is estimated, the raw estimate and the independent deviations
    behind it (the upper bound at another length T is raw + PERSIST_MARGIN / sqrt(T x series))."""
    full = {"rho": 1.0, "raw": None, "series": 0}
    num = den = 0.0
    series = rows = 0
    T = sd.size
    if T < PERSIST_MIN_STEPS:
        return full
    lags = range(1, min(PERSIST_LAGS, T // 4) + 1)
    scales = sorted({b for b in (T // 10, T // 4, T // 2) if b >= 2})
    block_sq = {b: 0.0 for b in scales}
    for g in groups:
        n = g.shape[0]
        if n < 2:
            continue
        e = (g - g.mean(0)) / (sd * np.sqrt((n - 1) / n))
        for row in e:
            den += float((row ** 2).mean())
            num += float(np.mean([((row[k:] - row[:-k]) ** 2).mean() / 2 for k in lags]))
            for b in scales:
                block_sq[b] += float((blocks(row, T // b) ** 2).mean()) * b
        series += n - 1
        rows += n
    if not series or den / rows < PERSIST_MIN_SCALE:
        return full
    rho = max(0.0, 1.0 - num / den)
    margin = PERSIST_MARGIN / np.sqrt(T * series)
    if rho > margin:   # persistence detected: how much, one pair cannot tell (a drift is one draw)
        return full
    for b in scales:   # a drift the short lags miss: window means vary more than white noise allows
        df = series * (T // b)
        if block_sq[b] / den > chi2.isf(PERSIST_ALPHA, df) / df:
            return full
    return {"rho": float(rho + margin), "raw": float(rho), "series": series}


def null_spreads(T: int, rho: float, n_blocks: int = 10) -> dict[str, float]:
    """Null standard deviation of each summary of z (unit per-step variance) with persistent share rho."""
    def mean_of(n: int) -> float:
        return float(np.sqrt((1 - rho) / max(n, 1) + rho))
    half, tail = T // 2, max(1, T // 4)
    size = max(1, T // n_blocks)
    slope = float(np.sqrt((1 - rho) * (1 / max(half, 1) + 1 / max(T - half, 1)) + rho)) if T >= 2 else 1.0
    return {"level": mean_of(T), "slope": min(1.0, slope), "final": mean_of(tail), "sup": mean_of(size)}


def curve_stats(z: np.ndarray, spreads: dict[str, float] | None = None) -> dict[str, float]:
    """Summaries of z, each in units of its null spread (1: z treated as fully correlated)."""
    half = z.size // 2
    tail = max(1, z.size // 4)
    spreads = spreads or {}
    return {"level": float(z.mean()) / spreads.get("level", 1.0),
            "slope": (float(z[half:].mean() - z[:half].mean()) if z.size >= 2 else 0.0) / spreads.get("slope", 1.0),
            "final": float(z[-tail:].mean()) / spreads.get("final", 1.0),
            "sup": float(np.abs(blocks(z)).max()) / spreads.get("sup", 1.0)}


def compare(candidate: np.ndarray, refs: np.ndarray, null_groups: list[np.ndarray], metric: str,
            inflate: float = 1.0, adaptive: bool = False) -> dict:
    """Standardised comparison of one metric: z(t), its summary stats and the band it implies.

    candidate [T]; refs [n, T] (the replicates the candidate is compared with); grad_norm comes in
    as log grad-norm; null_groups: replicate groups whose within-group spread calibrates the noise.
    When refs holds two or more runs their own spread counts too (per step, the larger wins): the
    noise on the candidate's own batches is what it must be compared with.
    """
    center = refs.mean(0)
    floor = FLOORS[metric] * (np.abs(center) if metric in RELATIVE_FLOOR else np.ones_like(center))

    def spread(groups: list[np.ndarray]) -> tuple[np.ndarray, int]:
        sd, df = group_spread(groups)
        return np.maximum(fit_spread(sd, df, floor), local_spread(sd)), df

    s, df = spread(null_groups)
    if refs.shape[0] >= 2:
        s = np.maximum(s, spread([refs])[0])
    sd_diff = inflate * s * np.sqrt(1.0 + 1.0 / refs.shape[0])
    z = (candidate - center) / sd_diff
    persist = persistence_detail(null_groups, s) if adaptive else {"rho": 1.0, "raw": None, "series": 0}
    rho = persist["rho"]
    spreads = null_spreads(z.size, rho) if rho < 1.0 else None
    return {"z": z, "center": center, "sd": sd_diff, "df": df, "rho": rho, "persistence": persist,
            "stats": curve_stats(z, spreads)}
