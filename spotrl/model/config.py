"""Typed architecture config of the Qwen2/Llama decoder family."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


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


class ModelConfig(BaseModel):
    """Shape of a decoder-only transformer (Qwen2 / Llama family).

    Defaults are the built-in tiny model that trains on two CPU cores.
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
