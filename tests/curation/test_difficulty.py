"""Difficulty curation on a fake policy whose pass rate per prompt is known."""

import numpy as np
import pandas as pd
import pytest

from spotrl.curation.difficulty import (
    estimate_pass_rates,
    load_estimates,
    merge_estimates,
    needs_estimate,
    reestimate,
    save_estimates,
    select_informative,
)

RATES = {"never": 0.0, "always": 1.0, "half": 0.5, "quarter": 0.25, "mostly": 0.9}
ROWS = pd.DataFrame({"id": list(RATES), "prompt": [f"prompt {k}" for k in RATES]})


class FakePolicy:
    """Reward 1 with the prompt's known probability; deterministic per (prompt, call)."""

    def __init__(self, rates, seed=0):
        self.rates, self.seed, self.calls = dict(rates), seed, 0

    def __call__(self, rows: pd.DataFrame, n: int) -> np.ndarray:
        self.calls += 1
        out = []
        for i, row_id in enumerate(rows["id"]):
            rng = np.random.default_rng([self.seed, self.calls, i])
            out.append((rng.random(n) < self.rates[row_id]).astype(np.float32))
        return np.stack(out)


def test_always_and_never_solved_prompts_are_dropped():
    estimates = estimate_pass_rates(ROWS, FakePolicy(RATES), n=64, version=3)
    rate = dict(zip(estimates["id"], estimates["pass_rate"]))
    assert rate["never"] == 0.0 and rate["always"] == 1.0
    for key in ("half", "quarter", "mostly"):
        assert abs(rate[key] - RATES[key]) < 0.15 and 0.0 < rate[key] < 1.0
    assert (estimates["samples"] == 64).all() and (estimates["version"] == 3).all()
    kept, counts = select_informative(ROWS, estimates)
    assert kept["id"].tolist() == ["half", "quarter", "mostly"]
    assert counts == {"never": 1, "always": 1, "unestimated": 0}
    narrower, _ = select_informative(ROWS, estimates, low=0.3, high=0.8)
    assert narrower["id"].tolist() == ["half"]


def test_unestimated_prompts_are_kept():
    estimates = estimate_pass_rates(ROWS.iloc[:2], FakePolicy(RATES), n=8, version=1)
    kept, counts = select_informative(ROWS, estimates)
    assert kept["id"].tolist() == ["half", "quarter", "mostly"] and counts["unestimated"] == 3


def test_reward_threshold_and_batches():
    policy = lambda rows, n: np.full((len(rows), n), 0.6)  # noqa: E731 - partial credit everywhere
    assert (estimate_pass_rates(ROWS, policy, n=4, version=0)["pass_rate"] == 0.0).all()
    assert (estimate_pass_rates(ROWS, policy, n=4, version=0, success_threshold=0.5)["pass_rate"] == 1.0).all()
    fake = FakePolicy(RATES)
    estimate_pass_rates(ROWS, fake, n=4, version=0, batch_size=2)
    assert fake.calls == 3
    with pytest.raises(ValueError, match="shape"):
        estimate_pass_rates(ROWS, lambda rows, n: np.zeros((1, n)), n=4, version=0)


def test_merge_pools_same_version_and_prefers_newer():
    old = pd.DataFrame(
        {"id": ["a", "b"], "samples": [8, 8], "successes": [2, 8], "pass_rate": [0.25, 1.0], "version": [1, 1]}
    )
    same = pd.DataFrame({"id": ["a"], "samples": [8], "successes": [6], "pass_rate": [0.75], "version": [1]})
    newer = pd.DataFrame(
        {"id": ["b", "c"], "samples": [4, 4], "successes": [1, 0], "pass_rate": [0.25, 0.0], "version": [5, 5]}
    )
    late = pd.DataFrame({"id": ["b"], "samples": [100], "successes": [100], "pass_rate": [1.0], "version": [2]})
    merged = merge_estimates(merge_estimates(merge_estimates(old, same), newer), late)
    got = {r.id: (r.samples, r.successes, r.pass_rate, r.version) for r in merged.itertuples()}
    assert got == {"a": (16, 8, 0.5, 1), "b": (4, 1, 0.25, 5), "c": (4, 0, 0.0, 5)}


def test_reestimation_as_the_policy_improves(tmp_path):
    path = tmp_path / "run" / "data" / "difficulty.parquet"
    assert load_estimates(path).empty
    weak = FakePolicy({**RATES, "never": 0.0, "half": 0.0})
    estimates = reestimate(ROWS, load_estimates(path), weak, n=32, version=1)
    save_estimates(path, estimates)
    kept, _ = select_informative(ROWS, load_estimates(path))
    assert "half" not in kept["id"].tolist()  # never solved by the weak policy
    assert needs_estimate(ROWS, load_estimates(path), version=2, max_age=1).empty  # fresh enough
    assert len(needs_estimate(ROWS, load_estimates(path), version=3, max_age=1)) == len(ROWS)
    strong = FakePolicy(RATES, seed=1)
    estimates = reestimate(ROWS, load_estimates(path), strong, n=32, version=3, max_age=1)
    save_estimates(path, estimates)
    kept, _ = select_informative(ROWS, load_estimates(path))
    assert "half" in kept["id"].tolist() and "never" not in kept["id"].tolist()
    assert set(load_estimates(path)["version"]) == {3}
