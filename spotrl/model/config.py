"""Typed architecture config of the Qwen2/Llama decoder family."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The keys that describe the network itself: with `path` set they come from the checkpoint's
# config.json (see ModelConfig._from_checkpoint); the other keys say how to run it.
ARCHITECTURE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "rope_theta", "rope_scaling", "max_position_embeddings", "rms_norm_eps",
                     "tie_embeddings", "qkv_bias")


class RopeScaling(BaseModel):
    """Llama 3 rotary-frequency scaling (`"rope_type": "llama3"` in a Hugging Face config).

    Wavelengths shorter than original_max_position_embeddings / high_freq_factor keep their
    frequency, those longer than original_max_position_embeddings / low_freq_factor are divided by
    `factor`, and the ones in between are interpolated smoothly.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    rope_type: Literal["llama3"] = "llama3"
    factor: float = Field(8.0, gt=0)
    low_freq_factor: float = Field(1.0, gt=0)
    high_freq_factor: float = Field(4.0, gt=0)
    original_max_position_embeddings: int = Field(8192, gt=0)

    @model_validator(mode="after")
    def _check_band(self) -> "RopeScaling":
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"high_freq_factor ({self.high_freq_factor}) must be greater than low_freq_factor "
                f"({self.low_freq_factor})"
            )
        return self


class MeshConfig(BaseModel):
    """Device mesh the parameters are laid out on: fsdp x tp devices (1 x 1: one device, no sharding)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fsdp: int = Field(1, gt=0, description="parameters and the batch split over this many devices")
    tp: int = Field(1, gt=0, description="tensor parallel: attention heads and MLP columns split this many ways")

    @property
    def devices(self) -> int:
        return self.fsdp * self.tp


class ModelConfig(BaseModel):
    """Shape of a decoder-only transformer (Qwen2 / Llama family), and where its weights come from.

    Defaults are the built-in tiny model that trains on two CPU cores. With `path` (a Hugging Face
    checkpoint directory, local or gs://) the architecture keys that are not given are read from
    its config.json, and those that are given must agree with it; a preset lists them all so that
    it validates, and its memory estimate is computed, without the checkpoint at hand.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = Field(16, gt=0)
    hidden_size: int = Field(96, gt=0)
    intermediate_size: int = Field(256, gt=0)
    num_layers: int = Field(3, gt=0)
    num_heads: int = Field(4, gt=0)
    num_kv_heads: int = Field(2, gt=0)
    head_dim: int | None = Field(None, gt=0, description="defaults to hidden_size // num_heads")
    rope_theta: float = Field(10000.0, gt=0)
    rope_scaling: RopeScaling | None = Field(None, description="null: plain RoPE; Llama 3.1+ checkpoints set it")
    max_position_embeddings: int = Field(32768, gt=0, description="context length the checkpoint declares")
    rms_norm_eps: float = Field(1e-6, gt=0)
    tie_embeddings: bool = True
    qkv_bias: bool = False
    dtype: str = Field("float32", pattern="^(float32|bfloat16)$")
    compute_dtype: str | None = Field(
        None, pattern="^(float32|bfloat16)$",
        description="dtype of the matmuls and activations; null: dtype. float32 weights with bfloat16 "
        "compute is mixed precision (the optimizer updates float32 master weights)")
    path: str | None = Field(None, description="Hugging Face checkpoint directory (local or gs://); null: the "
                                               "built-in model, randomly initialised, and the character tokenizer")
    chat_template: bool = Field(True, description="render task prompts through the tokenizer's chat template "
                                                  "(when the checkpoint has one)")
    remat: bool = Field(False, description="recompute each layer's activations in the backward pass (memory for FLOPs)")
    mesh: MeshConfig = MeshConfig()
    sharding_rules: tuple[tuple[str, tuple[str | None, ...]], ...] | None = Field(
        None, description="[regex over a parameter path, [mesh axis or null per dimension]], first match wins; "
                          "null: spotrl.model.hf.DEFAULT_RULES")

    @model_validator(mode="before")
    @classmethod
    def _from_checkpoint(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not data.get("path") or all(k in data for k in ARCHITECTURE_KEYS):
            return data  # no I/O when nothing is missing: a resolved config re-validates offline
        from spotrl.model.hf import read_config

        # the run's dtype is the config's (default float32) whatever the checkpoint's: a rule with no exception
        found = read_config(data["path"], dtype=data.get("dtype", cls.model_fields["dtype"].default))
        merged = {**found.model_dump(), **data}
        problems = architecture_mismatches(ModelConfig.model_validate(merged), found)
        if problems:
            raise ValueError(f"{data['path']}/config.json disagrees with the config: " + "; ".join(problems))
        return merged

    @model_validator(mode="after")
    def _check_rules(self) -> "ModelConfig":
        import re

        for pattern, axes in self.sharding_rules or ():
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"sharding_rules: {pattern!r} is not a regular expression ({err})") from None
            unknown = set(axes) - {"fsdp", "tp", None}
            if unknown:  # an unknown axis would silently replicate the tensor
                raise ValueError(f"sharding_rules: {pattern!r} names mesh axes {sorted(unknown)} (the mesh has fsdp, tp)")
        return self

    @model_validator(mode="after")
    def _check_heads(self) -> "ModelConfig":
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads}) "
                "unless head_dim is set"
            )
        return self

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def resolved_compute_dtype(self) -> str:
        return self.compute_dtype or self.dtype


def architecture_mismatches(config: ModelConfig, checkpoint: ModelConfig) -> list[str]:
    """'key: config X, checkpoint Y' for every architecture key on which the two differ."""
    problems = []
    for key in ARCHITECTURE_KEYS:
        ours, theirs = getattr(config, key), getattr(checkpoint, key)
        if key == "head_dim":
            ours, theirs = config.resolved_head_dim, checkpoint.resolved_head_dim
        if ours != theirs:
            problems.append(f"model.{key}: config {ours!r}, checkpoint {theirs!r}")
    return problems
