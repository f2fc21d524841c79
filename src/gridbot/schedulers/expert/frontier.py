"""The Pareto frontier of (makespan, cost), and the best strategy for a utility (ExPERT sections 4.4-4.5).

A strategy is dominated when another is no worse on both metrics and better on one; the frontier is what
no sampled strategy dominates. A utility scores (makespan, cost), lower is better; the ones the paper
marks on its Figure 8 are built in, and a user may write one over `Makespan` and `Cost` with numbers,
+ - * / **, min(...), max(...) and parentheses (parsed here, never given to eval).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import numpy as np
from numpy.typing import ArrayLike, NDArray

from gridbot.errors import GridbotError

Floats = NDArray[np.float64]
Score = Callable[[Floats, Floats], Floats]


class ExpressionError(GridbotError, ValueError):
    """A utility is not one gridbot knows, or its expression is not one it can read."""


def pareto(makespan: ArrayLike, cost: ArrayLike) -> NDArray[np.int64]:
    """Indices of the points no other point dominates, by increasing makespan (equal points all stay)."""
    m, c = np.asarray(makespan, dtype=float), np.asarray(cost, dtype=float)
    if m.shape != c.shape or m.ndim != 1:
        raise ValueError("makespan and cost must be 1-d arrays of the same length")
    order = np.lexsort((c, m))
    sm, sc = m[order], c[order]
    new = np.ones(sm.size, dtype=bool)
    new[1:] = (sm[1:] != sm[:-1]) | (sc[1:] != sc[:-1])
    group = np.cumsum(new) - 1
    firsts = np.flatnonzero(new)
    best_before = np.concatenate(([np.inf], np.minimum.accumulate(sc[firsts])[:-1]))
    keep = sc < best_before[group]
    return np.asarray(order[keep], dtype=np.int64)


def dominating(makespan: ArrayLike, cost: ArrayLike, point: tuple[float, float]) -> NDArray[np.int64]:
    """Indices of the points that dominate `point` = (makespan, cost)."""
    m, c = np.asarray(makespan, dtype=float), np.asarray(cost, dtype=float)
    pm, pc = point
    better = (m <= pm) & (c <= pc) & ((m < pm) | (c < pc))
    return np.asarray(np.flatnonzero(better), dtype=np.int64)


@dataclass(frozen=True)
class Utility:
    """A score of (makespan, cost) arrays, lower is better; infinite where a strategy is out of bounds.
    Ties go to the faster strategy, then the cheaper."""

    name: str
    score: Score
    bounded: bool = False
    """A deadline or a budget: an infinite score means out of bounds (else it means the score is no number)."""

    @classmethod
    def makespan(cls) -> Utility:
        return cls("fastest", lambda m, c: m)

    @classmethod
    def cost(cls) -> Utility:
        return cls("cheapest", lambda m, c: c)

    @classmethod
    def product(cls) -> Utility:
        return cls("makespan x cost", lambda m, c: m * c)

    @classmethod
    def deadline(cls, seconds: float) -> Utility:
        """The cheapest strategy that finishes within `seconds`."""
        return cls(f"cheapest within {seconds:g} s", lambda m, c: np.where(m <= seconds, c, np.inf), True)

    @classmethod
    def budget(cls, amount: float) -> Utility:
        """The fastest strategy that costs at most `amount` per task."""
        return cls(f"fastest within {amount:g} per task", lambda m, c: np.where(c <= amount, m, np.inf), True)

    @classmethod
    def expression(cls, text: str) -> Utility:
        """A user's expression over Makespan and Cost (see the module's docstring); an ExpressionError if it is
        no finite number wherever it is evaluated ('1/0', '10 ** 400', '(-1) ** 0.5'): no strategy would ever
        be chosen by it, which a bag's [strategy] used to accept and the planner to blame on a bound."""
        score = _Parser(text).parse()
        m, c = np.meshgrid(_PROBES, _PROBES)
        with np.errstate(all="ignore"):
            values = np.asarray(score(m.ravel(), c.ravel()), dtype=float)
        if not np.isfinite(values).any():
            raise ExpressionError(f"utility {text!r} is not a finite number at any makespan and cost tried (0 to "
                                  f"1e10; e.g. {NOT_FINITE}); {FINITE_FIX}")
        return cls(text, score)


def utility(spec: str) -> Utility:
    """A utility by name: "makespan", "cost", "product", "deadline:SECONDS", "budget:AMOUNT", or else an
    expression such as "Makespan * Cost ** 2"."""
    name, _, arg = spec.strip().partition(":")
    named: dict[str, Callable[[], Utility]] = {"makespan": Utility.makespan, "cost": Utility.cost,
                                               "product": Utility.product}
    key = name.strip().lower()
    if key in named and not arg:
        return named[key]()
    if key in ("deadline", "budget") and arg:
        try:
            bound = float(arg)
        except ValueError:
            raise ExpressionError(f"utility '{spec}': {key} takes a number, as in '{key}:5000'") from None
        if not (math.isfinite(bound) and bound > 0):  # no strategy meets a bound of 0 or less, NaN compares false
            raise ExpressionError(f"utility '{spec}': {key} takes a finite number above 0, as in '{key}:5000'")
        return Utility.deadline(bound) if key == "deadline" else Utility.budget(bound)
    return Utility.expression(spec)


NOT_FINITE = "a division by zero, a number too large, or a fractional power of a negative number"
"""Why an expression is not a finite number."""
FINITE_FIX = "write one that is, such as 'Makespan * Cost', or name one: makespan, cost or product"
_PROBES = np.array([0.0, 1e-3, 1.0, 60.0, 3600.0, 1e6, 1e8, 1e10])
"""Makespans and costs an expression is tried on when it is read: it must be a finite number at one of them."""


def best(makespan: ArrayLike, cost: ArrayLike, chosen: Utility, among: ArrayLike | None = None) -> int | None:
    """The index of the best point for `chosen` (among `among` if given); None when no score is a finite
    number: no strategy meets the deadline or the budget (`chosen.bounded`), or the expression is infinite
    or NaN at every point ('Makespan / Cost' where every strategy is free)."""
    m, c = np.asarray(makespan, dtype=float), np.asarray(cost, dtype=float)
    idx = np.arange(m.size) if among is None else np.asarray(among, dtype=np.int64)
    if idx.size == 0:
        return None
    with np.errstate(all="ignore"):
        score = np.asarray(chosen.score(m[idx], c[idx]), dtype=float) * np.ones(idx.size)
    score = np.where(np.isnan(score), np.inf, score)
    if not np.isfinite(score).any():
        return None
    pick = np.lexsort((c[idx], m[idx], score))[0]
    return int(idx[pick])


_TOKEN = re.compile(r"\s*(?:(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)|(?P<name>[A-Za-z_]\w*)"
                    r"|(?P<op>\*\*|[-+*/(),]))")
_NAMES = {"makespan": 0, "cost": 1}
_FUNCTIONS: dict[str, Callable[[list[Floats]], Floats]] = {
    "min": lambda xs: np.asarray(np.minimum.reduce(np.broadcast_arrays(*xs))),
    "max": lambda xs: np.asarray(np.maximum.reduce(np.broadcast_arrays(*xs))),
}
_HELP = "use numbers, Makespan, Cost, + - * / **, min(...), max(...) and parentheses"
_MAX_LENGTH = 500
_MAX_DEPTH = 50


class _Parser:
    """Recursive descent over: expr = term {(+|-) term}; term = unary {(*|/) unary};
    unary = (+|-) unary | power; power = atom [** unary]; atom = number | name | func(expr, ...) | (expr)."""

    def __init__(self, text: str) -> None:
        self.text = text
        if len(text) > _MAX_LENGTH:
            raise ExpressionError(f"utility expression is {len(text)} characters long; keep it under {_MAX_LENGTH} "
                                  f"and {_HELP}")
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if match is None or match.end() == pos:
                if text[pos:].strip() == "":
                    break
                col = pos + len(text[pos:]) - len(text[pos:].lstrip())
                self._fail(f"unexpected {text[col]!r} at column {col + 1}")
            kind = match.lastgroup
            assert kind is not None
            self.tokens.append((kind, match.group(kind), match.start(kind)))
            pos = match.end()
        self.i = 0
        self.depth = 0

    def parse(self) -> Score:
        if not self.tokens:
            self._fail("it is empty")
        node = self._expr()
        if self.i < len(self.tokens):
            _, value, col = self.tokens[self.i]
            self._fail(f"unexpected {value!r} at column {col + 1}")
        return node

    def _fail(self, why: str) -> NoReturn:
        raise ExpressionError(f"utility expression {self.text!r}: {why}; {_HELP}")

    def _peek(self) -> str | None:
        return self.tokens[self.i][1] if self.i < len(self.tokens) else None

    def _next(self) -> tuple[str, str, int]:
        if self.i >= len(self.tokens):
            self._fail("it ends too early")
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def _expect(self, op: str) -> None:
        kind, value, col = self._next()
        if value != op or kind != "op":
            self._fail(f"expected {op!r} at column {col + 1}, found {value!r}")

    def _expr(self) -> Score:
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            self._fail(f"it nests deeper than {_MAX_DEPTH}")
        node = self._term()
        while self._peek() in ("+", "-"):
            op = self._next()[1]
            node = _binary(op, node, self._term())
        self.depth -= 1
        return node

    def _term(self) -> Score:
        node = self._unary()
        while self._peek() in ("*", "/"):
            op = self._next()[1]
            node = _binary(op, node, self._unary())
        return node

    def _unary(self) -> Score:
        if self._peek() in ("+", "-"):
            op = self._next()[1]
            self.depth += 1
            if self.depth > _MAX_DEPTH:
                self._fail(f"it nests deeper than {_MAX_DEPTH}")
            inner = self._unary()
            self.depth -= 1
            return inner if op == "+" else _binary("-", lambda m, c: np.zeros_like(m), inner)
        return self._power()

    def _power(self) -> Score:
        node = self._atom()
        if self._peek() == "**":
            self._next()
            node = _binary("**", node, self._unary())
        return node

    def _atom(self) -> Score:
        kind, value, col = self._next()
        if kind == "num":
            number = float(value)
            return lambda m, c: np.full(m.shape, number)
        if kind == "name":
            key = value.lower()
            if key in _NAMES:
                return (lambda m, c: m) if _NAMES[key] == 0 else (lambda m, c: c)
            if key in _FUNCTIONS and self._peek() == "(":
                return self._call(_FUNCTIONS[key])
            self._fail(f"unknown name {value!r} at column {col + 1}")
        if value == "(":
            node = self._expr()
            self._expect(")")
            return node
        self._fail(f"unexpected {value!r} at column {col + 1}")

    def _call(self, fn: Callable[[list[Floats]], Floats]) -> Score:
        self._expect("(")
        args = [self._expr()]
        while self._peek() == ",":
            self._next()
            args.append(self._expr())
        self._expect(")")
        return lambda m, c: fn([a(m, c) for a in args])


def _binary(op: str, left: Score, right: Score) -> Score:
    ops: dict[str, Callable[[Floats, Floats], Floats]] = {
        "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide, "**": np.power}
    fn = ops[op]
    return lambda m, c: np.asarray(fn(left(m, c), right(m, c)), dtype=float)
