"""A re-tune that starts from what an earlier campaign of the same model measured.

    earlier campaign's trials ──► re-measure its best layouts (the shipped one first) after the baseline
        ──► a map old → new: one scale (log ratio) and how far the re-measured layouts stray from it
        ──► ranks hold: the old trials, scaled and discounted, are prior data for the planner's belief
            ranks do not: one line says so, and the campaign searches as a fresh one would

Jamshidi et al. (ASE'17) found that after a small change of environment (hardware, version) a
linear map of the old performance model transfers, and after a large one it does not; the
re-measured layouts are what tells the two apart here. A layout that ran out of memory before stays
an out-of-memory observation only where the memory per GPU is the same.

Pure functions (the models they fill are in attune.campaign.carried): the engine asks them which layout to re-measure next, fits the
map once the re-measures are in, and hands the planner the old layouts as `observations`.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

from attune.campaign.carried import OldLayout, RankMap, WarmStart
from attune.campaign.costs import MeasuredRun
from attune.campaign.context import CampaignSettings
from attune.campaign.listing import find_campaign, list_campaigns
from attune.campaign import store_campaigns
from attune.campaign.noise import campaign_spread
from attune.campaign.state import CampaignState, TrialRecord
from attune.errors import InputError
from attune.layout import PP, PP_MICROBATCH, PP_SCHEDULE
from attune.levers import layout_key
from attune.planners.base import Observation
from attune.space import layout_of, lever_domains
from attune.stacks.base import TrialResult, TrialStatus

MAP_PAIRS = 2          # layouts measured in both campaigns the map is fitted from (the baseline is one, where
                       # the earlier campaign ran it): a run of a 64-GPU MoE recipe is 3 GPU-hours, and a re-tune's
                       # budget pays a few
REMEASURE = 2          # the earlier campaign's best layouts listed for re-measuring (beside the baseline)
SPARE = 2              # more listed, where some of them fail now (out of memory on a smaller GPU)
DISCOUNT = 0.05        # log sd added to an old trial: the map is fitted from a few noisy pairs
STRAY = 2.5            # a re-measured layout further than this many pair sds from the map: the ranks moved
FLAG = "--warm-start"


def resolve(recipe, settings: CampaignSettings, home: Path | None = None,
            store: str | None = None) -> tuple[CampaignSettings, Path | None]:
    """The settings with --warm-start named by the earlier campaign's folder (so `auto` is one
    campaign's identity), and that folder; `auto` with no finished campaign of this recipe: none."""
    if not settings.warm_start:
        return settings, None
    source = find_source(settings.warm_start, recipe.name, home, store)
    return settings.model_copy(update={"warm_start": source.name if source else None}), source


def find_source(ref: str, recipe_name: str, home: Path | None = None, store: str | None = None) -> Path | None:
    """The earlier campaign's folder: `auto` (the latest finished campaign of this recipe name under
    ATTUNE_HOME or in the recipe store `store`, whichever finished later; one of the store's is copied
    under ATTUNE_HOME, attune.campaign.store_campaigns; None if there is none), a campaign id or
    folder name under ATTUNE_HOME, or a campaign folder's path."""
    if ref == "auto":
        done = [s for s in list_campaigns(home) if s.status == "done" and s.recipe == recipe_name]
        local = done[0] if done else None
        # a teammate's or another worker's re-tune since this machine's last one: the store's is newer
        stored = store_campaigns.latest(store, recipe_name)
        if stored is not None and (local is None or (stored.campaign != local.id and stored.finished > local.updated)):
            return store_campaigns.copy_home(stored, recipe_name, home)
        return Path(local.directory) if local else None
    path = Path(ref)
    if ("/" in ref or ref.startswith(".")) and path.is_dir():
        if not (path / "state.json").is_file():
            raise InputError(FLAG, f"{ref} is not a campaign folder (no state.json in it)")
        return path
    try:
        return find_campaign(ref, home)
    except InputError as err:
        raise InputError(FLAG, err.rule) from None


def load(folder: Path, recipe) -> WarmStart:
    """What the campaign in `folder` measured that this recipe can use; an InputError naming --warm-start
    where it tuned another model, or measured nothing."""
    state = CampaignState.load(folder / "state.json")
    old = _old_recipe(state, folder)
    if old.model_name != recipe.model_name:
        raise InputError(FLAG, f"{folder.name} tuned {old.model_name}, this recipe is {recipe.model_name}: a warm "
                               f"start needs an earlier campaign of the same model")
    layouts = _layouts(state.trials, recipe)
    shipped = state.incumbent_record.levers if state.shipped and state.incumbent_record else None
    noise, _ = campaign_spread({"baseline": state.baseline_tps}) or (0.0, 0)
    allowed = {layout_key(lay.levers) for lay in layouts}
    timed = [MeasuredRun(levers=t.levers, steps=t.steps, wall_time_s=t.result.wall_time_s,
                         step_time_s=t.result.step_time_s or 0.0)
             for t in state.trials if layout_key(t.levers) in allowed and t.steps and t.result.ok
             and t.result.wall_time_s > 0]
    warm = WarmStart(source=folder.name, memory_gib=old.cluster.memory_gib, noise_sd=noise, shipped=shipped,
                     spread=campaign_spread(state.runs_by_layout()), runs=timed,
                     layouts=layouts, remeasure=_remeasure(layouts, shipped, recipe.layout().levers(),
                                                           recipe.cluster.memory_gib))
    if not any(lay.tps for lay in layouts):   # another batch or sequence: nothing of it transfers
        warm.map = RankMap(scale=0.0, pairs=0, stray=0.0, tolerance=0.0, holds=False,
                           why="no layout it measured is one this recipe allows: a fresh campaign")
    return warm


def _old_recipe(state: CampaignState, folder: Path):
    from attune.recipe import recipe_from_dict
    try:
        return recipe_from_dict(tomllib.loads(state.recipe_toml), origin=str(folder))
    except Exception as err:   # noqa: BLE001 - any reason the old recipe cannot be read is the same answer
        raise InputError(FLAG, f"{folder.name}: its recipe cannot be read ({type(err).__name__})") from None


def _layouts(trials: list[TrialRecord], recipe) -> list[OldLayout]:
    """The old trials per layout the new recipe allows (in its search space, and dividing on its
    cluster), best mean throughput first, then those that ran out of memory."""
    domains = lever_domains(recipe)
    grouped: dict[tuple, list[TrialRecord]] = {}
    for t in trials:
        grouped.setdefault(layout_key(t.levers), []).append(t)
    out = []
    for key, runs in grouped.items():
        levers = dict(key)
        if not _in_space(levers, domains) or not _valid(recipe, levers):
            continue
        ok = [t for t in runs if t.result.ok and t.tps]
        peaks = [t.result.peak_memory_gib for t in ok if t.result.peak_memory_gib]
        out.append(OldLayout(levers=levers, tps=float(np.mean([t.tps for t in ok])) if ok else None,
                             peak_memory_gib=max(peaks) if peaks else None,
                             oom=not ok and any(t.result.status.value == "oom" for t in runs)))
    out = [lay for lay in out if lay.tps or lay.oom]
    return sorted(out, key=lambda lay: -(lay.tps or 0.0))


def _in_space(levers: dict[str, Any], domains: dict[str, list]) -> bool:
    """Every lever within this recipe's search, a pipeline schedule and micro-batch only where there is
    a pipeline (without one they are placeholders: seq512's space lists one schedule, not 1F1B)."""
    piped = levers.get(PP, 1) > 1
    return all(v in domains[k] for k, v in levers.items()
               if k in domains and (piped or k not in (PP_SCHEDULE, PP_MICROBATCH)))


def _valid(recipe, levers: dict[str, Any]) -> bool:
    try:
        layout_of(recipe, levers)
    except InputError:
        return False
    return True


def _remeasure(layouts: list[OldLayout], shipped: dict[str, Any] | None, baseline: dict[str, Any],
               memory_gib: float = float("inf")) -> list[dict[str, Any]]:
    """The layouts to re-measure in order, the shipped one first, then the best other old layouts:
    REMEASURE of them beside the baseline, and SPARE more for those that fail now. A layout whose
    peak there was above this cluster's memory is not among them: it would run out of memory here."""
    fits = {layout_key(lay.levers) for lay in layouts
            if lay.tps and (lay.peak_memory_gib is None or lay.peak_memory_gib <= memory_gib)}
    order = [lv for lv in ([shipped] if shipped else []) + [lay.levers for lay in layouts if lay.tps]
             if layout_key(lv) in fits]
    picked: list[dict[str, Any]] = []
    for levers in order:
        if levers != baseline and levers not in picked:
            picked.append(levers)
        if len(picked) == REMEASURE + SPARE:
            break
    return picked


def next_remeasure(warm: WarmStart | None, measured: list[dict[str, Any]], ran: list[dict[str, Any]]
                   ) -> dict[str, Any] | None:
    """The next old layout to re-measure (`measured`: every layout this campaign tried, `ran`: those
    that ran): from the list, until MAP_PAIRS layouts of the earlier campaign ran here; None then, or
    once the map is fitted."""
    if warm is None or warm.map is not None:
        return None
    old = {layout_key(lay.levers) for lay in warm.layouts if lay.tps}
    if len({layout_key(lv) for lv in ran} & old) >= MAP_PAIRS:
        return None
    return next((lv for lv in warm.remeasure if lv not in measured), None)


def fit_map(warm: WarmStart, new_runs: dict[tuple, list[float]], noise_sd: float) -> RankMap:
    """The map old → new from the layouts measured in both (new_runs: layout key -> this campaign's
    successful throughputs). It holds where every such layout lies within STRAY pair sds of one common
    scale: the old order, rescaled, is what this campaign measures, up to its noise."""
    old = {layout_key(lay.levers): lay.tps for lay in warm.layouts if lay.tps}
    pairs = [(key, math.log(float(np.mean(runs)) / old[key])) for key, runs in new_runs.items()
             if key in old and runs]
    sd = math.hypot(max(noise_sd, 0.01), max(warm.noise_sd, 0.01))   # a new mean against an old one
    if len(pairs) < 2:
        return RankMap(scale=pairs[0][1] if pairs else 0.0, pairs=len(pairs), stray=0.0, tolerance=STRAY * sd,
                       holds=False, why=f"only {len(pairs)} layout(s) measured in both campaigns: searching afresh")
    ratios = np.array([r for _, r in pairs])
    scale = float(ratios.mean())
    stray = float(np.max(np.abs(ratios - scale)))
    holds = stray <= STRAY * sd
    text = (f"{len(pairs)} layouts re-measured at {math.exp(scale) - 1:+.1%} of what {warm.source} measured, "
            f"the furthest {stray:.1%} from that (noise allows {STRAY * sd:.1%}): ")
    text += ("the ranks hold, its trials are prior data" if holds
             else "the ranks moved, searching as a fresh campaign would")
    return RankMap(scale=scale, pairs=len(pairs), stray=stray, tolerance=STRAY * sd, holds=holds, why=text)




def earlier_spread(warm: WarmStart | None) -> tuple[float, int] | None:
    """The earlier campaign's run-to-run spread, for the confirmation test, where the ranks held (the
    same noise, measured before); None otherwise."""
    if warm is None or warm.map is None or not warm.map.holds:
        return None
    return warm.spread


def baseline_spread(warm: WarmStart | None) -> tuple[float, int] | None:
    """The earlier campaign's spread for deciding a third baseline run, before the map is fitted:
    None where it carried nothing over (another batch or sequence), or where the map did not hold."""
    if warm is None or (warm.map is not None and not warm.map.holds):
        return None
    return warm.spread


def observations(warm: WarmStart | None, recipe, stack: str) -> list[Observation]:
    """The old layouts as the planner sees them, where the map holds: each at this campaign's scale,
    with its peak memory; an old out-of-memory only on the same memory per GPU."""
    if warm is None or warm.map is None or not warm.map.holds:
        return []
    factor = math.exp(warm.map.scale)
    same_memory = abs(warm.memory_gib - recipe.cluster.memory_gib) < 1e-6
    return [Observation(levers=lay.levers, result=TrialResult(
        status=TrialStatus.OK if lay.tps else TrialStatus.OOM, stack=stack, levers=lay.levers, gpus=recipe.cluster.gpus,
        wall_time_s=0.0, tokens_per_sec_per_gpu=lay.tps * factor if lay.tps else None,
        peak_memory_gib=lay.peak_memory_gib, message="an earlier campaign's measurement"))
        for lay in warm.layouts if lay.tps or (lay.oom and same_memory)]


def prior_sd(warm: WarmStart) -> float:
    """The log sd an old trial carries beyond run-to-run noise: DISCOUNT and the map's own misfit."""
    return math.hypot(DISCOUNT, warm.map.stray if warm.map else 0.0)
