"""A run's policy and tokenizer from its `model` config: the built-in model, or a Hugging Face checkpoint
(Qwen2 / Qwen2.5 / Llama 3) loaded into our NNX transformer.

    check_checkpoint(cfg)          # config.json, every tensor header, the tokenizer: no tensor data read
    policy, tokenizer = build_policy(cfg, seed)

    cfg, graphdef, state = load_checkpoint("path/to/Qwen2.5-0.5B")           # one device
    params = load_params(path, cfg, sharding=sharding_rules(mesh, cfg))      # sharded, pure dict

A checkpoint directory (a local path, or any fsspec URL such as gs://bucket/dir) holds
`config.json` and `model.safetensors` or a sharded `model.safetensors.index.json`. Loading reads
the safetensors headers of every file first and checks every tensor's name, shape and dtype
against the architecture; any problem is one `CheckpointError` naming the file and the tensor,
raised before a single tensor's data is read. Then tensors are read one at a time and placed on
their devices (in `model.dtype`, onto `model.mesh` when it has more than one device): a tensor that
one device holds whole is read in one sequential read; a sharded one is read block by block from a
read-only memory map, each device's block only (spotrl/model/hf/safetensors.py). So the host never
holds a copy of the whole model, at most one tensor. The transpose and the cast to the config's
dtype run on the devices.

Hugging Face stores a Linear's weight as [out, in]; our `nnx.Linear` kernels are [in, out], so
those tensors are transposed on the way in (and out, in spotrl/model/hf/export.py).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spotrl.config import ModelConfig, architecture_mismatches
from spotrl.model import sharding
from spotrl.model.hf.config import CONFIG_FILE, CheckpointError, read_config
from spotrl.model.hf.safetensors import DTYPES, HostTensor, TensorEntry, checkpoint_tensors
from spotrl.model.policy import Policy, abstract_model, param_shapes
from spotrl.model.tokenizers import CharTokenizer
from spotrl.storage.paths import as_path

# buffers some exporters write that are not parameters (recomputed from the config)
_IGNORED = re.compile(r"^model\.(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq$")

Sharding = jax.sharding.Sharding
ShardingFn = Callable[[str], "Sharding | None"]


# ---------------------------------------------------------------------------------------------
# names


def tensor_map(cfg: ModelConfig) -> dict[str, tuple[str, bool]]:
    """Hugging Face tensor name -> (our flat parameter path, whether it is transposed)."""
    names = {
        "model.embed_tokens.weight": ("embed_tokens.embedding", False),
        "model.norm.weight": ("norm.weight", False),
    }
    for i in range(cfg.num_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            names[f"{hf}self_attn.{proj}.weight"] = (f"{ours}self_attn.{proj}.kernel", True)
        if cfg.qkv_bias:
            for proj in ("q_proj", "k_proj", "v_proj"):
                names[f"{hf}self_attn.{proj}.bias"] = (f"{ours}self_attn.{proj}.bias", False)
        for proj in ("gate_proj", "up_proj", "down_proj"):
            names[f"{hf}mlp.{proj}.weight"] = (f"{ours}mlp.{proj}.kernel", True)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            names[f"{hf}{norm}.weight"] = (f"{ours}{norm}.weight", False)
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = ("lm_head.kernel", True)
    return names


def _nest_like(template: Mapping, flat: Mapping[str, Any], prefix: str = "") -> dict:
    return {
        key: _nest_like(value, flat, f"{prefix}{key}.") if isinstance(value, Mapping) else flat[f"{prefix}{key}"]
        for key, value in template.items()
    }


# ---------------------------------------------------------------------------------------------
# checking


def check_tensors(
    cfg: ModelConfig, listing: str, tensors: Mapping[str, TensorEntry]
) -> dict[str, tuple[TensorEntry, bool]]:
    """Every expected tensor present with the right shape and a readable dtype, and nothing else.

    Returns {our path: (entry, transposed)}; raises one CheckpointError listing every problem.
    """
    shapes = param_shapes(cfg)
    expected = tensor_map(cfg)
    problems, plan = [], {}
    for hf_name, (ours, transposed) in expected.items():
        entry = tensors.get(hf_name)
        if entry is None:
            problems.append(f"{listing}: missing tensor {hf_name!r}")
            continue
        shape = shapes[ours][::-1] if transposed else shapes[ours]
        if entry.shape != shape:
            problems.append(f"{entry.file}: tensor {hf_name!r} has shape {list(entry.shape)}, expected {list(shape)}")
        elif entry.dtype not in DTYPES:
            problems.append(
                f"{entry.file}: tensor {hf_name!r} has unsupported dtype {entry.dtype} (supported: {', '.join(DTYPES)})"
            )
        elif entry.end - entry.start != int(np.prod(entry.shape)) * DTYPES[entry.dtype].itemsize:
            problems.append(
                f"{entry.file}: tensor {hf_name!r} has {entry.end - entry.start} bytes, "
                f"not {list(entry.shape)} x {entry.dtype}"
            )
        else:
            plan[ours] = (entry, transposed)
    for name in sorted(set(tensors) - set(expected)):
        if _IGNORED.match(name) or (cfg.tie_embeddings and name == "lm_head.weight"):
            continue  # recomputed buffers; a tied checkpoint's redundant copy of the embedding
        problems.append(
            f"{tensors[name].file}: unexpected tensor {name!r} for this config "
            f"(tie_word_embeddings={cfg.tie_embeddings}, qkv bias={cfg.qkv_bias}, "
            f"{cfg.num_layers} layers)"
        )
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise CheckpointError("checkpoint does not match its config:\n  " + "\n  ".join(shown))
    return plan


# ---------------------------------------------------------------------------------------------
# loading


def _transposed_sharding(sharding: Sharding) -> Sharding | None:
    """The sharding of the [out, in] source whose transpose has `sharding` (None: not expressible)."""
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return sharding
    if isinstance(sharding, jax.sharding.NamedSharding):
        spec = tuple(sharding.spec) + (None,) * (2 - len(sharding.spec))
        return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*spec[::-1]))
    return None


@functools.lru_cache(maxsize=64)
def _converter(dtype, transposed: bool, sharding: Sharding | None):
    """Jitted cast (and transpose) on the devices: each device converts its own block, no host copy."""
    fn = (lambda x: x.T.astype(dtype)) if transposed else (lambda x: x.astype(dtype))
    return jax.jit(fn) if sharding is None else jax.jit(fn, out_shardings=sharding)


def _place(host: HostTensor, transposed: bool, dtype, sharding: Sharding | None) -> jax.Array:
    """Put one tensor on its devices in our layout and dtype.

    Each device's block is read in the checkpoint's own layout and dtype; the transpose and the
    cast run on the devices (a host transpose of a large matrix is cache-unfriendly: slower than
    reading it).
    """
    if sharding is None:  # the default device, uncommitted (as jnp.asarray places arrays)
        raw = jax.device_put(host.whole())
        if not transposed and host.dtype == dtype:
            return raw
        return _converter(jnp.dtype(dtype), transposed, None)(raw)
    source = _transposed_sharding(sharding) if transposed else sharding
    if source is None:  # a sharding we cannot mirror: transpose on the host, block by block
        shape = host.shape[::-1]
        return jax.make_array_from_callback(
            shape, sharding, lambda index: np.array(host.block(index[::-1]).T, dtype=dtype, order="C")
        )
    raw = jax.make_array_from_callback(host.shape, source, host.block)
    if not transposed and host.dtype == dtype:
        return raw
    return _converter(jnp.dtype(dtype), transposed, sharding)(raw)


def load_params(
    path: str,
    config: ModelConfig | None = None,
    *,
    dtype: str | None = None,
    sharding: ShardingFn | Sharding | None = None,
) -> dict:
    """Parameters of the checkpoint at `path` as our nested pure dict of jax arrays.

    config: the architecture to expect (default: read from config.json, with `dtype` if given);
    parameters are cast to `config.dtype`. sharding: a Sharding for every tensor, or a function of
    our flat parameter path ("layers.0.self_attn.q_proj.kernel") returning one (None: default
    device). Every header is checked before any tensor's data is read.
    """
    cfg = config if config is not None else read_config(path, dtype=dtype)
    listing, tensors = checkpoint_tensors(path)
    plan = check_tensors(cfg, listing, tensors)
    target = jnp.dtype(cfg.dtype)
    flat = {}
    for ours, (entry, transposed) in plan.items():
        shard = sharding(ours) if callable(sharding) else sharding
        flat[ours] = _place(HostTensor(entry), transposed, target, shard)  # host memory: one tensor at most
    _, state = abstract_model(cfg)
    return _nest_like(nnx.to_pure_dict(state), flat)


def load_checkpoint(
    path: str, *, dtype: str | None = None, sharding: ShardingFn | Sharding | None = None
) -> tuple[ModelConfig, nnx.GraphDef, nnx.State]:
    """(config, graphdef, state) of a Hugging Face checkpoint; `nnx.merge(graphdef, state)` is the model."""
    cfg = read_config(path, dtype=dtype)
    params = load_params(path, cfg, sharding=sharding)
    graphdef, state = abstract_model(cfg)
    nnx.replace_by_pure_dict(state, params)
    return cfg, graphdef, state


# ---------------------------------------------------------------------------------------------
# sharding rules

# The rules live in spotrl/model/sharding.py (one set for loading, training and activations):
# (regex over our flat path, one logical axis name or None per dimension). Mesh axes not in the mesh,
# and dimensions the axis size does not divide, are replicated.
DEFAULT_RULES = sharding.PARAM_AXES


def sharding_rules(mesh: jax.sharding.Mesh, config: ModelConfig, rules=DEFAULT_RULES) -> Callable[[str], Sharding]:
    """A path -> NamedSharding function for `load_params`: FSDP over mesh axis 'fsdp', tensor
    parallel over 'tp' (see spotrl/model/sharding.py). `rules` name logical axes, or mesh axes directly.

    The mesh's axes should be `jax.sharding.AxisType.Auto` (XLA propagates the parameters'
    shardings through the jitted step).
    """
    shapes = param_shapes(config)
    return lambda path: jax.sharding.NamedSharding(mesh, sharding.param_spec(path, shapes[path], mesh, rules))


# ---------------------------------------------------------------------------------------------
# a run's policy and tokenizer


def load_tokenizer(cfg: ModelConfig, builtin=None):
    """The checkpoint's HFTokenizer (prompts through its chat template when `cfg.chat_template`), or
    `builtin` (the problem's tokenizer for the built-in model; the CharTokenizer when not given)."""
    if not cfg.path:
        return builtin or CharTokenizer()
    from spotrl.model.hf.tokenizer import HFTokenizer

    return HFTokenizer.for_prompts(cfg.path, cfg.chat_template)


def check_checkpoint(cfg: ModelConfig):
    """Everything about `cfg.path` that can be wrong, checked from headers and small files; returns the tokenizer."""
    source = as_path(cfg.path) / CONFIG_FILE
    found = read_config(cfg.path, dtype=cfg.dtype)
    problems = architecture_mismatches(cfg, found)
    if problems:
        raise CheckpointError(f"{source}: the run config's model does not match it:\n  " + "\n  ".join(problems))
    listing, tensors = checkpoint_tensors(cfg.path)
    check_tensors(cfg, listing, tensors)
    tokenizer = load_tokenizer(cfg)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise CheckpointError(
            f"{as_path(cfg.path) / 'tokenizer.json'}: {tokenizer.vocab_size} tokens, more than "
            f"the model's vocab_size {cfg.vocab_size} in {source}"
        )
    return tokenizer


def mesh_sharding(cfg: ModelConfig):
    """The path -> sharding function for `model.mesh`, or None for one device."""
    if cfg.mesh.devices == 1:
        return None
    if jax.device_count() != cfg.mesh.devices:
        raise ValueError(
            f"model.mesh asks for {cfg.mesh.fsdp} x {cfg.mesh.tp} = {cfg.mesh.devices} devices, "
            f"this process has {jax.device_count()}"
        )
    mesh = jax.make_mesh((cfg.mesh.fsdp, cfg.mesh.tp), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    return sharding_rules(mesh, cfg, cfg.sharding_rules or DEFAULT_RULES)


def build_policy(cfg: ModelConfig, seed: int, builtin_tokenizer=None):
    """(Policy, tokenizer): a random built-in model with `builtin_tokenizer` (the CharTokenizer when not
    given), or the checkpoint at `cfg.path` with its own tokenizer."""
    if not cfg.path:
        policy = Policy(cfg, init_seed=seed)
        placement = mesh_sharding(cfg)
        if placement is not None:  # model.mesh: the same initial values, laid out as a checkpoint's would be
            # (every process initialises the same values; each fills the shards on its own devices)
            host = jax.tree.map(np.asarray, policy.template())
            params = jax.tree_util.tree_map_with_path(
                lambda key, x: jax.make_array_from_callback(
                    x.shape, placement(sharding.path_string(key)), lambda index, x=x: x[index]
                ),
                host,
            )
            policy = Policy(cfg, params=params)
        return policy, builtin_tokenizer or CharTokenizer()
    tokenizer = check_checkpoint(cfg)
    params = load_params(cfg.path, cfg, sharding=mesh_sharding(cfg))
    return Policy(cfg, params=params), tokenizer
