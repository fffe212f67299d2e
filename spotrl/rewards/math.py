"""Math answers: extract the final answer from a completion, normalise it, compare for equivalence.

    extract_answer("... so the total is \\boxed{\\frac{3}{4}}.")  -> "\\frac{3}{4}"
    equivalent("\\frac{3}{4}", "0.75")                            -> True
    math_reward(completion, stopped, reference)                  -> 1.0 or 0.0

Extraction, in order: the last \\boxed{...} / \\fbox{...} (nested braces), a GSM8K "#### x" line,
the last "answer: x" / "answer is x", else the last number in the text. Only the last candidate
counts, so hedging ("\\boxed{5} or \\boxed{6}") gains nothing.

Equivalence: both sides are normalised (LaTeX fractions, roots, \\cdot, thousands separators,
units and \\text{...}, "x = ", degrees and percent signs, mixed numbers like 2\\frac{1}{2}) and
evaluated with `expr` (no eval): exact rationals compare exactly ("0.5" == "1/2", "0.333" !=
"1/3"); values with sqrt/pi compare within a relative 1e-9, but a decimal answer never matches an
irrational reference ("1.414" != "\\sqrt{2}"); expressions with variables compare at fixed rational
points ("2(x+1)" == "2x+2"). Tuples compare in order, bare comma lists as multisets; anything
that does not parse compares as normalised text ("Yes" == "yes").
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from spotrl.rewards import expr as ex

POINTS = (Fraction(7, 3), Fraction(-5, 2), Fraction(11, 7), Fraction(13, 5), Fraction(-17, 11))
REL_TOL, ABS_TOL = 1e-9, 1e-12
MAX_ANSWER_CHARS = 400

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_ANSWER_IS = re.compile(r"(?i)(?:final\s+answer|answer)\s*(?:is\s*[:=]?|[:=])\s*")


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """The content of the brace group opening at text[start] == '{', and the index after it."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None


def last_boxed(text: str) -> str | None:
    best = None
    for m in re.finditer(r"\\(?:boxed|fbox)\s*", text):
        if m.end() < len(text) and text[m.end()] == "{":
            group = _braced(text, m.end())
            if group is not None:
                best = group[0]
        else:
            tail = re.match(r"\s*([^\s$]+)", text[m.end() :])
            if tail:
                best = tail.group(1)
    return best


def extract_answer(text: str) -> str | None:
    """The final answer in a completion (or a reference solution), or None if there is none."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    hashes = re.findall(r"####\s*([^\n]+)", text)
    if hashes:
        return hashes[-1].strip()
    stated = list(_ANSWER_IS.finditer(text))
    if stated:
        line = text[stated[-1].end() :].split("\n", 1)[0].strip()
        line = re.sub(r"[.\s]+$", "", line)
        if line:
            return line
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


# ------------------------------------------------------------------------------------ normalise

_TEXT_CMDS = r"\\(?:text|textbf|textit|mathrm|mathbf|mathit|operatorname|mbox)\s*"
_UNIT_WORDS = re.compile(r"^(-?[\d.,/]+)\s+(?!(?:pi|sqrt)\b)[a-zA-Z]{2,}\.?(?:\s+[a-zA-Z]{2,}\.?){0,2}$")
_WORD = re.compile(r"[a-zA-Z]{2,}")


def _replace_braced(text: str, command: str, render) -> str:
    """Replace `\\command{a}{b}...` (arity = render's argument count) using `render`."""
    arity = render.__code__.co_argcount
    out, i = [], 0
    pattern = re.compile(command)
    while True:
        m = pattern.search(text, i)
        if not m:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i : m.start()])
        j, args = m.end(), []
        for _ in range(arity):
            while j < len(text) and text[j] == " ":
                j += 1
            if j < len(text) and text[j] == "{":
                group = _braced(text, j)
                if group is None:
                    break
                args.append(group[0])
                j = group[1]
            elif j < len(text) and text[j] != "\\":
                args.append(text[j])  # \frac12
                j += 1
            else:
                break
        if len(args) == arity:
            out.append(render(*args))
        else:
            out.append(text[m.start() : j])
        i = j


def normalise(answer: str) -> str:
    """Canonical text of an answer (LaTeX and notation removed), still a string."""
    s = answer.strip()
    s = s.replace("\\$", "").replace("$", "").strip()
    s = re.sub(r"^\\\(|\\\)$|^\\\[|\\\]$", "", s).strip()
    s = _replace_braced(s, _TEXT_CMDS, lambda a: " " + a + " ")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\(?:left|right|displaystyle)\b", "", s)
    s = re.sub(r"\\[,;:! ]|~", " ", s)
    s = re.sub(r"\^\s*\{?\\circ\}?|°|\\degree", "", s)
    s = re.sub(r"\\?%", "", s)
    s = re.sub(r"(\d)\s*\\frac\s*\{(\d+)\}\s*\{(\d+)\}", r"(\1+\\frac{\2}{\3})", s)  # mixed number 2\frac{1}{2}
    s = _replace_braced(s, r"\\frac", lambda a, b: f"(({a})/({b}))")
    s = _replace_braced(s, r"\\sqrt", lambda a: f"sqrt({a})")
    s = s.replace("\\cdot", "*").replace("\\times", "*").replace("\\div", "/").replace("\\pi", "pi")
    s = re.sub(r"(\d)\s*[eE]([+-]?\d+)\b", r"\1*10^(\2)", s)
    s = s.replace("{", "(").replace("}", ")").replace("\\", "")
    s = re.sub(r"^\s*[a-zA-Z]\s*=\s*(?=\S)", "", s)  # "x = 5" -> "5"
    s = re.sub(r"\s+", " ", s).strip().rstrip(".").strip()
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    unit = _UNIT_WORDS.match(s)
    if unit:  # "5 apples", "12 cm" -> the number
        s = unit.group(1)
        if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
            s = s.replace(",", "")
    return s


# ---------------------------------------------------------------------------------- equivalence


def _split_top(s: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def _structure(s: str):
    """('tuple', items) for '(a, b)', ('interval', brackets, items), ('list', items) for 'a, b', or ('one', s)."""
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and _matching_outer(s):
        inner = _split_top(s[1:-1])
        if len(inner) > 1:
            return ("seq", s[0] + s[-1], inner)
    parts = _split_top(s)
    if len(parts) > 1:
        return ("set", "", parts)
    return ("one", "", [s])


def _matching_outer(s: str) -> bool:
    depth = 0
    for i, ch in enumerate(s):
        depth += ch in "(["
        depth -= ch in ")]"
        if depth == 0 and i < len(s) - 1:
            return False
    return True


def _value(s: str):
    """('num', value, has_decimal) or ('expr', node) or None when `s` is not an expression (a word
    of two or more letters other than sqrt and pi makes it text: "yes", "(A)", "none")."""
    if any(word not in ("sqrt", "pi") for word in _WORD.findall(s)):
        return None
    try:
        node = ex.parse(s)
    except (ex.ExprError, RecursionError):
        return None
    if ex.variables(node):
        return ("expr", node)
    try:
        return ("num", ex.evaluate(node), "." in s)
    except (ex.ExprError, ZeroDivisionError, OverflowError, ValueError, RecursionError):
        return None


def _close(a, b) -> bool:
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        return a == b
    return math.isclose(float(a), float(b), rel_tol=REL_TOL, abs_tol=ABS_TOL)


def _same_scalar(a: str, b: str) -> bool:
    va, vb = _value(a), _value(b)
    if va is None or vb is None:
        return _text(a) == _text(b) and va is None and vb is None
    if va[0] == "num" and vb[0] == "num":
        (_, x, x_dec), (_, y, y_dec) = va, vb
        if isinstance(x, Fraction) != isinstance(y, Fraction) and (x_dec or y_dec):
            return False  # a decimal never equals an irrational (1.414 vs sqrt(2))
        return _close(x, y)
    if va[0] == "expr" and vb[0] == "expr":
        names = sorted(ex.variables(va[1]) | ex.variables(vb[1]))
        checked = 0
        for k in range(len(POINTS)):
            env = {name: POINTS[(k + j) % len(POINTS)] + j for j, name in enumerate(names)}
            try:
                x, y = ex.evaluate(va[1], env), ex.evaluate(vb[1], env)
            except ZeroDivisionError:
                continue
            except (ex.ExprError, OverflowError, ValueError, RecursionError):
                return False
            if not _close(x, y):
                return False
            checked += 1
        return checked >= 2
    return False


def _text(s: str) -> str:
    return re.sub(r"\s+", "", s).lower()


def equivalent(answer: str | None, reference: str | None) -> bool:
    """Whether two extracted answers mean the same value (see the module docstring)."""
    if answer is None or reference is None:
        return False
    if len(answer) > MAX_ANSWER_CHARS or len(reference) > MAX_ANSWER_CHARS:
        return False
    a, b = normalise(answer), normalise(reference)
    if not a or not b:
        return False
    if a == b:
        return True
    sa, sb = _structure(a), _structure(b)
    if sa[0] != sb[0] or len(sa[2]) != len(sb[2]):
        return False
    if sa[0] == "one":
        return _same_scalar(a, b)
    if sa[0] == "seq":
        return sa[1] == sb[1] and all(_same_scalar(x, y) for x, y in zip(sa[2], sb[2]))
    unmatched = list(sb[2])
    for x in sa[2]:
        for i, y in enumerate(unmatched):
            if _same_scalar(x, y):
                del unmatched[i]
                break
        else:
            return False
    return True


def reference_answer(reference: str) -> str:
    """The answer a reference holds: itself, or what it states (a solution with \\boxed or ####)."""
    if "\\boxed" in reference or "\\fbox" in reference or "####" in reference:
        return extract_answer(reference) or reference
    return reference


def math_reward(completion: str, stopped: bool, reference: str) -> float:
    """1.0 when the completion ended by itself and its final answer is equivalent to the reference."""
    if not stopped:
        return 0.0
    return float(equivalent(extract_answer(completion), reference_answer(reference)))
