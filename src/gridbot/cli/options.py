"""The `gridbot server` options of the dispatcher, made from DispatchConfig's fields (`core.config.knobs`):
each field's kind gives the option's type and range, its default and help come from the field."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar

import click

from gridbot.cli import render
from gridbot.core.config import DispatchConfig, Knob, knob_conflict, knobs


class Finite(click.FloatRange):
    """A click.FloatRange that refuses nan and infinity as well: click's range check lets nan through (every
    comparison with it is false) and an open end lets inf through, and no option here means either (a
    duration, a fraction or an amount of money; "never" is 0 where an option has it)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        number: float = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number; give one in the range {self._describe_range()}", param,
                      ctx)
        return number

F = TypeVar("F", bound=Callable[..., Any])
DISPATCH_SECTION = "Dispatcher options (a simulation's [server] keys too: see docs/simulation.md)"
KNOBS = {k.name: k for k in knobs()}


class Size(click.ParamType[int]):
    """Bytes from `1024`, `64K`, `16M` or `2G`, at least `low`."""

    name = "size"

    def __init__(self, low: int = 0) -> None:
        self.low = low

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        n = value if isinstance(value, int) else render.parse_size(str(value))
        if n < self.low:
            self.fail(f"{value} is below the least that works, {size_text(self.low)}", param, ctx)
        return n


def size_text(n: int) -> str:
    """`16M` for 16 MiB: a size as an option takes it."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def knob_option(k: Knob) -> Callable[[F], F]:
    """The option of one DispatchConfig field; the command gets its value, converted, as the field's name."""
    if k.kind == "flag":
        return click.option(k.option, k.name, is_flag=True, default=k.default, help=k.help)
    if k.kind == "pools":
        return click.option(k.option, k.name, multiple=True, metavar="POOL", help=k.help,
                            callback=lambda ctx, param, value: frozenset(value))
    if k.kind == "size":
        return click.option(k.option, k.name, type=Size(int(k.low)), default=size_text(k.default), show_default=True,
                            metavar="SIZE", help=k.help)
    if k.kind == "count":
        kind: click.ParamType[Any] = click.IntRange(int(k.low))
    else:
        kind = Finite(k.low, min_open=k.low == 0)
    return click.option(k.option, k.name, type=kind, default=k.default, show_default=True,
                        metavar="N" if k.kind == "count" else "SECONDS", help=k.help)


def dispatch_options(fn: F) -> F:
    """Add an option per DispatchConfig field that has one, and call `fn` with their values gathered into
    `dispatch=DispatchConfig(...)` (the fields without an option keep their defaults)."""
    exposed = [k for k in knobs() if k.option]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {k.name: kwargs.pop(k.name) for k in exposed}
        if (conflict := knob_conflict(values)) is not None:
            raise click.UsageError(conflict.replace("replicas_first", "--replicas-first").replace(
                "replicas_mixed", "--replicas-mixed"))
        return fn(*args, dispatch=DispatchConfig(**values), **kwargs)

    out: Callable[..., Any] = wrapper
    for k in reversed(exposed):
        out = knob_option(k)(out)
    return out  # type: ignore[return-value]


class DispatchCommand(click.Command):
    """A command whose help lists the dispatcher's options that a scenario also takes in a section of their
    own, after the others."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        own: list[tuple[str, str]] = []
        dispatch: list[tuple[str, str]] = []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and not isinstance(param, click.Argument):
                (dispatch if param.name in KNOBS and KNOBS[param.name].scenario else own).append(record)
        for title, rows in (("Options", own), (DISPATCH_SECTION, dispatch)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)
