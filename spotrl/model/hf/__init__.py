"""Hugging Face checkpoints (Qwen2 / Qwen2.5 / Llama 3) in and out of our NNX transformer.

A checkpoint directory (a local path, or any fsspec URL such as gs://bucket/dir) holds
`config.json` and `model.safetensors` or a sharded `model.safetensors.index.json`. Loading:

    cfg, graphdef, state = load_checkpoint("path/to/Qwen2.5-0.5B")           # one device
    cfg = read_config(path, dtype="bfloat16")
    params = load_params(path, cfg, sharding=sharding_rules(mesh, cfg))      # sharded, pure dict

reads the safetensors headers of every file first and checks every tensor's name, shape and
dtype against the architecture; any problem is one `CheckpointError` naming the file and the
tensor, raised before a single tensor's data is read. Then tensors are read one at a time and
placed on their devices: a tensor that one device holds whole is read in one sequential read; a
sharded one is read block by block from a read-only memory map, each device's block only. So the
host never holds a copy of the whole model, at most one tensor. The transpose and the cast to
the config's dtype run on the devices. (safetensors' own `safe_open` cannot hand bfloat16 to
numpy and reads only local files, so the few lines of its format that we need are read here: an
8-byte little-endian header length, a JSON header of {name: {dtype, shape, data_offsets}}, then
the raw little-endian data.)

Hugging Face stores a Linear's weight as [out, in]; our `nnx.Linear` kernels are [in, out], so
those tensors are transposed on the way in (and out, in spotrl/model/hf/export.py).
"""

from __future__ import annotations

import functools
import json
import re
import struct
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import fsspec
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from pydantic import ValidationError

from spotrl.model import sharding
from spotrl.config import ModelConfig, RopeScaling

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

ARCHITECTURES = {"Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama"}
_MODEL_TYPES = {v: k for k, v in ARCHITECTURES.items()}

# safetensors dtype codes we can read, and what numpy calls them
_ST_DTYPES = {
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": jnp.dtype(jnp.bfloat16),
    "F64": np.dtype(np.float64),
}
ST_CODES = {v: k for k, v in _ST_DTYPES.items()}
_CONFIG_DTYPES = {"float32": "float32", "bfloat16": "bfloat16"}

# buffers some exporters write that are not parameters (recomputed from the config)
_IGNORED = re.compile(r"^model\.(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq$")

Sharding = jax.sharding.Sharding
ShardingFn = Callable[[str], "Sharding | None"]


class CheckpointError(ValueError):
    """A checkpoint that cannot load: the message names the file and, where there is one, the tensor."""


# ---------------------------------------------------------------------------------------------
# files (local or fsspec)


def join(root: str, name: str) -> str:
    return str(root).rstrip("/") + "/" + name


def _fs(path: str):
    return fsspec.core.url_to_fs(str(path))


def exists(path: str) -> bool:
    fs, p = _fs(path)
    return fs.exists(p)


def _is_local(path: str) -> bool:
    fs, _ = _fs(path)
    return "file" in (fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,))


def read_json(path: str, *, required: bool = True) -> dict | None:
    if not exists(path):
        if required:
            raise CheckpointError(f"{path}: missing file")
        return None
    try:
        with fsspec.open(str(path), "r", encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


# ---------------------------------------------------------------------------------------------
# config.json <-> ModelConfig


def architecture_of(hf: Mapping[str, Any], source: str = CONFIG_FILE) -> str:
    """'qwen2' or 'llama' from config.json's `architectures` (or `model_type`); else CheckpointError."""
    archs = hf.get("architectures") or []
    if archs:
        for arch in archs:
            if arch in ARCHITECTURES:
                return ARCHITECTURES[arch]
        raise CheckpointError(
            f"{source}: unsupported architecture {', '.join(map(str, archs))} "
            f"(supported: {', '.join(ARCHITECTURES)})"
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
    source = join(path, CONFIG_FILE)
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


@functools.lru_cache(maxsize=8)
def _abstract_model(cfg: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
    from spotrl.model.transformer import Transformer

    model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))  # seconds for a large model: cached
    return nnx.split(model)


def abstract_model(cfg: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
    """Graph definition and shape-only state of our Transformer for `cfg` (allocates nothing)."""
    graphdef, state = _abstract_model(cfg)
    return graphdef, jax.tree.map(lambda x: x, state)  # a fresh State: callers fill it in place


def _flat(tree: Mapping, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _nest_like(template: Mapping, flat: Mapping[str, Any], prefix: str = "") -> dict:
    return {
        key: _nest_like(value, flat, f"{prefix}{key}.") if isinstance(value, Mapping) else flat[f"{prefix}{key}"]
        for key, value in template.items()
    }


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Our flat parameter path -> shape."""
    _, state = abstract_model(cfg)
    return {k: tuple(v.shape) for k, v in _flat(nnx.to_pure_dict(state)).items()}


# ---------------------------------------------------------------------------------------------
# safetensors headers


@dataclass(frozen=True)
class TensorEntry:
    file: str  # path of the .safetensors file
    name: str
    dtype: str  # safetensors code: F32, BF16, ...
    shape: tuple[int, ...]
    start: int  # absolute byte offsets in the file
    end: int


def read_header(path: str) -> dict[str, TensorEntry]:
    """The tensors of one .safetensors file (reads only its header)."""
    if not exists(path):
        raise CheckpointError(f"{path}: missing file")
    with fsspec.open(str(path), "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: not a safetensors file (shorter than its header length)")
        (length,) = struct.unpack("<Q", head)
        if length > 100 * 2**20:
            raise CheckpointError(f"{path}: not a safetensors file (header length {length})")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path}: not a safetensors file (bad header: {err})") from None
    header.pop("__metadata__", None)
    base = 8 + length
    entries = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        entries[name] = TensorEntry(str(path), name, info["dtype"], tuple(info["shape"]), base + begin, base + end)
    return entries


def checkpoint_tensors(path: str) -> tuple[str, dict[str, TensorEntry]]:
    """(the file that lists the tensors, {tensor name: entry}) of a checkpoint directory."""
    index_path, single = join(path, INDEX_FILE), join(path, WEIGHTS_FILE)
    if exists(index_path):
        index = read_json(index_path)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, Mapping):
            raise CheckpointError(f"{index_path}: no weight_map")
        tensors: dict[str, TensorEntry] = {}
        for file in sorted(set(weight_map.values())):
            shard = join(path, file)
            if not exists(shard):
                first = next(n for n, f in weight_map.items() if f == file)
                raise CheckpointError(f"{index_path}: tensor {first!r} is in {shard}, which is missing")
            tensors.update(read_header(shard))
        for name, file in weight_map.items():
            entry = tensors.get(name)
            if entry is None or entry.file != join(path, file):
                raise CheckpointError(f"{join(path, file)}: tensor {name!r} listed in {index_path} is not in it")
        return index_path, tensors
    if exists(single):
        return single, read_header(single)
    raise CheckpointError(f"{path}: no {WEIGHTS_FILE} or {INDEX_FILE} (only safetensors checkpoints load)")


def check_tensors(cfg: ModelConfig, listing: str, tensors: Mapping[str, TensorEntry]) -> dict[str, tuple[TensorEntry, bool]]:
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
        elif entry.dtype not in _ST_DTYPES:
            problems.append(f"{entry.file}: tensor {hf_name!r} has unsupported dtype {entry.dtype} "
                            f"(supported: {', '.join(_ST_DTYPES)})")
        elif entry.end - entry.start != int(np.prod(entry.shape)) * _ST_DTYPES[entry.dtype].itemsize:
            problems.append(f"{entry.file}: tensor {hf_name!r} has {entry.end - entry.start} bytes, "
                            f"not {list(entry.shape)} x {entry.dtype}")
        else:
            plan[ours] = (entry, transposed)
    for name in sorted(set(tensors) - set(expected)):
        if _IGNORED.match(name) or (cfg.tie_embeddings and name == "lm_head.weight"):
            continue  # recomputed buffers; a tied checkpoint's redundant copy of the embedding
        problems.append(f"{tensors[name].file}: unexpected tensor {name!r} for this config "
                        f"(tie_word_embeddings={cfg.tie_embeddings}, qkv bias={cfg.qkv_bias}, "
                        f"{cfg.num_layers} layers)")
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise CheckpointError("checkpoint does not match its config:\n  " + "\n  ".join(shown))
    return plan


# ---------------------------------------------------------------------------------------------
# loading


class _HostTensor:
    """One tensor's data on the host, read on demand: whole (one sequential read) or block by block
    (from a read-only memory map of a local file, so a device's block is all that is read)."""

    def __init__(self, entry: TensorEntry):
        self.entry = entry
        self.dtype = _ST_DTYPES[entry.dtype]
        self.shape = entry.shape
        self.local = _is_local(entry.file)
        self._whole: np.ndarray | None = None

    def whole(self) -> np.ndarray:
        if self._whole is None:
            e = self.entry
            if self.local:
                out = np.empty(e.shape, self.dtype)
                with open(_fs(e.file)[1], "rb") as f:
                    f.seek(e.start)
                    if f.readinto(out.reshape(-1).view(np.uint8)) != e.end - e.start:
                        raise CheckpointError(f"{e.file}: truncated: tensor {e.name!r} ends past the end of the file")
            else:
                with fsspec.open(e.file, "rb") as f:
                    f.seek(e.start)
                    data = f.read(e.end - e.start)
                if len(data) != e.end - e.start:
                    raise CheckpointError(f"{e.file}: truncated: tensor {e.name!r} ends past the end of the file")
                out = np.frombuffer(data, dtype=self.dtype).reshape(e.shape)
            self._whole = out
        return self._whole

    def block(self, index: tuple) -> np.ndarray:
        """A fresh array holding data[index] (a jax array on the CPU may alias it, never the file)."""
        full = all(i == slice(None) or (i.start in (None, 0) and i.stop in (None, n) and i.step in (None, 1))
                   for i, n in zip(index, self.shape))
        if full or not self.local or self._whole is not None:
            return self.whole() if full else np.array(self.whole()[index])
        e = self.entry
        mapped = np.memmap(_fs(e.file)[1], dtype=self.dtype, mode="r", offset=e.start, shape=e.shape)
        try:
            return np.array(mapped[index], order="C")
        finally:
            del mapped


def _host_tensor(entry: TensorEntry) -> _HostTensor:
    return _HostTensor(entry)


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


def _place(host: _HostTensor, transposed: bool, dtype, sharding: Sharding | None) -> jax.Array:
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
            shape, sharding, lambda index: np.array(host.block(index[::-1]).T, dtype=dtype, order="C"))
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
        flat[ours] = _place(_host_tensor(entry), transposed, target, shard)  # host memory: one tensor at most
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
# memory


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
