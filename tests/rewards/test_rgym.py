"""The reasoning_gym verifier: reasoning-gym's own score_answer in a scorer process, full marks -> 1.0;
a scorer that crashes, raises or times out is an error (ScorerError), never a reward of 0."""

import json
import os
import signal

import pytest

from spotrl.rewards.rgym import Scorer, ScorerError, admissible, extract_answer, rgym_reward
from spotrl.rewards.score import score


def countdown_reference(numbers, target, dataset="countdown"):
    entry = {"question": "", "metadata": {"numbers": numbers, "target": target}}
    return json.dumps({"dataset": dataset, "options": {}, "entry": entry})


@pytest.fixture(scope="module")
def scorer():
    s = Scorer()
    yield s
    s.close()


# 3 5 7 = 22: hand-checked
@pytest.mark.parametrize(
    "completion, expected",
    [
        ("3*5+7", 1.0),  # 15 + 7
        ("7+5*3", 1.0),  # another order: many answers are correct
        ("(7-5)*3*5", 0.0),  # 30 != 22
        ("3+5+7", 0.0),  # wrong value (15)
        ("3*5+7+7", 0.0),  # 29, and 7 used twice
        ("7*3+1", 0.0),  # 22, but 1 is not a given number and 5 is unused
        ("3*5", 0.0),  # 15: a number left out
        ("(3*5+7", 0.0),  # malformed
        ("3*+5+7", 1.0),  # 3 * (+5) + 7: the scorer (sympy) accepts a unary plus
        ("", 0.0),
        ("<answer>5*3+7</answer>", 1.0),  # reasoning-gym's answer tags
        ("3**5+7", 0.0),  # ** is not a countdown operator: never reaches the scorer
    ],
)
def test_countdown_answers_scored_by_reasoning_gym(scorer, completion, expected):
    assert rgym_reward(completion, True, countdown_reference([3, 5, 7], 22), scorer) == expected


def test_a_completion_cut_off_scores_zero(scorer):
    assert rgym_reward("3*5+7", False, countdown_reference([3, 5, 7], 22), scorer) == 0.0


def test_the_scorer_is_reasoning_gyms_with_its_partial_scores(scorer):
    entry = {"metadata": {"numbers": [3, 5, 7], "target": 22}}
    # countdown's score_answer: 1.0 correct, 0.05 right numbers / wrong value, 0.01 otherwise
    assert scorer.score("countdown", {}, entry, "3*5+7") == 1.0
    assert scorer.score("countdown", {}, entry, "3+5+7") == 0.05
    assert scorer.score("countdown", {}, entry, "3*5") == 0.05  # numbers differ: also 0.05
    assert scorer.score("countdown", {}, entry, "(3*5+7") == 0.01  # does not parse


def test_answer_extraction_and_guard():
    assert extract_answer(" 1+2 ") == "1+2"
    assert extract_answer("think <answer>1</answer> more <answer> 2 </answer>") == "2"
    assert admissible("countdown", "(1+2)*3") and admissible("chain_sum", "anything at all")
    assert not admissible("countdown", "9**9**9") and not admissible("puzzle24", "__import__('os')")


def test_a_scorer_exception_is_an_error_of_the_reward_stage():
    bad = json.dumps({"dataset": "no_such_dataset", "options": {}, "entry": {}})
    good = countdown_reference([3, 5, 7], 22)
    with pytest.raises(ScorerError, match="no_such_dataset"):
        score("reasoning_gym", ["3*5+7", "1"], [True, True], [good, bad])


def test_a_dead_scorer_process_is_an_error_and_the_next_call_starts_a_new_one():
    scorer = Scorer()
    ref = countdown_reference([3, 5, 7], 22)
    try:
        assert rgym_reward("3*5+7", True, ref, scorer) == 1.0
        (worker,) = scorer._idle
        os.kill(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait()
        with pytest.raises(ScorerError, match="gone|died"):
            rgym_reward("3*5+7", True, ref, scorer)
        assert rgym_reward("3*5+7", True, ref, scorer) == 1.0  # a fresh process
    finally:
        scorer.close()


def test_a_scorer_past_its_time_limit_is_an_error_and_is_killed():
    scorer = Scorer(time_limit_s=1.0)
    ref = countdown_reference([3, 5, 7], 22)
    try:
        assert rgym_reward("3*5+7", True, ref, scorer) == 1.0
        (worker,) = scorer._idle
        os.kill(worker.proc.pid, signal.SIGSTOP)  # a scorer that never answers
        with pytest.raises(ScorerError, match="within 1 s"):
            rgym_reward("3*5+7", True, ref, scorer)
        assert worker.proc.poll() is not None  # killed, not left behind
    finally:
        scorer.close()
