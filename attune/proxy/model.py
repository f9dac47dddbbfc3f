"""The proxy's tiny decoder (about 0.2 M parameters) and the parallel numerics it emulates.

One process plays every rank. What changes numerics on a real cluster is reproduced where it
happens, so a layout change moves the curve by exactly the kind of rounding it would:
  tensor parallel   row-parallel matmuls (attention out, MLP down) are per-shard partial
                    products summed in shard order, as the TP all-reduce does
  context parallel  attention over key blocks with an online softmax, as ring attention does
  expert parallel   tokens reach an expert grouped by source EP rank (all-to-all order)
  float8            matmul inputs and weights cast to float8_e4m3fn with tensorwise or
                    rowwise scales, output gradients to float8_e5m2 (torchao's recipe)
  recomputation     torch.utils.checkpoint on every second layer's MLP (selective) or every block (full)
Faults that live in the model (router in bf16, token dropping, recompute drift, a pipeline
stage seeded differently) are switched by name through `Numerics.faults`.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class Shape:
    vocab: int
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    ffn: int = 128
    n_experts: int = 4     # 0: dense; else the last layer's MLP is a top-k MoE
    top_k: int = 2
    moe_ffn: int = 64


@dataclass(frozen=True)
class Numerics:
    tp: int = 1
    cp: int = 1
    ep: int = 1
    float8: str = "none"                  # none | tensorwise | rowwise
    ac_mode: str = "selective"            # none | selective | full
    capacity_factor: float | None = None  # None: no token dropping
    router_dtype: str = "float32"
    compile: bool = False                 # attention core through torch.compile
    faults: frozenset[str] = field(default_factory=frozenset)


class MoEStats:
    """Tokens per expert and dropped tokens of one forward (recomputation not double-counted), and
    how many routing decisions the recompute under activation checkpointing made differently."""

    def __init__(self, n_experts: int):
        self.counts = torch.zeros(max(n_experts, 1))
        self.dropped = 0
        self.recompute_mismatch = 0


class _RoundBF16(torch.autograd.Function):
    """bf16 rounding of values and of their gradients, kept in fp32 tensors: bf16 compute without
    changing dtypes (recomputation checks metadata), matmuls still accumulating in fp32 as on GPUs."""

    @staticmethod
    def forward(ctx, x):
        return x.bfloat16().float()

    @staticmethod
    def backward(ctx, grad):
        return grad.bfloat16().float()


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return _RoundBF16.apply(x)


def _quantize(t: torch.Tensor, dtype: torch.dtype, rowwise: bool) -> torch.Tensor:
    fmax = torch.finfo(dtype).max
    amax = t.abs().amax(dim=-1, keepdim=True) if rowwise else t.abs().amax()
    scale = fmax / amax.clamp(min=1e-12)
    return (t * scale).to(dtype).to(t.dtype) / scale


class _Float8MM(torch.autograd.Function):
    """y = q(x) @ q(w).T with e4m3 forward casts and an e5m2 output gradient, as float8 training does."""

    @staticmethod
    def forward(ctx, x, w, rowwise):
        xq, wq = _quantize(x, torch.float8_e4m3fn, rowwise), _quantize(w, torch.float8_e4m3fn, rowwise)
        ctx.save_for_backward(xq, wq)
        return xq @ wq.transpose(-1, -2)

    @staticmethod
    def backward(ctx, grad):
        xq, wq = ctx.saved_tensors
        gq = _quantize(grad, torch.float8_e5m2, False)
        if wq.dim() == 3:  # batched experts: [E, tokens, in] x [E, out, in]
            return gq @ wq, gq.transpose(-1, -2) @ xq, None
        grad_w = gq.reshape(-1, gq.shape[-1]).t() @ xq.reshape(-1, xq.shape[-1])
        return gq @ wq, grad_w, None


def _mm(x: torch.Tensor, w: torch.Tensor, num: Numerics) -> torch.Tensor:
    if num.float8 != "none":
        return _Float8MM.apply(x, w, num.float8 == "rowwise")
    return x @ w.transpose(-1, -2)


def linear(x: torch.Tensor, w: torch.Tensor, num: Numerics, row_parallel: bool = False) -> torch.Tensor:
    if row_parallel and num.tp > 1:
        # Each TP rank holds a slice of the input features; the all-reduce sums the partials.
        width = w.shape[-1] // num.tp
        out = _mm(x[..., :width], w[..., :width], num)
        for r in range(1, num.tp):
            sl = slice(r * width, (r + 1) * width)
            out = out + _mm(x[..., sl], w[..., sl], num)
        return out
    return _mm(x, w, num)


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


@functools.cache
def _causal(T: int) -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool).tril()


def _attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: int,
                    causal: torch.Tensor) -> torch.Tensor:
    T, scale = q.shape[-2], 1.0 / math.sqrt(q.shape[-1])
    if cp == 1:
        s = (q @ k.transpose(-1, -2)) * scale
        return torch.softmax(s.masked_fill(~causal, float("-inf")), -1) @ v
    # Ring attention: key/value blocks arrive one at a time; an online softmax merges them.
    width = T // cp
    m = torch.full(q.shape[:-1] + (1,), float("-inf"))
    den = torch.zeros_like(m)
    acc = torch.zeros_like(q)
    for b in range(cp):
        sl = slice(b * width, T if b == cp - 1 else (b + 1) * width)
        s = (q @ k[..., sl, :].transpose(-1, -2)) * scale
        s = s.masked_fill(~causal[:, sl], float("-inf"))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - safe)
        corr = torch.exp(torch.where(torch.isinf(m), torch.full_like(m, float("-inf")), m - safe))
        den = den * corr + p.sum(-1, keepdim=True)
        acc = acc * corr + p @ v[..., sl, :]
        m = m_new
    return acc / den


@functools.cache
def _compiled_core():
    """torch.compile of the attention core; aot_eager needs no C++ toolchain and keeps eager kernels
    (ATTUNE_PROXY_COMPILE_BACKEND=inductor for real code generation where a compiler exists)."""
    backend = os.environ.get("ATTUNE_PROXY_COMPILE_BACKEND", "aot_eager")
    return torch.compile(_attention_core, backend=backend, dynamic=False)


class TinyDecoder(nn.Module):
    """Pre-norm decoder, tied embeddings; layer 0 dense, the last layer MoE when n_experts > 0."""

    def __init__(self, shape: Shape, seed: int, faults: frozenset[str] = frozenset()):
        super().__init__()
        self.shape = shape
        d, gen = shape.dim, torch.Generator().manual_seed(seed)

        def init(*size: int, std: float = 0.02, g: torch.Generator = gen) -> nn.Parameter:
            return nn.Parameter(torch.randn(*size, generator=g) * std)

        self.emb = init(shape.vocab, d)
        self.head = init(shape.vocab, d) if "untied_head" in faults else None
        if self.head is not None:
            self.head.data.copy_(self.emb.data)  # untied copy: equal at step 0, then drifts apart
        self.layers = nn.ModuleList()
        for i in range(shape.n_layers):
            # torchtitan seeds each pipeline stage differently; without a seed checkpoint the
            # second stage's weights then differ from the baseline's (fault pp_stage_seed).
            g = gen
            if "pp_stage_seed" in faults and i >= shape.n_layers // 2:
                g = torch.Generator().manual_seed(seed + 7919)
            layer = nn.Module()
            layer.attn_norm, layer.mlp_norm = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))
            layer.wq, layer.wk, layer.wv = init(d, d, g=g), init(d, d, g=g), init(d, d, g=g)
            layer.wo = init(d, d, std=0.02 / math.sqrt(2 * shape.n_layers), g=g)
            layer.moe = shape.n_experts > 0 and i == shape.n_layers - 1
            if layer.moe:
                e, f = shape.n_experts, shape.moe_ffn
                layer.router = init(e, d, g=g)
                layer.w1 = init(e, f, d, g=g)
                layer.w2 = init(e, d, f, std=0.02 / math.sqrt(2 * shape.n_layers), g=g)
                layer.register_buffer("expert_bias", torch.zeros(e))
            else:
                layer.w1 = init(shape.ffn, d, g=g)
                layer.w2 = init(d, shape.ffn, std=0.02 / math.sqrt(2 * shape.n_layers), g=g)
            self.layers.append(layer)
        self.norm = nn.Parameter(torch.ones(d))

    def group_of(self, name: str) -> str:
        """The parameter group a gradient norm is reported for (as the gate study proposes)."""
        if name in ("emb", "head"):
            return "embed"
        leaf = name.rsplit(".", 1)[-1]
        if leaf.endswith("norm") or name == "norm":
            return "norm"
        if leaf in ("wq", "wk", "wv", "wo"):
            return "attn"
        if leaf == "router":
            return "router"
        return "experts" if self.layers[int(name.split(".")[1])].moe else "mlp"

    def forward(self, tokens: torch.Tensor, num: Numerics, stats: MoEStats | None = None) -> torch.Tensor:
        x = self.emb[tokens]
        if "embed_input_grad_lost" in num.faults:
            x = x.detach()
        for index, layer in enumerate(self.layers):
            x = self._block(index, layer, x, num, stats)
        head = self.head if self.head is not None else self.emb
        return rms_norm(x, self.norm) @ head.t()

    def _block(self, index: int, layer: nn.Module, x: torch.Tensor, num: Numerics, stats) -> torch.Tensor:
        calls = [0]

        def attn(x):
            return x + self._attention(layer, rms_norm(x, layer.attn_norm), num)

        routes: dict[str, torch.Tensor] = {}

        def mlp(x):
            calls[0] += 1
            h = rms_norm(x, layer.mlp_norm)
            out = self._moe(layer, h, num, stats, routes, recompute=calls[0] > 1) if layer.moe \
                else linear(F.gelu(linear(h, layer.w1, num)), layer.w2, num, row_parallel=True)
            return x + out

        if num.ac_mode == "full":
            return checkpoint(lambda t: mlp(attn(t)), x, use_reentrant=False)
        x = attn(x)
        if num.ac_mode == "selective" and index % 2 == 1:  # layer-wise SAC: every second layer's MLP
            return checkpoint(mlp, x, use_reentrant=False)
        return mlp(x)

    def _attention(self, layer, x: torch.Tensor, num: Numerics) -> torch.Tensor:
        B, T, D = x.shape
        H = self.shape.n_heads

        def heads(w):
            return linear(x, w, num).view(B, T, H, D // H).transpose(1, 2)

        core = _compiled_core() if num.compile else _attention_core
        o = core(heads(layer.wq), heads(layer.wk), heads(layer.wv), num.cp, _causal(T))
        return linear(o.transpose(1, 2).reshape(B, T, D), layer.wo, num, row_parallel=True)

    def _moe(self, layer, x: torch.Tensor, num: Numerics, stats, routes: dict, recompute: bool) -> torch.Tensor:
        B, T, D = x.shape
        tokens = x.reshape(-1, D)
        low = num.router_dtype == "bfloat16" or "router_bf16" in num.faults \
            or (recompute and "ac_recompute_drift" in num.faults)
        # The router stays out of float8 (torchtitan filters it). bf16 is emulated in fp32 (values
        # rounded, gradient straight through) so recomputation sees the same dtypes and shapes.
        if low:
            logits = _bf16(_bf16(tokens) @ _bf16(layer.router).t())
            scores = _bf16(torch.softmax(logits, -1))
        else:
            scores = torch.softmax(tokens @ layer.router.t(), -1)
        sel = torch.topk(scores + layer.expert_bias, self.shape.top_k, dim=-1).indices
        # The recompute must route exactly as the forward did (a cheap replay check, as in the
        # pytorch#186572 repro): count the tokens whose experts changed.
        if not recompute:
            routes["sel"] = sel.detach().clone()
        elif stats is not None and "sel" in routes:
            stats.recompute_mismatch += int((torch.sort(sel, -1).values != torch.sort(routes["sel"], -1).values)
                                            .any(-1).sum())
            stats = None  # counts and drops were recorded by the forward
        gates = scores.gather(-1, sel)
        gates = gates / gates.sum(-1, keepdim=True)
        capacity = num.capacity_factor
        if capacity is None and "capacity_drop" in num.faults:
            capacity = 1.0  # a dispatcher sizing buffers by capacity although the recipe drops nothing
        E, n = self.shape.n_experts, tokens.shape[0]
        chosen = torch.zeros(n, E).scatter(1, sel, 1.0)                   # [tokens, experts] 0/1
        weight = torch.zeros(n, E).scatter(1, sel, gates)                 # combine weights
        if stats is not None:
            stats.counts += chosen.sum(0)
        if capacity:
            cap = math.ceil(capacity * n * self.shape.top_k / E)
            kept = (chosen.cumsum(0) <= cap) & (chosen > 0)               # first come, first served
            if stats is not None:
                stats.dropped += int(chosen.sum() - kept.sum())
            weight = weight * kept
        if num.ep > 1:  # all-to-all delivers tokens grouped by source EP rank: another summation order
            order = torch.argsort(torch.arange(n) % num.ep, stable=True)
            tokens, weight = tokens[order], weight[order]
        # Every expert on every token, weighted by the (mostly zero) combine weights: exact for the
        # routed tokens, and far cheaper in Python than gathering each expert's tokens.
        h = F.gelu(linear(tokens.unsqueeze(0).expand(E, n, D), layer.w1, num))
        y = linear(h, layer.w2, num, row_parallel=True)                   # [E, tokens, D]
        out = (y * weight.t().unsqueeze(-1)).sum(0)
        if num.ep > 1:
            out = out[torch.argsort(order)]
        return out.view(B, T, D)
