"""Mixing sources by weight and splitting train/eval, deterministically from a seed.

Mixing samples without replacement: each source contributes round(total * weight share) rows
(largest remainders), chosen by a generator derived from (seed, source name), kept in source order.
Without a total, the largest total every source can supply at its share is used; without
weights, every row is kept. The split puts a row in eval by a hash of (seed, id), so a row's side
does not depend on the order of the rows or on which other rows exist.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pandas as pd

from spotrl.rng import derive_numpy_rng


def allocate(sizes: dict[str, int], weights: dict[str, float], total: int | None = None) -> dict[str, int]:
    """Rows per source for `weights` (a source without weight gets 0)."""
    unknown = sorted(set(weights) - set(sizes))
    if unknown:
        raise ValueError(f"weights for unknown sources {unknown}; sources are {sorted(sizes)}")
    if any(w < 0 or not math.isfinite(w) for w in weights.values()):
        raise ValueError(f"weights must be finite and >= 0: {weights}")
    mass = sum(weights.get(name, 0.0) for name in sizes)
    if mass <= 0:
        raise ValueError("at least one source needs a positive weight")
    share = {name: weights.get(name, 0.0) / mass for name in sizes}
    most = min(math.floor(sizes[n] / share[n] + 1e-9) for n in sizes if share[n] > 0)
    if total is None:
        total = most
    if total > most:
        raise ValueError(
            f"a total of {total} rows at these weights needs more rows than some source has "
            f"(sizes {sizes}); at most {most}"
        )
    exact = {n: total * share[n] for n in sizes}
    counts = {n: math.floor(exact[n]) for n in sizes}
    left = total - sum(counts.values())
    for n in sorted(sizes, key=lambda n: (-(exact[n] - counts[n]), list(sizes).index(n)))[:left]:
        counts[n] += 1
    return counts


def mix(
    frames: dict[str, pd.DataFrame], weights: dict[str, float] | None, seed: int, total: int | None = None
) -> tuple[pd.DataFrame, dict[str, int]]:
    """(the mixed rows, rows taken per source); with neither weights nor total, every row."""
    sizes = {name: len(frame) for name, frame in frames.items()}
    if not weights and total is None:
        counts = sizes
    else:
        counts = allocate(sizes, weights or {n: float(s) for n, s in sizes.items()}, total)
    parts = []
    for name, frame in frames.items():
        k = counts[name]
        if k == len(frame):
            parts.append(frame)
        elif k > 0:
            chosen = np.sort(derive_numpy_rng(seed, f"mix/{name}").choice(len(frame), size=k, replace=False))
            parts.append(frame.iloc[chosen])
    mixed = pd.concat(parts, ignore_index=True) if parts else next(iter(frames.values())).iloc[0:0]
    return mixed, counts


def split_key(seed: int, row_id: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}\0{row_id}".encode()).digest()[:8], "big")


def split(frame: pd.DataFrame, seed: int, eval_fraction: float = 0.0, eval_size: int | None = None):
    """(train, eval): the eval rows are those with the smallest split keys; both keep the input order."""
    if eval_size is None:
        if not 0.0 <= eval_fraction < 1.0:
            raise ValueError(f"eval fraction must be in [0, 1), got {eval_fraction}")
        eval_size = round(eval_fraction * len(frame))
    if not 0 <= eval_size <= len(frame):
        raise ValueError(f"eval size {eval_size} for {len(frame)} rows")
    keys = np.array([split_key(seed, i) for i in frame["id"]], dtype=np.uint64)
    in_eval = np.zeros(len(frame), bool)
    in_eval[np.argsort(keys, kind="stable")[:eval_size]] = True
    return frame[~in_eval].reset_index(drop=True), frame[in_eval].reset_index(drop=True)
