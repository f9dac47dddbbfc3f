"""Budget, noise band, payback and the lessons catalog: the campaign's pure parts."""

import numpy as np
import pytest

from attune.campaign.budget import Budget
from attune.campaign.noise import MIN_RELATIVE_SD, gain_is_real, relative_sd, search_band
from attune.campaign.payback import payback_hours
from attune.recipe import load_recipe
from attune.space import lever_domains
from attune.lessons.catalog import load_lessons, match


def test_budget_never_affords_more_than_is_left():
    budget = Budget(total_gpu_hours=10)
    assert budget.can_afford(10) and not budget.can_afford(10.01)
    budget.charge(7.5)
    assert budget.left == pytest.approx(2.5) and not budget.can_afford(3)
    budget.charge(5)
    assert budget.left == 0.0


def test_noise_band_follows_replicate_spread_with_a_floor():
    assert relative_sd([100, 100, 100]) == MIN_RELATIVE_SD
    noisy = relative_sd([100, 104, 96])
    assert noisy == pytest.approx(0.04, rel=1e-6)
    assert search_band(noisy) > search_band(MIN_RELATIVE_SD)


def test_welch_test_accepts_a_real_gain_and_rejects_noise():
    rng = np.random.default_rng(0)
    base = list(1000 * (1 + 0.02 * rng.standard_normal(3)))
    assert gain_is_real(base, [1100, 1105, 1098])[0]
    assert not gain_is_real(base, [b * 1.004 for b in base])[0]
    assert not gain_is_real(base, [900, 905, 899])[0]


def test_payback():
    # 64 GPUs, +10%: each hour saves 64*0.1/1.1 GPU-hours; 40 spent -> 6.875 h
    assert payback_hours(40, 0.10, 64) == pytest.approx(40 * 1.1 / (64 * 0.1))
    assert payback_hours(40, 0.0, 64) is None and payback_hours(40, -0.1, 64) is None


def test_catalog_has_25_lessons_with_when_try_expected(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    lessons = load_lessons()
    assert len(lessons) >= 25
    assert len({ls.id for ls in lessons}) == len(lessons)
    for lesson in lessons:
        assert lesson.when.symptoms and lesson.try_.lever and lesson.expected


def test_oom_matches_recompute_first_and_moves_one_lever(write_recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    recipe = load_recipe(write_recipe())
    layout = recipe.layout()
    found = match(load_lessons(), {"oom"}, False, layout)
    ids = [ls.id for ls in found]
    assert "oom-recompute" in ids and "headroom-bigger-microbatch" not in ids
    move = next(ls for ls in found if ls.id == "oom-recompute").move(layout, lever_domains(recipe)["activation_checkpoint.mode"])
    assert move == {"activation_checkpoint.mode": "full"}


def test_a_confirmed_gain_must_exceed_the_margin_asked():
    base = [1000.0, 1010.0, 995.0]
    three_percent = [1031.0, 1034.0]
    assert gain_is_real(base, three_percent)[0]
    assert not gain_is_real(base, three_percent, margin=0.03)[0]     # +3%, but not surely beyond 3%
    assert gain_is_real(base, [1100.0, 1105.0], margin=0.03)[0]      # +10% clears a 3% band surely


def test_two_fresh_runs_far_apart_still_confirm_a_large_gain():
    # the noise is the cluster's: the baseline's replicates say how large it is, two runs alone cannot
    # (llama3_8b on a realistic sibling: +20.5% measured on two runs 6% apart, refused by a Welch test)
    assert gain_is_real([2636.0, 2623.0, 2584.0], [3240.0, 3061.0], margin=0.019)[0]
