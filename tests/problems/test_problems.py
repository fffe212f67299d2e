"""The registered problems: each spec is consistent with the tokenizer and verifier it names, and the
config asks the registries for the names it accepts."""

import pytest

from spotrl.config import ConfigError, RunConfig
from spotrl.configs import build_config
from spotrl.model.tokenizers import BucketedCharTokenizer, CharTokenizer
from spotrl.problems import PROBLEMS, Problem, get_problem
from spotrl.registry import registry
from spotrl.rewards.verifiers import VERIFIERS


def test_the_builtin_problems_are_registered():
    assert PROBLEMS.names() == ["arithmetic", "code", "countdown", "math", "reasoning_gym"]
    assert registry("problem") is PROBLEMS
    assert get_problem("code") is PROBLEMS["code"]


@pytest.mark.parametrize("name", ["arithmetic", "code", "countdown", "math", "reasoning_gym"])
def test_problem_spec_is_consistent(name):
    problem = PROBLEMS[name]
    assert isinstance(problem, Problem) and problem.name == name
    tok = problem.tokenizer()
    assert isinstance(tok, problem.tokenizer_class) and isinstance(tok, CharTokenizer)
    assert tok.alphabet == problem.alphabet and tok.vocab_size == len(problem.alphabet) + 3
    assert problem.verifier in VERIFIERS
    assert problem.reference_field in ("answer", "tests")
    if problem.longest_prompt is not None:
        tok.encode(problem.longest_prompt)  # in the alphabet
    if name == "arithmetic":  # the default run's problem fits the default model
        assert tok.vocab_size <= RunConfig().model.vocab_size
        assert type(tok) is CharTokenizer
    elif name == "countdown":  # zero-padded prompts of one length
        assert type(tok) is CharTokenizer and problem.generated is not None
    else:
        assert isinstance(tok, BucketedCharTokenizer)


def test_builtin_splits_and_targets():
    assert PROBLEMS["math"].builtin_splits is None
    cfg = RunConfig().problem.model_copy(update={"train_size": 20, "eval_size": 5})
    for name in ("arithmetic", "code"):
        problem = PROBLEMS[name]
        train, held_out = problem.builtin_splits(cfg, 0)
        assert (len(train), len(held_out)) == (20, 5)
        assert not set(train["prompt"]) & set(held_out["prompt"])
    assert PROBLEMS["arithmetic"].target("357", None) == "753"
    assert PROBLEMS["math"].target("42", "{}") == "42"
    assert PROBLEMS["code"].target(None, '{"reference": "def f():\\n    pass\\n"}').startswith("```python\ndef f()")
    assert PROBLEMS["code"].target(None, "not json") is None


@pytest.mark.parametrize(
    "override, key, known",
    [
        ("problem.name=poetry", "problem.name", "['arithmetic', 'code', 'countdown', 'math', 'reasoning_gym']"),
        ("algorithm.advantage=ppo_v9", "algorithm.advantage", "'gae', 'grpo'"),
        ("algorithm.aggregation=sum", "algorithm.aggregation", "'token_mean'"),
        ("algorithm.kl.estimator=k4", "algorithm.kl.estimator", "['k1', 'k2', 'k3']"),
    ],
)
def test_unknown_registered_name_names_the_key_and_the_known_names(override, key, known):
    with pytest.raises(ConfigError) as err:
        build_config(None, [override])
    assert f"  {key}:" in str(err.value) and "known:" in str(err.value) and known in str(err.value)


def test_registered_names_are_accepted_and_listed_in_the_schema():
    assert build_config(None, ["algorithm.advantage=gae", "algorithm.value.head=shared"]).algorithm.advantage == "gae"
    defs = RunConfig.model_json_schema()["$defs"]
    assert defs["ProblemConfig"]["properties"]["name"]["enum"] == PROBLEMS.names()
    advantages = set(registry("advantage estimator").names()) | set(registry("per-token advantage estimator").names())
    assert set(defs["AlgorithmConfig"]["properties"]["advantage"]["enum"]) == advantages
    assert defs["KLConfig"]["properties"]["estimator"]["enum"] == registry("KL estimator").names()


def test_problem_checks_run_from_the_config():
    with pytest.raises(ConfigError, match="'math' has no built-in prompts"):
        build_config(None, ["problem.name=math"])
    with pytest.raises(ConfigError, match="distinct problems"):
        build_config(None, ["problem.min_digits=1", "problem.max_digits=1", "problem.train_size=100"])
