"""The built-in code problem: generated offline, deterministic, and its reference solutions pass their
tests in the real sandbox (and a wrong one does not)."""

import json

from spotrl.curation.schema import canonical_failures
from spotrl.problems import code as code_problem
from spotrl.rewards.code_tests import plan_tests
from spotrl.rewards.sandbox.runner import Limits, Sandbox
from spotrl.rewards.score import score


def test_splits_are_deterministic_disjoint_and_valid():
    train, held_out = code_problem.make_splits(3, 200, 20)
    again, _ = code_problem.make_splits(3, 200, 20)
    assert train["prompt"].tolist() == again["prompt"].tolist()
    assert not set(train["prompt"]) & set(held_out["prompt"])
    assert len(set(train["prompt"])) == 200
    assert canonical_failures(train) == [] and canonical_failures(held_out) == []
    assert code_problem.make_splits(4, 200, 20)[0]["prompt"].tolist() != train["prompt"].tolist()
    for tests in train["tests"]:
        plan = plan_tests(tests)
        assert plan.tests_total == code_problem.TESTS_PER_PROBLEM and plan.trust == "out-of-process"


def test_reference_solutions_pass_and_wrong_ones_fail_in_the_sandbox():
    train, _ = code_problem.make_splits(0, 300, 10)
    one_per_family = {}
    for tests, meta in zip(train["tests"], train["metadata"]):
        meta = json.loads(meta)
        one_per_family.setdefault(meta["family"], (meta["reference"], tests, meta["entry_point"]))
    assert len(one_per_family) == len(code_problem.FAMILIES)
    completions = [code_problem.completion_text(ref) for ref, _, _ in one_per_family.values()]
    tests = [t for _, t, _ in one_per_family.values()]
    rewards = score("code", completions, [True] * len(tests), tests, workers=2)
    assert rewards.tolist() == [1.0] * len(tests)
    wrong = [f"```python\ndef {name}(*args):\n    return None\n```" for _, _, name in one_per_family.values()]
    assert score("code", wrong, [True] * len(tests), tests, workers=2).tolist() == [0.0] * len(tests)
    example = next(iter(one_per_family.values()))
    result = Sandbox(Limits()).run(example[0], example[1])
    assert result.tests_passed == code_problem.TESTS_PER_PROBLEM
