"""What a gate run of torchtitan 0.3 records, loaded as an override:

    --override.imports attune.stacks.torchtitan.recorder.gate_run      (env ATTUNE_GATE_RUN=settings.json)

The convergence check compares a candidate's curves with the baseline replicates' (gate/). For
that comparison to mean something on the real trainer, a gate run fixes what a layout change
would otherwise change for reasons that have nothing to do with correctness, and records what the
loss curve cannot show (gate-study.md: Adam hides constant gradient-scale faults from the loss):

  same weights   every run loads the verdict's seed checkpoint (seed_init.py: one process, the
                 gate's seeded draw by parameter name), resharded to its own layout, so TP, FSDP
                 and every pipeline stage start from the same weights
  same batches   GateOrderLoader composes each optimizer step's global batch as torchtitan's own
                 loader would at `order_dp` data-parallel ranks, then hands each rank its slice
                 (by rank and accumulation micro-step), so TP/FSDP/HSDP/accumulation moves see
                 the same samples; a different `order_dp` is a different data order on purpose
  per step       loss and pre-clip gradient norm at full precision (what the metrics line
                 prints rounded), the post-clip norm the optimizer sees, the update norm, the
                 learning rate, an order-independent hash of the global batch, its valid tokens
  step 1         per-group gradient and update norms and a random projection of each group's
                 gradient (the sketch): these catch a gradient that is scaled, rounded or missing
                 a rank's share even where the first loss is the same

GPU-like noise (settings `noise`: {"scale": s, "seed": n}): on this CPU torchtitan is bitwise
deterministic, so baseline replicates agree exactly and the band is the gate's precision floor. On
a GPU the reduced gradient of a step differs from run to run in its last bits: atomics (embedding
and attention backward) and split reductions sum in another order each run, and in bf16 training
that order decides how an element rounds, by up to one bf16 unit in the last place (2^-8
relative). With `noise`, every gradient element is multiplied by (1 + s * N(0, 1)) after the
backward and before clipping (the point where a GPU run's reduced gradient would carry its
rounding differences), drawn from (seed, rank, step): replicates with different seeds then differ
as GPU replicates do, with the size set by s, and the step-1 records and gradient norms carry it.
The wrapper is installed at the first forward, after every override has patched what it patches,
so it runs first on a fault's own clipping as well.

Under pipeline parallelism (settings pp > 1) a rank holds only its stages' parameters and only the
last stage holds the loss: the step's norms, group norms and sketches are merged across ranks by
parameter name (each rank's figures are already whole over its data-parallel shards), and the
loss is the one rank that holds it; rank 0 writes the record as always.

Settings (a JSON file named by ATTUNE_GATE_RUN): record (the JSON-lines file rank 0 writes, one
line per step), order_dp, global_batch (samples per optimizer step), max_norm, noise, pp, and
steps, accumulation, dp (read by the historical bugs' overrides). Like cpu.py and overrides.py it
imports torch and torchtitan only.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.distributed.tensor import DTensor
from torch.utils.data import IterableDataset

from torchtitan.components import metrics as tt_metrics
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.config import derive, override
from torchtitan.distributed import utils as tt_dist_utils
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader, HuggingFaceTextDataset

SETTINGS_ENV = "ATTUNE_GATE_RUN"
SKETCH_DIM = 4           # random projections per parameter group
GROUPS = ("tok_embeddings", "attention", "feed_forward", "norm", "output")

# Global batch hashes and valid-token counts, in step order, as the loader composes them.
_BATCHES: list[tuple[str, int]] = []
_INSTALLED = False


def _settings() -> dict:
    path = os.environ.get(SETTINGS_ENV)
    if not path:
        raise RuntimeError(f"{SETTINGS_ENV} must name the gate run's settings file")
    return json.loads(Path(path).read_text())


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def group_of(name: str) -> str:
    for group in GROUPS:
        if group in name:
            return group
    return "other"


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _sample_digest(sample) -> bytes:
    inputs, labels = sample
    return hashlib.sha1(inputs["input"].numpy().tobytes() + labels.numpy().tobytes()).digest()


# ---- same batches --------------------------------------------------------------------------------

class _GlobalOrder(IterableDataset):
    """This rank's samples of each global batch, in (accumulation micro-step, rank) order."""

    def __init__(self, sources: list[HuggingFaceTextDataset], global_batch: int, local_batch: int,
                 dp_rank: int, dp_world: int):
        if global_batch % len(sources) or global_batch % (local_batch * dp_world):
            raise ValueError(f"gate run: global batch {global_batch} does not split into {len(sources)} "
                             f"data-order ranks and micro-batches of {local_batch} x {dp_world} ranks")
        self.sources, self.global_batch, self.local_batch = sources, global_batch, local_batch
        self.dp_rank, self.dp_world = dp_rank, dp_world

    def __iter__(self):
        streams = [iter(source) for source in self.sources]
        per_source = self.global_batch // len(self.sources)
        micro_steps = self.global_batch // (self.local_batch * self.dp_world)
        while True:
            batch = [next(stream) for stream in streams for _ in range(per_source)]
            digest = hashlib.sha1(b"".join(sorted(_sample_digest(s) for s in batch))).hexdigest()[:16]
            _BATCHES.append((digest, int(sum((labels != IGNORE_INDEX).sum() for _, labels in batch))))
            for micro in range(micro_steps):
                start = (micro * self.dp_world + self.dp_rank) * self.local_batch
                yield from batch[start:start + self.local_batch]


class GateOrderLoader(HuggingFaceTextDataLoader):
    """torchtitan's text loader with the data order of `order_dp` ranks, whatever the layout."""

    @dataclass(kw_only=True, slots=True)
    class Config(HuggingFaceTextDataLoader.Config):
        order_dp: int = 1
        global_batch: int = 0

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, tokenizer, seq_len: int,
                 local_batch_size: int, snapshot_every_n_steps: int | None = 1, **kwargs):
        sources = [HuggingFaceTextDataset(dataset_name=config.dataset, dataset_path=config.dataset_path,
                                          tokenizer=tokenizer, seq_len=seq_len, dp_rank=i,
                                          dp_world_size=config.order_dp, infinite=config.infinite)
                   for i in range(config.order_dp)]
        ordered = _GlobalOrder(sources, config.global_batch or local_batch_size * dp_world_size,
                               local_batch_size, dp_rank, dp_world_size)
        # The parent's __init__ builds one sharded dataset; skip it and build the loader on ours.
        super(HuggingFaceTextDataLoader, self).__init__(
            ordered, dp_rank=dp_rank, dp_world_size=dp_world_size, num_workers=0,
            persistent_workers=False, pin_memory=False, prefetch_factor=None,
            snapshot_every_n_steps=snapshot_every_n_steps, batch_size=local_batch_size)


def _lr(optimizer) -> float | None:
    """The learning rate this step used (the container's groups carry none; its optimizers do)."""
    for opt in [optimizer, *getattr(optimizer, "optimizers", [])]:
        for group in opt.param_groups:
            if "lr" in group:
                return float(group["lr"])
    return None


# ---- GPU-like run-to-run noise ----------------------------------------------------------------------

@torch.no_grad()
def perturb_grads(parameters, scale: float, generator: torch.Generator) -> None:
    """g *= 1 + scale * N(0, 1), element by element, on this rank's shard of every gradient."""
    for p in parameters:
        if p.grad is None:
            continue
        local = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
        noise = torch.randn(tuple(local.shape), generator=generator, dtype=torch.float32)
        local.mul_(1.0 + scale * noise.to(local.dtype))


def install_noise(scale: float, seed: int) -> None:
    """Wrap torchtitan's clip_grad_norm_ (whatever is installed now) with the seeded perturbation."""
    inner = tt_dist_utils.clip_grad_norm_
    calls = [0]

    def clip_grad_norm_(parameters, *args, **kwargs):
        parameters = list(parameters)
        calls[0] += 1
        gen = torch.Generator().manual_seed((seed * 1_000_003 + _rank()) * 1_000_003 + calls[0])
        perturb_grads(parameters, scale, gen)
        return inner(parameters, *args, **kwargs)

    tt_dist_utils.clip_grad_norm_ = clip_grad_norm_


# ---- what each step records ------------------------------------------------------------------------

def _merged(local: dict) -> dict:
    """{parameter name: figure} of every rank, merged by name (under pipeline parallelism a rank
    holds its own stages' parameters; ranks of one stage hold the same whole figures)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return local
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    merged: dict = {}
    for part in gathered:
        merged |= part
    return dict(sorted(merged.items()))


class _Recorder:
    def __init__(self, settings: dict):
        self.path = Path(settings["record"])
        self.max_norm = settings.get("max_norm")
        self.noise = settings.get("noise")
        self.piped = int(settings.get("pp", 1)) > 1
        self.step = 0
        self.current: dict = {}
        self.before: dict[str, torch.Tensor] = {}
        self.depth = 0  # torchtitan's OptimizersContainer is an Optimizer wrapping Optimizers: hooks nest
        self._first_forward = torch.nn.modules.module.register_module_forward_pre_hook(self._on_first_forward)

    def _on_first_forward(self, module, args):
        # after every override has patched what it patches (a fault's clipping included)
        self._first_forward.remove()
        if self.noise:
            install_noise(float(self.noise["scale"]), int(self.noise["seed"]))

    @staticmethod
    def _params(optimizer):
        """(name, parameter) of this rank, named as torchtitan's optimizers name them (canonical
        FQNs: the same under every layout, every pipeline stage included)."""
        inner = getattr(optimizer, "optimizers", None) or [optimizer]
        for opt in inner:
            for group in opt.param_groups:
                names = group.get("param_names") or [f"param{id(p)}" for p in group["params"]]
                yield from zip(names, group["params"])

    @torch.no_grad()
    def pre_step(self, optimizer, args, kwargs):
        self.depth += 1
        if self.depth > 1:
            return
        self.step += 1
        grads = {name: _full(p.grad).float() for name, p in self._params(optimizer) if p.grad is not None}
        record = {"step": self.step, "post_clip_norm": self._norm(grads)}
        if self.step == 1:
            record["group_grad_norms"] = self._group_norms(grads)
            record["grad_sketch"] = self._sketch(grads)
        self.before = {name: _full(p).detach().float().clone() for name, p in self._params(optimizer)}
        self.current = record

    @torch.no_grad()
    def post_step(self, optimizer, args, kwargs):
        self.depth -= 1
        if self.depth > 0:
            return
        deltas = {name: _full(p).detach().float() - self.before[name] for name, p in self._params(optimizer)}
        self.current["update_norm"] = self._norm(deltas)
        self.current["lr"] = _lr(optimizer)
        if self.current["step"] == 1:
            self.current["group_update_norms"] = self._group_norms(deltas)
        self.before = {}

    def _norm(self, tensors: dict[str, torch.Tensor]) -> float:
        if self.piped:   # this rank's stages only: sum the squares of every stage's parameters
            return sum(_merged({n: float((t * t).sum()) for n, t in tensors.items()}).values()) ** 0.5
        return float(torch.sqrt(sum((t * t).sum() for t in tensors.values())))

    def _group_norms(self, tensors: dict[str, torch.Tensor]) -> dict[str, float]:
        squares = {name: float((t * t).sum()) for name, t in tensors.items()}
        if self.piped:
            squares = _merged(squares)
        groups: dict[str, float] = {}
        for name, square in squares.items():
            groups[group_of(name)] = groups.get(group_of(name), 0.0) + square
        return {g: s ** 0.5 for g, s in sorted(groups.items())}

    def _sketch(self, grads: dict[str, torch.Tensor]) -> dict[str, list[float]]:
        projections = {}
        for name, g in sorted(grads.items()):
            gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            projections[name] = (torch.randn((SKETCH_DIM, g.numel()), generator=gen) @ g.reshape(-1)).tolist()
        if self.piped:
            projections = _merged(projections)
        sketch: dict[str, torch.Tensor] = {}
        for name, proj in sorted(projections.items()):
            sketch[group_of(name)] = sketch.get(group_of(name), 0) + torch.tensor(proj)
        return {k: [float(x) for x in v] for k, v in sketch.items()}

    def on_log(self, step: int, loss: float, grad_norm: float) -> None:
        if self.piped:   # the last stage holds the loss; the other stages log a negative placeholder
            losses = _merged({f"rank{_rank()}": float(loss)}).values()
            loss = next((x for x in losses if x >= 0), float(loss))
        record = dict(self.current) | {"step": step, "loss": float(loss), "grad_norm": float(grad_norm)}
        if self.max_norm:
            record["max_norm"] = float(self.max_norm)
        if 0 < step <= len(_BATCHES):
            record["batch_hash"], record["valid_tokens"] = _BATCHES[step - 1]
        if _rank() == 0:
            with self.path.open("a") as out:
                out.write(json.dumps(record) + "\n")


def _install(recorder: _Recorder) -> None:
    register_optimizer_step_pre_hook(recorder.pre_step)
    register_optimizer_step_post_hook(recorder.post_step)
    original_log = tt_metrics.MetricsProcessor.log

    def log(self, step, global_avg_loss, global_max_loss, grad_norm, *args, **kwargs):
        recorder.on_log(step, float(global_avg_loss), float(grad_norm))
        return original_log(self, step, global_avg_loss, global_max_loss, grad_norm, *args, **kwargs)

    tt_metrics.MetricsProcessor.log = log


@override(target=HuggingFaceTextDataLoader.Config, exact=True,
          description="ATTUNE gate run: same weights, same batches, per-step and step-1 records")
def gate_run(cfg):
    global _INSTALLED
    settings = _settings()
    if not _INSTALLED:  # called once per matching node (the validator has a loader config too)
        Path(settings["record"]).parent.mkdir(parents=True, exist_ok=True)
        if _rank() == 0:
            Path(settings["record"]).write_text("")
        _install(_Recorder(settings))
        _INSTALLED = True
    return derive(cfg, GateOrderLoader.Config, order_dp=int(settings.get("order_dp", 1)),
                  global_batch=int(settings.get("global_batch", 0)))
