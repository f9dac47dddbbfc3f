"""ModelSpec: the architecture of a dense or MoE decoder, and its parameter counts."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from attune.data_files import load_data, read_text, read_toml
from attune.errors import InputError
from attune.validation import first_error, name_rule


class ModelSpec(BaseModel):
    """A decoder-only transformer. MoE models set n_experts > 0; their first n_dense_layers are dense."""

    # strict: a count written 4096.0 or "4096" is a mistake to report, not a value to round
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str
    n_layers: int = Field(gt=0)
    dim: int = Field(gt=0)
    n_heads: int = Field(gt=0)
    n_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    ffn_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    n_experts: int = Field(default=0, ge=0)
    top_k: int = Field(default=0, ge=0)
    moe_ffn_dim: int = Field(default=0, ge=0)
    n_shared_experts: int = Field(default=0, ge=0)
    n_dense_layers: int = Field(default=0, ge=0)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        # The model name is a store key part (recipes/<model>/...) and a leaderboard row
        return name_rule(value, "model name")

    @model_validator(mode="after")
    def _consistent(self) -> "ModelSpec":
        if self.n_heads % self.n_kv_heads:
            raise ValueError("n_kv_heads must divide n_heads")
        if self.n_experts:
            if not 0 < self.top_k <= self.n_experts:
                raise ValueError("top_k must be in 1..n_experts for an MoE model")
            if self.moe_ffn_dim <= 0:
                raise ValueError("moe_ffn_dim must be > 0 for an MoE model")
            if self.n_dense_layers >= self.n_layers:
                raise ValueError("n_dense_layers must be < n_layers")
        return self

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.n_dense_layers if self.is_moe else 0

    @property
    def attention_params_per_layer(self) -> int:
        q_and_o = 2 * self.dim * self.n_heads * self.head_dim
        k_and_v = 2 * self.dim * self.n_kv_heads * self.head_dim
        return q_and_o + k_and_v

    @property
    def dense_ffn_params(self) -> int:
        return 3 * self.dim * self.ffn_dim  # SwiGLU: gate, up, down

    @property
    def expert_params(self) -> int:
        return 3 * self.dim * self.moe_ffn_dim

    @property
    def embedding_params(self) -> int:
        return 2 * self.vocab_size * self.dim  # input embedding and untied output head

    @property
    def total_params(self) -> int:
        n_dense = self.n_layers - self.n_moe_layers
        moe_layer = (self.n_experts + self.n_shared_experts) * self.expert_params + self.dim * self.n_experts
        return (self.n_layers * self.attention_params_per_layer + n_dense * self.dense_ffn_params
                + self.n_moe_layers * moe_layer + self.embedding_params)

    @property
    def active_params(self) -> int:
        """Parameters one token touches: what 6·N·tokens counts for MoE models."""
        n_dense = self.n_layers - self.n_moe_layers
        moe_layer = (self.top_k + self.n_shared_experts) * self.expert_params + self.dim * self.n_experts
        return (self.n_layers * self.attention_params_per_layer + n_dense * self.dense_ffn_params
                + self.n_moe_layers * moe_layer + self.embedding_params)


def model_names() -> list[str]:
    return sorted(load_data("models")["models"])


def catalog_model(name: str) -> ModelSpec:
    models = load_data("models")["models"]
    if name not in models:
        raise InputError("model", f"unknown catalog model {name!r}; known: {', '.join(sorted(models))}")
    return ModelSpec(**models[name])


def load_model_spec(path: Path | str) -> ModelSpec:
    """A model spec file, JSON or TOML, with exactly the ModelSpec keys."""
    path = Path(path)
    if path.suffix == ".json":
        try:
            raw = json.loads(read_text(path, "model spec file"))
        except json.JSONDecodeError as err:
            raise InputError(str(path), f"not valid JSON ({err.msg} at line {err.lineno})") from None
    else:
        raw = read_toml(path, "model spec file")
    if not isinstance(raw, dict):
        raise InputError(str(path), "a model spec must be an object of keys")
    try:
        return ModelSpec(**raw)
    except ValidationError as err:
        field, rule = first_error(err)
        raise InputError(f"{path}: {field}" if field else str(path), rule) from None
