"""Where a real cluster departs from the clean step model: the hooks, all neutral here.

The public estimator runs the step model with NEUTRAL. The ground truth (attune/sim/ground_truth.py,
which planners may not import) fills these hooks with seeded per-cluster values. Every hook is a
multiplier (1 = as modelled) or an addition (0 = as modelled), so the neutral object is the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Effects:
    # multipliers on achieved kernel efficiency (>1 faster), per GEMM class and shape
    def gemm(self, kind: int, m: np.ndarray, n: np.ndarray, prec: np.ndarray) -> np.ndarray | float:
        return 1.0

    def attention(self, chunk: np.ndarray, cp: np.ndarray) -> np.ndarray | float:
        return 1.0

    # multipliers on communication time (>1 slower)
    net_slow: float = 1.0           # every inter-node collective (a slow link in the ring)
    nvlink_slow: float = 1.0
    a2a_inter_slow: float = 1.0     # inter-node all-to-all on top of net_slow
    a2a_intra_slow: float = 1.0
    cp_ring_slow: float = 1.0
    # stack quirks
    compile_gain: dict[str, float] = field(default_factory=dict)   # per schedule: share of compile's gain kept
    compile_gain_unpiped: float = 1.0   # the same without a pipeline (pp = 1: the schedule is not used)
    bubble_slow: dict[str, float] = field(default_factory=dict)    # per schedule: bubble multiplier
    rowwise_slow: float = 1.0       # float8 rowwise GEMM time multiplier
    sac_recompute: float = 1.0      # selective AC recompute work multiplier
    launch_slow: float = 1.0        # host overhead multiplier
    ep_exposed: float = 1.0         # exposed share of expert all-to-all multiplier
    tp_exposed: float = 1.0         # exposed share of TP collectives multiplier
    pp_exposed: float = 1.0         # exposed share of pipeline send/recv multiplier
    fsdp_overlap: float = 1.0       # share of FSDP / HSDP traffic hidden behind compute, multiplier (<1: more exposed)
    # memory: saved activations multiplier (extra buffers, allocator rounding); extra allocator
    # fragmentation (fraction of the live peak) and per in-flight micro-batch
    activation_memory: float = 1.0
    fragmentation: float = 0.0
    fragmentation_per_inflight: float = 0.0


NEUTRAL = Effects()

# GEMM classes the `gemm` hook is asked about
GEMM_ATTN, GEMM_FFN, GEMM_EXPERT, GEMM_HEAD = 0, 1, 2, 3
