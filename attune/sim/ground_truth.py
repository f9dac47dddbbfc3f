"""The simulated cluster's ground truth: the estimator's physics plus hidden per-cluster effects.

ONLY attune/sim/oracle.py, attune/stacks/sim.py and attune/cli/cmd_sim.py may import this module
(tests/test_sim_honesty.py enforces it): planners see measured trials and the public estimator.

Hidden effects (ranges in attune/data/sim_hidden.toml), drawn from a seed made of the cluster's
identity (accelerator, gpus, gpus_per_node), the stack fingerprint and an integer cluster_seed, so
the oracle and every campaign on the same cluster see the same cluster:
  * kernel efficiency per GEMM shape: a per-(class, rows, sharded dim, precision) factor, sigma
    ~4.5%, and now and then a shape whose tile heuristic is poor (-10..-22%);
  * flash attention efficiency per (query chunk, cp), sigma ~3.5%;
  * collectives: sometimes a slow link that slows every inter-node ring (+15..50%), inter-node
    all-to-all slower than modelled (+0..60%), a slower CP ring, NVLink within a few percent;
  * stack quirks: compile helps much less under one pipeline schedule, per-schedule bubble
    overhead, float8 rowwise slower, selective-AC recompute heavier or lighter, host overhead,
    more or less of the expert all-to-all exposed;
  * memory: allocator fragmentation (+0..4% of the live peak, more with micro-batches in flight),
    so a layout the estimator calls fitting can run out of memory;
  * run-to-run noise: CV 1-2.5% of step time, part shared by a run and part per step, from the
    trial's own seed (noise off for the oracle).
A sibling cluster (cluster_seed >= 1) departs from its reference (cluster_seed 0, which the public
calibration pins) by a further seeded factor on every effect, as large as the world says
(`world`: easy | realistic | hard; attune/sim/worlds.py): a class of GEMMs or the fabric slower
than modelled, less communication hidden, heavier bubbles, more fragmentation.
Estimator error against the reference: median 5-7% per layout, p90 ~15%, occasional misses past 25%
(tests/test_sim_truth.py measures it). Most effects are slow-downs, so the estimator is a little
optimistic, as a clean model of a real cluster is. Out-of-memory is reported when peak memory exceeds the device.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, replace

import numpy as np

from attune.data_files import load_data
from attune.layout import Layout
from attune.recipe import Recipe
from attune.sim.arrays import SCHEDULES, LayoutArrays
from attune.sim.calibration import Point
from attune.sim.effects import Effects
from attune.sim.estimator import STACK, as_arrays, recipe_hardware
from attune.sim.stepmodel import SimResult, evaluate, fits_mask, result_at
from attune.sim.worlds import DEFAULT_WORLD, world_scale, world_shift
from attune.spec import ClusterSpec, StackSpec

_M1, _M2, _M3 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, vectorised (uint64 arithmetic wraps, as intended)."""
    with np.errstate(over="ignore"):
        x = np.asarray(x + _M3, dtype=np.uint64)
        x = np.asarray((x ^ (x >> np.uint64(30))) * _M1, dtype=np.uint64)
        x = np.asarray((x ^ (x >> np.uint64(27))) * _M2, dtype=np.uint64)
    return x ^ (x >> np.uint64(31))


def _uniforms(seed: int, *keys: np.ndarray) -> np.ndarray:
    """A deterministic uniform [0, 1) per element of the broadcast keys."""
    h = np.full(np.broadcast(*keys).shape, np.uint64(seed & 0xFFFFFFFFFFFFFFFF), dtype=np.uint64)
    for k in keys:
        h = _mix(h ^ np.asarray(k).astype(np.int64).astype(np.uint64))
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def _half_octave(x: np.ndarray) -> np.ndarray:
    return np.round(2.0 * np.log2(np.maximum(np.asarray(x, dtype=np.float64), 1.0)))


@dataclass(frozen=True)
class HiddenEffects(Effects):
    seed: int = 0
    gemm_sigma: float = 0.0
    bad_tile_p: float = 0.0
    bad_tile: tuple[float, float] = (1.0, 1.0)
    gemm_clip: tuple[float, float] = (1.0, 1.0)
    attn_sigma: float = 0.0
    attn_clip: tuple[float, float] = (1.0, 1.0)
    # a sibling's departure (neutral on a reference cluster)
    gemm_class_slow: tuple[float, ...] = (1.0,) * 8    # per GEMM class x (bf16, float8): time multiplier
    gemm_shape_sigma: float = 0.0                      # per-shape spread on top of the reference's
    attn_slow: float = 1.0

    def gemm(self, kind, m, n, prec):
        u1 = _uniforms(self.seed, kind, _half_octave(m), _half_octave(n), prec)
        u2 = _uniforms(self.seed + 1, kind, _half_octave(m), _half_octave(n), prec)
        normal = np.sqrt(3.0) * (2.0 * u1 - 1.0)            # unit variance, bounded
        factor = np.exp(self.gemm_sigma * normal)
        lo, hi = self.bad_tile
        bad = np.where(u2 < self.bad_tile_p, lo + (hi - lo) * u2 / max(self.bad_tile_p, 1e-12), 1.0)
        out = np.clip(factor * bad, *self.gemm_clip)
        if self.gemm_shape_sigma or self.gemm_class_slow != (1.0,) * 8:
            u3 = _uniforms(self.seed + 5, kind, _half_octave(m), _half_octave(n), prec)
            slow = np.asarray(self.gemm_class_slow)[2 * kind + (np.asarray(prec) > 0)]
            out = out * np.exp(self.gemm_shape_sigma * np.sqrt(3.0) * (2.0 * u3 - 1.0)) / slow
        return out

    def attention(self, chunk, cp):
        u = _uniforms(self.seed + 2, _half_octave(chunk), cp)
        return np.clip(np.exp(self.attn_sigma * np.sqrt(3.0) * (2.0 * u - 1.0)), *self.attn_clip) / self.attn_slow


def cluster_seed_of(cluster: ClusterSpec, stack: StackSpec, cluster_seed: int = 0) -> int:
    text = f"{cluster.accelerator}|{cluster.gpus}|{cluster.gpus_per_node}|{stack.fingerprint()}|{int(cluster_seed)}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


@functools.lru_cache(maxsize=256)
def _effects(seed: int) -> HiddenEffects:
    cfg = load_data("sim_hidden")
    rng = np.random.default_rng(seed)
    u = lambda pair: float(rng.uniform(*pair))  # noqa: E731
    net, quirks, mem = cfg["network"], cfg["quirks"], cfg["memory"]
    slow = rng.uniform() < net["slow_ring_probability"]
    weak = SCHEDULES[int(rng.integers(len(SCHEDULES)))]
    compile_gain = {s: (u(quirks["compile_weak_gain"]) if s == weak else u(quirks["compile_gain"])) for s in SCHEDULES}
    bubble = {s: u(quirks["bubble"]) for s in SCHEDULES}
    effects = dict(
        seed=seed, gemm_sigma=cfg["gemm"]["sigma"], bad_tile_p=cfg["gemm"]["bad_tile_probability"],
        bad_tile=tuple(cfg["gemm"]["bad_tile_factor"]), gemm_clip=tuple(cfg["gemm"]["clip"]),
        attn_sigma=cfg["attention"]["sigma"], attn_clip=tuple(cfg["attention"]["clip"]),
        net_slow=u(net["slow_ring"] if slow else net["normal"]), nvlink_slow=u(net["nvlink"]),
        a2a_inter_slow=u(net["a2a_inter"]), a2a_intra_slow=u(net["a2a_intra"]), cp_ring_slow=u(net["cp_ring"]),
        compile_gain=compile_gain, bubble_slow=bubble, rowwise_slow=u(quirks["rowwise"]),
        sac_recompute=u(quirks["sac_recompute"]), launch_slow=u(quirks["launch"]),
        ep_exposed=u(quirks["ep_exposed"]), fragmentation=u(mem["fragmentation"]),
        fragmentation_per_inflight=u(mem["fragmentation_per_inflight"]))
    # Drawn last so that every earlier draw (and with it every calibrated cluster) stays as it was.
    return HiddenEffects(**effects, compile_gain_unpiped=u(quirks["compile_gain"]))


# Departure draws in a fixed order (a new effect goes last, so existing siblings stay as they were).
_DEPARTURES = ("network", "nvlink", "a2a_inter", "a2a_intra", "cp_ring", "fsdp_overlap", "ep_exposed", "tp_exposed",
               "pp_exposed", "sac_recompute", "launch", "compile_gain", "activation_memory", "fragmentation",
               "attention", "gemm_shape")


@functools.lru_cache(maxsize=256)
def _departed(seed: int, scale: float) -> HiddenEffects:
    """The reference's effects times this sibling's departure at the world's scale."""
    base = _effects(seed)
    if scale == 0.0:
        return base
    table = load_data("sim_hidden")["departure"]
    rng = np.random.default_rng([seed & 0xFFFFFFFF, seed >> 32, 0xDE9A])
    z = {name: float(rng.uniform(-np.sqrt(3.0), np.sqrt(3.0))) for name in _DEPARTURES}
    z_gemm = rng.uniform(-np.sqrt(3.0), np.sqrt(3.0), size=8)
    z_bubble = rng.uniform(-np.sqrt(3.0), np.sqrt(3.0), size=len(SCHEDULES))
    z_compile = rng.uniform(-np.sqrt(3.0), np.sqrt(3.0), size=len(SCHEDULES))

    def log_factor(name: str, zz):
        return scale * (table[name]["bias"] + table[name]["spread"] * zz)

    f = {name: float(np.exp(log_factor(name, z[name]))) for name in _DEPARTURES}
    gemm_class = tuple(float(x) for x in np.exp(log_factor("gemm_class", z_gemm)))
    return replace(
        base,
        net_slow=base.net_slow * f["network"], nvlink_slow=base.nvlink_slow * f["nvlink"],
        a2a_inter_slow=base.a2a_inter_slow * f["a2a_inter"], a2a_intra_slow=base.a2a_intra_slow * f["a2a_intra"],
        cp_ring_slow=base.cp_ring_slow * f["cp_ring"], fsdp_overlap=base.fsdp_overlap * f["fsdp_overlap"],
        ep_exposed=base.ep_exposed * f["ep_exposed"], tp_exposed=base.tp_exposed * f["tp_exposed"],
        pp_exposed=base.pp_exposed * f["pp_exposed"], sac_recompute=base.sac_recompute * f["sac_recompute"],
        launch_slow=base.launch_slow * f["launch"],
        compile_gain={s: _kept(base.compile_gain[s] * np.exp(log_factor("compile_gain", z_compile[i])))
                      for i, s in enumerate(SCHEDULES)},
        compile_gain_unpiped=_kept(base.compile_gain_unpiped * f["compile_gain"]),
        bubble_slow={s: base.bubble_slow[s] * float(np.exp(log_factor("bubble", z_bubble[i])))
                     for i, s in enumerate(SCHEDULES)},
        activation_memory=base.activation_memory * f["activation_memory"],
        fragmentation=base.fragmentation + max(0.0, float(log_factor("fragmentation", z["fragmentation"]))),
        attn_slow=f["attention"], gemm_class_slow=gemm_class,
        gemm_shape_sigma=scale * table["gemm_shape"]["spread"])


def hidden_effects(cluster: ClusterSpec, stack: StackSpec, cluster_seed: int = 0,
                   world: str = DEFAULT_WORLD) -> HiddenEffects:
    """The cluster's hidden effects: the reference's at cluster_seed 0, a sibling's in `world` else."""
    seed = cluster_seed_of(cluster, stack, cluster_seed)
    effects = _effects(seed) if int(cluster_seed) == 0 else _departed(seed, world_scale(world))
    return _shifted(effects, world_shift(world))


def _shifted(effects: HiddenEffects, shift: dict[str, float]) -> HiddenEffects:
    """The effects with some multiplied (a world's stack upgrade; a per-schedule effect on every schedule).
    Compile's gain moves with and without a pipeline alike, and a share of it stays <= 1."""
    changed = {}
    for name, factor in shift.items():
        value = getattr(effects, name)
        changed[name] = {k: v * factor for k, v in value.items()} if isinstance(value, dict) else value * factor
    if "compile_gain" in shift:
        changed["compile_gain"] = {k: _kept(v) for k, v in changed["compile_gain"].items()}
        changed["compile_gain_unpiped"] = _kept(effects.compile_gain_unpiped * shift["compile_gain"])
    return replace(effects, **changed) if changed else effects


def _kept(share: float) -> float:
    """A cluster never keeps more of compile's gain than all of it."""
    return float(min(1.0, share))

def noise_cv(cluster: ClusterSpec, stack: StackSpec, cluster_seed: int = 0) -> float:
    lo, hi = load_data("sim_hidden")["noise"]["cv"]
    seed = cluster_seed_of(cluster, stack, cluster_seed)
    return float(lo + (hi - lo) * _uniforms(seed + 3, np.array(0))[()])


def step_noise(recipe: Recipe, cluster_seed: int, trial_seed: int, steps: int) -> np.ndarray:
    """Multiplicative step-time factors for one run: a run-wide part and a per-step part."""
    cv = noise_cv(recipe.cluster, recipe.stack, cluster_seed)
    share = load_data("sim_hidden")["noise"]["trial_share"]
    rng = np.random.default_rng([cluster_seed_of(recipe.cluster, recipe.stack, cluster_seed) & 0xFFFFFFFF,
                                 int(trial_seed) & 0xFFFFFFFF])
    run = rng.normal(0.0, cv * np.sqrt(share))
    per_step = rng.normal(0.0, cv * np.sqrt(1.0 - share), size=max(int(steps), 1))
    return np.exp(run + per_step)


def measure_many(recipe: Recipe, layouts, cluster_seed: int = 0, world: str = DEFAULT_WORLD) -> dict[str, np.ndarray]:
    """Ground-truth columns (noise off) over Layouts or LayoutArrays of the recipe."""
    fx = hidden_effects(recipe.cluster, recipe.stack, cluster_seed, world)
    return evaluate(recipe.architecture, recipe_hardware(recipe), as_arrays(recipe, layouts), STACK, fx)


def fitting_mask(recipe: Recipe, layouts, cluster_seed: int = 0, world: str = DEFAULT_WORLD) -> np.ndarray:
    """Which layouts fit on this cluster (hidden fragmentation included), without timing them."""
    fx = hidden_effects(recipe.cluster, recipe.stack, cluster_seed, world)
    return fits_mask(recipe.architecture, recipe_hardware(recipe), as_arrays(recipe, layouts), STACK, fx)


def measure(recipe: Recipe, layout: Layout | None = None, cluster_seed: int = 0,
            noise_seed: int | None = None, world: str = DEFAULT_WORLD) -> SimResult:
    """One layout's ground truth; with noise_seed, one noisy run's step (what `sim predict` shows)."""
    cols = measure_many(recipe, [layout or recipe.layout()], cluster_seed, world)
    if noise_seed is not None:
        factor = float(step_noise(recipe, cluster_seed, noise_seed, 1)[0])
        cols = dict(cols)
        for key in [k for k in cols if k.endswith("_s")]:
            cols[key] = cols[key] * factor
        cols["tps"], cols["mfu"] = cols["tps"] / factor, cols["mfu"] / factor
    return result_at(cols, 0, recipe_hardware(recipe), source="ground_truth")


def measure_point(point: Point, cluster_seed: int = 0, arrays: LayoutArrays | None = None,
                  eff=None, mem=None, world: str = DEFAULT_WORLD) -> dict[str, np.ndarray]:
    """A calibration point's ground truth (noise off), on the point's own part and stack."""
    fx = hidden_effects(point.cluster, point.stack_spec, cluster_seed, world)
    return evaluate(point.model, point.hw, arrays if arrays is not None else point.layout, point.stack, fx, eff,
                    mem or point.memory_params())
