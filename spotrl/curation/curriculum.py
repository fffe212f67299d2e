"""Difficulty curation inside a run (`curation.difficulty`): which training prompts the stream draws from.

Before iterations 1, 1 + every, 1 + 2 * every, ... the pass rate of each pooled training prompt is
estimated from `samples` completions of the policy that iteration samples with (difficulty.py), and
saved as RUN/difficulty/iter_NNNNNN.parquet. Until the next estimate, the prompt stream (the seeded
data order of batches.py) runs over the training rows that estimate did not drop: never solved,
always solved. Rows outside the estimated pool are kept (no evidence against them). If fewer rows
than one iteration needs are left, the whole split is used: a narrow stream would repeat prompts.

Everything is a function of (seed, iteration, weight version): an estimate made again after a kill
is the same, byte for byte, and so is the stream.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from spotrl.curation.difficulty import estimate_pass_rates, load_estimates, save_estimates, select_informative
from spotrl.rng import derive_numpy_rng
from spotrl.storage.parquet import read_frame
from spotrl.storage.paths import as_path


def estimate_iteration(iteration: int, every: int) -> int:
    """The iteration whose estimate filters `iteration`'s prompts."""
    return 1 + (iteration - 1) // every * every


def estimate_path(run_dir: str | Path, iteration: int) -> Path:
    return as_path(run_dir) / "difficulty" / f"iter_{iteration:06d}.parquet"


def estimated_rows(train: pd.DataFrame, seed: int, prompts: int | None) -> pd.DataFrame:
    """The training rows whose pass rates are estimated: all, or a seeded subset in split order."""
    if prompts is None or prompts >= len(train):
        return train
    chosen = np.sort(derive_numpy_rng(seed, "difficulty-pool").choice(len(train), size=prompts, replace=False))
    return train.iloc[chosen]


def estimate(
    path: Path, rows: pd.DataFrame, make_sampler, samples: int, version: int, batch_size: int
) -> tuple[pd.DataFrame, str]:
    """(estimates, file sha256). An estimate already on disk (written before a kill) is reused: it is
    the one this call would make, and the weights it was made with may be gone. `make_sampler()`
    returns the `sample_rewards` callable; it is only called when an estimate has to be made."""
    if path.exists():
        try:
            frame = load_estimates(path)
            if set(frame["id"]) == set(rows["id"]) and (frame["version"] == version).all():
                return frame, _sha256(path)
        except (OSError, ValueError):
            pass  # unreadable: made again below
    frame = estimate_pass_rates(rows, make_sampler(), samples, version, batch_size=batch_size)
    return frame, save_estimates(path, frame)


def _sha256(path: Path) -> str:
    from spotrl.storage.atomic import sha256_file

    return sha256_file(path)


def stream_pool(
    train_ids, estimates: pd.DataFrame, drop_never: bool, drop_always: bool, min_rows: int
) -> tuple[np.ndarray, dict]:
    """(indices of the training rows the prompt stream draws from, counts)."""
    rows = pd.DataFrame({"id": list(train_ids), "row": np.arange(len(train_ids))})
    kept, counts = select_informative(
        rows, estimates, low=0.0 if drop_never else -1.0, high=1.0 if drop_always else 2.0
    )
    counts = {
        "estimated": len(estimates),
        "never_solved": counts["never"],
        "always_solved": counts["always"],
        "stream_rows": len(kept),
    }
    if len(kept) < min_rows:
        counts.update(stream_rows=len(rows), filter_skipped=True)
        return np.arange(len(rows)), counts
    return kept["row"].to_numpy(np.int64), counts


def estimate_for_iteration(
    run_dir,
    train: pd.DataFrame,
    *,
    iteration: int,
    version: int,
    make_sampler,
    cfg,
    seed: int,
    batch_size: int,
    min_rows: int,
) -> dict:
    """Estimate (or find) the pass rates that filter the stream from `iteration` on, sampling
    `batch_size` prompts at a time; returns the reference the rollouts take: file, sha256, versions
    and the stream's counts."""
    path = estimate_path(run_dir, iteration)
    rows = estimated_rows(train, seed, cfg.prompts)
    estimates, sha256 = estimate(path, rows, make_sampler, cfg.samples, version, batch_size)
    _, counts = stream_pool(train["id"], estimates, cfg.drop_never, cfg.drop_always, min_rows)
    return {"uri": str(path), "sha256": sha256, "iteration": iteration, "weights_version": version, **counts}


def stream_rows(train, ref: dict | None, cfg, min_rows: int) -> np.ndarray:
    """The training rows the prompt stream draws from under a difficulty reference (None: all)."""
    if ref is None:
        return np.arange(len(train))
    estimates = read_frame(ref["uri"], ref["sha256"])
    return stream_pool(train["id"], estimates, cfg.drop_never, cfg.drop_always, min_rows)[0]
