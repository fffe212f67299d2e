"""Rollout shards planned by predicted cost, so that no worker idles while another finishes a long tail.

A prompt's predicted cost is its length in tokens plus the completion length expected for it: the
mean length of its own earlier completions if it was sampled before, else the mean over every
completion so far (half of max_new_tokens before the first). The "lpt" plan takes prompts longest
first and gives each to the least-loaded shard that still has room (Graham's LPT rule, with every
shard holding at most ceil(prompts / shards) prompts, the fixed batch shape the sampler compiles
for); "equal" is the plan before costs were known: the prompts in order, in equal slices.

The plan changes where a completion is sampled, never what is sampled: every sample draws from its
own key (rng.rollout_key) and every shard pads to the same shape, so any plan gives the same
rollouts (tests/flows/test_shard_plans.py).

The per-prompt record of completion lengths lives in RUN/lengths/iter_NNNNNN.json, cumulative
through that iteration, rebuilt from the scored shards when missing (after a kill), so a resumed
run plans as an uninterrupted one does.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from spotrl.config import RolloutConfig
from spotrl.storage.atomic import atomic_write_json
from spotrl.storage.parquet import read_frame
from spotrl.storage.paths import AnyPath, as_path
from spotrl.storage.records import read_json
from spotrl.storage.rollouts import iteration_dir

LengthRecord = dict[str, tuple[int, int]]  # prompt id -> (completions seen, their total length)


def shard_capacity(prompts: int, shards: int) -> int:
    """Prompts per shard: every shard's batch is padded to this many, whatever the plan."""
    return -(-prompts // shards)


def equal_plan(costs: Sequence[float], shards: int) -> list[list[int]]:
    """The prompts in order, in slices of equal size (the first ones one larger)."""
    return [part.tolist() for part in np.array_split(np.arange(len(costs)), shards)]


def lpt_plan(costs: Sequence[float], shards: int) -> list[list[int]]:
    """Longest processing time first: by decreasing cost (ties: earlier prompt first), each prompt to
    the shard with the least cost so far (ties: the lower shard) among those with fewer than
    shard_capacity prompts. Each shard lists its prompts in their original order."""
    capacity = shard_capacity(len(costs), shards)
    loads = [(0.0, s) for s in range(shards)]  # a heap of (cost so far, shard) with room left
    plan: list[list[int]] = [[] for _ in range(shards)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, s = heapq.heappop(loads)
        plan[s].append(i)
        if len(plan[s]) < capacity:
            heapq.heappush(loads, (load + costs[i], s))
    return [sorted(part) for part in plan]


PLANS = {"lpt": lpt_plan, "equal": equal_plan}


def predicted_costs(prompt_ids: Sequence[int], prompt_lengths: Sequence[int], record: LengthRecord, default: float):
    """Prompt length + expected completion length of every prompt (see the module's docstring)."""
    seen, total = sum(c for c, _ in record.values()), sum(t for _, t in record.values())
    fallback = total / seen if seen else default
    expected = [record[str(i)][1] / record[str(i)][0] if str(i) in record else fallback for i in prompt_ids]
    return [float(p) + e for p, e in zip(prompt_lengths, expected, strict=True)]


def shard_costs(plan: list[list[int]], costs: Sequence[float]) -> list[float]:
    return [float(sum(costs[i] for i in part)) for part in plan]


def idle_fraction(rounds: Sequence[Sequence[float]]) -> float:
    """1 - busy worker-seconds / held worker-seconds, for rounds that run one after another, each
    holding one worker per shard (busy for that shard's seconds) until its slowest shard is done."""
    held = sum(len(shards) * max(shards) for shards in rounds if shards)
    return 1.0 - sum(map(sum, rounds)) / held if held > 0 else 0.0


def merge_lengths(record: LengthRecord, prompt_ids: Sequence[int], lengths: Sequence[int]) -> LengthRecord:
    """The record with more completions (prompt_ids[k] got one of length lengths[k])."""
    out = dict(record)
    for prompt, length in zip(prompt_ids, lengths, strict=True):
        count, total = out.get(str(prompt), (0, 0))
        out[str(prompt)] = (count + 1, total + int(length))
    return out


def _record_path(run_dir: AnyPath, iteration: int) -> AnyPath:
    return as_path(run_dir) / "lengths" / f"iter_{iteration:06d}.json"


def _load(path: AnyPath) -> LengthRecord:
    return {k: (v[0], v[1]) for k, v in read_json(path, keys=("prompts",))["prompts"].items()}


def length_record(run_dir: AnyPath, through: int) -> LengthRecord:
    """Completion lengths per prompt id over iterations 1..through (scored shards of every round)."""
    if through < 1:
        return {}
    start = through
    while start >= 1 and not _record_path(run_dir, start).exists():
        start -= 1
    record = _load(_record_path(run_dir, start)) if start >= 1 else {}
    for iteration in range(start + 1, through + 1):  # fold in what no record holds yet, and keep it
        scored = sorted(iteration_dir(as_path(run_dir) / "rollouts", iteration).glob("scored_*.parquet"))
        for path in scored:
            frame = read_frame(path)
            record = merge_lengths(record, frame["prompt_id"].tolist(), frame["length"].tolist())
        if not scored:
            continue  # not scored yet (or moved aside as damaged): no record that a later call could not complete
        prompts = {k: list(v) for k, v in sorted(record.items())}
        atomic_write_json(_record_path(run_dir, iteration), {"iteration": iteration, "prompts": prompts})
    return record


def plan_summary(plan: list[list[int]], costs: Sequence[float]) -> dict:
    """The plan as the metrics record it: prompts and predicted cost per shard."""
    return {"sizes": [len(p) for p in plan], "predicted_costs": [round(c, 2) for c in shard_costs(plan, costs)]}


def plan_round(prompts, tokenizer, record: LengthRecord, rollout: RolloutConfig) -> dict:
    """Which of a round's `prompts` (columns id and prompt, in the order their keys follow) each of
    `rollout.shards` shards samples, by `rollout.plan` on their predicted costs; and the length
    every shard pads its prompts to (the round's longest, in tokens)."""
    _, valid = tokenizer.encode_batch_left_padded(list(prompts["prompt"]))
    costs = predicted_costs(prompts["id"], valid.sum(axis=1).tolist(), record, rollout.max_new_tokens / 2)
    plan = PLANS[rollout.plan](costs, rollout.shards)
    return {"shards": plan, "prompt_length": int(valid.shape[1]), **plan_summary(plan, costs)}


def makespan(plan: list[list[int]], costs: Sequence[float]) -> float:
    loads = shard_costs(plan, costs)
    return max(loads) if loads else 0.0
