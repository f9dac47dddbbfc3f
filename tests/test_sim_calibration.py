"""The ground truth (cluster_seed 0, noise off) against public measurements: every point within 15%.

Run with -s to see the table (source, model, cluster, layout, measured, predicted, error, memory).
"""

from __future__ import annotations

import numpy as np
import pytest

from attune.sim.calibration import CALIBRATION_DIR, calibration_table, estimate_point, format_table, load_points
from attune.sim.ground_truth import hidden_effects, measure_point

TOLERANCE = 0.15


def test_every_calibration_csv_is_read():
    names = {p.name for p in CALIBRATION_DIR.glob("*.csv")}
    assert {"torchtitan_public.csv", "megatron_nemo_public.csv"} <= names
    points = load_points()
    assert len(points) >= 40
    assert {p.stack for p in points} == {"torchtitan", "megatron"}
    assert any(p.model.is_moe for p in points)
    # torchtitan's benchmark H100s are 96 GB parts at a 500 W limit: a lower sustained clock
    h100 = [p for p in points if p.stack == "torchtitan" and p.hw.accelerator == "h100"]
    assert h100 and all(p.hw.capacity_gib == 96 and p.hw.power_w == 500 and p.hw.clock < 1 for p in h100)


def test_ground_truth_is_within_15_percent_of_every_public_point():
    rows = calibration_table(measure_point)
    print("\n" + format_table(rows))
    bad = [f"{r['source']} {r['model']} {r['cluster']} {r['layout']}: {r['error']:+.1%}" for r in rows
           if abs(r["error"]) > TOLERANCE]
    assert not bad, "\n".join(bad)
    assert np.median([abs(r["error"]) for r in rows]) < 0.07


def test_calibration_needs_no_per_row_factors():
    """The points are predicted from the model, the part and the layout only: the same layout on
    another row's part gives the same answer, and rows carry no fitted column."""
    for path in CALIBRATION_DIR.glob("*.csv"):
        header = path.read_text().splitlines()[0].lower()
        assert "factor" not in header and "fudge" not in header and "scale" not in header, path


def test_every_public_run_fits_in_the_simulated_memory_model():
    """Every public run that ran fits in the public memory model, the one planners consult (so no
    planner avoids a layout that works in reality), Megatron's rows with Megatron's accounting. On
    the simulated reference cluster (cluster_seed 0) a drawn allocator fragmentation (0-4% of the live
    peak) comes on top; without it every run fits there too."""
    public = calibration_table(estimate_point)
    misfits = [f"{r['model']} {r['cluster']} {r['layout']}: {r['predicted_memory_gib']:.1f} GiB" for r in public
               if not r["fits"]]
    assert not misfits, "\n".join(misfits)
    assert len(public) >= 44
    rows = calibration_table(measure_point)
    for point, row in zip(load_points(), rows):
        if not row["fits"]:   # only the reference cluster's drawn fragmentation puts it over
            fx = hidden_effects(point.cluster, point.stack_spec, 0)
            assert row["predicted_memory_gib"] < (1 + fx.fragmentation + 0.01) * point.hw.hbm_gib, row["layout"]
    # torchtitan's rows that report memory: the median within 10% of what the runs showed (the two
    # H200 rows of one third-party report show 35-41% less than modelled, the widest misses)
    errors = [abs(r["predicted_memory_gib"] / r["measured_memory_gib"] - 1) for r in rows if r["measured_memory_gib"]]
    assert len(errors) >= 10 and np.median(errors) < 0.10 and max(errors) < 0.45


MEMORY_ONLY = sorted((CALIBRATION_DIR / "memory_only").glob("*.csv"))
BRIDGE_MOE = load_points(MEMORY_ONLY)


@pytest.mark.parametrize("point", BRIDGE_MOE, ids=[f"{p.source.rsplit('(', 1)[-1].rstrip(')')}-{p.model.name}-"
                                                    f"{p.cluster.gpus}-{p.label.split(' s')[0].replace(' ', '-')}"
                                                    for p in BRIDGE_MOE])
def test_megatron_bridge_moe_run_fits(point):
    """Every MoE run on H100 that Megatron-Bridge published (25.09-26.06, up to 1,024 GPUs) ran, so it
    fits in the public memory model the planners consult (a planner must not avoid a layout that works)."""
    row = calibration_table(estimate_point, [point])[0]
    assert row["fits"], (f"{row['model']} {row['cluster']} {row['layout']}: {row['predicted_memory_gib']:.1f} GiB "
                         f"predicted on an {point.hw.hbm_gib:.0f} GiB part")


def test_the_memory_only_rows_are_read_and_stay_out_of_the_throughput_calibration():
    assert len(BRIDGE_MOE) == 19 and {p.model.name for p in BRIDGE_MOE} >= {"deepseek-v3-671b", "gpt-oss-120b"}
    assert max(p.cluster.gpus for p in BRIDGE_MOE) == 1024
    # the throughput calibration reads the top folder only: its figure stays comparable with earlier ones
    assert len(load_points()) == sum(len(p.read_text().splitlines()) - 1 for p in CALIBRATION_DIR.glob("*.csv"))


def test_a_megatron_pipeline_layout_gives_its_slots_or_a_clear_error():
    from attune.sim.calibration import pipeline_layout_slots
    assert pipeline_layout_slots("Et|(tt|)*30mL", 61, 32) == 3     # embedding, MTP block, loss
    assert pipeline_layout_slots("", 61, 32) is None
    for bad, chunks in (("Et|(tt|)*30mL", 16), ("Et|(tt|)*29mL", 32), ("Et|(ttt|)*30mL", 32)):
        with pytest.raises(ValueError, match="pipeline_layout"):
            pipeline_layout_slots(bad, 61, chunks)
