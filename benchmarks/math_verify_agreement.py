"""The math verifier on math_verify against the hand-written one it replaced: agreement and time per call.

    python benchmarks/math_verify_agreement.py [--record]

Generates answer pairs (completion, reference) deterministically: integers, fractions, decimals,
LaTeX \\frac / \\sqrt / \\pi, intervals, sets and tuples, percentages, units and text around
answers, \\boxed{} vs "answer:" vs the last number, wrong answers, near misses, malformed
answers. Each pair carries what a careful grader says (`truth`: True, False, or None where the
field has no single convention); the script prints the agreement rate of the two verifiers, every
disagreement with the verdict of each and which one the grader sides with, each verifier's
accuracy on the pairs with a truth, the time per call (median, p99) of both, and one JSON line.

The old verifier (spotrl/rewards/math.py and expr.py at OLD_COMMIT) is loaded from git into a
temporary module. Where git or that commit is not at hand, its verdicts come from
benchmarks/data/math_verify_old_verdicts.json (written by `--record`), with no old timings.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import subprocess
import sys
import time
import types
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spotrl.rewards import math_judge  # noqa: E402
from spotrl.rewards.math import default_judges, math_reward  # noqa: E402

OLD_COMMIT = "9df5ac5eca80ae56fba4d7baa054c024c90c47cd"  # the last commit with the hand-written verifier
RECORD = ROOT / "benchmarks" / "data" / "math_verify_old_verdicts.json"


def load_old_verifier():
    """The old `math_reward`, from git at OLD_COMMIT, or None."""

    def show(path: str) -> str:
        return subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{OLD_COMMIT}:{path}"], check=True, capture_output=True, text=True
        ).stdout

    try:
        expr_src, math_src = show("spotrl/rewards/expr.py"), show("spotrl/rewards/math.py")
    except (OSError, subprocess.CalledProcessError):
        return None
    expr = types.ModuleType("old_expr")
    sys.modules["old_expr"] = expr  # dataclasses look the module up while the class is built
    exec(compile(expr_src, "old_expr.py", "exec"), expr.__dict__)
    line = "from spotrl.rewards import expr as ex"
    assert line in math_src
    old = types.ModuleType("old_math")
    old.__dict__["ex"] = expr
    exec(compile(math_src.replace(line, ""), "old_math.py", "exec"), old.__dict__)
    return old.math_reward


# ------------------------------------------------------------------------------------- the pairs


def _dec(x: Fraction) -> str | None:
    """The exact decimal of x when it has one with at most 6 places."""
    for places in range(7):
        scaled = x * 10**places
        if scaled.denominator == 1:
            s = f"{abs(scaled.numerator):0{places + 1}d}"
            body = s if places == 0 else s[:-places] + "." + s[-places:]
            return ("-" if x < 0 else "") + body
    return None


WRAPS = (
    lambda a: f"Adding the parts gives the result. So the answer is \\boxed{{{a}}}.",
    lambda a: f"We check 3 cases first.\nAnswer: {a}",
    lambda a: f"After 2 steps, the final answer is {a}.",
    lambda a: f"First 12 + 7 = 19, then it works out to ${a}$.",
    lambda a: f"Step 1 uses 4 items; in the end we get {a}",
)


def generate() -> list[dict]:
    rng = random.Random(20)
    pairs: list[dict] = []

    def add(kind, completion, reference, truth):
        pairs.append({"kind": kind, "completion": completion, "reference": reference, "truth": truth})

    def wrap(a):
        return rng.choice(WRAPS)(a)

    for _ in range(30):  # integers
        n = rng.choice([rng.randint(0, 99), rng.randint(100, 99999), -rng.randint(1, 500)])
        add("int", wrap(str(n)), str(n), True)
        add("int/zero-decimals", f"\\boxed{{{n}.0}}", str(n), True)
        add("int/wrong", wrap(str(n + rng.choice([-1, 1, 10]))), str(n), False)
        if abs(n) >= 1000:
            add("int/separators", f"The total is \\boxed{{{n:,}}}.", str(n), True)
    for _ in range(25):  # fractions
        b = rng.randint(2, 12)
        a = rng.choice([k for k in range(1, 3 * b) if Fraction(k, b).denominator == b])
        x = Fraction(a, b)
        ref = f"\\frac{{{a}}}{{{b}}}"
        add("frac/slash", wrap(f"{a}/{b}"), ref, True)
        add("frac/dfrac", f"\\boxed{{\\dfrac{{{a}}}{{{b}}}}}", ref, True)
        add("frac/unreduced", f"\\boxed{{\\frac{{{2 * a}}}{{{2 * b}}}}}", ref, True)
        d = _dec(x)
        if d:
            add("frac/exact-decimal", wrap(d), ref, True)
        else:
            add("frac/rounded-decimal", wrap(f"{float(x):.3f}"), ref, False)  # a near miss
        add("frac/inverted", f"\\boxed{{\\frac{{{b}}}{{{a}}}}}", ref, x == 1 / x)
    for _ in range(15):  # decimals as references
        x = Fraction(rng.randint(1, 99), rng.choice([4, 5, 8, 20, 25]))
        d = _dec(x)
        add("dec/fraction", f"\\boxed{{\\frac{{{x.numerator}}}{{{x.denominator}}}}}", d, True)
        add("dec/trailing-zero", wrap(d + "0" if "." in d else d + ".00"), d, True)
        add("dec/near-miss", wrap(_dec(x + Fraction(1, 100))), d, False)
    for k in range(2, 8):  # roots and pi
        add("sqrt/simplified", f"\\boxed{{\\sqrt{{{k * k * 2}}}}}", f"{k}\\sqrt{{2}}", True)
        add("sqrt/no-braces", f"\\boxed{{{k}\\sqrt2}}", f"{k}\\sqrt{{2}}", True)
        add("sqrt/rounded", f"\\boxed{{{k * 2**0.5:.3f}}}", f"{k}\\sqrt{{2}}", None)  # approximations: graders differ
        add("sqrt/wrong", f"\\boxed{{{k}\\sqrt{{3}}}}", f"{k}\\sqrt{{2}}", False)
        add("pi/frac", f"\\boxed{{\\frac{{{k}\\pi}}{{3}}}}", f"\\frac{{{k}}}{{3}}\\pi", True)
        add("pi/ascii", f"the answer is {k}pi", f"{k}\\pi", True)
        add("pi/rounded", f"\\boxed{{{k * 3.14159:.4f}}}", f"{k}\\pi", None)
        add("pi/wrong", f"\\boxed{{{k + 1}\\pi}}", f"{k}\\pi", False)
    for _ in range(10):  # intervals
        a, b = sorted(rng.sample(range(-9, 10), 2))
        add("interval/spacing", f"\\boxed{{[{a},{b})}}", f"[{a}, {b})", True)
        add("interval/left-right", f"\\boxed{{\\left[{a}, {b}\\right)}}", f"[{a}, {b})", True)
        add("interval/closed-vs-open", f"\\boxed{{[{a}, {b}]}}", f"[{a}, {b})", False)
        add("interval/infinity", f"\\boxed{{(-\\infty, {b}]}}", f"(-\\infty, {b}]", True)
        add("interval/wrong-end", f"\\boxed{{(-\\infty, {b + 1}]}}", f"(-\\infty, {b}]", False)
    for _ in range(12):  # sets and tuples
        items = rng.sample(range(1, 20), 3)
        shuffled = rng.sample(items, 3)
        add(
            "set/order",
            f"\\boxed{{\\{{{', '.join(map(str, shuffled))}\\}}}}",
            f"\\{{{', '.join(map(str, items))}\\}}",
            True,
        )
        add("list/order", f"\\boxed{{{', '.join(map(str, shuffled))}}}", ", ".join(map(str, items)), True)
        add(
            "set/missing",
            f"\\boxed{{\\{{{', '.join(map(str, items[:2]))}\\}}}}",
            f"\\{{{', '.join(map(str, items))}\\}}",
            False,
        )
        add("tuple/same", f"\\boxed{{({items[0]}, {items[1]})}}", f"({items[0]},{items[1]})", True)
        add("tuple/swapped", f"\\boxed{{({items[1]}, {items[0]})}}", f"({items[0]},{items[1]})", False)
    for _ in range(10):  # percentages
        p = rng.randint(1, 99)
        add("pct/sign", wrap(f"{p}\\%"), str(p), True)
        add("pct/plain-sign", f"The rate rose by {p}%.", f"{p}\\%", True)
        add("pct/as-fraction", f"\\boxed{{{_dec(Fraction(p, 100))}}}", f"{p}\\%", None)  # 0.25 for 25%: graders differ
        add("pct/wrong", wrap(f"{p + 1}\\%"), f"{p}\\%", False)
    for _ in range(10):  # units and text around answers
        n = rng.randint(2, 90)
        add("units/word", f"She has {n} apples left.", str(n), True)
        add("units/text", f"\\boxed{{{n}\\text{{ cm}}}}", str(n), True)
        add("units/dollar", f"It costs \\boxed{{\\${n}}}.", str(n), True)
        add("units/degree", f"\\boxed{{{n}^\\circ}}", str(n), True)
        add("units/wrong", f"\\boxed{{{n + 2}\\text{{ cm}}}}", str(n), False)
    for _ in range(15):  # where the answer is, with other numbers around it
        n, m = rng.randint(10, 99), rng.randint(100, 999)
        add(
            "where/boxed-then-number", f"\\boxed{{{n}}} (checked with {m} trials)", str(n), None
        )  # which one is "final"
        add("where/answer-then-text", f"Answer: {n}. It took {m} tries.", str(n), True)
        add("where/last-number", f"We had {m}, then removed some, leaving {n}", str(n), True)
        add("where/gsm8k-reference", f"So she has \\boxed{{{n}}} marbles.", f"She had {m} ... \n#### {n}", True)
        add("where/hedge", f"\\boxed{{{n}}} or \\boxed{{{n + 1}}}", str(n + 1), False)  # a hedge is no answer
    for k in range(1, 6):  # expressions with variables
        add("expr/expanded", f"\\boxed{{{k}x+{k}}}", f"{k}(x+1)", True)
        add("expr/factored", f"\\boxed{{(x-{k})(x+{k})}}", f"x^2-{k * k}", True)
        add("expr/wrong", f"\\boxed{{x+{k + 1}}}", f"x+{k}", False)
        add("expr/equation", f"\\boxed{{y = {k}x + 1}}", f"{k}x+1", True)
    for ref, good, bad in [("Yes", "yes", "no"), ("(A)", "\\text{(A)}", "(B)"), ("B", "\\textbf{B}", "C")]:
        add("text/same", f"\\boxed{{{good}}}", ref, True)
        add("text/wrong", f"\\boxed{{{bad}}}", ref, False)
    for n in (1500, 2000, 3.5e4):  # scientific notation
        add("sci/e", f"\\boxed{{{n:.1e}}}", str(int(n)), True)
        add("sci/times", f"\\boxed{{{n / 1000:g} \\times 10^{{3}}}}", str(int(n)), True)
    for text in [
        "\\boxed{",
        "\\boxed{}",
        "\\frac{1}{",
        "answer:",
        "}{",
        "",
        "\\sqrt{}",
        "2^",
        "½",
        "((((",
        "The answer is \\boxed{5",
        "x" * 500,
    ]:
        add("malformed", text, "5", False)
    return pairs


# ------------------------------------------------------------------------------------ measuring


def timed(fn, pairs) -> tuple[list[float], list[float]]:
    verdicts, seconds = [], []
    for p in pairs:
        start = time.perf_counter()
        verdicts.append(float(fn(p["completion"], True, p["reference"])))
        seconds.append(time.perf_counter() - start)
    return verdicts, seconds


def stats(seconds: list[float]) -> dict:
    s = sorted(seconds)
    return {"median_ms": round(1e3 * statistics.median(s), 3), "p99_ms": round(1e3 * s[int(0.99 * (len(s) - 1))], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true", help=f"write the old verdicts to {RECORD.name}")
    args = parser.parse_args()
    pairs = generate()
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its note that its own alarm is off (ours is on)
    old_reward = load_old_verifier()
    if old_reward is not None:
        old, old_s = timed(old_reward, pairs)
        if args.record:
            RECORD.parent.mkdir(exist_ok=True)
            RECORD.write_text(json.dumps({"commit": OLD_COMMIT, "pairs": len(pairs), "verdicts": old}) + "\n")
    else:
        recorded = json.loads(RECORD.read_text())
        if recorded["pairs"] != len(pairs):
            sys.exit(f"{RECORD} holds {recorded['pairs']} verdicts for {len(pairs)} pairs: re-record with git at hand")
        old, old_s = recorded["verdicts"], None
        print(f"old verdicts from {RECORD} (git commit {OLD_COMMIT[:9]} not at hand: no old timings)")

    default_judges().call("reward", "\\boxed{1}", "1")  # start the judge process: not a per-call cost
    new, new_s = timed(math_reward, pairs)
    _, inproc_s = timed(lambda c, s, r: math_judge.reward(c, r), pairs)  # math_verify here, without the process hop

    agree = sum(a == b for a, b in zip(old, new))
    print(f"{len(pairs)} pairs; old and new agree on {agree} ({agree / len(pairs):.1%})\n")
    print("disagreements (kind | completion | reference | old | new | grader sides with):")
    sides = {"new": 0, "old": 0, "neither (no single convention)": 0}
    for p, a, b in zip(pairs, old, new):
        if a != b:
            side = "neither (no single convention)" if p["truth"] is None else "new" if b == p["truth"] else "old"
            sides[side] += 1
            print(f"  {p['kind']} | {p['completion']!r} | {p['reference']!r} | {a:g} | {b:g} | {side}")
    graded = [(p, a, b) for p, a, b in zip(pairs, old, new) if p["truth"] is not None]
    old_acc = sum(a == p["truth"] for p, a, _ in graded) / len(graded)
    new_acc = sum(b == p["truth"] for p, _, b in graded) / len(graded)
    print(f"\naccuracy against the grader on {len(graded)} pairs with a truth: old {old_acc:.1%}, new {new_acc:.1%}")
    wrong_new = [(p, b) for p, _, b in graded if b != p["truth"]]
    for p, b in wrong_new:
        print(f"  new wrong: {p['kind']} | {p['completion']!r} | {p['reference']!r} | new {b:g}")

    figures = {
        "pairs": len(pairs),
        "agree": agree,
        "agreement": round(agree / len(pairs), 4),
        "disagreements_new_right": sides["new"],
        "disagreements_old_right": sides["old"],
        "disagreements_no_convention": sides["neither (no single convention)"],
        "old_accuracy": round(old_acc, 4),
        "new_accuracy": round(new_acc, 4),
        "new_call": stats(new_s),
        "new_in_process_call": stats(inproc_s),
    }
    if old_s is not None:
        figures["old_call"] = stats(old_s)
        figures["new_vs_old_median"] = round(statistics.median(new_s) / statistics.median(old_s), 1)
    print(
        "\ntime per call: "
        + (
            f"old median {figures['old_call']['median_ms']} ms, p99 {figures['old_call']['p99_ms']} ms; "
            if old_s
            else ""
        )
        + f"new median {figures['new_call']['median_ms']} ms, p99 {figures['new_call']['p99_ms']} ms "
        + f"(math_verify in this process, no judge process: median {figures['new_in_process_call']['median_ms']} ms, "
        + f"p99 {figures['new_in_process_call']['p99_ms']} ms)"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
