"""Random quantities of a scenario: job runtimes, queue waits, host speeds, lifetimes, turnaround ratios.

A scenario writes each as a number (a constant), a duration string (`"10m"`), or a table naming a
distribution (`{ dist = "uniform", low = "10m", high = "15m" }`) or a trace (`{ trace = "blastall" }`,
`{ swf = "NASA-iPSC" }`, `{ fta = "overnet03" }`, `{ lanl = "between_failures" }`). Every draw takes
the simulator's own `random.Random`, so a run is a pure function of its scenario and seed.
"""

from __future__ import annotations

import difflib
import math
import random
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gridbot.errors import GridbotError
from gridbot.model.spec import MAX_DURATION, as_float, duration_problem, shown
from gridbot.sim import traces

DIST_KEYS: dict[str, tuple[str, ...]] = {
    "constant": ("value",),
    "uniform": ("low", "high"),
    "exponential": ("mean",),
    "normal": ("mean", "sd"),
    "lognormal": ("mu", "sigma"),
    "weibull": ("shape", "scale"),
    "gamma": ("shape", "scale"),
    "empirical": ("values",),
}
"""Each named distribution and its required parameters (durations may be written with units)."""
OPTIONAL_KEYS = ("min", "max", "unit")
TRACE_KEYS = ("trace", "swf", "fta", "lanl")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_LOG_MAX = math.log(sys.float_info.max)
"""The largest logarithm of a float (about 709.8): a lognormal's mean exp(mu + sigma²/2) overflows above it."""


class DistError(GridbotError, ValueError):
    """A distribution that cannot be built; the message names the problem and the fix (still a ValueError, as
    callers caught it)."""


_DECIMAL = re.compile(r"\s*[-+]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?|inf(?:inity)?|nan)\s*",
                      re.ASCII | re.IGNORECASE)
"""A number as a duration's text writes it: ASCII digits, a point, an exponent (as a spec's durations, model/spec.py);
inf and nan too, which the checks after it refuse by name."""


def seconds(value: object, allow_zero: bool = True) -> float:
    """Seconds from a number or a string like `"90s"`, `"10m"`, `"2h"`, `"1.5d"`, at most MAX_DURATION as a
    spec's durations are: a runtime of 1e300 s would run the simulation to its horizon without a word."""
    if isinstance(value, bool):
        raise DistError("a duration is a number of seconds or a string like '90s', '10m', '2h', '1d'")
    if isinstance(value, int | float):
        out = as_float(value)
    elif isinstance(value, str):
        text = value.strip()
        unit = text[-1:] if text[-1:] in _UNITS else "s"
        number = text[:-1] if text[-1:] in _UNITS else text
        try:
            if not _DECIMAL.fullmatch(number):  # float() reads any script's digits and '1_0': "١٠s" was 10 s
                raise ValueError(number)
            out = float(number) * _UNITS[unit]
        except ValueError:
            raise DistError(f"{shown(value)} is not a duration: write a number of seconds or '90s', '10m', "
                            "'2h', '1d'") from None
    else:
        raise DistError(f"{shown(value)} is not a duration: write a number of seconds or '90s', '10m', '2h', "
                        "'1d'")
    if math.isnan(out) or out < 0 or (out == 0 and not allow_zero):
        raise DistError(f"{shown(value)} must be {'zero or more' if allow_zero else 'more than zero'}")
    if out > MAX_DURATION:
        raise DistError(f"{shown(value)}: {duration_problem(out)}")
    return out


@dataclass(frozen=True)
class Dist:
    """A distribution of non-negative numbers, drawn with the caller's random generator."""

    describe: str
    draw: Callable[[random.Random], float]
    mean: float
    """The distribution's mean (of the clipped samples for empirical ones), for sizing and reports."""

    def sample(self, rng: random.Random) -> float:
        return self.draw(rng)


def constant(value: float) -> Dist:
    return Dist(f"{value:g}", lambda _rng: value, value)


def empirical(values: Sequence[float], describe: str) -> Dist:
    """Draw uniformly from measured values (a trace's column)."""
    vals = [float(v) for v in values if v >= 0 and math.isfinite(v)]
    if not vals:
        raise DistError(f"{describe} holds no usable values")
    n = len(vals)
    return Dist(f"{describe} ({n:,} values)", lambda rng: vals[int(rng.random() * n)], sum(vals) / n)


def parse_dist(value: object, what: str, durations: bool = True, base: Path = Path()) -> Dist:
    """Build a distribution from a scenario value; `what` names it in errors (`"runtime of bag b1"`).

    With `durations`, numbers are seconds and strings may carry units; without, values are plain numbers. A file
    it names (`swf = "log.swf"`) is found from `base`, the scenario's folder, as `[swf_bags]` logs are.
    """
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        if not durations:
            return constant(_number(value, what))
        try:
            return constant(seconds(value))
        except DistError as e:
            raise DistError(f"{what}: {e}") from None
    if not isinstance(value, dict):
        raise DistError(f"{what}: {value!r} is neither a number nor a table like "
                        '{ dist = "uniform", low = 1, high = 2 }')
    traced = [k for k in TRACE_KEYS if k in value]
    if traced:
        return _in_range(_scaled(_trace(value, traced[0], what, base), value, what, durations), what, durations)
    name = value.get("dist")
    if name not in DIST_KEYS:
        names = ", ".join(DIST_KEYS)
        guess = difflib.get_close_matches(str(name), list(DIST_KEYS), n=1)
        hint = f"did you mean '{guess[0]}'? " if guess else ""
        raise DistError(f"{what}: unknown distribution {name!r}; {hint}use dist = one of {names}, or a trace: "
                        f"{', '.join(k + ' = ...' for k in TRACE_KEYS)}")
    allowed = ("dist", *DIST_KEYS[name], *OPTIONAL_KEYS)
    for key in value:
        if key not in allowed:
            raise DistError(f"{what}: '{key}' is not a parameter of the {name} distribution "
                            f"(it takes {', '.join(DIST_KEYS[name])}; optional {', '.join(OPTIONAL_KEYS)})")
    for key in DIST_KEYS[name]:
        if key not in value:
            raise DistError(f"{what}: the {name} distribution needs '{key}' "
                            f"(it takes {', '.join(DIST_KEYS[name])})")

    def num(key: str, scaled: bool = True) -> float:
        v = value[key]
        return seconds(v) if durations and scaled else _number(v, f"{what}: '{key}'")

    dist: Dist
    if name == "constant":
        dist = constant(num("value"))
    elif name == "uniform":
        low, high = num("low"), num("high")
        if high < low:
            raise DistError(f"{what}: high ({high:g}) is below low ({low:g})")
        dist = Dist(f"uniform({low:g}, {high:g})", lambda rng: rng.uniform(low, high), (low + high) / 2)
    elif name == "exponential":
        mean = num("mean")
        if mean <= 0:
            raise DistError(f"{what}: the exponential mean must be more than zero")
        dist = Dist(f"exponential(mean {mean:g})", lambda rng: rng.expovariate(1 / mean), mean)
    elif name == "normal":
        mean, sd = num("mean"), num("sd")
        _not_negative(what, sd=sd)
        dist = Dist(f"normal({mean:g}, {sd:g})", lambda rng: max(0.0, rng.gauss(mean, sd)), mean)
    elif name == "lognormal":
        mu, sigma = num("mu", False), num("sigma", False)
        _not_negative(what, sigma=sigma)
        dist = Dist(f"lognormal(mu {mu:g}, sigma {sigma:g})", lambda rng: rng.lognormvariate(mu, sigma),
                    _lognormal_mean(what, mu, sigma, durations))
    elif name == "weibull":
        shape, scale = num("shape", False), num("scale")
        _positive(what, shape=shape, scale=scale)
        dist = Dist(f"weibull(shape {shape:g}, scale {scale:g})", lambda rng: rng.weibullvariate(scale, shape),
                    _weibull_mean(what, shape, scale))
    elif name == "gamma":
        shape, scale = num("shape", False), num("scale")
        _positive(what, shape=shape, scale=scale)
        dist = Dist(f"gamma(shape {shape:g}, scale {scale:g})", lambda rng: rng.gammavariate(shape, scale),
                    shape * scale)
    else:
        values = value["values"]
        if not isinstance(values, list) or not values:
            raise DistError(f"{what}: 'values' must be a non-empty list")
        dist = empirical([seconds(v) if durations else _number(v, what) for v in values], "listed values")
    return _in_range(_scaled(dist, value, what, durations, unit_allowed=name in ("lognormal",)), what, durations)


def _in_range(dist: Dist, what: str, durations: bool) -> Dist:
    """The distribution, if its mean is a number the simulator can use: finite, and for durations at most
    MAX_DURATION (a spec's longest), or the simulation would only run to its horizon with nothing ending."""
    limit = MAX_DURATION if durations else sys.float_info.max
    if not dist.mean <= limit:
        unit = " s" if durations else ""
        raise DistError(f"{what}: the mean of {dist.describe} is out of range ({dist.mean:g}{unit}); it must be at "
                        f"most {limit:g}{unit}{' (about 31 years)' if durations else ''}: lower its parameters, "
                        "or add a max")
    return dist


def _lognormal_mean(what: str, mu: float, sigma: float, durations: bool) -> float:
    """exp(mu + sigma²/2), or DistError naming mu and sigma when it overflows (mu = 1000, or sigma = 40)."""
    try:
        exponent = mu + sigma**2 / 2
    except OverflowError:
        exponent = math.inf
    if exponent <= _LOG_MAX:
        return math.exp(exponent)
    advice = (f"for a duration in seconds keep it at most {math.log(MAX_DURATION):.1f} (a mean of 31 years): "
              "mu and sigma are those of the logarithm of the value (mu = 6, sigma = 1 is a median of 400 s)"
              if durations else f"keep it at most {math.floor(_LOG_MAX)}")
    raise DistError(f"{what}: the mean of the lognormal, exp(mu + sigma²/2), is out of range: mu + sigma²/2 is "
                    f"{exponent:g} (mu {mu:g}, sigma {sigma:g}); {advice}")


def _weibull_mean(what: str, shape: float, scale: float) -> float:
    """scale × Γ(1 + 1/shape), or DistError naming the shape when it overflows (shape = 0.001)."""
    try:
        mean = scale * math.gamma(1 + 1 / shape)
    except OverflowError:
        mean = math.inf
    if math.isfinite(mean):
        return mean
    raise DistError(f"{what}: the mean of the weibull, scale × Γ(1 + 1/shape), is out of range: shape {shape:g} is "
                    "too small (the mean grows as Γ(1 + 1/shape), 3.6 million times the scale at a shape of 0.1); "
                    "raise shape to 0.1 or more")


def _scaled(dist: Dist, table: dict[str, object], what: str, durations: bool, unit_allowed: bool = True) -> Dist:
    """Apply the optional `unit` (a multiplier: a lognormal of log-minutes has unit = "1m") and min/max."""
    factor = 1.0
    if "unit" in table:
        if not unit_allowed:
            raise DistError(f"{what}: 'unit' applies to lognormal and trace distributions only; write the "
                            "parameters with units instead ('10m')")
        factor = seconds(table["unit"], allow_zero=False) if durations else _number(table["unit"], what)
    low = (seconds(table["min"]) if durations else _number(table["min"], what)) if "min" in table else 0.0
    high = (seconds(table["max"]) if durations else _number(table["max"], what)) if "max" in table else math.inf
    if high < low:
        raise DistError(f"{what}: max ({high:g}) is below min ({low:g})")
    if factor == 1.0 and low == 0.0 and high == math.inf:
        return dist
    inner = dist.draw

    def draw(rng: random.Random) -> float:
        return min(high, max(low, inner(rng) * factor))

    mean = min(high, max(low, dist.mean * factor))
    return Dist(f"{dist.describe} x{factor:g}" if factor != 1 else dist.describe, draw, mean)


def _trace(table: dict[str, object], key: str, what: str, base: Path) -> Dist:
    allowed = {"trace": ("trace", "unit", "min", "max"), "swf": ("swf", *traces.SwfFilter.KEYS, "unit", "min", "max"),
               "fta": ("fta", "family", "interval", "min", "max"), "lanl": ("lanl", "unit", "min", "max")}[key]
    for k in table:
        if k not in allowed:
            raise DistError(f"{what}: '{k}' does not go with {key} = ... (it takes {', '.join(allowed)})")
    try:
        if key == "trace":
            return empirical(traces.task_runtimes(str(table["trace"])), f"measured {table['trace']} runtimes")
        if key == "swf":
            log = traces.swf_source(str(table["swf"]), base)
            return empirical(traces.swf_runtimes(log, traces.SwfFilter.from_table(table)),
                             f"runtimes of SWF log {table['swf']}")
        if key == "fta":
            return _fta(str(table["fta"]), str(table.get("family", "Wbl")), str(table.get("interval", "available")),
                        what)
        return empirical(traces.lanl_intervals(str(table["lanl"])), f"LANL {table['lanl']}")
    except traces.TraceError as e:
        raise DistError(f"{what}: {e}") from None


def _fta(trace: str, family: str, interval: str, what: str) -> Dist:
    """A fitted availability (or unavailability) interval of a Failure Trace Archive trace, in seconds."""
    if interval not in ("available", "unavailable"):
        raise DistError(f"{what}: interval must be 'available' or 'unavailable', not {interval!r}")
    kind, p1, p2 = traces.fta_fit(trace, family, interval == "available")
    hour = 3600.0
    label = f"FTA {trace} {interval} ({kind})"
    if kind == "Exponential":
        return Dist(label, lambda rng: rng.expovariate(1 / p1) * hour, p1 * hour)
    if kind == "Weibull":
        return Dist(label, lambda rng: rng.weibullvariate(p2, p1) * hour, p2 * math.gamma(1 + 1 / p1) * hour)
    if kind == "LogNormal":
        return Dist(label, lambda rng: rng.lognormvariate(p1, p2) * hour, math.exp(p1 + p2**2 / 2) * hour)
    return Dist(label, lambda rng: rng.gammavariate(p1, p2) * hour, p1 * p2 * hour)


def _number(value: object, what: str) -> float:
    """A finite number; a whole number too large for a float (TOML takes any) is refused as one out of range."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DistError(f"{what}: {shown(value)} is not a number")
    out = as_float(value)
    if not math.isfinite(out):
        raise DistError(f"{what}: {shown(value)} is not a finite number; it must be at most "
                        f"{sys.float_info.max:g} in size")
    return out


def _not_negative(what: str, **values: float) -> None:
    """A spread below zero is a typo: Python's generators draw from it as from its absolute value, so the
    scenario would run as if it were written without the sign (issue 14)."""
    for key, v in values.items():
        if v < 0:
            raise DistError(f"{what}: {key} is a spread and cannot be negative, not {v:g}")


def _positive(what: str, **values: float) -> None:
    for key, v in values.items():
        if v <= 0:
            raise DistError(f"{what}: {key} must be more than zero, not {v:g}")
