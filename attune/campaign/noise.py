"""The noise band: how large a throughput gain must be before it counts as real.

Run-to-run variation is measured on baseline replicates. During the search the incumbent is the
best measured layout whose gain over the baseline clears the band (attune.campaign.engine.
best_measured); at the end the incumbent is re-measured and accepted only if a one-sided t-test against the baseline replicates says, at `alpha`, that its
gain exceeds the band itself: with the 5% a test allows, a campaign that explores reaches the
confirmation with a noise-sized incumbent on nearly every well-tuned recipe, and "better than the
baseline" alone then ships a false gain about one time in twenty.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

# Below this the replicate spread is indistinguishable from luck with 2-3 samples: never trust a
# band tighter than half a percent.
MIN_RELATIVE_SD = 0.005


def relative_sd(samples: list[float]) -> float:
    """Run-to-run coefficient of variation of replicate throughputs (floored)."""
    values = np.asarray(samples, dtype=float)
    if len(values) < 2:
        return MIN_RELATIVE_SD * 4  # one run says nothing about noise: be conservative
    return max(MIN_RELATIVE_SD, float(values.std(ddof=1) / values.mean()))


def search_band(rel_sd: float, confidence: float = 0.9) -> float:
    """Relative gain a single candidate run must show over the incumbent: z · sd · √2
    (the difference of two noisy runs)."""
    return float(stats.norm.ppf(confidence) * rel_sd * math.sqrt(2.0))


def clears_band(candidate: list[float], incumbent: list[float], rel_sd: float, confidence: float = 0.9) -> bool:
    """Whether the candidate's mean throughput beats the incumbent's by more than run-to-run noise
    explains: a relative margin of z · sd · √(1/n_candidate + 1/n_incumbent). One candidate run
    against a baseline measured three times needs less than against a single run, and a candidate
    measured twice less again (the attune planner re-measures a near miss, see its `recheck` rule)."""
    if not candidate or not incumbent:
        return False
    margin = float(stats.norm.ppf(confidence)) * rel_sd * math.sqrt(1.0 / len(candidate) + 1.0 / len(incumbent))
    return float(np.mean(candidate)) > float(np.mean(incumbent)) * (1.0 + margin)


def gain_is_real(baseline: list[float], candidate: list[float], alpha: float = 0.05,
                 margin: float = 0.0, spread: tuple[float, int] | None = None,
                 earlier: tuple[float, int] | None = None) -> tuple[bool, float]:
    """One-sided t-test that candidate throughput exceeds baseline by more than `margin` (a relative
    gain: the campaign asks for its noise band); returns (accepted, p-value).

    The test is on log throughput with the two sides' spread pooled: run-to-run noise is the
    cluster's and multiplicative, the same share of any layout's throughput, and two fresh runs of a
    candidate cannot estimate it alone (a Welch test on them had one degree of freedom and refused a
    +20% gain whose two runs were 6% apart).

    With one run on each side there is no spread to pool: `spread`, the (log sd, degrees of freedom)
    the campaign measured on layouts it ran more than once (campaign_spread), stands in; without it
    nothing is accepted. An assumed noise floor would pass a noise-sized "gain" about one time in
    ten on a cluster twice as noisy as assumed.

    `earlier`: the (log sd, degrees of freedom) an earlier campaign measured on the same cluster (a
    warm start whose ranks held), pooled with this test's own: the same noise, measured before, so a
    test of one confirmation run is not left with one degree of freedom."""
    b, c = np.log(np.asarray(baseline, float)), np.log(np.asarray(candidate, float))
    shift = c.mean() - b.mean() - math.log1p(margin)
    if shift <= 0:
        return False, 1.0
    dof = len(b) + len(c) - 2
    squares = float(((b - b.mean()) ** 2).sum() + ((c - c.mean()) ** 2).sum())
    if dof < 1 and earlier is None:
        if spread is None or spread[1] < 1:
            return False, float("nan")
        sd, dof = max(spread[0], MIN_RELATIVE_SD), spread[1]
    else:
        if earlier is not None and earlier[1] >= 1:
            squares, dof = squares + earlier[0] ** 2 * earlier[1], dof + earlier[1]
        if dof < 1:
            return False, float("nan")
        sd = max(math.sqrt(squares / dof), MIN_RELATIVE_SD)
    t = shift / (sd * math.sqrt(1.0 / len(b) + 1.0 / len(c)))
    p = float(stats.t.sf(t, dof))
    return p < alpha, p


def campaign_spread(runs: dict[tuple, list[float]]) -> tuple[float, int] | None:
    """The run-to-run spread of log throughput pooled over the layouts measured more than once
    (runs: layout -> throughputs), with its degrees of freedom; None where none was."""
    squares, dof = 0.0, 0
    for values in runs.values():
        logs = np.log(np.asarray(values, float))
        if len(logs) > 1:
            squares += float(((logs - logs.mean()) ** 2).sum())
            dof += len(logs) - 1
    return (math.sqrt(squares / dof), dof) if dof else None


def pool_spreads(*spreads: tuple[float, int] | None) -> tuple[float, int] | None:
    """Spreads (log sd, dof) of the same noise measured apart, pooled; None where none has a dof."""
    squares = sum(sd ** 2 * dof for sd, dof in filter(None, spreads))
    dof = sum(dof for _, dof in filter(None, spreads))
    return (math.sqrt(squares / dof), dof) if dof else None
