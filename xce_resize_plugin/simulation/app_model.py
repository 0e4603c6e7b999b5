"""ElastiSim application models: the expressions in them and the compute time they give.

An application model's values are numbers or arithmetic expressions over a job's
arguments (:func:`compile_expression`); :class:`ModelEvaluator` walks a model's phases
and tasks to the compute time of one job at a node count. :mod:`.elastisim` says which
parts of a model count and why.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

_TOKEN = re.compile(
    r"\s*(?:(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)|(?P<name>[A-Za-z_]\w*)|(?P<op>[-+*/%^()]))"
)

Env: TypeAlias = Mapping[str, float]
Compiled: TypeAlias = Callable[[Env], float]


class ExprError(ValueError):
    """An expression that does not parse or evaluate; turned into a TraceError."""


def compile_expression(text: str) -> Compiled:
    """Compile an arithmetic expression (numbers, names, ``+ - * / % ^``, parentheses).

    ``^`` is a right-associative power binding tighter than unary minus (``-2^2`` is -4,
    the mathematical reading). ElastiSim's own evaluator knows more (functions,
    comparisons, ``?:``); those raise here, and the example project does not need them.
    Names are looked up in the environment at call time, so one compiled expression
    serves every job.
    """
    try:
        return _ExprParser(text).parse()
    except RecursionError:
        raise ExprError(f"expression nested too deeply: {text[:40]!r}...") from None


def _tokenize(text: str) -> list[tuple[str, str]]:
    """The expression's tokens: ``(kind, text)`` with kind ``num``, ``name`` or ``op``."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    text_end = len(text.rstrip())
    while pos < text_end:
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise ExprError(f"cannot parse {text!r} at {text[pos:].strip()!r}")
        kind = m.lastgroup
        assert kind is not None
        tokens.append((kind, m.group(kind)))
        pos = m.end()
    return tokens


def _binary(op: str, a: Compiled, b: Compiled) -> Compiled:
    """The compiled ``a op b``."""
    if op == "+":
        return lambda env: a(env) + b(env)
    if op == "-":
        return lambda env: a(env) - b(env)
    if op == "*":
        return lambda env: a(env) * b(env)
    if op == "/":
        return lambda env: a(env) / b(env)
    if op == "%":
        return lambda env: math.fmod(a(env), b(env))
    return lambda env: float(a(env) ** b(env))


class _ExprParser:
    """Recursive descent over one expression's tokens, one method per grammar rule::

    expr  = term (("+" | "-") term)*
    term  = unary (("*" | "/" | "%") unary)*
    unary = ("+" | "-") unary | power
    power = atom ("^" unary)?
    atom  = number | name | "(" expr ")"
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.at = 0

    def parse(self) -> Compiled:
        compiled = self.expr()
        if self.at != len(self.tokens):
            raise ExprError(f"unexpected {self.tokens[self.at][1]!r} in {self.text!r}")
        return compiled

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        if self.at >= len(self.tokens):
            raise ExprError(f"unexpected end of {self.text!r}")
        self.at += 1
        return self.tokens[self.at - 1]

    def expr(self) -> Compiled:
        node = self.term()
        while (t := self.peek()) is not None and t[1] in "+-" and t[0] == "op":
            self.take()
            node = _binary(t[1], node, self.term())
        return node

    def term(self) -> Compiled:
        node = self.unary()
        while (t := self.peek()) is not None and t[0] == "op" and t[1] in "*/%":
            self.take()
            node = _binary(t[1], node, self.unary())
        return node

    def unary(self) -> Compiled:
        t = self.peek()
        if t is not None and t[0] == "op" and t[1] in "+-":
            self.take()
            inner = self.unary()
            return (lambda env: -inner(env)) if t[1] == "-" else inner
        return self.power()

    def power(self) -> Compiled:
        base = self.atom()
        t = self.peek()
        if t is not None and t == ("op", "^"):
            self.take()
            return _binary("^", base, self.unary())
        return base

    def atom(self) -> Compiled:
        kind, value = self.take()
        if kind == "num":
            number = float(value)
            return lambda env: number
        if kind == "name":
            text = self.text

            def lookup(env: Env) -> float:
                try:
                    return env[value]
                except KeyError:
                    raise ExprError(f"unknown variable {value!r} in {text!r}") from None

            return lookup
        if value == "(":
            inner = self.expr()
            if self.take() != ("op", ")"):
                raise ExprError(f"missing ')' in {self.text!r}")
            return inner
        raise ExprError(f"unexpected {value!r} in {self.text!r}")


class ModelEvaluator:
    """Compute time of an ElastiSim application model for one job at a node count.

    Compiled expressions are cached by text, so a workload sharing one model compiles
    each expression once.
    """

    def __init__(self, node_flops: float) -> None:
        self.node_flops = node_flops
        self._cache: dict[str, Compiled] = {}

    def value(self, raw: Any, env: Env, what: str) -> float:
        if isinstance(raw, bool):
            raise ExprError(f"{what} is a boolean")
        if isinstance(raw, int | float):
            if not (isinstance(raw, int) or math.isfinite(raw)):
                raise ExprError(f"{what} {raw!r} is not a finite number")
            try:
                return float(raw)
            except OverflowError:
                raise ExprError(f"{what} is too large for a float") from None
        if isinstance(raw, str):
            fn = self._cache.get(raw)
            if fn is None:
                fn = self._cache[raw] = compile_expression(raw)
            try:
                result = fn(env)
            except (ArithmeticError, ValueError, TypeError) as exc:
                if isinstance(exc, ExprError):
                    raise
                raise ExprError(f"{what} {raw!r}: {exc}") from None
            except RecursionError:
                raise ExprError(f"{what}: expression nested too deeply") from None
            if isinstance(result, complex) or not math.isfinite(result):
                raise ExprError(f"{what} {raw!r} is not a finite number")
            return result
        raise ExprError(f"{what} must be a number or an expression, not {raw!r}")

    def seconds(self, model: Mapping[str, Any], env: Env) -> float:
        total = 0.0
        for key in ("on_init", "on_termination"):
            block = model.get(key)
            if block is not None:
                tasks = block.get("tasks", []) if isinstance(block, Mapping) else block
                total += self._tasks(tasks, env)
        phases = model.get("phases")
        if not isinstance(phases, list):
            raise ExprError("application model has no 'phases' list")
        for phase in phases:
            if not isinstance(phase, Mapping):
                raise ExprError("a phase is not an object")
            # The docs give 0 as the default; a phase listed without iterations is
            # meant to run, and the example always sets it, so 1 is the safer reading.
            reps = self.value(phase.get("iterations", 1), env, "phase iterations")
            total += max(reps, 0.0) * self._tasks(phase.get("tasks", []), env)
        return total

    def _tasks(self, tasks: Any, env: Env) -> float:
        if not isinstance(tasks, list):
            raise ExprError("'tasks' is not a list")
        return sum(self._task(t, env) for t in tasks)

    def _task(self, task: Any, env: Env) -> float:
        if not isinstance(task, Mapping):
            raise ExprError("a task is not an object")
        reps = max(self.value(task.get("iterations", 1), env, "task iterations"), 0.0)
        kind = task.get("type")
        if kind == "sequence":
            return reps * self._tasks(task.get("tasks", []), env)
        if kind in ("busy_wait", "idle"):
            return reps * self.value(task.get("delay", 0), env, "delay")
        if kind == "cpu" and "flops" in task:
            raw = task["flops"]
            pattern = task.get("computation_pattern", "uniform")
            if isinstance(raw, list):
                flops = max((self.value(x, env, "flops") for x in raw), default=0.0)
            else:
                flops = self.value(raw, env, "flops")
                if pattern == "total":
                    flops /= env["num_nodes"]
            return reps * flops / self.node_flops
        return 0.0  # I/O, communication and GPU work are not modelled (docstring)
