"""Rollout shards: one parquet file per (iteration, shard, kind), named by its content hash.

    rollouts/iter_000005/rollouts_001.<sha256[:16]>.parquet   sampled completions of shard 1
    rollouts/iter_000005/scored_001.<sha256[:16]>.parquet     the same rows with rewards

The file is written under a temporary name and renamed into place complete, and the name carries
the content hash, so a shard is self-verifying: `damaged_shards` finds a truncated or altered one
without any other record, and `read_shard` refuses one whose bytes are not the ones recorded.
"""

from __future__ import annotations

import hashlib
import re

import pandas as pd

from spotrl.storage.atomic import atomic_write_bytes, sha256_file
from spotrl.storage.parquet import frame_bytes, read_frame
from spotrl.storage.paths import AnyPath, as_path

_SHARD = re.compile(r"^(?P<kind>[a-z]+)_(?P<shard>\d{3})\.(?P<digest>[0-9a-f]{16})\.parquet$")


def iteration_dir(root: str | AnyPath, iteration: int) -> AnyPath:
    return as_path(root) / f"iter_{iteration:06d}"


def write_shard(root: str | AnyPath, iteration: int, shard: int, kind: str, frame: pd.DataFrame) -> tuple[AnyPath, str]:
    """Write a shard; returns (path, sha256). Rewriting identical content is a no-op."""
    data = frame_bytes(frame)
    digest = hashlib.sha256(data).hexdigest()
    path = iteration_dir(root, iteration) / f"{kind}_{shard:03d}.{digest[:16]}.parquet"
    if not path.exists():
        atomic_write_bytes(path, data)
    return path, digest


def read_shard(path: str | AnyPath, sha256: str) -> pd.DataFrame:
    return read_frame(path, sha256)


def find_shard(root: str | AnyPath, iteration: int, shard: int, kind: str) -> AnyPath:
    """The shard file of (iteration, shard, kind); FileNotFoundError names what is missing."""
    found = sorted(iteration_dir(root, iteration).glob(f"{kind}_{shard:03d}.*.parquet"))
    if len(found) != 1:
        raise FileNotFoundError(
            f"{iteration_dir(root, iteration)}: expected one {kind} shard {shard}, found {len(found)}"
        )
    return found[0]


def damaged_shards(root: str | AnyPath, after_iteration: int) -> dict[AnyPath, str]:
    """Shard files of iterations > `after_iteration` whose content does not match their name."""
    damaged = {}
    for folder in sorted(as_path(root).glob("iter_*")):
        if not folder.name[5:].isdigit() or int(folder.name[5:]) <= after_iteration:
            continue
        for path in sorted(folder.iterdir()):
            match = _SHARD.match(path.name)
            if match is None:
                continue
            if not sha256_file(path).startswith(match["digest"]):
                damaged[path] = "content does not match the sha256 in its name"
    return damaged
