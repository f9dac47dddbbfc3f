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
  * confirmation: as many fresh runs as the test needs to pass with probability POWER at the gain
    at stake, as far as the budget left pays; none where it pays none, and then the incumbent's own
    search runs are tested, with the confidence split over the k layouts the search measured
    (Bonferroni: it was the best of k, and holding each of the k to alpha / k keeps the chance that
    any noise-sized winner ships at alpha).

Confirmations are sized on either protocol (runs_for_power): on noisy hardware (9% run to run on
the CPU benchmark) the fixed protocol's two runs left a t-test that a true +100% failed, with the
budget to pass it unspent. The fixed protocol never measures fewer than its two, and `--protocol
fixed` measures exactly those.

The statistics stay those of attune.campaign.noise: a shipped gain clears the noise band at the same
confidence; fewer runs make the test harder to pass, never easier (a one-degree-of-freedom t-test,
or with a single baseline run the assumed noise of noise.relative_sd([])).

Pure functions of numbers (costs, budget, samples): the engine asks them and records what they say.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict

from scipy import stats

from attune.campaign.noise import relative_sd

SEARCH_ROOM = 3        # search trials the fixed protocol must leave room for, or it is refitted
DISAGREE = 0.015       # relative sd of two baseline runs above which a third is measured
SCREEN_SHARE = 0.5     # share of the steps a screening run measures in the fitted protocol
MIN_SCREEN_STEPS = 3   # a first (warm-up) step and two measured ones at least
ALPHA = 0.05           # the confirmation test's level (attune.campaign.noise.gain_is_real)
POWER = 0.95           # the chance a confirmation sized by runs_for_power gives its test to pass
MOST_CONFIRM_RUNS = 6  # fresh confirmation runs at most, where the noise asks for more than the protocol's
# A confirmation is paid only with this share of its estimate to spare: the budget curve's campaigns
# ran one priced at 3.54 GPU-hours with 3.58 left, and it cost 3.60 (step times vary run to run).
CONFIRM_SLACK = 1.05
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
    max_confirm_runs: int             # the protocol's fresh confirmation runs (replicates - 1)
    # more runs where the test needs them and the budget left pays (None: never more, as in a state
    # saved before confirmations were sized, or on --protocol fixed)
    confirm_up_to: int | None = None
    screen_steps: int | None = None   # measured steps of baseline and search runs at most (None: all)
    why: str = ""

    def most_confirm_runs(self) -> int:
        return max(self.max_confirm_runs, self.confirm_up_to or 0)

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
                        max_confirm_runs=replicates - 1, why=why,
                        confirm_up_to=None if mode == "fixed" or replicates < 2 else MOST_CONFIRM_RUNS)
    two = 3 * screen_cost + gate_cost <= budget   # two baseline runs and one search trial
    return Protocol(fitted=True, baseline_runs=2 if two else 1, max_baseline_runs=replicates,
                    max_confirm_runs=replicates - 1, confirm_up_to=MOST_CONFIRM_RUNS,
                    screen_steps=screen_steps(steps_per_trial),
                    why=(f"{replicates} baseline runs and {replicates - 1} confirmation(s) would cost about "
                         f"{fixed_cost:.3g} of {budget:.3g} GPU-hours, room for {max(room, 0):.1f} search trials: "
                         f"measured leaner ({2 if two else 1} baseline run(s), screening trials of "
                         f"{screen_steps(steps_per_trial)} steps, confirmations as the gain and budget allow)"))


def more_baseline(p: Protocol, runs: int, samples: list[float], left: float, screen_cost: float,
                  gate_cost: float = 0.0, earlier: tuple[float, int] | None = None) -> tuple[bool, str]:
    """Whether to measure another baseline run after `runs` of them (`samples`: the successful ones'
    throughputs); the text says why not, where a run the fixed protocol measures is skipped.
    `earlier`: the run-to-run spread (log sd, dof) an earlier campaign of this recipe measured (a warm
    start): where the two runs disagree no more than twice that, the third would only measure it again."""
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
    if earlier is not None and earlier[1] >= 2 and spread <= 2 * earlier[0]:
        return False, (f"{skipped}: the runs disagree (relative sd {spread:.2%}) no more than the noise the earlier "
                       f"campaign measured ({earlier[0]:.2%} over {earlier[1]} degrees of freedom) allows")
    if left - screen_cost < (1 + UNRESERVED_MARGIN) * screen_cost + gate_cost:   # what the first trial must find
        return False, f"{skipped}: the runs disagree (relative sd {spread:.2%}) but a third leaves no search trial"
    return True, ""


def runs_for_power(baseline: list[float], measured_gain: float, band: float, rel_sd: float, most: int) -> int | None:
    """The fewest fresh confirmation runs (1..most) whose test passes with probability POWER, if the
    layout's true gain is what the search measured less one standard deviation of luck (it won the
    search for being the best of several noisy runs). None where even `most` do not reach it, and 0
    where that gain does not clear the band at all (more runs would only confirm a loss).

    Sized before any confirmation runs, from the search and the baseline alone, so the test is still
    one look at ALPHA: growing it run by run until it passes would spend the level many times over."""
    if not baseline:
        return None
    shift = math.log1p(measured_gain) - rel_sd - math.log1p(band)
    if shift <= 0:
        return 0
    b = len(baseline)
    for n in range(1, most + 1):
        dof = b + n - 2
        if dof < 1:
            continue
        needed = (stats.t.ppf(1 - ALPHA, dof) + stats.norm.ppf(POWER)) * rel_sd * math.sqrt(1 / b + 1 / n)
        if shift >= needed:
            return n
    return None


def confirmations(p: Protocol, baseline: list[float], measured_gain: float, band: float, left: float,
                  confirm_cost: float, gate_cost: float = 0.0, rel_sd: float | None = None) -> tuple[int, str]:
    """Fresh confirmation runs of the incumbent, and what was skipped or added and why ('' when the
    protocol's own count stands). `rel_sd`: the run-to-run noise the campaign measured (default: the
    baseline's spread).

    The count is what the test needs to pass with probability POWER at the gain at stake
    (runs_for_power), within what the budget left pays and `p.most_confirm_runs()`: where the noise is
    wide, the protocol's two runs give a test that a true +100% fails (a one- or three-degree t-test
    on 9% noise), while the budget the search left would have paid for the runs that pass it. The
    fixed protocol never measures fewer than its own count; a gain that does not clear the band gets
    no more than that."""
    if p.max_confirm_runs == 0:
        return 0, ""
    pays = (int(max(0.0, left - gate_cost) // (confirm_cost * CONFIRM_SLACK)) if confirm_cost > 0
            else p.most_confirm_runs())
    floor = 0 if p.fitted else p.max_confirm_runs
    sd = rel_sd if rel_sd is not None else relative_sd(baseline)
    needed = runs_for_power(baseline, measured_gain, band, sd, p.most_confirm_runs())
    if needed == 0:
        target = p.max_confirm_runs
    else:
        target = max(needed if needed is not None else p.most_confirm_runs(), floor)
    runs = max(floor, min(target, pays))
    stake = f"the gain at stake ({measured_gain:+.1%} measured, noise band {band:.1%}, run-to-run {sd:.1%})"
    if p.fitted and pays == 0:
        return 0, (f"confirmation: the {left:.3g} GPU-hours left pay no run ({confirm_cost:.3g} each), so the "
                   f"incumbent's own search runs were tested, the confidence split over the layouts measured")
    if runs > p.max_confirm_runs:
        return runs, (f"{_runs('confirmation', p.max_confirm_runs + 1, runs)} added: {stake} needs "
                      f"{needed if needed is not None else f'more than {p.most_confirm_runs()}'} for a test "
                      f"that passes {POWER:.0%} of the time, and the {left:.3g} GPU-hours left pay {pays}")
    if runs < p.max_confirm_runs:
        if target < p.max_confirm_runs:
            return runs, f"{_runs('confirmation', runs + 1, p.max_confirm_runs)}: {stake} passes the test with {runs}"
        return runs, (f"{_runs('confirmation', runs + 1, p.max_confirm_runs)}: the {left:.3g} GPU-hours left pay "
                      f"{pays} ({confirm_cost:.3g} each)")
    return runs, ""


def search_alpha(layouts_measured: int) -> float:
    """The test's level for an incumbent judged on its own search runs: Bonferroni over the layouts the
    search measured (it was chosen as the best of them)."""
    return ALPHA / max(1, layouts_measured)
