"""The rows an update trains on: stale rollouts dropped, groups chosen, padded to one fixed shape.

A pure function of the iteration's scored rollouts (one row per completion, `group_size` rows per
prompt in generation order, with `reward` and `weights_version` columns) and a few numbers.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from spotrl.rl.shaping import fill_batch_with_signal


@dataclasses.dataclass(frozen=True)
class TrainingBatch:
    frame: pd.DataFrame  # exactly prompts * group_size rows (unless there were no rows at all)
    real_rows: int  # the rows past this one are padding: no valid token, no advantage
    info: dict  # counts for the metrics: rollouts_dropped_stale, and with dynamic sampling the groups
    warning: str | None = None  # a short batch under dynamic sampling, for the caller to log


def in_generation_order(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The scored shards of an iteration as one frame, in the order the rounds drew their prompts
    (round, the prompt's place in its round, sample), whichever shard sampled them: the shard plan
    changes nothing in the update."""
    frame = pd.concat(frames, ignore_index=True)
    return frame.sort_values(["round", "slot", "sample"], kind="stable", ignore_index=True)


def training_batch(
    frame: pd.DataFrame, iteration: int, *, group_size: int, prompts: int, max_staleness: int, dynamic_sampling: bool
) -> TrainingBatch:
    """The rows to train on at `iteration`, padded with inert rows to `prompts * group_size`.

    Rollouts sampled with weights older than `iteration - 1 - max_staleness` are dropped (the
    schedule never makes them; a bug or a hand-edited run would). With dynamic sampling: the first
    `prompts` groups that have signal; otherwise the first `prompts` groups.
    """
    target_rows = prompts * group_size
    stale = (iteration - 1 - frame["weights_version"].to_numpy()) > max_staleness
    info = {"rollouts_dropped_stale": int(stale.sum())}
    frame = frame[~stale].reset_index(drop=True)
    grouped = frame["reward"].to_numpy().reshape(-1, group_size)
    warning = None
    if dynamic_sampling:
        kept, dropped = fill_batch_with_signal(grouped, prompts)
        info.update(
            groups_generated=len(grouped),
            groups_dropped=dropped,
            groups_trained=len(kept),
            batch_short_groups=prompts - len(kept),
        )
        if len(kept) < prompts:
            warning = (
                f"dynamic sampling: only {len(kept)} of {prompts} groups had signal after {len(grouped)} "
                f"generated; training on {len(kept)} (the rest is padding)"
            )
    else:
        kept = list(range(min(len(grouped), prompts)))
    batch = frame.iloc[[g * group_size + i for g in kept for i in range(group_size)]].reset_index(drop=True)
    real_rows = len(batch)
    if len(batch) < target_rows and len(frame):
        filler = frame.iloc[[0] * (target_rows - len(batch))]  # any row: padding has no valid token and no advantage
        batch = pd.concat([batch, filler], ignore_index=True)
    return TrainingBatch(batch, real_rows, info, warning)
