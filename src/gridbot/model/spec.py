"""Bag specifications: the TOML a user writes, validated into a `BagSpec`, and the plan it expands to.

A sweep is never expanded into stored parameter sets: job `i` of a cartesian product is computed from
`i` alone (`BagSpec.params`), so a ten-million-job bag costs one spec, not ten million dictionaries.
Ranges use decimal arithmetic, so `from = 0.1, step = 0.1` yields `0.3`, not `0.30000000000000004`.
Everything here is pure: the caller reads files and passes their text.
"""

from __future__ import annotations

import difflib
import math
import re
import string
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, localcontext
from functools import lru_cache
from itertools import repeat
from math import prod
from typing import Any, TypeVar

import msgspec

from gridbot.errors import GridbotError
from gridbot.model.records import Limits

DEFAULT_MAX_FAILURES = 3
DEFAULT_INSTANCE_DEADLINE = 24 * 3600.0
DEFAULT_MAX_JOBS = 10_000_000
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
PARAM_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
"""(`\\Z`, not `$`: `$` also matches before a final newline, and let a bag be named "sweep\\n".)"""
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
    "cpus",
    "memory",
    "cpu_time",
    "max_file_size",
    "max_processes",
    "policy",
    "strategy",
    "bag_deadline",
    "budget",
    "quorum",
    "max_instances",
    "spot_check",
    "compare",
)
RANGE_KEYS = ("from", "to", "step")
MAX_CPUS = 4_096
"""CPUs one job may ask for at most."""
MAX_QUORUM = 16
MAX_OPTION = 1_000
"""Characters of a strategy option's string value at most."""
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE_SHIFTS = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}
MIN_MEMORY = 1 << 20
"""The smallest `memory` accepted: below it a number was surely meant in megabytes, not bytes."""
HARD_MAX_JOBS = 100_000_000
"""The most jobs one bag may have, whatever --max-jobs says (issue 12). The server writes a row for every
job when the bag is submitted, in one transaction during which it serves nobody: in SQLite about 110
bytes and 1 µs a job, so 10^8 jobs take some 11 GB and two minutes (a sweep of 10^12 wrote 25 GB in ten
minutes, and would have needed 110 TB)."""
MAX_COMMAND_BYTES = 100_000
"""The longest command of a job in UTF-8 bytes, with its parameters filled in (or one line of an
each-line bag). A job runs as `sh -c COMMAND`, and Linux refuses a single argument longer than
MAX_ARG_STRLEN, 131,072 bytes, with "Argument list too long": such a bag is refused when submitted."""
MAX_EXEC_BYTES = 1_000_000
"""The most a job's command and environment may take together: Linux refuses more than a quarter of the
stack limit (2 MiB by default) for them, and the worker's own environment needs some of it."""
MAX_DURATION = 1e9
"""The longest duration accepted (timeout, instance_deadline, cpu_time), about 31 years: durations are
added to clock times, and stored as JSON, which has no infinity (a NaN deadline read back as null)."""
MAX_SIZE = 1 << 60
"""The largest size accepted (memory, max_file_size), 1 EiB: rlimits are 64-bit."""
MAX_COUNT = 2**31 - 1
"""The largest max_failures or max_processes accepted."""
MAX_DESCRIPTION = 10_000
"""The longest description, in characters."""
RANGE_LIMIT = Decimal("1e18")
RANGE_DIGITS = 18
"""Range bounds and steps are at most RANGE_LIMIT in size, with at most RANGE_DIGITS digits after the
point, so a range has a length the server can compute and values it can render (at most _RANGE_CHARS)."""
_RANGE_CHARS = 40
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?", re.ASCII)


class Parameter(msgspec.Struct, frozen=True):
    """One axis of the sweep: an explicit list of values, or an inclusive range `start..stop by step`."""

    name: str
    values: list[str] | None = None
    start: str | None = None
    stop: str | None = None
    step: str | None = None

    def __len__(self) -> int:
        return self.size

    @property
    def size(self) -> int:
        """Number of values; unlike len(), also beyond 2^63 (which validation must be able to report)."""
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
        with localcontext() as ctx:
            ctx.prec = 80  # exact for every range validation allows (28 digits rounded 1e17 + 0.5 to 1e17)
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
    """Values of the inclusive range; cached, since every job's parameters need it. Exact for the ranges
    validation lets through (bounds of up to 37 digits), where 28 digits of precision rounded."""
    with localcontext() as ctx:
        ctx.prec = 80
        span = (Decimal(stop) - Decimal(start)) / Decimal(step)
        return max(0, int(span.to_integral_value(rounding="ROUND_FLOOR")) + 1)


@lru_cache(maxsize=4096)
def _whole(start: str, step: str) -> tuple[int, int] | None:
    """(start, step) as integers when both are whole numbers, for exact and quick rendering."""
    a, b = Decimal(start), Decimal(step)
    if a == a.to_integral_value() and b == b.to_integral_value():
        return int(a), int(b)
    return None


StrategyOption = str | int | float | bool


class StrategyChoice(msgspec.Struct, frozen=True):
    """The bag's `[strategy]` table: which registered strategies schedule it, and their options.

    The names are checked against `gridbot.schedulers.registry` when the bag is submitted (the model
    does not know which strategies exist); other keys of the table are options of those strategies.
    """

    tail: str = "gridbot"
    """When the bag is in its tail and which running jobs get replicas (GridBot's Algorithm 2 by default)."""
    placement: str = "gridbot"
    """How much the bag wants a host, pilots per pool, jobs moved between pools (GridBot's Rank by default)."""
    options: dict[str, StrategyOption] = msgspec.field(default_factory=dict)


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
    cpus: int = 1
    """CPUs (slots) one job of the bag needs at once: it runs on a host or pilot with that many free slots, and
    the worker lets it use them (an MPI run, a threaded solver: the RENCI report's 8-32 CPU ensemble members)."""
    memory: int | None = None
    """Bytes of resident memory the processes of one job may use together (None: unlimited)."""
    cpu_time: float | None = None
    """CPU seconds each process of a job may use (None: unlimited)."""
    max_file_size: int | None = None
    """Bytes of the largest file a job may write (None: unlimited)."""
    max_processes: int | None = None
    """Processes the job's user may have at once, as RLIMIT_NPROC counts them (None: unlimited)."""
    strategy: StrategyChoice = msgspec.field(default_factory=StrategyChoice)
    """The bag's tail strategy and placement, with their options."""
    bag_deadline: float | None = None
    """The bag's QoS deadline as seconds after its submission: when its owner wants every result (None: none,
    or `bag_deadline_at`). Not an instance's deadline (`instance_deadline`)."""
    bag_deadline_at: float | None = None
    """The bag's QoS deadline as an absolute time, seconds since the epoch (a spec gives one of the two)."""
    budget: float | None = None
    """What the bag may spend at most, in the pools' currency (`price_per_cpu_hour`, `price_per_pilot_hour`;
    the paper's G$); None: no limit."""
    quorum: int = 1
    """Results of one job, from hosts of distinct accounts, that must agree (byte for byte: outputs and stdout)
    before one is accepted, as BOINC projects validate volunteers' results; a host of a `trusted` pool, or one
    with a long record of valid results (adaptive replication), counts as a quorum alone."""
    max_instances: int | None = None
    """Instances of one job sent at most before it fails for want of a quorum (None: 2 x quorum + max_failures,
    BOINC's max_total_results)."""
    spot_check: float = 0.1
    """Of the jobs sent unreplicated to a host with a long record of valid results, the share replicated all the
    same to check it (adaptive replication)."""
    compare: str = ""
    """How a quorum compares two results: "" byte for byte, else the name of a validator the server's admin
    registered (`[validators.NAME]` in the pools file: a command that says whether two results are equivalent)."""

    def instance_cap(self) -> int:
        """Instances of one job sent at most (`max_instances`, or its default)."""
        return self.max_instances if self.max_instances is not None else 2 * self.quorum + self.max_failures

    def deadline_at(self, created_at: float) -> float | None:
        """The bag's QoS deadline as a time on the server's clock, given when the bag was submitted."""
        if self.bag_deadline_at is not None:
            return self.bag_deadline_at
        return None if self.bag_deadline is None else created_at + self.bag_deadline

    def limits(self) -> Limits | None:
        """What the worker enforces on each job of the bag, or None when the spec sets no limit.

        A value that is not a positive finite number (only possible in a spec that did not come from TOML)
        is no limit.
        """
        limits = Limits(_positive(self.memory), _positive(self.cpu_time), _positive(self.max_file_size),
                        _positive(self.max_processes))
        return None if limits == Limits() else limits

    @property
    def sweep_size(self) -> int:
        """Number of jobs of a parameter sweep (1 for a command with no parameters)."""
        return prod(p.size for p in self.parameters) if self.parameters else 1

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


_N = TypeVar("_N", int, float)


def _positive(value: _N | None) -> _N | None:
    return value if value is not None and 0 < value < math.inf else None



@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec: where, what, and what to do about it."""

    message: str
    line: int | None = None
    hint: str = ""

    def format(self, source: str) -> str:
        where = f"{source}:{self.line}" if self.line else source
        return f"{where}: {self.message}" + (f"\n  hint: {self.hint}" if self.hint else "")


class SpecError(GridbotError, ValueError):
    """A bag spec (or pools file, or scenario) that cannot be accepted; `problems` lists every defect found, in
    file order. Still a ValueError, as callers caught it before it was a GridbotError."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = sorted(problems, key=lambda p: p.line or 0)
        super().__init__("\n".join(p.format(source) for p in self.problems))


def parse_duration(value: object, zero: bool = False) -> float:
    """Seconds from `90`, `90.5`, `"90s"`, `"10m"`, `"2h"` or `"1d"` (and 0 written any of those ways if `zero`);
    raise ValueError otherwise. A number written with a sign or an exponent (`"-5"`, `"1e300"`, as a command
    line option gives it) is read as a number, so that one out of range says so, not that it is no duration."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '90s', '10m', '2h', '1d'")
    if isinstance(value, int | float):
        seconds = as_float(value)
    elif isinstance(value, str) and (m := _DURATION.fullmatch(value)):
        seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    else:
        raise ValueError("a duration is a number of seconds or a string like '90s', '10m', '2h', '1d'")
    if zero and seconds == 0:
        return 0.0
    if zero and seconds < 0:
        raise ValueError(f"a duration must be positive or 0 (at most {MAX_DURATION:,.0f} s), not {seconds:g} s")
    problem = duration_problem(seconds)
    if problem:
        raise ValueError(problem)
    return seconds


QOS_PLACEMENT = "cost-time"
"""The placement a bag with a deadline or a budget gets when it names none (the DBC paper's own)."""


def with_qos_placement(spec: BagSpec) -> BagSpec:
    """The spec, with placement `QOS_PLACEMENT` if it has a deadline or a budget and names GridBot's placement
    (which counts no money): a user who gives a budget expects it kept without knowing the strategies."""
    qos = spec.budget is not None or spec.bag_deadline is not None or spec.bag_deadline_at is not None
    if not qos or spec.strategy.placement != "gridbot":
        return spec
    return msgspec.structs.replace(spec, strategy=msgspec.structs.replace(spec.strategy, placement=QOS_PLACEMENT))


def budget_problem(value: object) -> str:
    """Why `value` cannot be a bag's budget, or ""."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"'budget' must be a number, not {shown(value)}"
    if not 0 <= as_float(value) < math.inf:
        return f"'budget' must be a finite number >= 0, not {shown(value)}"
    return ""


def as_float(value: int | float) -> float:
    """`value` as a float, an integer too large for one as an infinity of its sign: TOML writes whole numbers of
    any size (`budget = 1` and 400 zeros), and float() of them raised OverflowError instead of the range's
    message."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


_ISO = re.compile(r"\s*(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2})(?::(\d{2})(\.\d+)?)?\s*(Z|z|[+-]\d{2}:?\d{2})?\s*",
                  re.ASCII)


def parse_bag_deadline(value: object) -> dict[str, float]:
    """A bag's QoS deadline as spec fields: `{"bag_deadline": seconds}` from a duration (after submission:
    90, "10m", "2h", "1d"), or `{"bag_deadline_at": epoch seconds}` from an absolute time with its zone (a
    TOML offset date-time, or the same ISO 8601 text, "2026-11-27T17:00:00Z"); raise ValueError otherwise.

    (The model may not import `datetime`, the clock's module: a TOML date-time is read through its own
    methods, and ISO text by the calendar's arithmetic.)"""
    if hasattr(value, "tzinfo") and hasattr(value, "timestamp"):  # a TOML date-time
        if value.tzinfo is None:
            raise ValueError("an absolute deadline needs its time zone (add Z for UTC, or +01:00)")
        return {"bag_deadline_at": float(value.timestamp())}
    if isinstance(value, str) and (m := _ISO.fullmatch(value)):
        year, month, day, hour, minute = (int(m.group(i)) for i in range(1, 6))
        second = int(m.group(6) or 0) + float(m.group(7) or 0.0)
        zone = m.group(8)
        if zone is None:
            raise ValueError("an absolute deadline needs its time zone (add Z for UTC, or +01:00)")
        leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
        days = (31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
        if not (1 <= month <= 12 and 1 <= day <= days[month - 1] and hour <= 23 and minute <= 59 and second < 61):
            raise ValueError(f"{value.strip()!r} is not a valid time")
        if zone not in "Zz" and (int(zone[1:3]) > 23 or int(zone[-2:]) > 59):
            raise ValueError(f"{zone!r} in {value.strip()!r} is not a time zone's offset: its hours go from 00 to 23 "
                             "and its minutes from 00 to 59 (+01:00, -05:30, or Z for UTC)")
        offset = 0 if zone in "Zz" else (1 if zone[0] == "+" else -1) * (int(zone[1:3]) * 3600 + int(zone[-2:]) * 60)
        return {"bag_deadline_at": _days_from_civil(year, month, day) * 86400.0 + hour * 3600 + minute * 60 + second
                - offset}
    if isinstance(value, str) and "T" in value.upper() and any(c.isdigit() for c in value[:4]):
        raise ValueError("not an ISO 8601 time like 2026-11-27T17:00:00Z")
    try:
        return {"bag_deadline": parse_duration(value)}
    except ValueError as e:
        if isinstance(value, int | float) and not isinstance(value, bool):  # a number: what is wrong with it
            raise ValueError(f"a bag deadline after submission: {e}") from None
        raise ValueError("a bag deadline is a duration after submission (90, '10m', '2h', '1d') or an absolute "
                         "time with its zone (2026-11-27T17:00:00Z)") from None


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days from 1970-01-01 to a date of the proleptic Gregorian calendar (H. Hinnant's algorithm)."""
    year -= month <= 2
    era = (year if year >= 0 else year - 399) // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def duration_problem(seconds: float) -> str:
    """Why `seconds` cannot be a duration of a spec, or "" (shared by the TOML validator and `check_spec`)."""
    if math.isnan(seconds):
        return "a duration must be positive, not NaN"
    if not seconds > 0:
        return f"a duration must be positive (more than 0 s, at most {MAX_DURATION:,.0f} s), not {seconds:g} s"
    if not seconds <= MAX_DURATION:
        return f"a duration must be at most {MAX_DURATION:,.0f} s (about 31 years), not {seconds:g} s"
    return ""


_DURATION = re.compile(r"\s*([+-]?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*([smhd]?)\s*", re.ASCII)
"""A duration as text: a number (with a sign or an exponent, read so that one out of range is named as such)
and a unit."""


def parse_size(value: object) -> int:
    """Bytes from `1048576`, `"512K"`, `"100M"`, `"2G"`, `"1.5T"` (powers of 1024, `MB`/`MiB` also read as
    `M`); raise ValueError otherwise."""
    message = "a size is a number of bytes or a string like '512K', '100M', '2G'"
    if isinstance(value, bool):
        raise ValueError(message)
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and (m := re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", value,
                                                       re.IGNORECASE)):
        exact = Decimal(m.group(1)) * (1 << _SIZE_SHIFTS[m.group(2).upper()])
        size = int(exact)
        if 0 < exact < 1:
            unit = "" if m.group(2) or value.strip()[-1:] in "bB" else " (a size without a unit is in bytes)"
            raise ValueError(f"{value.strip()!r} is less than one byte{unit}")
    else:
        raise ValueError(message)
    problem = size_problem(size)
    if problem:
        raise ValueError(problem)
    return size


def size_problem(size: int) -> str:
    """Why `size` bytes cannot be a limit of a spec, or "" (shared by the TOML validator and `check_spec`)."""
    if size <= 0:
        return "a size must be positive"
    if size > MAX_SIZE:
        return f"a size must be at most 1 EiB ({MAX_SIZE:,} bytes)"
    return ""


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


_LINE_END = re.compile(r"\r\n|\r|\n")
"""Where a line of a text file ends: LF, CRLF or a lone CR (an old Mac's), and nowhere else."""


def parse_lines(text: str, source: str, max_jobs: int = DEFAULT_MAX_JOBS) -> list[str]:
    """Commands of an each-line file: one shell command per non-blank line (each one checked as the server
    checks the lines it is sent)."""
    lines = [ln.strip() for ln in _LINE_END.split(text)]  # not splitlines(): \x0b, \x1c, \x85... end no line
    commands = [ln for ln in lines if ln]
    if not commands:
        raise SpecError(source, [Problem("the file has no commands", None, "write one shell command per line")])
    if len(commands) > min(max_jobs, HARD_MAX_JOBS):
        message, hint = jobs_issue(len(commands), max_jobs, "the file", RAISE_HINT) or ("", "")
        raise SpecError(source, [Problem(message, None, hint)])
    bad = lines_issues(commands)
    if bad:
        numbers = [n for n, ln in enumerate(lines, 1) if ln]  # the file's line of each command
        raise SpecError(source, [Problem(message, numbers[i], hint) for i, (message, hint) in bad[:MAX_PROBLEMS]])
    return commands


def placeholders(template: str) -> list[str]:
    """Names of the `{name}` placeholders in `template`; raise ValueError on other format syntax."""
    names = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:  # a lone brace, in Python's words ("Single '{' encountered in format string")
        raise ValueError(f"a brace that opens or closes no placeholder ({str(e)[:100]}); write {{name}} for a "
                         "parameter, and {{ or }} for a literal brace") from None
    for _, field, spec, conv in parsed:
        if field is None:
            continue
        if spec or conv or not PARAM_RE.match(field):
            written = f"{{{field}{'!' + conv if conv else ''}{':' + spec if spec else ''}}}"
            raise ValueError(f"{shown(written)} is not a placeholder; write {{name}} for a parameter, and {{{{ or "
                             "}} for a literal brace")
        names.append(field)
    return names


def _render_decimal(d: Decimal) -> str:
    text = format(d.normalize(), "f") if d != d.to_integral_value() else str(int(d))
    return text


def closest(word: str, candidates: list[str] | tuple[str, ...]) -> str:
    """'did you mean X?' for the candidate closest to a misspelt `word`, or ''."""
    match = difflib.get_close_matches(word, list(candidates), n=1)
    return f"did you mean '{match[0]}'?" if match else ""


def parse_strategy(table: object, source: str) -> StrategyChoice:
    """A `[strategy]` table on its own (a simulated bag's), checked as a spec's is (SpecError)."""
    v = _Validator("", source, DEFAULT_MAX_JOBS)
    choice = v.strategy(table)
    if v.problems:
        raise SpecError(source, v.problems)
    return choice


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
        if issue := name_issue(name):
            self.fail(("name",), *issue)
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
        deadline = self.bag_deadline(data)
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
            cpus=self.cpus(data),
            memory=self.size(data, "memory", MIN_MEMORY),
            cpu_time=self.duration(data, "cpu_time"),
            max_file_size=self.size(data, "max_file_size"),
            max_processes=self.positive_int(data, "max_processes", 1) if "max_processes" in data else None,
            description=self.string(data, "description", ""),
            policy=self.policy(data.get("policy", {})),
            strategy=self.strategy(data.get("strategy", {})),
            budget=self.budget(data),
            quorum=self.quorum(data),
            max_instances=self.positive_int(data, "max_instances", 1) if "max_instances" in data else None,
            spot_check=self.fraction(data, "spot_check", 0.1),
            compare=self.string(data, "compare", ""),
            bag_deadline=deadline.get("bag_deadline"),
            bag_deadline_at=deadline.get("bag_deadline_at"),
        )
        if len(spec.description) > MAX_DESCRIPTION:
            self.fail(("description",), f"the description has {len(spec.description):,} characters, over the "
                      f"limit of {MAX_DESCRIPTION:,}")
        if spec.compare and (problem := validator_name_problem(spec.compare)):
            self.fail(("compare",), problem, 'e.g. compare = "fuzzy", a validator of the server\'s pools file')
        elif spec.compare and spec.quorum < 2:
            self.fail(("compare",), f"'compare' = {shown(spec.compare)} needs a quorum of two or more results to "
                      "compare", "add quorum = 2")
        if spec.max_instances is not None and spec.max_instances < spec.quorum:
            self.fail(("max_instances",), f"'max_instances' = {spec.max_instances} is less than the quorum "
                      f"({spec.quorum}): no job could ever be accepted; e.g. max_instances = {2 * spec.quorum + 1}")
        if not self.problems:
            for key, issue in command_issues(spec):
                self.fail((key,), *issue)
            if issue := jobs_issue(spec.sweep_size, self.max_jobs, "the sweep", RAISE_HINT):
                self.fail(("parameters",), *issue)
        if self.problems:
            raise SpecError(self.source, self.problems)
        return with_qos_placement(spec)

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

    def quorum(self, data: dict[str, Any]) -> int:
        value = data.get("quorum", 1)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_QUORUM:
            self.fail(("quorum",), f"'quorum' must be a whole number of agreeing results from 1 to {MAX_QUORUM}, not "
                      f"{shown(value)}; e.g. quorum = 2")
            return 1
        return value

    def fraction(self, data: dict[str, Any], key: str, default: float) -> float:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            self.fail((key,), f"'{key}' must be a fraction from 0 to 1, not {shown(value)}; e.g. {key} = 0.1")
            return default
        return float(value)

    def cpus(self, data: dict[str, Any]) -> int:
        value = data.get("cpus", 1)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CPUS:
            self.fail(("cpus",), f"'cpus' must be a whole number of CPUs one job needs, from 1 to {MAX_CPUS:,}, "
                      f"not {shown(value)}; e.g. cpus = 8")
            return 1
        return value

    def positive_int(self, data: dict[str, Any], key: str, default: int) -> int:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            self.fail((key,), f"'{key}' must be a whole number of at least 1, not {shown(value)}")
            return default
        if value > MAX_COUNT:
            self.fail((key,), f"'{key}' = {shown(value)} is more than {MAX_COUNT:,}")
            return default
        return value

    def size(self, data: dict[str, Any], key: str, minimum: int = 1) -> int | None:
        if key not in data:
            return None
        try:
            size = parse_size(data[key])
        except ValueError as e:
            self.fail((key,), f"'{key}' = {shown(data[key])}: {e}", f'write {key} = "512M" or "2G"')
            return None
        if size < minimum:
            hint = f'did you mean {key} = "{data[key]}M"?' if isinstance(data[key], int) else ""
            self.fail((key,), f"'{key}' = {shown(data[key])} is {size:,} bytes, less than {minimum:,}",
                      hint)
            return None
        return size

    def duration(self, data: dict[str, Any], key: str) -> float | None:
        if key not in data:
            return None
        try:
            return parse_duration(data[key])
        except ValueError as e:
            self.fail((key,), f"'{key}' = {shown(data[key])}: {e}")
            return None

    def budget(self, data: dict[str, Any]) -> float | None:
        if "budget" not in data:
            return None
        value = data["budget"]
        if problem := budget_problem(value):
            self.fail(("budget",), problem, "write budget = 600 (in the pools' currency)")
            return None
        return float(value)

    def bag_deadline(self, data: dict[str, Any]) -> dict[str, float]:
        if "bag_deadline" not in data:
            return {}
        try:
            return parse_bag_deadline(data["bag_deadline"])
        except ValueError as e:
            self.fail(("bag_deadline",), f"'bag_deadline' = {shown(data['bag_deadline'])}: {e}",
                      'write bag_deadline = "2h" (after submission) or bag_deadline = 2026-11-27T17:00:00Z')
            return {}

    def env(self, table: object) -> dict[str, str]:
        if not isinstance(table, dict):
            self.fail(("env",), "'env' must be a table", '[env]\nNAME = "value"')
            return {}
        out = {}
        for k, v in table.items():
            if not isinstance(v, str | int | float) or isinstance(v, bool):
                self.fail(("env", k), f"env {shown(k)} must be a variable name with a string or number value")
            else:
                out[k] = str(v)
        for k, issue in env_issues(out):
            self.fail(("env", k), *issue)
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

    def strategy(self, table: object) -> StrategyChoice:
        example = '[strategy]\ntail = "gridbot"\nplacement = "gridbot"'
        if not isinstance(table, dict):
            self.fail(("strategy",), "'strategy' must be a table naming the bag's strategies", example)
            return StrategyChoice()
        names: dict[str, str] = {}
        options: dict[str, StrategyOption] = {}
        for k, v in table.items():
            if k in ("tail", "placement"):
                if not isinstance(v, str) or not NAME_RE.match(v):
                    self.fail(("strategy", k), f"strategy {k} must be the name of a strategy, as a string", example)
                else:
                    names[k] = v
            elif not PARAM_RE.match(k):
                self.fail(("strategy", k), f"strategy option '{k[:60]}' is not a valid name",
                          "use letters, digits and underscores")
            elif isinstance(v, str) and len(v) > MAX_OPTION:
                self.fail(("strategy", k), f"strategy option '{k}' has {len(v):,} characters, over the limit of "
                          f"{MAX_OPTION:,}")
            elif isinstance(v, float) and not math.isfinite(v):
                why = "" if math.isnan(v) else " (TOML reads a number too large for a double, such as 1e400, as inf)"
                self.fail(("strategy", k), f"strategy option '{k}' = {v!r} is not a finite number{why}", f"{k} = 1")
            elif isinstance(v, str | int | float | bool):
                options[k] = v
            else:
                self.fail(("strategy", k), f"strategy option '{k}' must be a string, a number or true/false",
                          f"{k} = 1")
        return StrategyChoice(**names, options=options)

    def parameters(self, table: object) -> list[Parameter]:
        if not isinstance(table, dict):
            self.fail(("parameters",), "'parameters' must be a table", "[parameters]\nseed = [1, 2, 3]")
            return []
        out = []
        for name, value in table.items():
            if issue := parameter_name_issue(name):
                self.fail(("parameters", name), *issue)
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
            values = [_render_value(v) for v in value]
            if issue := values_issue(name, values):
                self.fail(path, *issue)
                return None
            return Parameter(name, values=values)
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
            number = _decimal(str(v)) if isinstance(v, int | float | str) and not isinstance(v, bool) else None
            if number is None:
                self.fail(path, f"'{key}' of range '{name}' must be a number, not {shown(v)}")
                return None
            bounds[key] = number
        if issue := range_issue(name, bounds["from"], bounds["to"], bounds["step"]):
            self.fail(path, *issue)
            return None
        return Parameter(name, start=str(bounds["from"]), stop=str(bounds["to"]), step=str(bounds["step"]))

    def check_templates(self, path: tuple[str, ...], templates: list[str], names: list[str]) -> None:
        for issue in template_issues(path[0], templates, names):
            self.fail(path, *issue)

    def check_paths(self, inputs: list[str], outputs: list[str]) -> None:
        for key, issue in path_issues(inputs, outputs):
            self.fail((key,), *issue)


RESERVED_OUTPUTS = frozenset(("stdout", "stderr"))
"""Names the results folder of a job already uses for the command's own output."""
MAX_PATH = 255


def output_name_problem(name: str) -> str:
    """Why `name` cannot be an output (it must stay inside the job's folder and the results folder), or ""."""
    parts = name.replace("\\", "/").split("/")
    if not name or len(name) > MAX_PATH or "\0" in name:
        return f"output {name[:60]!r} must be a relative path of 1 to {MAX_PATH} characters"
    if name.startswith("/") or ".." in parts or "" in parts or "." in parts:
        return f"output '{name[:60]}' must be a relative path inside the job's directory (no '/', '..' or '.')"
    if name in RESERVED_OUTPUTS:
        return f"output '{name}' is reserved: the results folder keeps the job's {name} under that name"
    return ""


Issue = tuple[str, str]
"""A problem found by a check that the TOML validator (`parse_spec`, `parse_lines`: the command line) and
`check_spec` (the server, for what it is sent) share: the message, and a hint ("" if it says it all)."""
RAISE_HINT = "split it into several bags, or raise the limit with --max-jobs"
SERVER_HINT = "split it into several bags, or start the server with a larger --max-jobs"
MAX_PROBLEMS = 20
"""Problems reported at most for one spec (a spec with a million bad values gets a readable answer)."""


def shown(value: object, width: int = 60) -> str:
    """`value` quoted for a message, cut to `width` characters: messages never echo a megabyte of input."""
    text = repr(value)
    return text if len(text) <= width else text[:width] + "..."


def _decimal(text: str) -> Decimal | None:
    """A plain decimal number (`-3`, `0.25`, `1e3`), or None: not 'NaN', 'Infinity', '1_000' or '٣', all of
    which Decimal() reads."""
    return Decimal(text) if _NUMBER.fullmatch(text) else None


def name_issue(name: str) -> Issue | None:
    """Why `name` cannot name a bag (it names its results folder, and appears in URLs), or None. A name of
    digits only would be read as a bag id wherever a bag is named (`gridbot status 5`, /v1/bags/5)."""
    if NAME_RE.match(name) and name.isdigit():
        return (f"bag name {shown(name)} is made only of digits, which would be read as a bag's id",
                f"add a letter, e.g. 'run-{name[:59]}' (with --name where the name comes from a file's name)")
    if NAME_RE.match(name):
        return None
    return (f"bag name {shown(name)} is not allowed",
            "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")


def parameter_name_issue(name: str) -> Issue | None:
    if PARAM_RE.match(name):
        return None
    return f"parameter name {shown(name)} is not allowed", "use letters, digits and '_', starting with a letter or '_'"


def values_issue(name: str, values: Sequence[str]) -> Issue | None:
    """Why a list of values cannot be a parameter's (each becomes part of a command and an environment
    variable), or None."""
    if not values:
        return f"parameter '{name}' has no values", "give at least one value, or remove it"
    for v in values:
        if "\0" in v:
            return f"a value of parameter '{name}' contains a NUL character", "no command or variable can hold one"
        if len(v) > MAX_COMMAND_BYTES // 4 and len(v.encode()) > MAX_COMMAND_BYTES:
            return (f"a value of parameter '{name}' has {len(v.encode()):,} bytes, over the limit of "
                    f"{MAX_COMMAND_BYTES:,}", "put large data in an input file, and its name in the value")
    return None


def range_issue(name: str, start: Decimal, stop: Decimal, step: Decimal) -> Issue | None:
    """Why `start..stop by step` cannot be a parameter's range, or None."""
    for key, d in (("from", start), ("to", stop), ("step", step)):
        exponent = d.as_tuple().exponent
        if not d.is_finite() or d.copy_abs() > RANGE_LIMIT or (isinstance(exponent, int) and exponent < -RANGE_DIGITS):
            return (f"'{key}' of range '{name}' is {shown(str(d), 30)}: a range's numbers are at most 1e18 in size, "
                    f"with at most {RANGE_DIGITS} digits after the point", "")
    if step == 0:
        return f"range '{name}' has step 0", "use a positive step, or a negative one to count down"
    if _range_len(str(start), str(stop), str(step)) == 0:
        return (f"range '{name}' from {start} to {stop} step {step} is empty",
                "swap 'from' and 'to', or change the sign of 'step'")
    return None


def template_issues(key: str, templates: Sequence[str], names: Sequence[str]) -> list[Issue]:
    """Placeholders of `templates` (the command, env values or outputs) that are not `{name}` of a parameter:
    each would fail every job of the bag when it is sent (a KeyError, a 500, before issue 12)."""
    out = []
    for template in templates:
        try:
            used = placeholders(template)
        except ValueError as e:
            out.append((f"in '{key}': {e}", ""))
            continue
        for field in used:
            if field not in names:
                hint = closest(field, list(names)) or (
                    f"known parameters: {', '.join(names)}" if names else "define it under [parameters]")
                out.append((f"placeholder {{{field}}} in '{key}' names no parameter", hint))
    return out


def env_issues(env: Mapping[str, str]) -> list[tuple[str, Issue]]:
    """(name, problem) for each variable of `env` that no process environment can hold."""
    out = []
    for k, v in env.items():
        if not ENV_RE.match(k):
            out.append((k, (f"env {shown(k)} is not a variable name",
                            "use letters, digits and '_', starting with a letter or '_'")))
        elif k.startswith("GRIDBOT_"):
            out.append((k, (f"env {k} is gridbot's own: the worker sets GRIDBOT_* for every job (its index, its "
                            "parameters, the mark by which it finds the job's processes to watch and kill them)",
                            "give the variable another name")))
        elif "\0" in v:
            out.append((k, (f"env {k} contains a NUL character", "no environment variable can hold one")))
    return out


def path_issues(inputs: Sequence[str], outputs: Sequence[str]) -> list[tuple[str, Issue]]:
    """("inputs" or "outputs", problem) for names a job's folder cannot hold, and inputs staged under one name."""
    out: list[tuple[str, Issue]] = []
    seen: dict[str, str] = {}
    for p in inputs:
        base = p.rstrip("/").rsplit("/", 1)[-1]
        if not p:
            out.append(("inputs", ("an empty name in inputs", "name a file relative to the spec's folder")))
        elif not base or base in (".", "..") or len(base) > MAX_PATH or "\0" in p:
            out.append(("inputs", (f"input {shown(p)} has no usable file name", "name a file, not a folder")))
        elif base in seen:
            out.append(("inputs", (f"inputs {shown(seen[base])} and {shown(p)} would both be staged as "
                                   f"{shown(base)}", "rename one of them")))
        seen.setdefault(base, p)
    out.extend(("outputs", (problem, "")) for p in outputs if (problem := output_name_problem(p)))
    names = set(outputs)
    if len(names) < len(outputs):
        twice = sorted({p for p in outputs if list(outputs).count(p) > 1})
        out.append(("outputs", (f"output {shown(twice[0])} is listed twice", "list each output once")))
    for p in sorted(names):  # (a file and a folder of one name: no job can make both, no results folder keep both)
        parts = p.split("/")
        if above := next(("/".join(parts[:i]) for i in range(1, len(parts)) if "/".join(parts[:i]) in names), None):
            out.append(("outputs", (f"outputs {shown(above)} and {shown(p)} cannot both be: one would be a file and "
                                    "a folder at once", f"keep {shown(p)}, or rename one")))
    return out


def command_issues(spec: BagSpec) -> list[tuple[str, Issue]]:
    """("command" or "env", problem) for jobs that could not be started: a NUL in the command, or a command
    or environment longer than Linux takes once the longest values are filled in (the command of a 1 MB
    template failed on every host, three times, "Argument list too long"). For a spec whose parameters and
    placeholders are valid."""
    out: list[tuple[str, Issue]] = []
    if not spec.each_line and not spec.command.strip():
        out.append(("command", ("the command is empty: every job would succeed having run nothing",
                                "write the shell command each job runs, with {name} for its parameters")))
    if "\0" in spec.command:
        out.append(("command", ("the command contains a NUL character", "no shell command can hold one")))
    out.extend(("outputs", (problem, "keep the values of the parameters it names to plain file names"))
               for problem in _filled_output_problems(spec)[:MAX_PROBLEMS])
    by_variable: dict[str, str] = {}
    for p in spec.parameters:  # each parameter is also the job's variable GRIDBOT_PARAM_<NAME>
        other = by_variable.setdefault(p.name.upper(), p.name)
        if other != p.name:
            out.append(("parameters", (f"parameters '{other}' and '{p.name}' differ only in case, and both would "
                                       f"be the job's variable GRIDBOT_PARAM_{p.name.upper()}", "rename one")))
    widest = {p.name: _widest(p) for p in spec.parameters}
    size = _filled(spec.command, widest)
    if size > MAX_COMMAND_BYTES:
        filled = " with the longest values filled in" if spec.parameters else ""
        out.append(("command", (f"the command has {size:,} bytes{filled}, over the limit of {MAX_COMMAND_BYTES:,}",
                                "a job runs as `sh -c COMMAND`, and Linux refuses an argument of over 128 KiB; "
                                "put long scripts or data in an input file")))
    env = sum(len(k) + _filled(v, widest) + 2 for k, v in spec.env.items())
    env += sum(len(f"GRIDBOT_PARAM_{name}") + width + 2 for name, width in widest.items())
    if size + env > MAX_EXEC_BYTES:
        out.append(("env", (f"the command and environment of a job take up to {size + env:,} bytes, over the "
                            f"limit of {MAX_EXEC_BYTES:,}", "put long values in input files")))
    return out


def _widest(p: Parameter) -> int:
    """Most bytes a value of `p` takes in a command."""
    return max(len(v.encode()) for v in p.values) if p.values is not None else _RANGE_CHARS


def _filled_output_problems(spec: BagSpec) -> list[str]:
    """Why outputs filled in with the values of listed parameters would leave the job's folder (a value `..` or
    `a/../b`), each value tried with the first of the others': every job named so would fail at its end. Ranges
    give numbers, which make no such name; a problem that needs two values together goes unseen here."""
    templated = [o for o in spec.outputs if "{" in o]
    if not templated or spec.each_line:
        return []
    first = {p.name: p.value_of()(0) for p in spec.parameters}
    named = {field for t in templated for _, field, _, _ in string.Formatter().parse(t) if field}
    problems: list[str] = []
    for p in spec.parameters:
        if p.values is None or p.name not in named:  # (a list of millions that no output names costs nothing)
            continue
        for value in dict.fromkeys(p.values):
            values = {**first, p.name: value}
            for template in templated:
                try:
                    name = template.format_map(values)
                except (KeyError, ValueError, IndexError, AttributeError):
                    continue  # the template's own problem, reported by template_issues
                if problem := output_name_problem(name):
                    problems.append(f"{problem}, with {p.name} = {value[:60]!r}")
                    if len(problems) >= MAX_PROBLEMS:
                        return problems
    return problems


def _filled(template: str, widest: Mapping[str, int]) -> int:
    """Most bytes `template` takes with its placeholders filled in by values `widest` bytes long."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError:
        return len(template.encode())
    return sum(len(text.encode()) + (widest.get(field, 0) if field else 0) for text, field, _, _ in parts)


def line_issues(line: str) -> list[Issue]:
    """Why one line of an each-line bag cannot be the command of a job, or []."""
    if not line.strip():
        return [("a line has no command", "every line of an each-line bag is one shell command")]
    if "\0" in line:
        return [("a line contains a NUL character", "no shell command can hold one")]
    if len(line) > MAX_COMMAND_BYTES // 4 and (size := len(line.encode())) > MAX_COMMAND_BYTES:
        return [(f"a line has {size:,} bytes, over the limit of {MAX_COMMAND_BYTES:,} for a command",
                 "a job runs as `sh -c LINE`, and Linux refuses an argument of over 128 KiB; put long scripts or "
                 "data in an input file")]
    return []


def lines_issues(lines: Sequence[str]) -> list[tuple[int, Issue]]:
    """(index, problem) for each line of an each-line bag that cannot be a command. A bag may have ten
    million lines: when none is bad (the rule), this takes four passes in C, not a Python loop over them."""
    if lines and min(map(len, map(str.strip, lines))) > 0 and max(map(len, lines)) <= MAX_COMMAND_BYTES // 4 \
            and not any(map(str.__contains__, lines, repeat("\0"))):
        return []
    return [(i, issue) for i, line in enumerate(lines) for issue in line_issues(line)]


def jobs_issue(total: int, max_jobs: int, what: str, hint: str) -> Issue | None:
    """Why `total` jobs are too many or too few for one bag (`what` says what has them), or None."""
    if total > HARD_MAX_JOBS:
        return (f"{what} has {total:,} jobs; gridbot takes at most {HARD_MAX_JOBS:,} in one bag, whatever --max-jobs "
                "says: the server writes every job into its database when the bag is submitted (about 110 bytes "
                "each, and meanwhile it serves nobody)", "split it into several bags")
    if total > max_jobs:
        return f"{what} has {total:,} jobs, over the limit of {max_jobs:,}", hint
    if total < 1:
        return f"{what} has no jobs", "an each-line bag needs at least one line"
    return None


def check_spec(spec: BagSpec, lines: Sequence[str] | None = None, max_jobs: int = DEFAULT_MAX_JOBS) -> list[str]:
    """What is wrong with a spec (and the lines of an each-line bag) that arrived already decoded, through the
    API rather than a file: the server's own check of everything it is sent (issue 12), with the checks of
    the TOML validator, plus those of the values TOML cannot express (NaN, a range that is not a number).
    Each problem is "message: hint"; at most MAX_PROBLEMS of them."""
    issues = [issue for _, issue in _spec_issues(spec, lines, max_jobs)]
    out = [f"{message}: {hint}" if hint else message for message, hint in issues]
    return out if len(out) <= MAX_PROBLEMS else [*out[:MAX_PROBLEMS], f"and {len(out) - MAX_PROBLEMS} more problems"]


def _spec_issues(spec: BagSpec, lines: Sequence[str] | None, max_jobs: int) -> list[tuple[str, Issue]]:
    out: list[tuple[str, Issue]] = []
    if issue := name_issue(spec.name):
        out.append(("name", issue))
    params_ok = True
    seen: set[str] = set()
    for p in spec.parameters:
        issue = parameter_name_issue(p.name) or _parameter_issue(p)
        if issue is None and p.name in seen:
            issue = f"parameter '{p.name}' is defined twice", "give each parameter one name"
        seen.add(p.name)
        if issue:
            out.append(("parameters", issue))
            params_ok = False
    names = [p.name for p in spec.parameters]
    out.extend(("command", issue) for issue in template_issues("command", [spec.command], names))
    out.extend(("env", issue) for issue in template_issues("env", list(spec.env.values()), names))
    out.extend(("outputs", issue) for issue in template_issues("outputs", spec.outputs, names))
    out.extend(env_issues(spec.env))
    out.extend(path_issues(spec.inputs, spec.outputs))
    out.extend(_number_issues(spec))
    if len(spec.description) > MAX_DESCRIPTION:
        out.append(("description", (f"the description has {len(spec.description):,} characters, over the limit "
                                    f"of {MAX_DESCRIPTION:,}", "")))
    if spec.each_line != (lines is not None):
        out.append(("lines", ("an each-line bag needs its lines, and only an each-line bag has lines", "")))
    if spec.each_line and (spec.command or spec.parameters):  # (they were dropped without a word)
        out.append(("command" if spec.command else "parameters",
                    ("an each-line bag runs its lines, one command each: it has no command or parameters of its own",
                     "drop command and parameters, or send a spec without each_line")))
    if lines is not None:
        bad = lines_issues(lines)
        out.extend(("lines", (f"line {i + 1}: {message}", hint)) for i, (message, hint) in bad[:MAX_PROBLEMS])
    if params_ok and not out:
        out.extend(command_issues(spec))
        total = len(lines) if lines is not None else spec.sweep_size
        if issue := jobs_issue(total, max_jobs, "the bag", SERVER_HINT):
            out.append(("parameters", issue))
    return out


def _parameter_issue(p: Parameter) -> Issue | None:
    """What is wrong with one decoded parameter: a list of values, or a range of numbers, not both."""
    is_range = (p.start, p.stop, p.step) != (None, None, None)
    if (p.values is None) == (not is_range):
        return (f"parameter '{p.name}' must have either values or a range (start, stop and step)",
                "send values = [...], or start, stop and step")
    if p.values is not None:
        return values_issue(p.name, p.values)
    bounds = []
    for key, text in (("start", p.start), ("stop", p.stop), ("step", p.step)):
        number = _decimal(text) if text is not None else None
        if number is None:
            return f"'{key}' of range '{p.name}' must be a number, not {shown(text)}", ""
        bounds.append(number)
    return range_issue(p.name, *bounds)


def _number_issues(spec: BagSpec) -> list[tuple[str, Issue]]:
    """The spec's counts, durations and sizes, in the ranges the TOML validator allows."""
    out: list[tuple[str, Issue]] = []
    if not 1 <= spec.quorum <= MAX_QUORUM:
        out.append(("quorum", (f"'quorum' must be from 1 to {MAX_QUORUM}, not {spec.quorum}", "")))
    if spec.max_instances is not None and not spec.quorum <= spec.max_instances <= MAX_COUNT:
        out.append(("max_instances", (f"'max_instances' must be from the quorum ({spec.quorum}) to {MAX_COUNT:,}, "
                                      f"not {spec.max_instances}", "")))
    if not 0 <= spec.spot_check <= 1:
        out.append(("spot_check", (f"'spot_check' must be a fraction from 0 to 1, not {spec.spot_check}", "")))
    if spec.compare and (problem := validator_name_problem(spec.compare)):
        out.append(("compare", (problem, 'e.g. compare = "fuzzy", a validator of the server\'s pools file')))
    elif spec.compare and spec.quorum < 2:
        out.append(("compare", (f"'compare' needs a quorum of two or more results to compare, not {spec.quorum}",
                                "add quorum = 2")))
    if not 1 <= spec.cpus <= MAX_CPUS:
        out.append(("cpus", (f"'cpus' must be from 1 to {MAX_CPUS:,}, not {spec.cpus}", "")))
    for key, count, low in (("max_failures", spec.max_failures, 1), ("max_processes", spec.max_processes, 1)):
        if count is not None and not low <= count <= MAX_COUNT:
            out.append((key, (f"'{key}' must be a whole number from {low} to {MAX_COUNT:,}, not {count}", "")))
    for key, seconds in (("instance_deadline", spec.instance_deadline), ("timeout", spec.timeout),
                         ("cpu_time", spec.cpu_time)):
        if seconds is not None and (problem := duration_problem(seconds)):
            out.append((key, (f"'{key}': {problem}", "")))
    for key, size, low in (("memory", spec.memory, MIN_MEMORY), ("max_file_size", spec.max_file_size, 1)):
        if size is not None and (problem := size_problem(size) or (
                f"{size:,} bytes is less than {low:,}" if size < low else "")):
            out.append((key, (f"'{key}': {problem}", "")))
    if spec.budget is not None and (problem := budget_problem(spec.budget)):
        out.append(("budget", (problem, "")))
    if spec.bag_deadline is not None and (problem := duration_problem(spec.bag_deadline)):
        out.append(("bag_deadline", (f"'bag_deadline': {problem}", "")))
    if spec.bag_deadline_at is not None and not (math.isfinite(spec.bag_deadline_at)
                                                 and 0 < spec.bag_deadline_at <= MAX_EPOCH):
        out.append(("bag_deadline_at", (f"'bag_deadline_at' must be a time from 1970 to the year 33658 (0 to "
                                        f"{MAX_EPOCH:.0e} s), not {spec.bag_deadline_at:g}",
                                        "give a date with its time zone, e.g. 2026-12-01T17:00:00Z")))
    if spec.bag_deadline is not None and spec.bag_deadline_at is not None:
        out.append(("bag_deadline", ("give 'bag_deadline' (after submission) or 'bag_deadline_at' (absolute), "
                                     "not both", "")))
    return out


MAX_EPOCH = 1e12
"""The latest time a spec may name, in seconds since 1970 (the year 33658; as times a host reports)."""


def _render_value(v: str | int | float) -> str:
    if isinstance(v, float):
        return _render_decimal(Decimal(repr(v))) if math.isfinite(v) else str(v)
    return str(v)


_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
_ARRAY_HEADER = re.compile(r"^\s*\[\[\s*([^\[\]]+?)\s*\]\]\s*(#.*)?$")
_KEY = re.compile(r'^\s*("[^"]*"|[A-Za-z0-9_.\-]+)\s*=')


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Map each key path of a TOML text (`("parameters", "seed")`) to the line that defines it.

    tomllib keeps no positions, so semantic errors find their line here; dotted and quoted keys are
    handled, keys inside inline tables report the line of their table. The tables of an array of tables
    (`[[pools.p.external]]`) are numbered from 0: `("pools", "p", "external", "1", "count")`.
    """
    lines: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    arrays: dict[tuple[str, ...], int] = {}
    for n, raw in enumerate(text.split("\n"), 1):  # TOML's lines end at LF (CRLF keeps its CR: no matter here)
        if (m := _ARRAY_HEADER.match(raw)) or (m := _HEADER.match(raw)):
            table = tuple(part.strip().strip('"') for part in m.group(1).split("."))
            if m.re is _ARRAY_HEADER:
                index = arrays[table] = arrays.get(table, -1) + 1
                table = (*table, str(index))
            for i in range(1, len(table) + 1):
                lines.setdefault(table[:i], n)
        elif m := _KEY.match(raw):
            key = tuple(part.strip('"') for part in m.group(1).split(".")) if not m.group(1).startswith('"') \
                else (m.group(1).strip('"'),)
            lines.setdefault(table + key, n)
    return lines


VALIDATOR_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
"""A validator's name, as `[validators.NAME]` and a spec's `compare` give it."""


def validator_name_problem(name: str) -> str:
    """Why `name` cannot name a validator ("": it can)."""
    if VALIDATOR_NAME.fullmatch(name):
        return ""
    return (f"'compare' must name a validator: a letter, then up to 63 letters, digits, '-' or '_', not "
            f"{shown(name)}")
