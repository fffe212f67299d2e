"""Parameter counts and memory estimates of a model config, from the config alone (no weights read).

n = count_params(cfg)
parts = estimate_memory(cfg, batch=8, seq_len=1024, devices=4)    # bytes by part, and per device
estimate = memory_estimate(cfg, rollout_rows=64, minibatches=4, prompt_tokens=256, new_tokens=512,
                           reference=True)                        # a run's: an update plus sampling
print(memory_summary(cfg, estimate, prompt_tokens=256))
"""

from __future__ import annotations

import jax.numpy as jnp

from spotrl.config import ModelConfig


def count_params(cfg: ModelConfig) -> int:
    """Number of parameters, from the config alone."""
    d, hd, L = cfg.hidden_size, cfg.resolved_head_dim, cfg.num_layers
    q, kv = cfg.num_heads * hd, cfg.num_kv_heads * hd
    attn = d * q + 2 * d * kv + q * d + ((q + 2 * kv) if cfg.qkv_bias else 0)
    mlp = 3 * d * cfg.intermediate_size
    per_layer = attn + mlp + 2 * d
    head = 0 if cfg.tie_embeddings else d * cfg.vocab_size
    return cfg.vocab_size * d + L * per_layer + d + head


def estimate_memory(
    config: ModelConfig,
    *,
    batch: int,
    seq_len: int,
    devices: int = 1,
    training: bool = True,
    reference_copies: int = 1,
    remat: bool = False,
) -> dict[str, int]:
    """Bytes a run of `config` needs, by part, and per device when the state is sharded over `devices`.

    params: one copy in config.dtype; grads: the same; optimizer: AdamW's two moments in the
    parameter dtype (optax's default); reference: `reference_copies` more copies (the pinned KL
    reference policy, the rollout's pulled version); kv_cache: rollout cache for `batch` rows of
    `seq_len` slots; activations: what the backward pass keeps per layer, per token: the residual
    input, the two norm outputs, q/k/v and the attention output, gate/up/the SwiGLU product
    (hidden*4 + q*2 + kv*2 + intermediate*3 values in the model dtype) plus the float32 attention
    probabilities (heads*seq_len per token), with only the layer inputs kept under `remat`; plus
    the float32 logits and their log-softmax (2*vocab per token). Everything divides evenly over
    `devices` (FSDP for the state, data parallel for the batch): a lower bound, not a promise.
    """
    width = jnp.dtype(config.dtype).itemsize
    n = count_params(config)
    params = n * width
    d, hd = config.hidden_size, config.resolved_head_dim
    q, kv = config.num_heads * hd, config.num_kv_heads * hd
    tokens = batch * seq_len
    out = {
        "params_count": n,
        "params": params,
        "grads": params if training else 0,
        "optimizer": 2 * params if training else 0,
        "reference": reference_copies * params,
        "kv_cache": 2 * config.num_layers * tokens * kv * width,
    }
    if training:
        per_token = d * width if remat else (4 * d + 2 * q + 2 * kv + 3 * config.intermediate_size) * width
        attn = 0 if remat else config.num_heads * seq_len * 4
        out["activations"] = config.num_layers * tokens * (per_token + attn) + tokens * 2 * config.vocab_size * 4
    else:
        out["activations"] = tokens * 2 * config.vocab_size * 4
    out["total"] = sum(v for k, v in out.items() if k != "params_count")
    out["per_device"] = -(-out["total"] // devices)
    return out


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def memory_estimate(
    cfg: ModelConfig,
    *,
    rollout_rows: int,
    minibatches: int,
    prompt_tokens: int,
    new_tokens: int,
    reference: bool,
    max_chunk_rows: int = 1024,
) -> dict:
    """estimate_memory for a run: activations of one optimizer step (rollout_rows / minibatches rows
    of prompt_tokens + new_tokens), the KV cache of one sampling chunk (at most max_chunk_rows rows,
    as sample_completions chunks them), one pulled copy of the weights for sampling (two with a KL
    reference). Sampling and the update are summed although they run one after the other: a margin."""
    seq_len = prompt_tokens + new_tokens
    out = estimate_memory(
        cfg,
        batch=max(1, rollout_rows // minibatches),
        seq_len=seq_len,
        devices=cfg.mesh.devices,
        reference_copies=2 if reference else 1,
        remat=cfg.remat,
    )
    out["kv_cache"] = estimate_memory(cfg, batch=min(rollout_rows, max_chunk_rows), seq_len=seq_len, training=False)[
        "kv_cache"
    ]
    out["total"] = sum(v for k, v in out.items() if k not in ("params_count", "total", "per_device"))
    out["per_device"] = -(-out["total"] // cfg.mesh.devices)
    return out


def memory_summary(cfg: ModelConfig, estimate: dict, prompt_tokens: int) -> str:
    parts = ", ".join(
        f"{k} {format_bytes(estimate[k])}"
        for k in ("params", "grads", "optimizer", "reference", "kv_cache", "activations")
    )
    source = cfg.path or "built-in model"
    return (
        f"model: {source}: {estimate['params_count']:,} parameters in {cfg.dtype}; estimated memory "
        f"{format_bytes(estimate['total'])}, {format_bytes(estimate['per_device'])} per device over "
        f"{cfg.mesh.devices} (prompts of {prompt_tokens} tokens; {parts})"
    )
