"""Write our parameters as a Hugging Face checkpoint directory that `transformers` loads unchanged.

    export_checkpoint(params, config, "out/", tokenizer_from="path/to/source-checkpoint")
    export_checkpoint(params, config, "out/", tokenizer=CharTokenizer())   # the built-in model

writes `config.json` (Qwen2ForCausalLM when the model has q/k/v biases, else LlamaForCausalLM),
`model.safetensors` (or `model-0000i-of-0000n.safetensors` + `model.safetensors.index.json` past
`max_shard_bytes`) with Hugging Face tensor names and [out, in] Linear weights, and the tokenizer
files: copied from `tokenizer_from` when given (tokenizer.json, tokenizer_config.json,
chat_template.jinja, special_tokens_map.json, generation_config.json), or for our character
tokenizer a `tokenizer.json` of its own (one token per character, BOS added to every sequence as
the CharTokenizer does for prompts, decoded without spaces). Tensors are written one at a time
(a sharded jax array is gathered to the host one tensor at a time); `out` may be an fsspec URL.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping

import jax.numpy as jnp
import numpy as np

from spotrl.config import ModelConfig
from spotrl.model.hf.config import CONFIG_FILE, config_to_hf
from spotrl.model.hf.loader import tensor_map
from spotrl.model.hf.safetensors import INDEX_FILE, ST_CODES, WEIGHTS_FILE
from spotrl.model.hf.tokenizer import (
    GENERATION_CONFIG,
    TOKENIZER_CONFIG,
    TOKENIZER_FILE,
    TOKENIZER_FILES,
    HFTokenizer,
)
from spotrl.model.policy import flat_params, param_shapes
from spotrl.model.tokenizers import CharTokenizer
from spotrl.storage.paths import AnyPath, as_path


def _write_json(path: AnyPath, data: dict) -> None:
    with path.open("w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")


def _hf_tensors(params: Mapping, config: ModelConfig) -> list[tuple[str, object, bool, tuple[int, ...]]]:
    """[(hf name, our array, transposed, hf shape)] in a stable order, shapes checked."""
    flat = flat_params(params)
    shapes = param_shapes(config)
    expected = tensor_map(config)
    missing = sorted(set(ours for ours, _ in expected.values()) - set(flat))
    if missing:
        raise ValueError(f"params lack {missing[:5]} for this config")
    out = []
    for hf_name, (ours, transposed) in expected.items():
        array = flat[ours]
        if tuple(np.shape(array)) != shapes[ours]:
            raise ValueError(f"param {ours!r} has shape {tuple(np.shape(array))}, expected {shapes[ours]}")
        shape = shapes[ours][::-1] if transposed else shapes[ours]
        out.append((hf_name, array, transposed, shape))
    return out


def _write_safetensors(path: AnyPath, tensors: list, dtype: np.dtype) -> int:
    """One .safetensors file, tensor by tensor; returns its data bytes."""
    code = ST_CODES[dtype]
    header, offset = {}, 0
    for name, _, _, shape in tensors:
        size = int(np.prod(shape)) * dtype.itemsize
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, array, transposed, _ in tensors:
            host = np.asarray(array)  # gathers a sharded array: one tensor on the host at a time
            host = host.T if transposed else host
            f.write(np.ascontiguousarray(host, dtype=dtype).tobytes())
    return offset


def char_tokenizer_files(tok: CharTokenizer, model_max_length: int = 32768) -> dict[str, dict]:
    """tokenizer.json / tokenizer_config.json / generation_config.json equivalent to the CharTokenizer."""
    specials = {"<pad>": tok.pad_id, "<eos>": tok.eos_id, "<bos>": tok.bos_id}
    vocab = {**specials, **{c: tok.encode(c)[0] for c in tok.alphabet}}
    added = [
        {
            "id": i,
            "content": s,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for s, i in specials.items()
    ]
    bos = {"SpecialToken": {"id": "<bos>", "type_id": 0}}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": False},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 0}}],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [tok.bos_id], "tokens": ["<bos>"]}},
        },
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
    }
    generation = {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id}
    return {TOKENIZER_FILE: tokenizer, TOKENIZER_CONFIG: config, GENERATION_CONFIG: generation}


def export_checkpoint(
    params: Mapping,
    config: ModelConfig,
    out: str,
    *,
    architecture: str | None = None,
    dtype: str | None = None,
    tokenizer_from: str | None = None,
    tokenizer: CharTokenizer | None = None,
    max_shard_bytes: int = 5 * 2**30,
    overwrite: bool = False,
) -> str:
    """Write `params` (our nested pure dict) and `config` as a Hugging Face checkpoint at `out`."""
    out = str(out)
    root = as_path(out)
    if root.exists() and (root.is_file() or any(root.iterdir())) and not overwrite:
        raise FileExistsError(f"{out} exists and is not empty")
    root.mkdir(parents=True, exist_ok=True)
    np_dtype = jnp.dtype(dtype or config.dtype)
    if np_dtype not in ST_CODES:
        raise ValueError(f"cannot export dtype {np_dtype}")

    tensors = _hf_tensors(params, config)
    shards, current, size = [], [], 0
    for t in tensors:
        nbytes = int(np.prod(t[3])) * np_dtype.itemsize
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(t)
        size += nbytes
    shards.append(current)
    if len(shards) == 1:
        _write_safetensors(root / WEIGHTS_FILE, tensors, np_dtype)
    else:
        weight_map, total = {}, 0
        for i, shard in enumerate(shards):
            name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            total += _write_safetensors(root / name, shard, np_dtype)
            weight_map.update({t[0]: name for t in shard})
        _write_json(root / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})

    ids: dict = {}
    if tokenizer_from is not None:
        source = as_path(tokenizer_from)
        for name in TOKENIZER_FILES:
            if (source / name).exists():
                (root / name).write_bytes((source / name).read_bytes())
        if (source / TOKENIZER_FILE).exists():
            hf_tok = HFTokenizer.from_pretrained(tokenizer_from)
            ids = {
                "bos_token_id": hf_tok.bos_id,
                "eos_token_id": list(hf_tok.stop_ids) if len(hf_tok.stop_ids) > 1 else hf_tok.eos_id,
                "pad_token_id": hf_tok.pad_id,
            }
    elif tokenizer is not None:
        if tokenizer.vocab_size > config.vocab_size:
            raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens, the model only {config.vocab_size}")
        for name, data in char_tokenizer_files(tokenizer, config.max_position_embeddings).items():
            _write_json(root / name, data)
        ids = {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id, "pad_token_id": tokenizer.pad_id}
    _write_json(
        root / CONFIG_FILE,
        config_to_hf(config, architecture=architecture, **ids) | {"torch_dtype": str(np_dtype), "dtype": str(np_dtype)},
    )
    return out
