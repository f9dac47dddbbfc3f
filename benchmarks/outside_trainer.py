"""A small trainer that is neither the proxy nor torchtitan: the gate's independent curve set.

    from benchmarks.outside_trainer import TrainConfig, train, curve_set, CASES

A next-token model in numpy (float32): the embeddings of the 3 previous tokens, one tanh hidden
layer, a softmax over 64 tokens, trained with AdamW, linear warm-up and cosine decay, global-norm
gradient clipping and weight decay on the matrices. Its data is synthetic: contexts drawn from a
skewed unigram and next tokens from a fixed random "teacher" network of the same shape, a pool of
independent samples walked in an order set by a data-order seed (a new walk each epoch). A run of 300 steps
takes a fraction of a second.

Run-to-run variation as a GPU shows it, on this CPU: every step sums the batch's gradients in an
order drawn from the run's noise seed (float32 reduction order, the nondeterminism of atomics and
split reductions), and `nondeterminism` > 0 adds a seeded perturbation of that relative size to
each gradient tensor (the larger run-to-run noise of non-deterministic kernels). Baseline
replicates differ only in their noise seed; the candidate has its own.

`curve_set` writes what a user would bring to `attune gate --curves DIR`: baseline-1..4.csv (two
replicates on the candidate's data order, two on other orders) and candidate.csv, exported the
way a trainer logs them: `step,loss` and, when asked, the optional columns.
"""

from __future__ import annotations

import contextlib
import csv
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

try:   # BLAS threads cost more than they give on these tiny matrices, on a shared machine
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover
    threadpool_limits = None

VOCAB, CONTEXT, DIM, HIDDEN = 64, 3, 16, 64
POOL = 1 << 16          # training samples in the pool (one epoch covers steps x batch of them)
EVAL = 1024             # held-out samples of the fixed eval batch


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 300
    batch: int = 128
    lr: float = 3e-3
    warmup: int = 30
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    max_norm: float = 0.5
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    micro_batches: int = 1          # gradient accumulation: the batch in this many micro-batches
    label_smoothing: float = 0.0
    token_drop: float = 0.0         # a fraction of the batch's tokens left out of the loss
    recompute: bool = False         # recompute the forward in the backward (activation checkpointing)
    reduction: str = "sorted"       # how the per-sample gradients are summed: sorted | pairwise
    seed: int = 0                   # initial weights (shared by every run of a comparison)
    order: int = 0                  # data-order seed
    noise_seed: int = 0             # run-to-run nondeterminism
    nondeterminism: float = 0.0     # relative size of the seeded gradient perturbation
    faults: tuple[str, ...] = ()    # ga_not_divided | lr_schedule_ignored_warmup ... (see FAULTS)


# Faults injected into the trainer itself (the config a user would show is unchanged).
FAULTS = {
    "ga_not_divided": "accumulated micro-batch means summed, not averaged (gradients x micro-batches)",
    "clip_skipped": "gradient clipping computed but never applied",
    "bias_decayed": "weight decay applied to the biases and embeddings too",
}


@dataclass
class Params:
    E: np.ndarray
    W1: np.ndarray
    b1: np.ndarray
    W2: np.ndarray
    b2: np.ndarray

    NAMES = ("E", "W1", "b1", "W2", "b2")

    def tensors(self) -> list[np.ndarray]:
        return [getattr(self, n) for n in self.NAMES]


def _init(rng: np.random.Generator, scale: float = 1.0) -> Params:
    f32 = np.float32
    return Params(E=(rng.normal(0, 1.0, (VOCAB, DIM)) * scale).astype(f32),
                  W1=(rng.normal(0, 1 / math.sqrt(CONTEXT * DIM), (CONTEXT * DIM, HIDDEN)) * scale).astype(f32),
                  b1=np.zeros(HIDDEN, f32),
                  W2=(rng.normal(0, 1 / math.sqrt(HIDDEN), (HIDDEN, VOCAB)) * scale).astype(f32),
                  b2=np.zeros(VOCAB, f32))


_DATA: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}


def data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train contexts, train targets, eval contexts, eval targets), the same in every process."""
    if 0 not in _DATA:
        rng = np.random.default_rng(20261205)
        teacher = _init(rng, scale=2.5)
        unigram = rng.dirichlet(np.full(VOCAB, 0.5))
        ctx = rng.choice(VOCAB, size=(POOL + EVAL, CONTEXT), p=unigram)
        logits = _forward(teacher, ctx)[2].astype(np.float64)
        prob = np.exp(logits - logits.max(1, keepdims=True))
        prob /= prob.sum(1, keepdims=True)
        u = rng.random((POOL + EVAL, 1))
        tgt = np.minimum((prob.cumsum(1) < u).sum(1), VOCAB - 1)
        _DATA[0] = (ctx[:POOL], tgt[:POOL], ctx[POOL:], tgt[POOL:])
    return _DATA[0]


def _forward(p: Params, ctx: np.ndarray):
    x = p.E[ctx].reshape(ctx.shape[0], CONTEXT * DIM)
    h = np.tanh(x @ p.W1 + p.b1)
    return x, h, h @ p.W2 + p.b2


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(1, keepdims=True)
    return z - np.log(np.exp(z).sum(1, keepdims=True))


def _loss_and_grads(p: Params, ctx, tgt, weight, smoothing: float, recompute: bool):
    """Sum over the samples of weight x loss, and its gradients (weights carry the normalisation)."""
    x, h, logits = _forward(p, ctx)
    logp = _log_softmax(logits)
    rows = np.arange(ctx.shape[0])
    per = -(1 - smoothing) * logp[rows, tgt] - smoothing * logp.mean(1)
    loss = float((per.astype(np.float64) * weight).sum())
    if recompute:  # activation checkpointing: the backward recomputes the forward's activations
        x, h, logits = _forward(p, ctx)
    d = np.exp(logp)
    d[rows, tgt] -= 1 - smoothing
    d -= smoothing / VOCAB
    d *= weight[:, None].astype(np.float32)
    gW2, gb2 = h.T @ d, d.sum(0)
    da = (d @ p.W2.T) * (1 - h * h)
    gW1, gb1 = x.T @ da, da.sum(0)
    gE = np.zeros_like(p.E)
    np.add.at(gE, ctx.reshape(-1), (da @ p.W1.T).reshape(-1, DIM))
    return loss, [gE, gW1, gb1, gW2, gb2]


def _lr(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine to min_lr_ratio x lr at the last step."""
    if cfg.warmup and step <= cfg.warmup:
        return cfg.lr * step / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    frac = min(1.0, (step - cfg.warmup) / span)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def train(cfg: TrainConfig) -> list[dict]:
    """One run: a row per step (step, loss, eval_loss, grad_norm, lr, tokens, batch_id)."""
    with threadpool_limits(1) if threadpool_limits else contextlib.nullcontext():
        return _train(cfg)


def _train(cfg: TrainConfig) -> list[dict]:
    ctx_all, tgt_all, ev_ctx, ev_tgt = data()
    per_epoch = POOL // cfg.batch
    orders: dict[int, np.ndarray] = {}   # a new walk of the pool each epoch
    p = _init(np.random.default_rng(cfg.seed))
    m = [np.zeros_like(t) for t in p.tensors()]
    v = [np.zeros_like(t) for t in p.tensors()]
    noise = np.random.default_rng(7919 * (cfg.noise_seed + 1))
    drop_rng = np.random.default_rng(31 + cfg.order)    # which tokens a token-dropping loader loses
    b1, b2 = cfg.betas
    decayed = {"W1", "W2"} | ({"E", "b1", "b2"} if "bias_decayed" in cfg.faults else set())
    rows = []
    for step in range(1, cfg.steps + 1):
        epoch, k = divmod(step - 1, per_epoch)
        if epoch not in orders:
            orders[epoch] = np.random.default_rng([1000 + cfg.order, epoch]).permutation(POOL)
        idx = orders[epoch][k * cfg.batch: (k + 1) * cfg.batch]
        ctx, tgt = ctx_all[idx], tgt_all[idx]
        keep = np.ones(cfg.batch, bool)
        if cfg.token_drop > 0:
            keep = drop_rng.random(cfg.batch) >= cfg.token_drop
        # the reduction order of this step: a permutation drawn from the run's noise seed
        perm = noise.permutation(cfg.batch)
        ctx, tgt, keep = ctx[perm], tgt[perm], keep[perm]
        tokens = int(keep.sum())
        loss, grads = 0.0, None
        for part in np.array_split(np.arange(cfg.batch), cfg.micro_batches):
            denom = keep[part].sum() if "ga_not_divided" in cfg.faults else tokens
            weight = keep[part] / max(denom, 1)
            part_loss, part_grads = _loss_and_grads(p, ctx[part], tgt[part], weight.astype(np.float64),
                                                    cfg.label_smoothing, cfg.recompute)
            if cfg.reduction == "pairwise":  # the same sum, another order: half by half
                half = len(part) // 2
                w1, w2 = weight.copy(), weight.copy()
                w1[half:], w2[:half] = 0, 0
                _, g1 = _loss_and_grads(p, ctx[part], tgt[part], w1, cfg.label_smoothing, cfg.recompute)
                _, g2 = _loss_and_grads(p, ctx[part], tgt[part], w2, cfg.label_smoothing, cfg.recompute)
                part_grads = [a + b for a, b in zip(g1, g2)]
            loss += part_loss
            grads = part_grads if grads is None else [a + b for a, b in zip(grads, part_grads)]
        if "ga_not_divided" in cfg.faults:
            loss /= cfg.micro_batches   # the logged loss is right; the gradients are not
        if cfg.nondeterminism > 0:
            for g in grads:
                g += (noise.standard_normal(g.shape) * cfg.nondeterminism
                      * float(np.sqrt((g.astype(np.float64) ** 2).mean()))).astype(np.float32)
        norm = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads))
        if cfg.max_norm and norm > cfg.max_norm and "clip_skipped" not in cfg.faults:
            grads = [g * np.float32(cfg.max_norm / norm) for g in grads]
        lr = _lr(cfg, step)
        eval_loss = -float(_log_softmax(_forward(p, ev_ctx)[2])[np.arange(EVAL), ev_tgt].astype(np.float64).mean())
        for i, (name, t) in enumerate(zip(Params.NAMES, p.tensors())):
            g = grads[i]
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            mhat = m[i] / (1 - b1 ** step)
            vhat = v[i] / (1 - b2 ** step)
            if name in decayed:
                t *= np.float32(1 - lr * cfg.weight_decay)
            t -= (lr * mhat / (np.sqrt(vhat) + cfg.eps)).astype(np.float32)
        rows.append({"step": step, "loss": loss, "eval_loss": eval_loss, "grad_norm": norm, "lr": lr,
                     "tokens": tokens, "batch_id": f"o{cfg.order}e{epoch}b{k}"})
    return rows


# The comparison: what the candidate is, as a change of the baseline config.
BASE = TrainConfig()
CANDIDATE_NOISE = 99


@dataclass(frozen=True)
class Case:
    id: str
    kind: str          # fault | legit
    label: str
    change: dict = field(default_factory=dict)


CASES = [
    Case("L1_microbatch_4", "legit", "4 micro-batches, accumulated over the batch's tokens",
         {"micro_batches": 4}),
    Case("L2_microbatch_2", "legit", "2 micro-batches, accumulated over the batch's tokens",
         {"micro_batches": 2}),
    Case("L3_reduction_order", "legit", "gradients summed half by half (another reduction order)",
         {"reduction": "pairwise"}),
    Case("L4_recompute", "legit", "activation recomputation in the backward", {"recompute": True}),
    Case("L5_rerun", "legit", "the baseline config again (another noise draw)", {}),
    Case("F01_lr_x1.1", "fault", "learning rate x1.1", {"lr": BASE.lr * 1.1}),
    Case("F02_lr_x1.2", "fault", "learning rate x1.2", {"lr": BASE.lr * 1.2}),
    Case("F03_lr_x1.3", "fault", "learning rate x1.3", {"lr": BASE.lr * 1.3}),
    Case("F04_warmup_dropped", "fault", "warm-up dropped", {"warmup": 0}),
    Case("F05_warmup_half", "fault", "warm-up halved", {"warmup": BASE.warmup // 2}),
    Case("F06_clip_1.0", "fault", "clipping at 1.0 instead of 0.5", {"max_norm": 1.0}),
    Case("F06b_clip_0.25", "fault", "clipping at 0.25 instead of 0.5", {"max_norm": 0.25}),
    Case("F07_clip_skipped", "fault", "clipping computed, never applied", {"faults": ("clip_skipped",)}),
    Case("F08_wd_dropped", "fault", "weight decay dropped", {"weight_decay": 0.0}),
    Case("F09_wd_on_all", "fault", "weight decay on biases and embeddings too", {"faults": ("bias_decayed",)}),
    Case("F10_tokens_dropped_10pct", "fault", "10% of the tokens dropped from the loss", {"token_drop": 0.1}),
    Case("F11_label_smoothing", "fault", "label smoothing 0.1 inside the loss", {"label_smoothing": 0.1}),
    Case("F12_ga_not_divided", "fault", "4 micro-batches, their means summed (gradients x4)",
         {"micro_batches": 4, "faults": ("ga_not_divided",)}),
    Case("F13_beta2_0.99", "fault", "Adam beta2 0.95 -> 0.99", {"betas": (0.9, 0.99)}),
    Case("F14_min_lr_0", "fault", "cosine decays to 0 instead of 10%", {"min_lr_ratio": 0.0}),
]

# The replicates: (data order, noise seed). The candidate trains on order 0.
REPLICATES = [(0, 1), (0, 2), (1, 3), (2, 4)]
COLUMNS = ("eval_loss", "grad_norm", "lr", "tokens", "batch_id")


def write_csv(path: Path, rows: list[dict], columns: tuple[str, ...] = ()) -> None:
    """A curve as a trainer's export: step,loss and the named optional columns."""
    header = ["step", "loss", *columns]
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(header)
        for r in rows:
            w.writerow([r[h] if h in ("step", "tokens", "batch_id") else f"{r[h]:.7g}" for h in header])


def run_config(case: Case, base: TrainConfig = BASE) -> TrainConfig:
    return replace(base, noise_seed=CANDIDATE_NOISE, **case.change)


def baselines(base: TrainConfig = BASE, replicates=REPLICATES) -> list[list[dict]]:
    return [train(replace(base, order=o, noise_seed=n)) for o, n in replicates]


def curve_set(folder: Path, base_rows: list[list[dict]], cand_rows: list[dict],
              columns: tuple[str, ...] = ()) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, rows in enumerate(base_rows, start=1):
        write_csv(folder / f"baseline-{i}.csv", rows, columns)
    write_csv(folder / "candidate.csv", cand_rows, columns)
    return folder


# ---- the gate on this set -------------------------------------------------------------------

# Ways to bring the curves to the gate: which columns the CSVs carry, and whether pairing is inferred.
MODES = {
    "before": ((), False, False),                 # step,loss; no pairing, z fully correlated (gate of 2026-12-04)
    "unpaired": ((), False, True),                # step,loss; pairing off
    "paired-fc": ((), True, False),               # step,loss; pairing inferred, z fully correlated
    "paired": ((), True, True),                   # step,loss; pairing inferred from the curves
    "columns": (("grad_norm", "lr", "tokens"), True, True),   # + the optional columns
    "batch_id": (("batch_id",), True, True),      # exact pairing from a batch id column
}
REGIMES = {"rounding": 0.0, "gpu-like": 0.05}
RELATIVE_FLOOR = 2e-5   # the gate's precision floor of a loss (gate/stats.py FLOORS)


def paired_effect(cand: np.ndarray, b1: np.ndarray, b2: np.ndarray, n_blocks: int = 10) -> float:
    """How far the candidate moves the paired loss, in units of the same-data pair's sd: the largest
    block mean of (candidate - mean of the two same-data replicates) over the RMS of the replicates'
    difference in that block (floored at the gate's precision floor, below which logged values cannot
    tell runs apart)."""
    d, pair, mean = cand - (b1 + b2) / 2, b1 - b2, (b1 + b2) / 2
    size = max(1, cand.size // n_blocks)
    best = 0.0
    for k in range(cand.size // size):
        s = slice(k * size, (k + 1) * size)
        sd = max(float(np.sqrt((pair[s] ** 2).mean())), RELATIVE_FLOOR * float(np.abs(mean[s]).mean()))
        e = float(d[s].mean()) / sd
        best = e if abs(e) > abs(best) else best
    return best


def evaluate(root: Path, regime: str = "gpu-like", cases=None, modes=None, base: TrainConfig = BASE) -> dict:
    """Every case through the gate in every mode: {case id: {kind, effect, mode: verdict, mode/fired}}."""
    from attune.gate.convergence import check_convergence

    cases = CASES if cases is None else cases
    modes = list(MODES) if modes is None else modes
    base = replace(base, nondeterminism=REGIMES[regime])
    base_rows = baselines(base)
    loss = [np.array([r["loss"] for r in rows]) for rows in base_rows]
    out = {}
    for case in cases:
        rows = train(run_config(case, base))
        result = {"kind": case.kind, "label": case.label,
                  "effect": round(paired_effect(np.array([r["loss"] for r in rows]), loss[0], loss[1]), 2)}
        for mode in modes:
            columns, infer, adaptive = MODES[mode]
            folder = curve_set(Path(root) / regime / case.id / mode, base_rows, rows, columns)
            v = check_convergence(folder, infer_pairing=infer, adaptive=adaptive, plot=False)
            result[mode] = v.verdict
            result[f"{mode}/fired"] = sorted({c.kind for c in v.checks if not c.passed})
            result[f"{mode}/paired_with"] = v.paired_with
            result[f"{mode}/need"] = v.need_more_steps
        out[case.id] = result
    return out


def summary(results: dict, mode: str, threshold: float = 3.0) -> dict:
    """Caught faults, false rejects, and the target: every fault past `threshold` pair sds caught."""
    faults = [r for r in results.values() if r["kind"] == "fault"]
    legit = [r for r in results.values() if r["kind"] == "legit"]
    big = [r for r in faults if abs(r["effect"]) > threshold]
    return {"faults": len(faults), "caught": sum(r[mode] == "failed" for r in faults),
            "inconclusive": sum(r[mode] == "inconclusive" for r in results.values()),
            "legit": len(legit), "false_rejects": sum(r[mode] == "failed" for r in legit),
            "legit_inconclusive": sum(r[mode] == "inconclusive" for r in legit),
            "big_faults": len(big), "big_caught": sum(r[mode] == "failed" for r in big),
            "target": all(r[mode] == "failed" for r in big) and not any(r[mode] == "failed" for r in legit)}
