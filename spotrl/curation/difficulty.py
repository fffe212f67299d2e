"""Difficulty curation with the current policy: pass rates from n samples per prompt.

A prompt the policy always solves, or never solves, gives a group-relative method (GRPO and its
kin) no signal: every sample of its group gets the same reward, so its advantages are zero. These
functions estimate each prompt's pass rate from `n` samples, drop the uninformative prompts, keep
the estimates as parquet (in the run directory) and re-estimate the stale ones as the policy moves.

They take a callable instead of a policy, so they do not depend on the train flow:

    sample_rewards(rows: DataFrame, n: int) -> array of shape (len(rows), n)   # rewards in [0, 1]

Estimates carry the weight `version` they were made with. Merging keeps the newer version's
estimate of a prompt, and pools the samples of two estimates made with the same version.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from spotrl.storage.parquet import read_frame, write_frame
from spotrl.storage.paths import as_path

ESTIMATE_COLUMNS = ["id", "samples", "successes", "pass_rate", "version"]
SampleRewards = Callable[[pd.DataFrame, int], np.ndarray]


def empty_estimates() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": pd.Series([], dtype=object),
            "samples": pd.Series([], dtype=np.int64),
            "successes": pd.Series([], dtype=np.int64),
            "pass_rate": pd.Series([], dtype=np.float64),
            "version": pd.Series([], dtype=np.int64),
        }
    )


def estimate_pass_rates(
    rows: pd.DataFrame,
    sample_rewards: SampleRewards,
    n: int,
    version: int,
    success_threshold: float = 1.0,
    batch_size: int | None = None,
) -> pd.DataFrame:
    """Pass rate of each row's prompt: the fraction of `n` samples whose reward >= `success_threshold`."""
    if n < 1:
        raise ValueError(f"need at least one sample per prompt, got n={n}")
    if rows.empty:
        return empty_estimates()
    batch_size = batch_size or len(rows)
    parts = []
    for start in range(0, len(rows), batch_size):
        chunk = rows.iloc[start : start + batch_size]
        rewards = np.asarray(sample_rewards(chunk, n), dtype=np.float64)
        if rewards.shape != (len(chunk), n):
            raise ValueError(f"sample_rewards returned shape {rewards.shape}, expected {(len(chunk), n)}")
        parts.append((rewards >= success_threshold).sum(axis=1))
    successes = np.concatenate(parts).astype(np.int64)
    return pd.DataFrame(
        {
            "id": rows["id"].astype(object).to_numpy(),
            "samples": np.full(len(rows), n, np.int64),
            "successes": successes,
            "pass_rate": successes / n,
            "version": np.full(len(rows), version, np.int64),
        }
    )[ESTIMATE_COLUMNS]


def merge_estimates(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """Per id: the estimate of the newer version; two of the same version pool their samples."""
    both = pd.concat([old[ESTIMATE_COLUMNS], new[ESTIMATE_COLUMNS]], ignore_index=True)
    if both.empty:
        return empty_estimates()
    newest = both.groupby("id", sort=False)["version"].transform("max")
    current = both[both["version"] == newest]
    merged = current.groupby(["id", "version"], sort=False, as_index=False)[["samples", "successes"]].sum()
    merged["pass_rate"] = merged["successes"] / merged["samples"]
    return merged[ESTIMATE_COLUMNS].sort_values("id", kind="stable").reset_index(drop=True)


def needs_estimate(rows: pd.DataFrame, estimates: pd.DataFrame, version: int, max_age: int = 0) -> pd.DataFrame:
    """Rows without an estimate, or whose estimate is more than `max_age` versions older than `version`."""
    made = dict(zip(estimates["id"], estimates["version"]))
    stale = [made.get(i) is None or made[i] < version - max_age for i in rows["id"]]
    return rows[np.array(stale, dtype=bool)]


def reestimate(
    rows: pd.DataFrame,
    estimates: pd.DataFrame,
    sample_rewards: SampleRewards,
    n: int,
    version: int,
    max_age: int = 0,
    **kw,
) -> pd.DataFrame:
    """`estimates` with the stale rows (see `needs_estimate`) estimated again at `version`."""
    todo = needs_estimate(rows, estimates, version, max_age)
    return merge_estimates(estimates, estimate_pass_rates(todo, sample_rewards, n, version, **kw))


def select_informative(
    rows: pd.DataFrame, estimates: pd.DataFrame, low: float = 0.0, high: float = 1.0
) -> tuple[pd.DataFrame, dict[str, int]]:
    """(rows whose pass rate is strictly between `low` and `high`, or not yet estimated;
    {"never": ..., "always": ..., "unestimated": ...}). The defaults drop exactly the prompts never
    solved (rate 0) and always solved (rate 1)."""
    rate = rows["id"].map(dict(zip(estimates["id"], estimates["pass_rate"])))
    never = (rate <= low).fillna(False).to_numpy(bool)
    always = (rate >= high).fillna(False).to_numpy(bool)
    counts = {"never": int(never.sum()), "always": int(always.sum()), "unestimated": int(rate.isna().sum())}
    return rows[~(never | always)].reset_index(drop=True), counts


def save_estimates(path: str | Path, estimates: pd.DataFrame) -> str:
    """Write atomically; returns the file's sha256."""
    return write_frame(path, estimates[ESTIMATE_COLUMNS].reset_index(drop=True))


def load_estimates(path: str | Path) -> pd.DataFrame:
    """The saved estimates, or none yet."""
    if not as_path(path).exists():
        return empty_estimates()
    frame = read_frame(path)
    missing = set(ESTIMATE_COLUMNS) - set(frame.columns)
    if missing:
        raise ValueError(f"{path}: not a pass-rate estimates file (missing {sorted(missing)})")
    return frame[ESTIMATE_COLUMNS]
