"""A small, safe evaluator for answer expressions: no eval, bounded work, exact where it can be.

Grammar (after `spotrl.rewards.math.normalise` has turned LaTeX into this):

    expr  := term (('+' | '-') term)*
    term  := unary (('*' | '/') unary | unary)*        # juxtaposition multiplies: 2pi, 3(x+1), 2sqrt(2)
    unary := ('+' | '-') unary | power
    power := atom (('**' | '^') unary)?
    atom  := NUMBER | NAME | NAME '(' expr ')' | '(' expr ')'

Numbers are exact (`Fraction`: "0.5" is 1/2). `sqrt` of a perfect square stays exact; `sqrt(2)`, `pi`
and `e` make the value inexact (a float). Exponents must be integers of at most MAX_EXPONENT in
magnitude (fractional ones go through floats), and results are capped in size, so no input can make
the verifier run long or allocate much. Any other single letter is a variable.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

MAX_LENGTH = 400
MAX_EXPONENT = 512
MAX_BITS = 4096
FUNCTIONS = {"sqrt"}
CONSTANTS = {"pi": math.pi, "e": math.e}
_TOKEN = re.compile(r"\s*(?:(\d+\.\d*|\.\d+|\d+)|(\*\*|[-+*/^()])|([A-Za-z]+))")


class ExprError(ValueError):
    """Not an expression this evaluator understands (the caller falls back to text comparison)."""


Number = Fraction | float


@dataclass(frozen=True)
class Node:
    op: str  # "num", "var", "const", "neg", "+", "-", "*", "/", "**", "sqrt"
    args: tuple = ()
    value: Fraction | None = None
    name: str = ""


def parse(text: str) -> Node:
    if len(text) > MAX_LENGTH:
        raise ExprError("expression too long")
    tokens, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ExprError(f"unexpected {text[pos : pos + 10]!r}")
        pos = m.end()
        number, op, name = m.groups()
        if number is not None:
            tokens.append(("num", number))
        elif op is not None:
            tokens.append(("op", "**" if op == "^" else op))
        else:
            tokens.extend(_split_name(name))
    parser = _Parser(tokens)
    node = parser.expr()
    if parser.i != len(tokens):
        raise ExprError(f"unexpected {tokens[parser.i][1]!r}")
    return node


def _split_name(name: str) -> list[tuple[str, str]]:
    """'sqrt' and 'pi' are names; any other run of letters is a product of one-letter variables ('xy')."""
    out, i = [], 0
    while i < len(name):
        for word in ("sqrt", "pi"):
            if name.startswith(word, i):
                out.append(("name", word))
                i += len(word)
                break
        else:
            out.append(("name", name[i]))
            i += 1
    return out


class _Parser:
    def __init__(self, tokens):
        self.tokens, self.i = tokens, 0

    def peek(self):
        return self.tokens[self.i] if self.i < len(self.tokens) else (None, None)

    def take(self, kind=None, value=None):
        tok = self.peek()
        if tok[0] is None or (kind and tok[0] != kind) or (value and tok[1] != value):
            raise ExprError(f"expected {value or kind}, got {tok[1]!r}")
        self.i += 1
        return tok

    def expr(self):
        node = self.term()
        while self.peek() in (("op", "+"), ("op", "-")):
            op = self.take()[1]
            node = Node(op, (node, self.term()))
        return node

    def term(self):
        node = self.unary()
        while True:
            tok = self.peek()
            if tok in (("op", "*"), ("op", "/")):
                self.take()
                node = Node(tok[1], (node, self.unary()))
            elif tok[0] in ("num", "name") or tok == ("op", "("):
                node = Node("*", (node, self.power()))  # juxtaposition
            else:
                return node

    def unary(self):
        tok = self.peek()
        if tok in (("op", "-"), ("op", "+")):
            self.take()
            inner = self.unary()
            return Node("neg", (inner,)) if tok[1] == "-" else inner
        return self.power()

    def power(self):
        base = self.atom()
        if self.peek() == ("op", "**"):
            self.take()
            return Node("**", (base, self.unary()))
        return base

    def atom(self):
        kind, value = self.peek()
        if kind == "num":
            self.take()
            return Node("num", value=Fraction(value))
        if kind == "name":
            self.take()
            if value in FUNCTIONS:
                if self.peek() == ("op", "("):
                    self.take()
                    arg = self.expr()
                    self.take("op", ")")
                else:
                    arg = self.power()
                return Node(value, (arg,))
            if value in CONSTANTS:
                return Node("const", name=value)
            return Node("var", name=value)
        if (kind, value) == ("op", "("):
            self.take()
            node = self.expr()
            self.take("op", ")")
            return node
        raise ExprError(f"unexpected {value!r}")


def variables(node: Node) -> set[str]:
    if node.op == "var":
        return {node.name}
    out = set()
    for arg in node.args:
        out |= variables(arg)
    return out


def evaluate(node: Node, env: dict[str, Fraction] | None = None) -> Number:
    """The value of `node` (Fraction when exact, float otherwise); ZeroDivisionError propagates."""
    env = env or {}
    op = node.op
    if op == "num":
        return node.value
    if op == "var":
        if node.name not in env:
            raise ExprError(f"free variable {node.name}")
        return env[node.name]
    if op == "const":
        return CONSTANTS[node.name]
    if op == "neg":
        return -evaluate(node.args[0], env)
    if op == "sqrt":
        return _sqrt(evaluate(node.args[0], env))
    a, b = evaluate(node.args[0], env), evaluate(node.args[1], env)
    if op == "+":
        out = a + b
    elif op == "-":
        out = a - b
    elif op == "*":
        out = a * b
    elif op == "/":
        if b == 0:
            raise ZeroDivisionError("division by zero")
        out = a / b
    else:
        out = _power(a, b)
    return _bounded(out)


def _bounded(x: Number) -> Number:
    if isinstance(x, Fraction) and (x.numerator.bit_length() > MAX_BITS or x.denominator.bit_length() > MAX_BITS):
        raise ExprError("number too large")
    if isinstance(x, float) and not math.isfinite(x):
        raise ExprError("not a finite number")
    return x


def _power(a: Number, b: Number) -> Number:
    if isinstance(b, Fraction) and b.denominator == 1:
        if abs(b.numerator) > MAX_EXPONENT:
            raise ExprError("exponent too large")
        if isinstance(a, Fraction) and a.numerator.bit_length() * abs(b.numerator) > MAX_BITS * 2:
            raise ExprError("power too large")
        if a == 0 and b < 0:
            raise ZeroDivisionError("0 to a negative power")
        return a ** int(b)
    if isinstance(b, Fraction) and b.denominator == 2 and isinstance(a, Fraction):
        return _power(_sqrt(a), Fraction(b.numerator))
    if a < 0:
        raise ExprError("fractional power of a negative number")
    try:
        return float(a) ** float(b)
    except OverflowError:
        raise ExprError("number too large") from None


def _sqrt(x: Number) -> Number:
    if x < 0:
        raise ExprError("square root of a negative number")
    if isinstance(x, Fraction):
        n, d = math.isqrt(x.numerator), math.isqrt(x.denominator)
        if n * n == x.numerator and d * d == x.denominator:
            return Fraction(n, d)
    return math.sqrt(x)
