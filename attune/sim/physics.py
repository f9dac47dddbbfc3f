"""Time of one optimizer step for dense and MoE decoders, vectorised over layouts.

Per micro-batch on the busiest rank: GEMMs at an efficiency set by precision and per-GPU shape,
flash attention (causal) at its own efficiency, memory-bound kernels at HBM bandwidth, host
overhead per layer; recomputation re-runs part (selective) or all (full) of the forward.
Communication: TP collectives (mostly exposed), EP all-to-all (partly exposed), CP ring KV
exchange (hidden behind attention where it can be), FSDP gathers / reduce-scatters and the HSDP
all-reduce (hidden behind compute by prefetch, minus what cannot overlap), PP send/recv and the
bubble. Overlapped traffic still slows compute a little (contention).

`step_time` returns the parts in seconds per optimizer step; they sum to `step_s`. `<kind>_total_s`
is the whole time of each kind of collective, the part hidden behind compute included.
"""

from __future__ import annotations

import numpy as np

from attune.sim.arrays import SCHEDULES, LayoutArrays
from attune.sim.effects import GEMM_ATTN, GEMM_EXPERT, GEMM_FFN, GEMM_HEAD, NEUTRAL, Effects
from attune.sim.hardware import Hardware
from attune.sim.params import StackEfficiency
from attune.sim.shapes import Shapes, f64
from attune.spec import ModelSpec

FULL, SELECTIVE = 2, 1  # AC_MODES indices


def _sched_table(table: dict[str, float], sched: np.ndarray, default: float) -> np.ndarray:
    return np.array([table.get(s, default) for s in SCHEDULES])[sched]


def _gemm_time(flops, rows, n, rate, eff: StackEfficiency, fx: Effects, kind: int, prec) -> np.ndarray:
    m0 = eff.grouped_m0 if kind == GEMM_EXPERT else eff.gemm_m0
    shape = rows / (rows + m0) * n / (n + eff.gemm_n0)
    return flops / (rate * shape * fx.gemm(kind, rows, n, prec))


def _bw(within_node, hw: Hardware, eff: StackEfficiency, fx: Effects, per_node=1.0) -> np.ndarray:
    """Ring bandwidth per GPU. Across nodes NCCL runs one ring channel per NIC, so a group with k
    GPUs in each node moves k NICs' worth (capped by NVLink): FSDP over whole nodes is cheap, FSDP
    under tp = 8 (one GPU per node) is not."""
    nvl = hw.nvlink_bps * eff.nvlink_eff / fx.nvlink_slow
    net = np.minimum(nvl, hw.network_bps * eff.network_eff * per_node) / fx.net_slow
    return np.where(within_node, nvl, net)


def _lat(within_node, eff: StackEfficiency) -> np.ndarray:
    return np.where(within_node, eff.latency_nvlink_us, eff.latency_network_us) * 1e-6


def step_time(model: ModelSpec, hw: Hardware, la: LayoutArrays, sh: Shapes, eff: StackEfficiency,
              fx: Effects = NEUTRAL) -> dict[str, np.ndarray]:
    d, H, KV, hd = model.dim, model.n_heads, model.n_kv_heads, model.head_dim
    tp, cp, ep, M = sh.tp, sh.cp, sh.ep, sh.tokens
    f8, ac, comp = la.f8, la.ac, la.comp
    gpn = hw.gpus_per_node
    full, sel = ac == FULL, ac == SELECTIVE

    # --- rates ---
    bf16_rate = hw.peak_bf16 * hw.clock * hw.gemm_scale * eff.gemm_bf16
    fp8_rate = hw.peak_fp8 * hw.clock * hw.gemm_scale * eff.gemm_fp8 * np.where(f8 == 2, eff.fp8_rowwise / fx.rowwise_slow, 1.0)
    lin_rate = np.where(f8 > 0, fp8_rate, bf16_rate) if hw.supports_float8 else np.full_like(tp, bf16_rate)
    exp_rate = (lin_rate if eff.fp8_experts else bf16_rate) * eff.grouped_gemm
    hbm = hw.hbm_bps * eff.hbm_eff
    # The schedule quirk only exists where a pipeline runs: at pp = 1 the schedule field is inert.
    gain = np.where(sh.piped, _sched_table(fx.compile_gain, la.sched, 1.0), fx.compile_gain_unpiped)
    ew_scale = np.where(comp, 1.0 - gain * (1.0 - eff.compile_ew), 1.0)
    moe_scale = np.where(comp, 1.0 - gain * (1.0 - eff.compile_moe), 1.0)
    cast_scale = np.where(comp, 1.0 - gain * (1.0 - eff.compile_cast), 1.0) * (f8 > 0)
    launch = eff.launch_us_layer * 1e-6 * np.where(comp, eff.compile_launch, 1.0) * fx.launch_slow

    # --- one dense-block and one MoE-block forward, per micro-batch ---
    qdim = H * hd / tp
    t_attn_proj = _gemm_time(2.0 * model.attention_params_per_layer / tp * M, M, qdim, lin_rate, eff, fx,
                             GEMM_ATTN, f8)
    attn_fwd_flops = 2.0 * sh.seq * H * hd / tp * M          # causal: each query sees seq/2 keys
    chunk = sh.seq / cp
    attn_eff = (eff.attn[hw.accelerator] * chunk / (chunk + eff.attn_s0) * (eff.attn_hd64 if hd <= 64 else 1.0)
                / (1.0 + eff.cp_overhead * np.log2(cp)) * fx.attention(chunk, cp))
    t_attn_fwd = attn_fwd_flops / (hw.peak_bf16 * hw.clock * attn_eff)
    t_attn = t_attn_fwd * (1.0 + eff.attn_bwd_ratio)

    ffn_n = model.ffn_dim / tp
    t_ffn = _gemm_time(6.0 * d * model.ffn_dim / tp * M, M, ffn_n, lin_rate, eff, fx, GEMM_FFN, f8)
    attn_cast = (2 * d + H * hd) * M / tp
    ew_attn = (eff.ew_bytes_d * d * M / tp * ew_scale + eff.fp8_cast_bytes * attn_cast * cast_scale
               + np.where(tp > 1, eff.tp_bytes_d * d * M, 0.0))
    ew_dense = (eff.ew_bytes_ffn * model.ffn_dim * M / tp * ew_scale
                + eff.fp8_cast_bytes * (d + model.ffn_dim) * M / tp * cast_scale)
    fwd_dense = t_attn_proj + t_ffn
    ew_dense_t = (ew_attn + ew_dense) / hbm

    if model.is_moe:
        k, E, f_e = model.top_k, model.n_experts, model.moe_ffn_dim
        imb = sh.imbalance
        rows_e = np.where(ep > 1, M * k * ep / (E * tp), M * k / E)
        n_e = np.where(ep > 1, float(f_e), f_e / tp)
        exp_prec = f8 if eff.fp8_experts else np.zeros_like(f8)
        t_exp = _gemm_time(6.0 * d * f_e * k / tp * M * imb, rows_e, n_e, exp_rate, eff, fx, GEMM_EXPERT,
                           exp_prec)
        shared = model.n_shared_experts * f_e
        t_shared = (_gemm_time(6.0 * d * shared / tp * M, M, shared / tp, lin_rate, eff, fx, GEMM_FFN, f8)
                    if shared else 0.0)
        t_router = 2.0 * d * E * M / tp / (bf16_rate * 0.5)
        ew_moe = (eff.ew_bytes_ffn * f_e * (k * imb + model.n_shared_experts) * M / tp * ew_scale
                  + eff.ew_bytes_moe * d * k * imb * M / tp * moe_scale)
        ew_moe += eff.fp8_cast_bytes * (k * imb + model.n_shared_experts) * (d + f_e) * M / tp * cast_scale
        fwd_moe = t_attn_proj + t_exp + t_shared + t_router
        ew_moe_t = (ew_attn + ew_moe) / hbm
        launch_moe = launch + eff.launch_us_moe * 1e-6 * np.where(comp, eff.compile_launch, 1.0) * fx.launch_slow
    else:
        fwd_moe = ew_moe_t = launch_moe = np.zeros_like(tp)

    def block(fwd_gemm, ew_t, host):
        compute = 3.0 * fwd_gemm + t_attn + ew_t + host
        rec_sel = eff.sac_recompute * fx.sac_recompute * fwd_gemm + 0.5 * (ew_t + host) / 3.0
        rec_full = fwd_gemm + t_attn_fwd + (ew_t + host) / 3.0
        return compute, np.where(full, rec_full, np.where(sel, rec_sel, 0.0))

    c_dense, r_dense = block(fwd_dense, ew_dense_t, launch)
    c_moe, r_moe = block(fwd_moe, ew_moe_t, launch_moe)
    L, mf = sh.layers, sh.moe_frac
    t_head = 3.0 * _gemm_time(2.0 * d * model.vocab_size / tp * M, M, model.vocab_size / tp, bf16_rate, eff,
                              fx, GEMM_HEAD, np.zeros_like(f8))
    t_head += eff.loss_bytes * model.vocab_size / tp * M / hbm
    mb_compute = L * ((1 - mf) * c_dense + mf * c_moe) + t_head
    mb_recompute = L * ((1 - mf) * r_dense + mf * r_moe)

    # --- TP: sequence-parallel all-gather / reduce-scatter, 4 forward + 4 backward per layer ---
    tp_in = tp <= gpn
    n_tp = 8.0 + 4.0 * full
    tp_bytes = M * d * 2.0 * (tp - 1) / tp * np.where(f8 > 0, 0.8, 1.0)
    tp_exp_frac = np.minimum(1.0, fx.tp_exposed * np.where(la.async_tp & comp, eff.tp_exposed_async,
                                                           np.where(comp, eff.tp_exposed_compiled, eff.tp_exposed)))
    t_tp_layer = np.where(tp > 1, n_tp * (tp_bytes / _bw(tp_in, hw, eff, fx, gpn) + _lat(tp_in, eff)), 0.0)
    mb_tp = (L + 1) * t_tp_layer * tp_exp_frac

    # --- EP: dispatch + combine all-to-all, forward and backward (and full-AC recompute) ---
    if model.is_moe:
        n_a2a = 4.0 + 2.0 * full
        a2a_bytes = M / tp * model.top_k * d * 2.0 * sh.imbalance
        intra = np.minimum(ep, gpn)
        intra_share, inter_share = (intra - 1) / ep, np.maximum(ep - gpn, 0) / ep
        t_a2a = n_a2a * a2a_bytes * (
            intra_share / (hw.nvlink_bps * eff.a2a_nvlink_eff / (fx.a2a_intra_slow * fx.nvlink_slow))
            + inter_share / (hw.network_bps * eff.a2a_network_eff / (fx.a2a_inter_slow * fx.net_slow)))
        t_a2a += n_a2a * _lat(ep <= gpn, eff)
        ep_frac = np.minimum(1.0, eff.ep_exposed * fx.ep_exposed)
        mb_ep = np.where(ep > 1, L * mf * t_a2a * ep_frac, 0.0)
        ep_hidden = np.where(ep > 1, L * mf * t_a2a * (1 - ep_frac), 0.0)
    else:
        mb_ep = ep_hidden = np.zeros_like(tp)

    # --- CP: ring exchange of the local K,V chunk, hidden behind attention where possible ---
    cp_in = tp * cp <= gpn
    kv_bytes = M * 2.0 * KV * hd / tp * 2.0
    n_ring = (cp - 1) * (3.0 + full)
    t_ring = n_ring * (kv_bytes / _bw(cp_in, hw, eff, fx, np.maximum(1.0, gpn / tp)) + _lat(cp_in, eff)) * fx.cp_ring_slow
    cp_exposed_layer = np.maximum(0.0, t_ring - eff.cp_overlap * (t_attn + t_attn_fwd * full))
    mb_cp = np.where(cp > 1, L * cp_exposed_layer, 0.0)
    cp_hidden = np.where(cp > 1, L * (t_ring - cp_exposed_layer), 0.0)

    # --- pipeline: micro-batches, bubble, send/recv ---
    mb_crit = mb_compute + mb_recompute + mb_tp + mb_ep + mb_cp
    n_mb = sh.ga * sh.m
    bubble_units = np.where(sh.piped, (sh.pp - 1) / sh.v * _sched_table(eff.bubble, la.sched, 1.0)
                            * _sched_table(fx.bubble_slow, la.sched, 1.0), 0.0)
    bubble = sh.ga * bubble_units * mb_crit
    pp_in = sh.world / sh.pp < gpn
    pp_bytes = M * d * 2.0 / tp
    t_p2p = n_mb * 2.0 * sh.v * (pp_bytes / _bw(pp_in, hw, eff, fx) + _lat(pp_in, eff))
    pp_exposed = np.where(sh.piped, t_p2p * min(1.0, eff.pp_exposed * fx.pp_exposed), 0.0)

    # --- FSDP (per micro-step, or per step) and the HSDP replicate all-reduce ---
    compute_all = n_mb * (mb_compute + mb_recompute)
    fsdp_in = sh.dps * cp * tp <= gpn
    gather_share = sh.dense_local * (sh.g_dense - 1) / sh.g_dense + sh.expert_local * (sh.g_expert - 1) / sh.g_expert
    rounds = sh.ga if eff.fsdp_per_microstep else np.ones_like(tp)
    n_ag = np.where(sh.piped, 1.0, 2.0)   # PP keeps gathered params for the whole step (no reshard)
    fsdp_bytes = rounds * gather_share * (2.0 * n_ag + eff.reduce_bytes)
    n_fsdp = rounds * (n_ag + 1.0) * (L + 1.0)
    fsdp_bw = _bw(fsdp_in, hw, eff, fx, np.clip(gpn / tp, 1.0, sh.dps * cp))
    t_fsdp = np.where(gather_share > 0, fsdp_bytes / fsdp_bw + n_fsdp * _lat(fsdp_in, eff), 0.0)
    edge = 2.0 * t_fsdp / (L + 2.0)        # the first gather and the last reduce cannot overlap
    overlap = eff.fsdp_overlap * fx.fsdp_overlap
    fsdp_exposed = np.maximum(0.0, t_fsdp - overlap * compute_all) + edge
    rep_in = sh.dpr * sh.dps * cp * tp <= gpn
    rep_bytes = 2.0 * (sh.dpr - 1) / sh.dpr * 4.0 * sh.sharded_params
    rep_bw = _bw(rep_in, hw, eff, fx, np.clip(gpn / (sh.dps * cp * tp), 1.0, sh.dpr))
    t_rep = np.where(sh.dpr > 1, rep_bytes / rep_bw + _lat(rep_in, eff), 0.0)
    last_bwd = compute_all / n_mb * (2.0 / 3.0) * sh.m
    rep_exposed = np.maximum(0.0, t_rep - overlap * last_bwd) + np.where(sh.dpr > 1, 0.05 * t_rep, 0.0)

    optimizer = eff.optimizer_bytes * sh.sharded_params / hbm + 2e-3
    overlapped = (t_fsdp - fsdp_exposed + edge) + (t_rep - rep_exposed) + n_mb * (ep_hidden + cp_hidden)
    other = eff.contention * np.maximum(overlapped, 0.0) + 5e-3
    out = {"compute_s": n_mb * mb_compute, "recompute_s": n_mb * mb_recompute, "bubble_s": bubble,
           "optimizer_s": optimizer, "other_s": other,
           "fsdp_s": fsdp_exposed, "tp_s": n_mb * mb_tp, "pp_s": pp_exposed, "ep_s": n_mb * mb_ep,
           "cp_s": n_mb * mb_cp, "dp_replicate_s": rep_exposed}
    out["step_s"] = sum(out.values())
    out["microbatch_s"] = mb_crit
    # what a profiler's trace shows of each kind of collective, hidden behind compute or not
    zero = np.zeros_like(tp)
    out.update({"fsdp_total_s": t_fsdp, "tp_total_s": n_mb * (L + 1) * t_tp_layer,
                "pp_total_s": np.where(sh.piped, t_p2p, 0.0),
                "ep_total_s": n_mb * (mb_ep + ep_hidden) if model.is_moe else zero,
                "cp_total_s": np.where(cp > 1, n_mb * L * t_ring, 0.0), "dp_replicate_total_s": t_rep})
    return out


def launch_overhead_s(model: ModelSpec, gpus: int, compile_on: bool, eff: StackEfficiency) -> float:
    """Start-up before the first step: launch, model init and (with compile) compilation."""
    kinds = 1 + int(model.is_moe and model.n_dense_layers > 0) + int(model.is_moe)
    start = (eff.launch_s + eff.launch_s_per_log2_gpus * max(0.0, np.log2(max(gpus, 1) / 8))
             + eff.launch_s_per_100b_params * model.total_params / 1e11)
    return float(start + (eff.compile_s + eff.compile_s_per_layer_kind * kinds if compile_on else 0.0))


__all__ = ["step_time", "launch_overhead_s", "f64"]
