"""Idle rollout workers with equal shards and with length-aware (LPT) shards, on a long-tailed workload.

    python benchmarks/shard_balance.py [--iterations 20] [--seed 0]

rollout_idle_fraction = 1 - busy worker-seconds / (workers x rollout wall time), one worker per
shard (rollout/shards.py). Two measurements:

(a) synthetic, many workers: a dataset of 512 prompts, each with a typical completion length drawn
    from a Pareto distribution (shape 1.5, minimum 16 tokens, capped at 2048) and prompt lengths of
    20..200 tokens; an iteration takes 64 prompts in a seeded order, and each completion is the
    prompt's typical length times lognormal noise (sigma 0.3). A worker's time is the sum of its
    prompts' costs (prompt + completion tokens): a worker that serves one request at a time, or a
    continuously batching engine. Plans: equal slices in order, and LPT on predicted costs from
    the run's own record (the prompt's earlier mean, else the running mean), as the flow does.
(b) the real sampler: 48 prompts of one long-tailed batch (max new tokens 8 .. 128, a Pareto tail),
    4 samples each, 3 shards; a shard samples its prompts one group at a time with that prompt's
    max_new_tokens and no stop token, so a prompt's cost is its length limit. Each shard's
    generation time is measured alone (two cores cannot run three workers side by side), and the
    idle fraction is what three workers running them side by side would have. Iteration 1 plans
    without a record (prompt lengths only), iteration 2 with iteration 1's lengths.

Prints a table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from spotrl.rollout.shards import PLANS, idle_fraction, merge_lengths, predicted_costs, shard_costs


def synthetic(iterations: int, shards: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    dataset, per_iteration = 512, 64
    typical = np.minimum(16 * (1 + rng.pareto(1.5, dataset)), 2048)
    prompt_len = rng.integers(20, 200, dataset)
    out = {}
    for name, plan_fn in PLANS.items():
        record, idle, wall, busy = {}, [], 0.0, 0.0
        for iteration in range(iterations):
            ids = np.random.default_rng([seed, iteration]).choice(dataset, per_iteration, replace=False)
            actual = typical[ids] * np.random.default_rng([seed, iteration, 1]).lognormal(0, 0.3, per_iteration)
            predicted = predicted_costs(ids.tolist(), prompt_len[ids].tolist(), record, default=64.0)
            plan = plan_fn(predicted, shards)
            loads = shard_costs(plan, (prompt_len[ids] + actual).tolist())
            idle.append(idle_fraction([loads]))
            wall, busy = wall + max(loads), busy + sum(loads)
            record = merge_lengths(record, ids.tolist(), np.round(actual).astype(int).tolist())
        out[name] = {"idle_fraction_mean": float(np.mean(idle)), "wall_tokens": wall, "busy_tokens": busy}
    return out


def real_sampler(seed: int) -> dict:
    import jax
    from flax import nnx

    from spotrl.config import ModelConfig
    from spotrl.model.transformer import Transformer
    from spotrl.rollout.sampler import SamplingParams, generate_groups

    cfg = ModelConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_layers=4, num_heads=4, num_kv_heads=2)
    graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(seed)
    prompts, group, shards = 48, 4, 3
    buckets = np.array([8, 16, 32, 64, 128])
    # a long tail: most prompts stop early, a few run to 64 or 128 tokens
    limits = buckets[np.minimum(np.floor(rng.pareto(1.2, prompts)).astype(int), len(buckets) - 1)]
    tokens = rng.integers(2, cfg.vocab_size, (prompts, 16)).astype(np.int32)
    valid = np.ones_like(tokens, bool)

    def params(new):
        return SamplingParams(max_new_tokens=int(new), stop_token=cfg.vocab_size, temperature=1.0)

    def sample(i):
        key = jax.random.key(i)
        out = generate_groups(graphdef, state, tokens[i : i + 1], valid[i : i + 1], key, params(limits[i]), group)
        return jax.block_until_ready(out)

    for b in buckets:  # compile every length limit once, outside the timings
        out = generate_groups(graphdef, state, tokens[:1], valid[:1], jax.random.key(0), params(b), group)
        jax.block_until_ready(out)

    def shard_seconds(part):
        started = time.perf_counter()
        for i in part:
            sample(i)
        return time.perf_counter() - started

    out = {"limits": limits.tolist()}
    for name, plan_fn in PLANS.items():
        record, rounds = {}, []
        for _iteration in (1, 2):
            costs = predicted_costs(list(range(prompts)), [16] * prompts, record, default=64.0)
            plan = plan_fn(costs, shards)
            seconds = [shard_seconds(part) for part in plan]
            rounds.append({"idle_fraction": idle_fraction([seconds]), "wall_s": max(seconds), "busy_s": sum(seconds)})
            ids = [i for i in range(prompts) for _ in range(group)]
            record = merge_lengths(record, ids, [int(limits[i]) for i in ids])
        out[name] = rounds
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    figures = {"synthetic": {}, "real_sampler": real_sampler(args.seed)}
    print("(a) synthetic Pareto workload, 64 prompts per iteration, mean over iterations")
    print(f"{'workers':>8} {'idle equal':>11} {'idle lpt':>9} {'wall lpt / equal':>17}")
    for shards in (4, 8, 16, 32):
        s = figures["synthetic"][shards] = synthetic(args.iterations, shards, args.seed)
        ratio = s["lpt"]["wall_tokens"] / s["equal"]["wall_tokens"]
        idle = {name: s[name]["idle_fraction_mean"] for name in PLANS}
        print(f"{shards:>8} {idle['equal']:>11.3f} {idle['lpt']:>9.3f} {ratio:>17.3f}")
    r = figures["real_sampler"]
    print("(b) the real sampler, 48 prompts x 4 samples, 3 shards (iteration 1: no record; 2: with one)")
    print(f"{'plan':>6} {'iteration':>9} {'idle':>6} {'wall s':>7} {'busy s':>7}")
    for name in PLANS:
        for iteration, round_ in enumerate(r[name], 1):
            idle, wall, busy = round_["idle_fraction"], round_["wall_s"], round_["busy_s"]
            print(f"{name:>6} {iteration:>9} {idle:>6.3f} {wall:>7.2f} {busy:>7.2f}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
