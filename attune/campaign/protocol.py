"""How a campaign measures, fitted to its budget: baseline runs, confirmation runs, steps per trial.

The fixed protocol, 3 baseline replicates and 2 confirmation runs with every trial at `--steps`,
costs five runs before and after the search whatever the budget. Where a run costs a large share of
the budget (a MoE recipe at 128 H100s: 5-9 GPU-hours a run) those five are the whole budget, and
the campaign measures its baseline and ships nothing. So the protocol is chosen per campaign:

- **fixed** when the budget pays it and still leaves SEARCH_ROOM search trials (a large budget
  keeps the protocol every earlier figure was measured with);
- **fitted** otherwise:
  * baseline: two runs (one, when two and a search trial do not fit), a third only when the two
    disagree by more than DISAGREE and a search trial still fits after it;
  * screening: baseline and search runs measure SCREEN_SHARE of the steps (start-up is most of a
    run's cost, so this saves 5-20%; most of the run-to-run noise is shared by all steps of a run,
    so it costs little precision); a confirmation measures the full steps;
  * search: the first trial keeps no confirmation in reserve, later ones keep one;
  * confirmation: one fresh run where the gain at stake clears the test twice over (one run
    suffices), else as many as the budget left pays, up to replicates - 1; none where it pays none,
    and then the incumbent's own search runs are tested, with the confidence split over the k
    layouts the search measured (Bonferroni: it was the best of k, and holding each of the k to
    alpha / k keeps the chance that any noise-sized winner ships at alpha).

The statistics stay those of attune.campaign.noise: a shipped gain clears the noise band at the same
confidence; fewer runs make the test harder to pass, never easier (a one-degree-of-freedom t-test,
or with a single baseline run the assumed noise of noise.relative_sd([])).

Pure functions of numbers (costs, budget, samples): the engine asks them and records what they say.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict

from attune.campaign.noise import gain_is_real, relative_sd

SEARCH_ROOM = 3        # search trials the fixed protocol must leave room for, or it is refitted
DISAGREE = 0.015       # relative sd of two baseline runs above which a third is measured
SCREEN_SHARE = 0.5     # share of the steps a screening run measures in the fitted protocol
MIN_SCREEN_STEPS = 3   # a first (warm-up) step and two measured ones at least
ALPHA = 0.05           # the confirmation test's level (attune.campaign.noise.gain_is_real)
# A search trial with no confirmation in reserve must still fit with this share of its estimate to
# spare: the estimate carries a 30% margin, but a layout never measured on an unseen cluster can run
# slower still (the budget curve's random planner overshot a 1/4 budget by 16% without it), and on the
# fixed protocol the confirmation reserve behind every trial is what absorbed that.
UNRESERVED_MARGIN = 0.5

Mode = Literal["budget", "fixed"]


class Protocol(BaseModel):
    """What the campaign decided to measure, and why (saved with its state, so a resume keeps it)."""

    model_config = ConfigDict(frozen=True)

    fitted: bool                      # False: the fixed protocol
    baseline_runs: int                # baseline runs before the search (a third may follow if they disagree)
    max_baseline_runs: int            # the settings' replicates
    max_confirm_runs: int             # fresh confirmation runs at most (replicates - 1)
    screen_steps: int | None = None   # measured steps of baseline and search runs at most (None: all)
    why: str = ""

    def search_reserve_runs(self, search_trials_so_far: int) -> int:
        """Confirmation runs a search trial must leave room for."""
        if not self.fitted:
            return self.max_confirm_runs
        return 1 if search_trials_so_far > 0 and self.max_confirm_runs > 0 else 0


def _runs(role: str, first: int, last: int) -> str:
    return f"{role} run {first}" if first >= last else f"{role} runs {first}-{last}"


def screen_steps(steps_per_trial: int) -> int:
    return max(min(MIN_SCREEN_STEPS, steps_per_trial), math.ceil(steps_per_trial * SCREEN_SHARE))


def choose(budget: float, replicates: int, steps_per_trial: int, run_cost: float, screen_cost: float,
           gate_cost: float = 0.0, mode: Mode = "budget") -> Protocol:
    """The protocol for a campaign of this budget. `run_cost` and `screen_cost`: the estimated GPU-hours
    of one baseline run at all steps and at screening steps; `gate_cost`: the gate's runs (torchtitan:
    counted from the start, they are paid from the same budget)."""
    fixed_cost = (2 * replicates - 1) * run_cost + gate_cost
    room = (budget - fixed_cost) / run_cost if run_cost > 0 else math.inf
    if mode == "fixed" or replicates < 2 or room >= SEARCH_ROOM:
        why = ("asked for (--protocol fixed)" if mode == "fixed" else
               f"the budget pays {replicates} baseline runs and {replicates - 1} confirmation(s) "
               f"(about {fixed_cost:.3g} GPU-hours) with room for {max(room, 0):.0f} search trials")
        return Protocol(fitted=False, baseline_runs=replicates, max_baseline_runs=replicates,
                        max_confirm_runs=replicates - 1, why=why)
    two = 3 * screen_cost + gate_cost <= budget   # two baseline runs and one search trial
    return Protocol(fitted=True, baseline_runs=2 if two else 1, max_baseline_runs=replicates,
                    max_confirm_runs=replicates - 1, screen_steps=screen_steps(steps_per_trial),
                    why=(f"{replicates} baseline runs and {replicates - 1} confirmation(s) would cost about "
                         f"{fixed_cost:.3g} of {budget:.3g} GPU-hours, room for {max(room, 0):.1f} search trials: "
                         f"measured leaner ({2 if two else 1} baseline run(s), screening trials of "
                         f"{screen_steps(steps_per_trial)} steps, confirmations as the gain and budget allow)"))


def more_baseline(p: Protocol, runs: int, samples: list[float], left: float, screen_cost: float,
                  gate_cost: float = 0.0) -> tuple[bool, str]:
    """Whether to measure another baseline run after `runs` of them (`samples`: the successful ones'
    throughputs); the text says why not, where a run the fixed protocol measures is skipped."""
    if runs < p.baseline_runs:
        return True, ""
    if not p.fitted or runs >= p.max_baseline_runs:
        return False, ""
    skipped = _runs("baseline", runs + 1, p.max_baseline_runs)
    if len(samples) < 2:
        return False, f"{skipped}: one run is all the budget pays before a search trial (noise assumed, not measured)"
    spread = relative_sd(samples)
    if spread <= DISAGREE:
        return False, f"{skipped}: the runs agree (relative sd {spread:.2%} <= {DISAGREE:.1%})"
    if left - screen_cost < (1 + UNRESERVED_MARGIN) * screen_cost + gate_cost:   # what the first trial must find
        return False, f"{skipped}: the runs disagree (relative sd {spread:.2%}) but a third leaves no search trial"
    return True, ""


def one_confirmation_enough(baseline: list[float], measured_gain: float, band: float) -> bool:
    """The gain at stake is wide: a fresh run that measured the search's gain less one standard deviation
    of luck (the search's winner was the best of several noisy runs) would pass the confirmation test
    with half that gain over the band."""
    if not baseline or measured_gain <= band:
        return False
    sd = relative_sd(baseline)
    over = math.log1p(measured_gain) - sd - math.log1p(band)
    if over <= 0:
        return False
    mean = sum(baseline) / len(baseline)
    halfway = mean * math.exp(math.log1p(band) + over / 2)
    return gain_is_real(baseline, [halfway], ALPHA, margin=band)[0]


def confirmations(p: Protocol, baseline: list[float], measured_gain: float, band: float, left: float,
                  confirm_cost: float, gate_cost: float = 0.0) -> tuple[int, str]:
    """Fresh confirmation runs of the incumbent, and what was skipped and why ('' when nothing was)."""
    if not p.fitted:
        return p.max_confirm_runs, ""
    pays = int(max(0.0, left - gate_cost) // confirm_cost) if confirm_cost > 0 else p.max_confirm_runs
    pays = min(pays, p.max_confirm_runs)
    if pays == 0:
        return 0, (f"confirmation: the {left:.3g} GPU-hours left pay no run ({confirm_cost:.3g} each), so the "
                   f"incumbent's own search runs were tested, the confidence split over the layouts measured")
    if p.max_confirm_runs > 1 and one_confirmation_enough(baseline, measured_gain, band):
        return 1, (f"{_runs('confirmation', 2, p.max_confirm_runs)}: the gain at stake ({measured_gain:+.1%} measured, "
                   f"noise band {band:.1%}) clears the test twice over with one run")
    if pays < p.max_confirm_runs:
        return pays, (f"{_runs('confirmation', pays + 1, p.max_confirm_runs)}: the {left:.3g} GPU-hours left pay "
                      f"{pays} ({confirm_cost:.3g} each)")
    return pays, ""


def search_alpha(layouts_measured: int) -> float:
    """The test's level for an incumbent judged on its own search runs: Bonferroni over the layouts the
    search measured (it was chosen as the best of them)."""
    return ALPHA / max(1, layouts_measured)
