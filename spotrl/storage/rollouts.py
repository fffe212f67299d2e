"""Where rollout shards live: one parquet file per (iteration, shard) and kind (sampled, scored)."""

from __future__ import annotations

from pathlib import Path


def shard_path(root: str | Path, iteration: int, shard: int, kind: str = "rollouts") -> Path:
    return Path(root) / f"iter_{iteration:06d}" / f"{kind}_{shard:03d}.parquet"
