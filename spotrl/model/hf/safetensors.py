"""The few lines of the safetensors format that loading needs, for local files and fsspec URLs.

A .safetensors file is an 8-byte little-endian header length, a JSON header of
{name: {dtype, shape, data_offsets}}, then the raw little-endian data. safetensors' own
`safe_open` cannot hand bfloat16 to numpy and reads only local files, hence this module:
`checkpoint_tensors` lists every tensor of a checkpoint directory from the headers alone (a single
`model.safetensors` or a sharded `model.safetensors.index.json`), and `HostTensor` reads one
tensor's data on demand, whole or a device's block only.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from spotrl.model.hf.config import CheckpointError, read_json
from spotrl.storage.paths import AnyPath, as_path

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# safetensors dtype codes we can read, and what numpy calls them
DTYPES = {
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": jnp.dtype(jnp.bfloat16),
    "F64": np.dtype(np.float64),
}
ST_CODES = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class TensorEntry:
    file: str  # path of the .safetensors file
    name: str
    dtype: str  # safetensors code: F32, BF16, ...
    shape: tuple[int, ...]
    start: int  # absolute byte offsets in the file
    end: int


def read_header(path: str | AnyPath) -> dict[str, TensorEntry]:
    """The tensors of one .safetensors file (reads only its header)."""
    file = as_path(path)
    if not file.exists():
        raise CheckpointError(f"{file}: missing file")
    with file.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{file}: not a safetensors file (shorter than its header length)")
        (length,) = struct.unpack("<Q", head)
        if length > 100 * 2**20:
            raise CheckpointError(f"{file}: not a safetensors file (header length {length})")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{file}: not a safetensors file (bad header: {err})") from None
    header.pop("__metadata__", None)
    base = 8 + length
    entries = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        entries[name] = TensorEntry(str(file), name, info["dtype"], tuple(info["shape"]), base + begin, base + end)
    return entries


def checkpoint_tensors(path: str) -> tuple[str, dict[str, TensorEntry]]:
    """(the file that lists the tensors, {tensor name: entry}) of a checkpoint directory."""
    root = as_path(path)
    index_path, single = root / INDEX_FILE, root / WEIGHTS_FILE
    if index_path.exists():
        index = read_json(index_path)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, Mapping):
            raise CheckpointError(f"{index_path}: no weight_map")
        tensors: dict[str, TensorEntry] = {}
        for file in sorted(set(weight_map.values())):
            shard = root / file
            if not shard.exists():
                first = next(n for n, f in weight_map.items() if f == file)
                raise CheckpointError(f"{index_path}: tensor {first!r} is in {shard}, which is missing")
            tensors.update(read_header(shard))
        for name, file in weight_map.items():
            entry = tensors.get(name)
            if entry is None or entry.file != str(root / file):
                raise CheckpointError(f"{root / file}: tensor {name!r} listed in {index_path} is not in it")
        return str(index_path), tensors
    if single.exists():
        return str(single), read_header(single)
    raise CheckpointError(f"{path}: no {WEIGHTS_FILE} or {INDEX_FILE} (only safetensors checkpoints load)")


class HostTensor:
    """One tensor's data on the host, read on demand: whole (one sequential read) or block by block
    (from a read-only memory map of a local file, so a device's block is all that is read)."""

    def __init__(self, entry: TensorEntry):
        self.entry = entry
        self.dtype = DTYPES[entry.dtype]
        self.shape = entry.shape
        self.file = as_path(entry.file)
        self.local = isinstance(self.file, Path)
        self._whole: np.ndarray | None = None

    def whole(self) -> np.ndarray:
        if self._whole is None:
            e = self.entry
            if self.local:
                out = np.empty(e.shape, self.dtype)
                with open(self.file, "rb") as f:
                    f.seek(e.start)
                    if f.readinto(out.reshape(-1).view(np.uint8)) != e.end - e.start:
                        raise CheckpointError(f"{e.file}: truncated: tensor {e.name!r} ends past the end of the file")
            else:
                with self.file.open("rb") as f:
                    f.seek(e.start)
                    data = f.read(e.end - e.start)
                if len(data) != e.end - e.start:
                    raise CheckpointError(f"{e.file}: truncated: tensor {e.name!r} ends past the end of the file")
                out = np.frombuffer(data, dtype=self.dtype).reshape(e.shape)
            self._whole = out
        return self._whole

    def block(self, index: tuple) -> np.ndarray:
        """A fresh array holding data[index] (a jax array on the CPU may alias it, never the file)."""
        full = all(
            i == slice(None) or (i.start in (None, 0) and i.stop in (None, n) and i.step in (None, 1))
            for i, n in zip(index, self.shape)
        )
        if full or not self.local or self._whole is not None:
            return self.whole() if full else np.array(self.whole()[index])
        e = self.entry
        mapped = np.memmap(self.file, dtype=self.dtype, mode="r", offset=e.start, shape=e.shape)
        try:
            return np.array(mapped[index], order="C")
        finally:
            del mapped
