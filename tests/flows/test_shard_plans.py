"""Any shard plan gives the same run: one shard, or three planned by predicted cost, sample the same
completions and train to the same weights.

The batch shape differs (8 prompts against 3 per shard), and XLA's CPU kernels round a batch of
another size differently in the last bits, so the behaviour logprobs agree to ~1e-6, not bit for bit
(plans over the same shard count are bit-identical: tests/rollout/test_sampler.py)."""

import pandas as pd
import pytest
from support import TINY_OVERRIDES

from spotrl.chaos import strip_timing
from spotrl.configs import build_config
from spotrl.storage.parquet import read_frame
from spotrl.storage.records import read_jsonl
from spotrl.storage.weights import WeightStore

pytestmark = pytest.mark.slow


def _rollouts(run_dir, iteration) -> pd.DataFrame:
    frames = [read_frame(p) for p in sorted((run_dir / "rollouts" / f"iter_{iteration:06d}").glob("rollouts_*"))]
    return pd.concat(frames).sort_values(["round", "slot", "sample"], ignore_index=True)


def test_one_shard_and_three_lpt_shards_give_the_same_rollouts_and_digest(prefect_harness, tmp_path):
    from spotrl.flows.train import train

    # 8 training prompts, all of them every iteration: iteration 2 plans with iteration 1's lengths
    # the sampler's logprobs of one and of three shards differ by ~1e-6 (other batch shapes), so the digest is
    # the plan's only where the trainer rescores the tokens (algorithm.old_logprobs recompute; auto takes them)
    base = TINY_OVERRIDES + ["problem.train_size=8", "eval.prompts=8", "algorithm.old_logprobs=recompute"]
    runs = {}
    for shards in (1, 3):
        config = build_config(None, base + [f"rollout.shards={shards}", "rollout.plan=lpt"])
        train(config=config, run_dir=str(tmp_path / f"s{shards}"))
        runs[shards] = tmp_path / f"s{shards}"
    metrics = {s: read_jsonl(d / "metrics.jsonl") for s, d in runs.items()}
    plan = metrics[3][1]["rollout_plan"][0]
    assert plan["sizes"] == [3, 3, 2] and len(set(plan["predicted_costs"])) > 1
    slots = read_frame(next((runs[3] / "rollouts" / "iter_000002").glob("rollouts_000*")))["slot"].unique()
    assert slots.tolist() != [0, 1, 2]  # not the equal plan's first slice: the prompts moved between shards
    for iteration in (1, 2):
        one, three = _rollouts(runs[1], iteration), _rollouts(runs[3], iteration)
        assert len(one) == 8 * 4
        for column in ("prompt_id", "sample", "completion", "length"):
            assert one[column].tolist() == three[column].tolist(), column
        assert all((a == b).all() for a, b in zip(one["tokens"], three["tokens"], strict=True))
        assert all(abs(a - b).max() < 1e-5 for a, b in zip(one["logprobs"], three["logprobs"], strict=True))
    digests = {s: WeightStore(d / "weights").verified_digest() for s, d in runs.items()}
    assert digests[1] == digests[3]
    for one, three in zip(metrics[1], metrics[3], strict=True):  # the same but for what the logprobs' last bits move
        one, three = strip_timing(one), strip_timing(three)
        assert one.keys() == three.keys()
        for key in one.keys() - {"rollout_plan"}:
            close = isinstance(one[key], float) and one[key] == pytest.approx(three[key], rel=1e-4, abs=1e-5)
            assert close or one[key] == three[key], key
    assert all(0 <= m["timing"]["rollout_idle_fraction"] < 1 for m in metrics[3])
