"""The built-in no-label problem: instances from reasoning-gym's countdown generator, no solution in any
row, warm-start targets that are well-formed expressions over the prompt's numbers and never solutions."""

import json
from fractions import Fraction

import numpy as np
import pytest

from spotrl.config import ConfigError
from spotrl.configs import build_config, load_config, preset_path
from spotrl.problems import get_problem
from spotrl.problems.countdown import prompt_text, random_expression
from spotrl.rewards.rgym import Scorer

SMALL = ["problem.name=countdown", "model.vocab_size=21", "problem.train_size=300", "problem.eval_size=40"]


@pytest.fixture(scope="module")
def config():
    return build_config(None, SMALL + ["eval.prompts=40"])


@pytest.fixture(scope="module")
def records(config):
    (source,) = get_problem("countdown").generated(config.problem, config.seed)
    return source.records


@pytest.fixture(scope="module")
def scorer():
    s = Scorer()
    yield s
    s.close()


def test_generation_is_deterministic_from_the_seed(config, records):
    again = get_problem("countdown").generated(config.problem, config.seed)[0].records
    other = get_problem("countdown").generated(config.problem, config.seed + 1)[0].records
    assert again == records
    assert [r["prompt"] for r in other] != [r["prompt"] for r in records]


def test_prompts_are_compact_and_rows_hold_no_solution(records):
    tokenizer = get_problem("countdown").tokenizer()
    assert {len(r["prompt"]) for r in records} == {len("3 5 7=22")}  # one length: one compiled shape
    for r in records:
        tokenizer.encode(r["prompt"])
        ref = json.loads(r["answer"])
        numbers, target = ref["entry"]["metadata"]["numbers"], ref["entry"]["metadata"]["target"]
        assert r["prompt"] == prompt_text(numbers, target, 9, 99) and numbers == sorted(numbers)
        assert 1 <= target <= 99 and len(numbers) == 3 and all(1 <= n <= 9 for n in numbers)
        assert set(ref["entry"]) == {"question", "metadata"} and set(ref["entry"]["metadata"]) == {"numbers", "target"}
    assert prompt_text([7, 3, 5], 4, 9, 99) == "3 5 7=04" and prompt_text([12, 3], 150, 20, 999) == "03 12=150"


def test_warm_start_targets_are_well_formed_and_never_a_solution(records, scorer):
    """Every target is a format example, not an answer: reasoning-gym's scorer gives each 0.05 (all
    the numbers, each once, parses, wrong value), never 1.0 (correct) or 0.01 (malformed)."""
    problem = get_problem("countdown")
    targets = [problem.target(r["answer"], json.dumps({"format_target": r["format_target"]})) for r in records]
    assert all(isinstance(t, str) and t for t in targets)
    for r, target in zip(records, targets):
        entry = json.loads(r["answer"])["entry"]
        assert scorer.score("countdown", {}, entry, target) == 0.05, (r["prompt"], target)
    assert len(set(targets)) > len(targets) // 2  # drawn, not one fixed expression


def test_random_expression_value_by_hand():
    rng = np.random.default_rng(0)
    for _ in range(200):
        drawn = random_expression(rng, [3, 5, 7])
        if drawn is None:
            continue
        text, value = drawn
        assert sorted(int(c) for c in text if c.isdigit()) == [3, 5, 7]
        # a naive reference evaluation of the same text
        assert Fraction(eval(text.replace("/", "*Fraction(1)/"), {"Fraction": Fraction})) == value  # noqa: S307


def test_curated_splits_are_disjoint_with_a_manifest_and_no_quarantine(config, tmp_path):
    from spotrl.curation.rundata import prepare
    from spotrl.curation.store import load_split

    ref = prepare(config, tmp_path)
    train, held_out = load_split(tmp_path / "data", "train"), load_split(tmp_path / "data", "eval")
    assert len(held_out) == 40 and ref["rows"] == {"train": len(train), "eval": 40}
    assert not set(train["prompt"]) & set(held_out["prompt"])
    assert len(set(train["prompt"])) == len(train)  # duplicates removed (and counted)
    assert ref["curation"]["duplicates"]["exact"] == 340 - len(train) - 40
    # the JSON references hold letters outside the model's alphabet: not a reason to quarantine
    assert ref["curation"]["quarantined"] == 0
    assert all(t is not None for t in train["target"])
    assert (tmp_path / "curation" / "generated" / "countdown.jsonl").exists()


def test_the_preset_selects_the_problem_by_config_alone():
    config = load_config(preset_path("countdown"))
    assert config.problem.name == "countdown" and config.warmstart.target_greedy_accuracy == 1.0
    assert get_problem(config.problem.name).verifier == "reasoning_gym"


@pytest.mark.parametrize(
    "override, key",
    [
        ("problem.countdown.min_value=10", "problem.countdown"),  # > max_value
        ("problem.countdown.numbers=1", "problem.countdown.numbers"),
        ("problem.countdown.min_target=0", "problem.countdown.min_target"),
    ],
)
def test_bad_countdown_config_names_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        build_config(None, SMALL + [override])
    assert f"  {key}" in str(err.value)


def test_a_json_reference_is_not_held_to_the_models_alphabet():
    from spotrl.curation.canonical import canonicalize
    from spotrl.curation.sources import RawSource, SourceSpec

    problem = get_problem("countdown")
    record = {"prompt": "3 5 7=22", "answer": '{"dataset": "countdown"}'}
    raw = RawSource(SourceSpec("g", "g.jsonl"), "jsonl", [(0, record)], [], ["prompt", "answer"], "0")
    good, bad, _ = canonicalize(raw, "answer", problem.alphabet, problem.reference_is_text)
    assert (len(good), len(bad)) == (1, 0)
    good, bad, _ = canonicalize(raw, "answer", problem.alphabet)  # an answer the model writes would be
    assert (len(good), len(bad)) == (0, 1) and "tokenizer alphabet" in bad["reason"][0]
