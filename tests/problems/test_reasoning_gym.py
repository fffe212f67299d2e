"""problem.name reasoning_gym: datasets and generator options from the config (checked against
reasoning-gym when the config is built), prompts generated from the run seed, references that
reasoning-gym's own scorer accepts the generator's answers with."""

import json

import pytest

from spotrl.config import ConfigError
from spotrl.configs import build_config
from spotrl.problems import get_problem
from spotrl.rewards.rgym import Scorer, rgym_reward

BASE = ["problem.name=reasoning_gym", "model.vocab_size=100", "problem.train_size=60", "problem.eval_size=12"]
BASE += ["eval.prompts=12"]
DATASETS = (
    "problem.reasoning_gym.datasets=[{name: chain_sum, weight: 2, options: {min_terms: 2, max_terms: 3}}, "
    "{name: leg_counting, weight: 1}, {name: basic_arithmetic}]"
)


@pytest.fixture(scope="module")
def config():
    return build_config(None, BASE + [DATASETS])


def test_generation_is_deterministic_and_split_by_weight(config):
    sources = get_problem("reasoning_gym").generated(config.problem, config.seed)
    again = get_problem("reasoning_gym").generated(config.problem, config.seed)
    other = get_problem("reasoning_gym").generated(config.problem, config.seed + 1)
    assert [s.records for s in sources] == [s.records for s in again]
    assert [s.records for s in sources] != [s.records for s in other]
    # 72 rows at weights 2:1:1, rounded up per dataset
    sizes = [(s.name, len(s.records)) for s in sources]
    assert sizes == [("chain_sum", 36), ("leg_counting", 18), ("basic_arithmetic", 18)]
    for s in sources:
        for r in s.records:
            ref = json.loads(r["answer"])
            assert ref["dataset"] == s.name and r["prompt"] == ref["entry"]["question"]


def test_the_generators_own_answers_get_full_marks_through_the_verifier(config):
    """The reference round-trips through JSON into the scorer process: each entry's answer scores 1.0,
    and another entry's answer (a wrong one, almost always) does not."""
    problem = get_problem("reasoning_gym")
    scorer = Scorer()
    try:
        for source in problem.generated(config.problem, config.seed):
            refs = [r["answer"] for r in source.records[:6]]
            answers = [str(json.loads(ref)["entry"]["answer"]) for ref in refs]
            assert [rgym_reward(a, True, ref, scorer) for a, ref in zip(answers, refs)] == [1.0] * 6
            shifted = answers[1:] + answers[:1]
            wrong = [rgym_reward(a, True, ref, scorer) for a, ref, b in zip(shifted, refs, answers) if a != b]
            assert wrong and set(wrong) == {0.0}
            assert problem.target(refs[0], None) == answers[0]  # the warm start's target: the entry's answer
    finally:
        scorer.close()


def test_curated_into_the_run_with_quarantine_and_manifest(config, tmp_path):
    from spotrl.curation.rundata import prepare
    from spotrl.curation.store import load_split

    ref = prepare(config, tmp_path)
    train, held_out = load_split(tmp_path / "data", "train"), load_split(tmp_path / "data", "eval")
    assert len(held_out) == 12 and not set(train["prompt"]) & set(held_out["prompt"])
    assert ref["rows"]["train"] + 12 + sum(ref["curation"]["duplicates"].values()) <= 72
    assert (tmp_path / "quarantine.parquet").exists() and (tmp_path / "data" / "manifest.json").exists()
    assert {json.loads(a)["dataset"] for a in train["answer"]} == {"chain_sum", "leg_counting", "basic_arithmetic"}


def test_prompts_outside_the_alphabet_are_quarantined(tmp_path):
    from spotrl.storage.parquet import read_frame

    # emoji_mystery's questions hold emoji: the character tokenizer cannot encode them
    config = build_config(None, BASE + ["problem.reasoning_gym.datasets=[{name: emoji_mystery}, {name: chain_sum}]"])
    from spotrl.curation.rundata import prepare

    ref = prepare(config, tmp_path)
    quarantine = read_frame(tmp_path / "quarantine.parquet")
    assert ref["curation"]["quarantined"] == 36 and set(quarantine["source"]) == {"emoji_mystery"}
    assert all("tokenizer alphabet" in reason for reason in quarantine["reason"])


def test_prompts_longer_than_the_context_leaves_are_quarantined(config, tmp_path):
    from spotrl.curation.rundata import prepare
    from spotrl.storage.parquet import read_frame

    records = [r for s in get_problem("reasoning_gym").generated(config.problem, config.seed) for r in s.records]
    tokens = sorted(len(r["prompt"]) + 1 for r in records)  # the built-in tokenizer: BOS + characters
    limit = tokens[len(tokens) // 2]
    context = limit + config.rollout.max_new_tokens
    ref = prepare(build_config(None, BASE + [DATASETS, f"model.max_position_embeddings={context}"]), tmp_path)
    too_long = sum(t > limit for t in tokens)
    assert 0 < too_long and ref["quarantine_reasons"] == {"prompt: too long for the model's context": too_long}
    assert all(
        f"it allows {limit}: model.max_position_embeddings {context}" in reason
        for reason in read_frame(tmp_path / "quarantine.parquet")["reason"]
    )


@pytest.mark.parametrize(
    "datasets, key, message",
    [
        ("[{name: no_such_game}]", "problem.reasoning_gym.datasets.0.name", "no reasoning-gym dataset 'no_such_game'"),
        ("[{name: chain_sum}, {name: chain_sum, options: {bogus: 1}}]", "datasets.1.options", "bogus"),
        ("[{name: chain_sum, options: {min_terms: 5, max_terms: 2}}]", "datasets.0.options", "refuses"),
        ("[{name: chain_sum, options: {seed: 3}}]", "datasets.0.options", "set by the run"),
        ("[]", "problem.reasoning_gym.datasets", "at least one"),
        ("[{name: chain_sum, weight: 0}]", "problem.reasoning_gym.datasets.0.weight", "greater than 0"),
    ],
)
def test_bad_datasets_fail_at_config_time_naming_the_key(datasets, key, message):
    with pytest.raises(ConfigError) as err:
        build_config(None, BASE + [f"problem.reasoning_gym.datasets={datasets}"])
    assert key in str(err.value) and message in str(err.value)
