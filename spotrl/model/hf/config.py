"""A Hugging Face `config.json` <-> our ModelConfig (Qwen2 / Qwen2.5 / Llama 3).

    cfg = read_config("path/to/Qwen2.5-0.5B", dtype="bfloat16")     # local or fsspec URL (gs://)
    hf = config_to_hf(cfg)                                          # what export writes
    section = resolve_model_config({"path": ..., "dtype": ...})     # a run config's `model` section

Any problem with a checkpoint is one `CheckpointError` naming the file (and the tensor, where
there is one: spotrl/model/hf/loader.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from spotrl.config import ARCHITECTURE_KEYS, ModelConfig, RopeScaling, architecture_mismatches
from spotrl.storage.paths import AnyPath, as_path

CONFIG_FILE = "config.json"

ARCHITECTURES = {"Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama"}
_MODEL_TYPES = {v: k for k, v in ARCHITECTURES.items()}

_CONFIG_DTYPES = {"float32": "float32", "bfloat16": "bfloat16"}


class CheckpointError(ValueError):
    """A checkpoint that cannot load: the message names the file and, where there is one, the tensor."""


def read_json(path: str | AnyPath, *, required: bool = True) -> dict | None:
    """A checkpoint's JSON object file (local or fsspec URL); None when absent and not `required`."""
    file = as_path(path)
    if not file.exists():
        if required:
            raise CheckpointError(f"{file}: missing file")
        return None
    try:
        with file.open("r", encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{file}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{file}: expected a JSON object, found {type(data).__name__}")
    return data


def architecture_of(hf: Mapping[str, Any], source: str = CONFIG_FILE) -> str:
    """'qwen2' or 'llama' from config.json's `architectures` (or `model_type`); else CheckpointError."""
    archs = hf.get("architectures") or []
    if archs:
        for arch in archs:
            if arch in ARCHITECTURES:
                return ARCHITECTURES[arch]
        raise CheckpointError(
            f"{source}: unsupported architecture {', '.join(map(str, archs))} (supported: {', '.join(ARCHITECTURES)})"
        )
    model_type = hf.get("model_type")
    if model_type in _MODEL_TYPES:
        return model_type
    raise CheckpointError(
        f"{source}: unsupported model_type {model_type!r} and no `architectures` "
        f"(supported: {', '.join(ARCHITECTURES)})"
    )


def _rope_from_hf(hf: Mapping[str, Any], source: str) -> tuple[float, RopeScaling | None]:
    # transformers >= 5 writes `rope_parameters` {rope_theta, rope_type, ...}; 4.x `rope_theta` + `rope_scaling`
    params = hf.get("rope_parameters")
    if isinstance(params, Mapping) and params:
        theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
        scaling = params
    else:
        theta = hf.get("rope_theta", 10000.0)
        scaling = hf.get("rope_scaling") or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if rope_type in (None, "default"):
        return float(theta), None
    if rope_type != "llama3":
        raise CheckpointError(f"{source}: unsupported rope type {rope_type!r} (supported: default, llama3)")
    try:
        return float(theta), RopeScaling(
            factor=scaling["factor"],
            low_freq_factor=scaling["low_freq_factor"],
            high_freq_factor=scaling["high_freq_factor"],
            original_max_position_embeddings=scaling.get(
                "original_max_position_embeddings", hf.get("max_position_embeddings", 8192)
            ),
        )
    except KeyError as err:
        raise CheckpointError(f"{source}: llama3 rope scaling lacks {err.args[0]!r}") from None
    except ValidationError as err:
        raise CheckpointError(f"{source}: bad llama3 rope scaling: {err.errors()[0]['msg']}") from None


def config_from_hf(hf: Mapping[str, Any], source: str = CONFIG_FILE, *, dtype: str | None = None) -> ModelConfig:
    """Our ModelConfig from a Hugging Face config.json dict; `dtype` overrides the checkpoint's."""
    arch = architecture_of(hf, source)
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{source}: unsupported hidden_act {act!r} (only silu / SwiGLU)")
    if arch == "qwen2":
        if hf.get("use_sliding_window"):
            raise CheckpointError(f"{source}: use_sliding_window=true is not supported")
        qkv_bias = True  # Qwen2 attention always has q/k/v biases
    else:
        if hf.get("attention_bias"):
            raise CheckpointError(f"{source}: attention_bias=true (Llama biases on q/k/v and o_proj) is not supported")
        if hf.get("mlp_bias"):
            raise CheckpointError(f"{source}: mlp_bias=true is not supported")
        qkv_bias = False
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError(f"{source}: partial_rotary_factor != 1 is not supported")
    wanted = dtype or hf.get("dtype") or hf.get("torch_dtype") or "float32"
    if wanted not in _CONFIG_DTYPES:
        raise CheckpointError(
            f"{source}: unsupported dtype {wanted!r} (supported: {', '.join(_CONFIG_DTYPES)}; "
            "pass dtype='bfloat16' or 'float32' to convert on load)"
        )
    theta, scaling = _rope_from_hf(hf, source)
    try:
        num_heads = hf["num_attention_heads"]
        return ModelConfig(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim"),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=hf.get("max_position_embeddings", 32768),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            dtype=_CONFIG_DTYPES[wanted],
        )
    except KeyError as err:
        raise CheckpointError(f"{source}: missing key {err.args[0]!r}") from None
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise CheckpointError(f"{source}: {problems}") from None


def read_config(path: str, *, dtype: str | None = None) -> ModelConfig:
    """ModelConfig of the checkpoint directory `path` (its config.json)."""
    source = str(as_path(path) / CONFIG_FILE)
    return config_from_hf(read_json(source), source, dtype=dtype)


def default_architecture(cfg: ModelConfig) -> str:
    """The Hugging Face class our config maps onto: Qwen2 has q/k/v biases, Llama has none."""
    return "Qwen2ForCausalLM" if cfg.qkv_bias else "LlamaForCausalLM"


def config_to_hf(
    cfg: ModelConfig,
    *,
    architecture: str | None = None,
    bos_token_id: int | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
) -> dict:
    """config.json contents that transformers 4.x and 5.x read as `cfg`."""
    architecture = architecture or default_architecture(cfg)
    if architecture not in ARCHITECTURES:
        raise ValueError(f"unsupported architecture {architecture!r} (supported: {', '.join(ARCHITECTURES)})")
    model_type = ARCHITECTURES[architecture]
    if model_type == "llama" and cfg.qkv_bias:
        raise ValueError("LlamaForCausalLM has no q/k/v-only biases: export a qkv_bias model as Qwen2ForCausalLM")
    if model_type == "qwen2" and not cfg.qkv_bias:
        raise ValueError("Qwen2ForCausalLM always has q/k/v biases: export a model without them as LlamaForCausalLM")
    hf = {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.resolved_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None if cfg.rope_scaling is None else cfg.rope_scaling.model_dump(),
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": cfg.dtype,  # transformers 4.x
        "dtype": cfg.dtype,  # 5.x
        "use_cache": True,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
    }
    if model_type == "llama":
        hf.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    else:
        hf.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.num_layers)
    return hf


def resolve_model_config(section: Any) -> Any:
    """A run config's raw `model` section with `path` set, completed from the checkpoint's config.json.

    The architecture keys (spotrl.config.ARCHITECTURE_KEYS) that the section does not give are read
    from config.json; those it gives must agree with it (else CheckpointError naming the file and
    every disagreeing key). The run's dtype is the section's (default float32) whatever the
    checkpoint's: a rule with no exception. A section without `path`, or one that gives every
    architecture key (a resolved config re-validated), is returned as it is, without any I/O.
    """
    if not isinstance(section, dict) or not section.get("path") or all(k in section for k in ARCHITECTURE_KEYS):
        return section
    path = section["path"]
    found = read_config(path, dtype=section.get("dtype", ModelConfig.model_fields["dtype"].default))
    merged = {**found.model_dump(), **section}
    try:
        config = ModelConfig.model_validate(merged)
    except ValidationError:
        return merged  # a bad value of the section's own: the run config's validation names its key
    problems = architecture_mismatches(config, found)
    if problems:
        raise CheckpointError(f"{as_path(path) / CONFIG_FILE} disagrees with the config: " + "; ".join(problems))
    return merged
