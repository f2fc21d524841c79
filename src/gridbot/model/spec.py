"""Bag specifications: the TOML a user writes, validated into a `BagSpec`, and the plan it expands to.

A sweep is never expanded into stored parameter sets: job `i` of a cartesian product is computed from
`i` alone (`BagSpec.params`), so a ten-million-job bag costs one spec, not ten million dictionaries.
Ranges use decimal arithmetic, so `from = 0.1, step = 0.1` yields `0.3`, not `0.30000000000000004`.
Everything here is pure: the caller reads files and passes their text.
"""

from __future__ import annotations

import difflib
import re
import string
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from math import prod
from typing import Any

import msgspec

DEFAULT_MAX_FAILURES = 3
DEFAULT_INSTANCE_DEADLINE = 24 * 3600.0
DEFAULT_MAX_JOBS = 10_000_000
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
PARAM_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
TOP_KEYS = (
    "name",
    "description",
    "command",
    "parameters",
    "env",
    "inputs",
    "outputs",
    "max_failures",
    "instance_deadline",
    "timeout",
    "policy",
)
RANGE_KEYS = ("from", "to", "step")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class Parameter(msgspec.Struct, frozen=True):
    """One axis of the sweep: an explicit list of values, or an inclusive range `start..stop by step`."""

    name: str
    values: list[str] | None = None
    start: str | None = None
    stop: str | None = None
    step: str | None = None

    def __len__(self) -> int:
        if self.values is not None:
            return len(self.values)
        assert self.start is not None and self.stop is not None and self.step is not None
        return _range_len(self.start, self.stop, self.step)

    def value_of(self) -> Callable[[int], str]:
        """`value` as a function with the parameter's kind settled once (integer ranges are the common case)."""
        if self.values is not None:
            return self.values.__getitem__
        assert self.start is not None and self.step is not None
        ints = _whole(self.start, self.step)
        if ints is not None:
            first, step = ints
            return lambda i: str(first + step * i)
        return self.value

    def value(self, i: int) -> str:
        """The i-th value, rendered as it appears in commands."""
        if self.values is not None:
            return self.values[i]
        assert self.start is not None and self.step is not None
        ints = _whole(self.start, self.step)
        if ints is not None:
            return str(ints[0] + ints[1] * i)
        return _render_decimal(Decimal(self.start) + Decimal(self.step) * i)


def _plain_template(command: str) -> tuple[str, str, str] | None:
    """(text before, field name, text after) when `command` has exactly one plain `{name}` field, or
    (command, "", "") when it has none and no escaped braces."""
    try:
        parts = list(string.Formatter().parse(command))
    except ValueError:
        return None
    fields = [p for p in parts if p[1] is not None]
    if not fields and "{" not in command and "}" not in command:
        return command, "", ""
    if len(fields) != 1 or fields[0][2] or fields[0][3] or not fields[0][1] or not fields[0][1].isidentifier():
        return None
    if any(("{" in p[0] or "}" in p[0]) for p in parts):
        return None  # escaped braces: leave them to format_map
    i = parts.index(fields[0])
    head = "".join(p[0] for p in parts[: i + 1])
    tail = "".join(p[0] for p in parts[i + 1:])
    return head, fields[0][1], tail


@lru_cache(maxsize=4096)
def _range_len(start: str, stop: str, step: str) -> int:
    """Values of the inclusive range; cached, since every job's parameters need it."""
    span = (Decimal(stop) - Decimal(start)) / Decimal(step)
    return max(0, int(span.to_integral_value(rounding="ROUND_FLOOR")) + 1)


@lru_cache(maxsize=4096)
def _whole(start: str, step: str) -> tuple[int, int] | None:
    """(start, step) as integers when both are whole numbers, for exact and quick rendering."""
    a, b = Decimal(start), Decimal(step)
    if a == a.to_integral_value() and b == b.to_integral_value():
        return int(a), int(b)
    return None


class BagSpec(msgspec.Struct, frozen=True):
    """A validated bag: what to run, over which parameters, and how to treat its failures.

    `each_line` bags have no template: every job carries its own shell command (one line of a file).
    """

    name: str
    command: str = ""
    parameters: list[Parameter] = msgspec.field(default_factory=list)
    env: dict[str, str] = msgspec.field(default_factory=dict)
    inputs: list[str] = msgspec.field(default_factory=list)
    outputs: list[str] = msgspec.field(default_factory=list)
    max_failures: int = DEFAULT_MAX_FAILURES
    instance_deadline: float = DEFAULT_INSTANCE_DEADLINE
    timeout: float | None = None
    each_line: bool = False
    description: str = ""
    policy: dict[str, str] = msgspec.field(default_factory=dict)
    """ClassAd policies by name (JobRequirements, Rank, ...); validated by gridbot.policy, not here."""

    @property
    def sweep_size(self) -> int:
        """Number of jobs of a parameter sweep (1 for a command with no parameters)."""
        return prod(len(p) for p in self.parameters) if self.parameters else 1

    def params(self, index: int) -> dict[str, str]:
        """Parameter values of job `index` of the cartesian product (the first parameter varies slowest)."""
        out: dict[str, str] = {}
        for p in reversed(self.parameters):
            index, i = divmod(index, len(p))
            out[p.name] = p.value(i)
        return dict(reversed(out.items()))

    def render(self, index: int, line: str | None = None) -> tuple[str, dict[str, str], list[str]]:
        """Command, environment and output names of job `index` (`line` is its command in each-line bags)."""
        return self.renderer()(index, line)

    def renderer(self) -> Callable[[int, str | None], tuple[str, dict[str, str], list[str]]]:
        """`render` with the per-bag work done once: the dispatcher keeps one per bag and calls it for every
        job it sends, where looking up each parameter's size and kind again cost more than the job."""
        if self.each_line:
            env, outputs = self.env, self.outputs
            return lambda index, line: (line or "", dict(env), list(outputs))
        axes = [(p.name, f"GRIDBOT_PARAM_{p.name.upper()}", len(p), p.value_of()) for p in reversed(self.parameters)]
        axes.reverse()
        sizes = [n for _, _, n, _ in axes]
        command, env_t, outputs_t = self.command, self.env, self.outputs
        plain = _plain_template(command)
        if len(axes) == 1 and not env_t and not outputs_t and plain is not None and plain[1] in ("", axes[0][0]):
            # the common sweep: one parameter, in the command or only in the environment, nothing else
            head, field, tail = plain
            key, value = axes[0][1], axes[0][3]

            def render_one(index: int, line: str | None = None) -> tuple[str, dict[str, str], list[str]]:
                v = value(index)
                return (head + v + tail if field else command), {key: v}, []

            return render_one

        def render(index: int, line: str | None = None) -> tuple[str, dict[str, str], list[str]]:
            picks = []
            for n in reversed(sizes):
                index, i = divmod(index, n)
                picks.append(i)
            picks.reverse()
            values = {name: value(i) for (name, _, _, value), i in zip(axes, picks, strict=True)}
            env = {k: v.format_map(values) for k, v in env_t.items()} if env_t else {}
            for (name, key, _, _) in axes:
                env[key] = values[name]
            return command.format_map(values), env, [o.format_map(values) for o in outputs_t]

        return render


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec: where, what, and what to do about it."""

    message: str
    line: int | None = None
    hint: str = ""

    def format(self, source: str) -> str:
        where = f"{source}:{self.line}" if self.line else source
        return f"{where}: {self.message}" + (f"\n  hint: {self.hint}" if self.hint else "")


class SpecError(ValueError):
    """A bag spec that cannot be accepted; `problems` lists every defect found, in file order."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = sorted(problems, key=lambda p: p.line or 0)
        super().__init__("\n".join(p.format(source) for p in self.problems))


def parse_duration(value: object) -> float:
    """Seconds from `90`, `90.5`, `"90s"`, `"10m"`, `"2h"` or `"1d"`; raise ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '90s', '10m', '2h', '1d'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", value)):
        seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    else:
        raise ValueError("a duration is a number of seconds or a string like '90s', '10m', '2h', '1d'")
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    return seconds


def parse_spec(text: str, source: str, default_name: str, max_jobs: int = DEFAULT_MAX_JOBS) -> BagSpec:
    """Validate the TOML `text` of a spec (read from `source`) into a BagSpec, or raise SpecError."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"line (\d+)", str(e))
        hint = "check quotes, brackets and '=' signs on that line; strings need double quotes"
        raise SpecError(source, [Problem(f"TOML syntax error: {e}", int(m.group(1)) if m else None, hint)]) from e
    return _Validator(text, source, max_jobs).bag(data, default_name)


def each_line_spec(name: str, max_failures: int = DEFAULT_MAX_FAILURES) -> BagSpec:
    """The spec of an each-line bag: every job is one shell command of its own."""
    return BagSpec(name=name, each_line=True, max_failures=max_failures)


def parse_lines(text: str, source: str, max_jobs: int = DEFAULT_MAX_JOBS) -> list[str]:
    """Commands of an each-line file: one shell command per non-blank line."""
    lines = [ln.strip() for ln in text.splitlines()]
    commands = [ln for ln in lines if ln]
    if not commands:
        raise SpecError(source, [Problem("the file has no commands", None, "write one shell command per line")])
    if len(commands) > max_jobs:
        raise SpecError(
            source,
            [Problem(f"{len(commands):,} commands exceed the limit of {max_jobs:,} jobs per bag", None,
                     "split the file into several bags, or raise the limit with --max-jobs")],
        )
    return commands


def placeholders(template: str) -> list[str]:
    """Names of the `{name}` placeholders in `template`; raise ValueError on other format syntax."""
    names = []
    for _, field, spec, conv in string.Formatter().parse(template):
        if field is None:
            continue
        if spec or conv or not PARAM_RE.match(field):
            raise ValueError(f"'{{{field}{'!' + conv if conv else ''}{':' + spec if spec else ''}}}' is not a "
                             "placeholder; write {name} for a parameter, and {{ or }} for a literal brace")
        names.append(field)
    return names


def _render_decimal(d: Decimal) -> str:
    text = format(d.normalize(), "f") if d != d.to_integral_value() else str(int(d))
    return text


def closest(word: str, candidates: list[str] | tuple[str, ...]) -> str:
    """'did you mean X?' for the candidate closest to a misspelt `word`, or ''."""
    match = difflib.get_close_matches(word, list(candidates), n=1)
    return f"did you mean '{match[0]}'?" if match else ""


class _Validator:
    """Collects every problem of one spec, each with the line of the key it concerns."""

    def __init__(self, text: str, source: str, max_jobs: int) -> None:
        self.lines = key_lines(text)
        self.source = source
        self.max_jobs = max_jobs
        self.problems: list[Problem] = []

    def fail(self, path: tuple[str, ...], message: str, hint: str = "") -> None:
        line = None
        for n in range(len(path), 0, -1):
            if (line := self.lines.get(path[:n])) is not None:
                break
        self.problems.append(Problem(message, line, hint))

    def bag(self, data: dict[str, Any], default_name: str) -> BagSpec:
        for key in data:
            if key not in TOP_KEYS:
                self.fail((key,), f"unknown key '{key}'",
                          closest(key, TOP_KEYS) or f"known keys: {', '.join(TOP_KEYS)}")
        name = self.string(data, "name", default_name)
        if not NAME_RE.match(name):
            self.fail(("name",), f"bag name '{name}' is not allowed",
                      "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
        command = self.string(data, "command", "")
        if "command" not in data:
            self.fail((), "the spec has no 'command'", 'add a line like: command = "./simulate --seed {seed}"')
        raw_parameters = data.get("parameters", {})
        parameters = self.parameters(raw_parameters)
        names = list(raw_parameters) if isinstance(raw_parameters, dict) else []
        env = self.env(data.get("env", {}))
        outputs = self.string_list(data, "outputs")
        inputs = self.string_list(data, "inputs")
        self.check_templates(("command",), [command], names)
        self.check_templates(("env",), list(env.values()), names)
        self.check_templates(("outputs",), outputs, names)
        self.check_paths(inputs, outputs)
        spec = BagSpec(
            name=name,
            command=command,
            parameters=parameters,
            env=env,
            inputs=inputs,
            outputs=outputs,
            max_failures=self.positive_int(data, "max_failures", DEFAULT_MAX_FAILURES),
            instance_deadline=self.duration(data, "instance_deadline") or DEFAULT_INSTANCE_DEADLINE,
            timeout=self.duration(data, "timeout"),
            description=self.string(data, "description", ""),
            policy=self.policy(data.get("policy", {})),
        )
        if not self.problems and spec.sweep_size > self.max_jobs:
            self.fail(("parameters",), f"the sweep has {spec.sweep_size:,} jobs, over the limit of {self.max_jobs:,}",
                      "split it into several bags, or raise the limit with --max-jobs")
        if self.problems:
            raise SpecError(self.source, self.problems)
        return spec

    def string(self, data: dict[str, Any], key: str, default: str) -> str:
        value = data.get(key, default)
        if not isinstance(value, str):
            self.fail((key,), f"'{key}' must be a string, not {type(value).__name__}", f'write {key} = "..."')
            return default
        return value

    def string_list(self, data: dict[str, Any], key: str) -> list[str]:
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail((key,), f"'{key}' must be a list of strings", f'write {key} = ["a.txt", "b.txt"]')
            return []
        return list(value)

    def positive_int(self, data: dict[str, Any], key: str, default: int) -> int:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            self.fail((key,), f"'{key}' must be a whole number of at least 1, not {value!r}")
            return default
        return value

    def duration(self, data: dict[str, Any], key: str) -> float | None:
        if key not in data:
            return None
        try:
            return parse_duration(data[key])
        except ValueError as e:
            self.fail((key,), f"'{key}' = {data[key]!r}: {e}")
            return None

    def env(self, table: object) -> dict[str, str]:
        if not isinstance(table, dict):
            self.fail(("env",), "'env' must be a table", '[env]\nNAME = "value"')
            return {}
        out = {}
        for k, v in table.items():
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k) or not isinstance(v, str | int | float):
                self.fail(("env", k), f"env '{k}' must be a variable name with a string or number value")
            else:
                out[k] = str(v)
        return out

    def policy(self, table: object) -> dict[str, str]:
        if not isinstance(table, dict):
            self.fail(("policy",), "'policy' must be a table of ClassAd expressions", '[policy]\nRank = "1"')
            return {}
        out = {}
        for k, v in table.items():
            if isinstance(v, bool | int | float) and not isinstance(v, bool):
                v = str(v)
            if not isinstance(v, str):
                self.fail(("policy", k), f"policy {k} must be a ClassAd expression written as a string",
                          f'write {k} = "..." (quote the expression)')
            else:
                out[k] = v
        return out

    def parameters(self, table: object) -> list[Parameter]:
        if not isinstance(table, dict):
            self.fail(("parameters",), "'parameters' must be a table", "[parameters]\nseed = [1, 2, 3]")
            return []
        out = []
        for name, value in table.items():
            if not PARAM_RE.match(name):
                self.fail(("parameters", name), f"parameter name '{name}' is not allowed",
                          "use letters, digits and '_', starting with a letter or '_'")
            elif (param := self.parameter(name, value)) is not None:
                out.append(param)
        return out

    def parameter(self, name: str, value: object) -> Parameter | None:
        path = ("parameters", name)
        if isinstance(value, list):
            if not value:
                self.fail(path, f"parameter '{name}' has no values", "give at least one value, or remove it")
                return None
            if not all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in value):
                self.fail(path, f"values of parameter '{name}' must be strings or numbers")
                return None
            return Parameter(name, values=[_render_value(v) for v in value])
        if isinstance(value, dict):
            return self.range(name, value)
        self.fail(path, f"parameter '{name}' must be a list of values or a range",
                  f"write {name} = [1, 2, 3] or {name} = {{ from = 1, to = 10, step = 1 }}")
        return None

    def range(self, name: str, table: dict[str, Any]) -> Parameter | None:
        path = ("parameters", name)
        for key in table:
            if key not in RANGE_KEYS:
                self.fail(path, f"unknown key '{key}' in range '{name}'", closest(key, RANGE_KEYS) or
                          "a range has from, to and step")
                return None
        bounds: dict[str, Decimal] = {}
        for key in RANGE_KEYS:
            v = table.get(key, 1 if key == "step" else None)
            if v is None:
                self.fail(path, f"range '{name}' has no '{key}'", f"write {name} = {{ from = 1, to = 10, step = 1 }}")
                return None
            try:
                if isinstance(v, bool):
                    raise InvalidOperation
                bounds[key] = Decimal(str(v))
            except InvalidOperation:
                self.fail(path, f"'{key}' of range '{name}' must be a number, not {v!r}")
                return None
        if bounds["step"] == 0:
            self.fail(path, f"range '{name}' has step 0", "use a positive step, or a negative one to count down")
            return None
        param = Parameter(name, start=str(bounds["from"]), stop=str(bounds["to"]), step=str(bounds["step"]))
        if len(param) == 0:
            self.fail(path, f"range '{name}' from {bounds['from']} to {bounds['to']} step {bounds['step']} is empty",
                      "swap 'from' and 'to', or change the sign of 'step'")
            return None
        return param

    def check_templates(self, path: tuple[str, ...], templates: list[str], names: list[str]) -> None:
        for template in templates:
            try:
                used = placeholders(template)
            except ValueError as e:
                self.fail(path, str(e))
                continue
            for field in used:
                if field not in names:
                    hint = closest(field, names) or (
                        f"known parameters: {', '.join(names)}" if names else "define it under [parameters]")
                    self.fail(path, f"placeholder {{{field}}} in '{path[0]}' names no parameter", hint)

    def check_paths(self, inputs: list[str], outputs: list[str]) -> None:
        for key, paths in (("inputs", inputs), ("outputs", outputs)):
            for p in paths:
                parts = p.replace("\\", "/").split("/")
                if not p or (key == "outputs" and (p.startswith("/") or ".." in parts)):
                    self.fail((key,), f"'{p}' in {key} must be a relative path inside the job's directory")
        seen: dict[str, str] = {}
        for p in inputs:
            base = p.rstrip("/").rsplit("/", 1)[-1]
            if base in seen:
                self.fail(("inputs",), f"inputs '{seen[base]}' and '{p}' would both be staged as '{base}'",
                          "rename one of them")
            seen[base] = p


def _render_value(v: str | int | float) -> str:
    if isinstance(v, float):
        return _render_decimal(Decimal(repr(v)))
    return str(v)


_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
_KEY = re.compile(r'^\s*("[^"]*"|[A-Za-z0-9_.\-]+)\s*=')


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Map each key path of a TOML text (`("parameters", "seed")`) to the line that defines it.

    tomllib keeps no positions, so semantic errors find their line here; dotted and quoted keys are
    handled, keys inside inline tables report the line of their table.
    """
    lines: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    for n, raw in enumerate(text.splitlines(), 1):
        if m := _HEADER.match(raw):
            table = tuple(part.strip().strip('"') for part in m.group(1).split("."))
            for i in range(1, len(table) + 1):
                lines.setdefault(table[:i], n)
        elif m := _KEY.match(raw):
            key = tuple(part.strip('"') for part in m.group(1).split(".")) if not m.group(1).startswith('"') \
                else (m.group(1).strip('"'),)
            lines.setdefault(table + key, n)
    return lines
