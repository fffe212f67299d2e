"""Math answers: extraction, a table of equivalent and non-equivalent answers, the judge process's
time limit and failures, reward composition with format terms gated by correctness."""

import os
import signal
import sys

import pytest

from spotrl.rewards.compose import Term, boxed_format, compose, length_overflow, stopped_format
from spotrl.rewards.math import MathJudgeError, MathJudges, equivalent, extract_answer, math_reward, reference_answer
from spotrl.rewards.score import score
from spotrl.rewards.verifiers import get_verifier

EQUIVALENT = [
    ("\\frac{3}{4}", "0.75"),
    ("3/4", "0.75"),
    ("\\dfrac12", "0.5"),
    ("\\tfrac{1}{2}", "1/2"),
    ("-\\frac{1}{2}", "-0.5"),
    ("\\frac{-1}{2}", "-1/2"),
    ("\\frac{6}{8}", "\\frac{3}{4}"),
    ("1,000", "1000"),
    ("1,234,567.5", "1234567.5"),
    ("12", "12.00"),
    ("6", "6.0"),
    ("0", "-0"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("\\sqrt{4}", "2"),
    ("\\sqrt2", "\\sqrt{2}"),
    ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}"),
    ("2\\pi", "\\pi \\cdot 2"),
    ("2\\pi", "2pi"),
    ("10^{3}", "1000"),
    ("2^{-1}", "0.5"),
    ("1e3", "1000"),
    ("x = 5", "5"),
    ("5 apples", "5"),
    ("12\\text{ cm}", "12"),
    ("50\\%", "50"),
    ("90^\\circ", "90"),
    ("\\$5", "5"),
    ("$\\frac{1}{3}$", "\\frac13"),
    ("\\left( 1, 2 \\right)", "(1,2)"),
    ("2\\frac{1}{2}", "5/2"),
    ("2(x+1)", "2x+2"),
    ("x^2-1", "(x-1)(x+1)"),
    ("3x", "x \\times 3"),
    ("\\frac{x}{2}", "0.5x"),
    ("1, 2", "2, 1"),
    ("(1, 2)", "(1,2)"),
    ("Yes", "yes"),
    ("\\text{(A)}", "(A)"),
    ("3 \\div 4", "0.75"),
]

NOT_EQUIVALENT = [
    ("0.333", "1/3"),
    ("1.414", "\\sqrt{2}"),
    ("3.14159", "\\pi"),
    ("7", "-7"),
    ("x+1", "x+2"),
    ("x", "y"),
    ("(1, 2)", "(2, 1)"),
    ("[1, 2)", "[1, 2]"),
    ("1, 2", "1, 2, 3"),
    ("2^{10000}", "1"),
    ("12", "1.2"),
    ("yes", "no"),
    ("", "0"),
    ("5", "5x"),
    ("\\frac{1}{2}", "\\frac{1}{3}"),
    ("1000", "1,000,1"),
]


@pytest.mark.parametrize("answer, reference", EQUIVALENT)
def test_equivalent_answers(answer, reference):
    assert equivalent(answer, reference) and equivalent(reference, answer)


@pytest.mark.parametrize("answer, reference", NOT_EQUIVALENT)
def test_non_equivalent_answers(answer, reference):
    assert not equivalent(answer, reference) and not equivalent(reference, answer)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so \\boxed{\\frac{1}{\\sqrt{2}}} done", "\\frac{1}{\\sqrt{2}}"),
        ("\\boxed{\\{1, 2\\}} was my first guess but it is \\boxed{{a}^{b}}", "{a}^{b}"),  # nested braces, the last box
        ("\\boxed{\\{1, 2\\}} and \\boxed{{a}^{b}}", "\\{1, 2\\},{a}^{b}"),  # boxes joined by "and": one answer
        ("\\boxed{5} or maybe \\boxed{6}", "5,6"),  # hedging: the set {5, 6}, equal to neither
        ("\\fbox{7}", "7"),
        ("\\boxed 7", "7"),
        ("Natalia sold 48/2 = 24 clips.\n#### 72", "72"),
        ("The answer is 42.", "42"),
        ("Final answer: x = 3\nThanks", "3"),  # math_verify reads the value of "x = 3"
        ("answer: -2.5", "-2.5"),
        ("I think it is 3, no, 5", "5"),
        ("costs $1,250 in total", "1250"),  # and writes numbers without separators
        ("no number here", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_notation_is_read_through():
    # was test_normalise_examples (the hand-written normaliser's output text): the same three answers
    assert equivalent("\\dfrac{1}{2}", "0.5")
    assert equivalent("$1,000$", "1000")
    assert equivalent("x = \\sqrt{3}", "\\sqrt{3}")


def test_reward_needs_the_stop_token_and_reads_references_with_solutions():
    completion = "We add them: 3 + 4 = 7. So the answer is \\boxed{7}."
    assert math_reward(completion, True, "7") == 1.0
    assert math_reward(completion, False, "7") == 0.0  # cut off: not a finished answer
    assert math_reward(completion, True, "She has 3 + 4 = 7 apples.\n#### 7") == 1.0
    assert reference_answer("\\boxed{\\frac12}") == "\\frac12" and reference_answer("0.5") == "0.5"
    assert math_reward("no answer", True, "7") == 0.0
    assert math_reward("\\boxed{5} or maybe \\boxed{6}", True, "6") == 0.0  # a hedge gains nothing
    assert math_reward("\\boxed{5} or maybe \\boxed{6}", True, "5") == 0.0


def test_evaluator_is_bounded():
    for text in ("9^9^9^9", "2^100000", "(" * 300 + "1" + ")" * 300, "x" * 1000):
        assert not equivalent(text, "1")  # refused or compared within the time limit
    assert not equivalent("__import__('os')", "1")  # read as LaTeX, never run


def test_an_answer_past_the_time_limit_scores_zero_and_the_judge_goes_on():
    judges = MathJudges(time_limit_s=1.0, grace_s=5.0)
    try:
        # sympy works without end on this one (> 290 s measured without a limit)
        assert math_reward("\\boxed{10^{10^{10}}}", True, "1", judges) == 0.0
        assert judges.timeouts == 1
        assert math_reward("\\boxed{7}", True, "7", judges) == 1.0  # the same judge, still answering
    finally:
        judges.close()


def test_a_silent_judge_is_killed_and_a_dead_one_replaced():
    judges = MathJudges(time_limit_s=1.0, grace_s=0.5)
    try:
        assert math_reward("\\boxed{7}", True, "7", judges) == 1.0
        (judge,) = judges._idle
        os.kill(judge.proc.pid, signal.SIGSTOP)  # alive, answers nothing: what a judge stuck in C code looks like
        assert math_reward("\\boxed{7}", True, "7", judges) == 0.0 and judges.timeouts == 1
        assert judge.proc.poll() is not None and judges._idle == []  # killed, not reused
        assert math_reward("\\boxed{7}", True, "7", judges) == 1.0  # a fresh judge
        (judge,) = judges._idle
        judge.proc.kill()
        judge.proc.wait()
        assert math_reward("\\boxed{7}", True, "7", judges) == 1.0  # died between calls: replaced, retried
    finally:
        judges.close()


def test_a_judge_that_cannot_start_is_an_error_not_a_zero(monkeypatch):
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with pytest.raises(MathJudgeError, match="did not start"):
        math_reward("\\boxed{7}", True, "7", MathJudges())


def test_registry_and_score_use_the_math_verifier():
    assert get_verifier("math")("\\boxed{0.5}", True, "\\frac{1}{2}") == 1.0
    rewards = score("math", ["\\boxed{1/2}", "\\boxed{2}", "1/2"], [True, True, False], ["0.5"] * 3, workers=2)
    assert rewards.tolist() == [1.0, 0.0, 0.0]


# ---------------------------------------------------------------------------------- composition


def test_format_reward_only_counts_when_correct():
    reward = compose(math_reward, [Term("boxed", boxed_format, 0.2), Term("stopped", stopped_format, 0.1)])
    assert reward("so \\boxed{7}", True, "7") == pytest.approx(1.3)
    assert reward("so 7", True, "7") == pytest.approx(1.1)  # correct, unboxed
    assert reward("so \\boxed{8}", True, "7") == 0.0  # well formatted and wrong: nothing
    assert reward("so \\boxed{7}", False, "7") == 0.0  # cut off
    parts = reward.breakdown("so \\boxed{7}", True, "7")
    assert parts == pytest.approx({"correct": 1.0, "boxed": 0.2, "stopped": 0.1, "total": 1.3})


def test_ungated_terms_can_only_take_away():
    with pytest.raises(ValueError, match="farmed"):
        compose(math_reward, [Term("boxed", boxed_format, 0.5, gated=False)])
    reward = compose(math_reward, [Term("length", length_overflow(20), -0.5, gated=False)])
    long_wrong = "so \\boxed{8}" + " padding" * 10
    assert reward(long_wrong, True, "7") == pytest.approx(-0.5 * (len(long_wrong) - 20) / 20)
    assert reward("so \\boxed{7}", True, "7") == 1.0
    sneaky = compose(math_reward, [Term("bonus", lambda c, s, r: -1.0, -1.0, gated=False)])  # -1 * -1 = +1
    assert sneaky("wrong", True, "7") == 0.0  # clipped: an ungated term never adds


def test_weights_scale_each_part():
    reward = compose(math_reward, [Term("boxed", boxed_format, 0.5)], correctness_weight=2.0)
    assert reward("\\boxed{7}", True, "7") == pytest.approx(2.5)
    with pytest.raises(ValueError):
        compose(math_reward, [Term("a", boxed_format, 1.0), Term("a", stopped_format, 1.0)])
