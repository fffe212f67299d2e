"""A run's policy and tokenizer from its `model` config: the built-in model, or a Hugging Face checkpoint.

    check_checkpoint(cfg)          # config.json, every tensor header, the tokenizer: no tensor data read
    policy, tokenizer = build_policy(cfg, seed)
    print(memory_summary(cfg, ...))

With `model.path` the checkpoint is checked completely before anything is loaded, so a bad one
fails before any work with a `CheckpointError` naming the file and the tensor; then parameters are
loaded tensor by tensor in `model.dtype`, onto `model.mesh` when it has more than one device.
"""

from __future__ import annotations

import jax

from spotrl.model import hf
from spotrl.config import ModelConfig, architecture_mismatches
from spotrl.model.policy import Policy
from spotrl.model.tokenizers import CharTokenizer


def load_tokenizer(cfg: ModelConfig, builtin=None):
    """The checkpoint's HFTokenizer (prompts through its chat template when `cfg.chat_template`), or
    `builtin` (the task's tokenizer for the built-in model; the CharTokenizer when not given)."""
    if not cfg.path:
        return builtin or CharTokenizer()
    from spotrl.model.hf.tokenizer import HFTokenizer

    tokenizer = HFTokenizer.from_pretrained(cfg.path)
    tokenizer.chat_prompts = cfg.chat_template and tokenizer.has_chat_template
    return tokenizer


def check_checkpoint(cfg: ModelConfig):
    """Everything about `cfg.path` that can be wrong, checked from headers and small files; returns the tokenizer."""
    source = hf.join(cfg.path, hf.CONFIG_FILE)
    found = hf.read_config(cfg.path, dtype=cfg.dtype)
    problems = architecture_mismatches(cfg, found)
    if problems:
        raise hf.CheckpointError(f"{source}: the run config's model does not match it:\n  " + "\n  ".join(problems))
    listing, tensors = hf.checkpoint_tensors(cfg.path)
    hf.check_tensors(cfg, listing, tensors)
    tokenizer = load_tokenizer(cfg)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise hf.CheckpointError(f"{hf.join(cfg.path, 'tokenizer.json')}: {tokenizer.vocab_size} tokens, more than "
                                 f"the model's vocab_size {cfg.vocab_size} in {source}")
    return tokenizer


def mesh_sharding(cfg: ModelConfig):
    """The path -> sharding function for `model.mesh`, or None for one device."""
    if cfg.mesh.devices == 1:
        return None
    if jax.device_count() != cfg.mesh.devices:
        raise ValueError(f"model.mesh asks for {cfg.mesh.fsdp} x {cfg.mesh.tp} = {cfg.mesh.devices} devices, "
                         f"this process has {jax.device_count()}")
    mesh = jax.make_mesh((cfg.mesh.fsdp, cfg.mesh.tp), ("fsdp", "tp"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    return hf.sharding_rules(mesh, cfg, cfg.sharding_rules or hf.DEFAULT_RULES)


def build_policy(cfg: ModelConfig, seed: int, builtin_tokenizer=None):
    """(Policy, tokenizer): a random built-in model with `builtin_tokenizer` (the CharTokenizer when not
    given), or the checkpoint at `cfg.path` with its own tokenizer."""
    if not cfg.path:
        return Policy(cfg, init_seed=seed), builtin_tokenizer or CharTokenizer()
    tokenizer = check_checkpoint(cfg)
    params = hf.load_params(cfg.path, cfg, sharding=mesh_sharding(cfg))
    return Policy(cfg, params=params), tokenizer


def memory_estimate(cfg: ModelConfig, *, rollout_rows: int, minibatches: int, prompt_tokens: int,
                    new_tokens: int, reference: bool, max_chunk_rows: int = 1024) -> dict:
    """hf.estimate_memory for a run: activations of one optimizer step (rollout_rows / minibatches rows
    of prompt_tokens + new_tokens), the KV cache of one sampling chunk (at most max_chunk_rows rows,
    as sample_completions chunks them), one pulled copy of the weights for sampling (two with a KL
    reference). Sampling and the update are summed although they run one after the other: a margin."""
    seq_len = prompt_tokens + new_tokens
    out = hf.estimate_memory(cfg, batch=max(1, rollout_rows // minibatches), seq_len=seq_len,
                             devices=cfg.mesh.devices, reference_copies=2 if reference else 1, remat=cfg.remat)
    out["kv_cache"] = hf.estimate_memory(cfg, batch=min(rollout_rows, max_chunk_rows), seq_len=seq_len,
                                         training=False)["kv_cache"]
    out["total"] = sum(v for k, v in out.items() if k not in ("params_count", "total", "per_device"))
    out["per_device"] = -(-out["total"] // cfg.mesh.devices)
    return out


def memory_summary(cfg: ModelConfig, estimate: dict, prompt_tokens: int) -> str:
    parts = ", ".join(f"{k} {hf.format_bytes(estimate[k])}" for k in
                      ("params", "grads", "optimizer", "reference", "kv_cache", "activations"))
    source = cfg.path or "built-in model"
    return (f"model: {source}: {estimate['params_count']:,} parameters in {cfg.dtype}; estimated memory "
            f"{hf.format_bytes(estimate['total'])}, {hf.format_bytes(estimate['per_device'])} per device over "
            f"{cfg.mesh.devices} (prompts of {prompt_tokens} tokens; {parts})")
