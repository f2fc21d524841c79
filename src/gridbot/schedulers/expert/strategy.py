"""The NTDMr strategy space (ExPERT section 3), the static strategies to beat (section 5.3), and prices.

In the tail, a task not yet done gets another instance once T seconds have passed since its last one was
sent and none of its instances waits in a queue: instances 1..N (counted from the tail's start) go to the
unreliable pools, each with deadline D; instance N+1 goes to the reliable pool, which has Mr x #ur
machines. Queued instances of a task that succeeds are cancelled; instances already sent run on.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from gridbot.errors import GridbotError


class StrategyValueError(GridbotError, ValueError):
    """A strategy's parameters are out of their range."""


@dataclass(frozen=True, slots=True)
class NTDMr:
    """One point of the strategy space; times in seconds."""

    n: int | None
    """Most instances per task sent to the unreliable pools in the tail (None: no limit, N = infinity, so
    the reliable pool is never used)."""
    t: float
    """Seconds to wait after a task's last instance was sent before sending another."""
    d: float
    """The deadline of an instance sent to the unreliable pools in the tail."""
    mr: float
    """Reliable machines per unreliable machine."""

    def __post_init__(self) -> None:
        if self.n is not None and self.n < 0:
            raise StrategyValueError(f"N must be 0 or more (or None for no limit), not {self.n}")
        if not (self.t >= 0.0 and self.d >= 0.0 and math.isfinite(self.t) and math.isfinite(self.d)):
            raise StrategyValueError(f"T and D must be finite and non-negative, not T={self.t}, D={self.d}")
        if not self.mr >= 0.0:
            raise StrategyValueError(f"Mr must be non-negative, not {self.mr}")

    def reliable_machines(self, unreliable: int) -> int:
        """The reliable pool's size for `unreliable` machines: Mr x #ur, rounded to the nearest machine."""
        return math.floor(self.mr * unreliable + 0.5)

    def machines_applied(self, unreliable: int) -> int:
        """The reliable machines the tail uses for `unreliable` machines: Mr x #ur rounded, but at least one
        for any Mr > 0 (a small Mr on few machines would otherwise round to none and the tail never end)."""
        return max(1, self.reliable_machines(unreliable)) if self.mr > 0 else 0

    def describe(self, tur: float) -> str:
        """Compact, with T and D in units of T_ur: "N=3 T=1Tur D=2Tur Mr=0.02"."""
        n = "inf" if self.n is None else str(self.n)
        return f"N={n} T={_units(self.t, tur)} D={_units(self.d, tur)} Mr={self.mr:g}"


class Combine(enum.Enum):
    """Whether idle reliable machines also take work from the unreliable pools' queue (the CN strategies)."""

    NEVER = "never"
    THROUGHPUT = "throughput"
    """Only before the tail starts (CN1T0)."""
    ALWAYS = "always"
    """Throughout the bag (CN-infinity)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """A strategy for a whole bag: the throughput phase's behaviour, then an NTDMr tail.

    Every plan sends no replicas before the tail (N = infinity, T = D = the throughput deadline); the
    static strategies differ in how they use the reliable pool."""

    name: str
    tail: NTDMr
    combine: Combine = Combine.NEVER
    from_start: bool = False
    """The tail strategy applies from the bag's first task (AR: everything to the reliable pool)."""
    budget: float | None = None
    """B: once the remaining tasks would cost no more than what is left of `budget` (total, in the prices'
    currency) on the reliable pool, send each of them there (N = 0, T = 0)."""


@dataclass(frozen=True, slots=True)
class Prices:
    """What an instance that returns a result costs (the paper ignores failed instances' costs)."""

    unreliable_per_hour: float = 1.0
    """Per CPU hour on the unreliable pools: the paper's C_ur, 100 W at 10 cents per kWh = 1 cent."""
    reliable_per_hour: float = 34.0
    """Per CPU hour on the reliable pool: the paper's C_r, EC2 m1.large on demand = 34 cents."""
    charging_period: float = 1.0
    """Seconds the reliable pool charges by; an instance pays whole periods (3600 on hourly EC2)."""

    def __post_init__(self) -> None:
        if self.unreliable_per_hour < 0 or self.reliable_per_hour < 0 or self.charging_period <= 0:
            raise StrategyValueError("prices must be non-negative and the charging period positive")

    def reliable(self, seconds: np.ndarray) -> np.ndarray:
        """The cost of reliable instances that ran `seconds`."""
        periods = np.ceil(seconds / self.charging_period - 1e-9) * self.charging_period
        return np.asarray(periods * (self.reliable_per_hour / 3600.0))

    def unreliable(self, seconds: np.ndarray) -> np.ndarray:
        """The cost of unreliable instances that returned a result after `seconds`."""
        return np.asarray(seconds * (self.unreliable_per_hour / 3600.0))


def sample_space(tur: float, mr_max: float, n_values: range = range(4), points: int = 5, mr_points: int = 5,
                 d_max: float = 4.0, mr_min: float = 0.02) -> list[NTDMr]:
    """The paper's sampling (section 6.1): N in `n_values`, Mr at `mr_points` points from `mr_min` to
    `mr_max`, and 0 <= T <= D <= `d_max` T_ur with T and D at `points` points each (0, 1, ..., 4 T_ur)."""
    if points < 2 or mr_points < 1 or mr_max < mr_min or tur <= 0:
        raise StrategyValueError("the sampling needs 2 or more T/D points, 1 or more Mr points, mr_min <= mr_max "
                                 "and a positive T_ur")
    times = np.linspace(0.0, d_max * tur, points)
    mrs = np.linspace(mr_min, mr_max, mr_points) if mr_points > 1 else np.array([mr_max])
    return [NTDMr(n, float(t), float(d), round(float(mr), 6))
            for n in n_values for d in times for t in times if t <= d for mr in mrs]


def static_plans(tur: float, mr_max: float, tasks: int, budget_per_task: float = 2 / 3,
                 throughput_deadline: float | None = None) -> dict[str, Plan]:
    """The seven static strategies of section 5.3, for a bag of `tasks` tasks.

    The throughput phase sends no replicas, with deadline `throughput_deadline` (default 4 T_ur); B's
    budget is `budget_per_task` x `tasks` (the paper's 2/3 cent per task)."""
    d = 4.0 * tur if throughput_deadline is None else throughput_deadline
    return {
        "AR": Plan("AR", NTDMr(0, 0.0, d, mr_max), from_start=True),
        "TRR": Plan("TRR", NTDMr(0, 0.0, d, mr_max)),
        "TR": Plan("TR", NTDMr(0, d, d, mr_max)),
        "AUR": Plan("AUR", NTDMr(None, d, d, 0.0)),
        "B": Plan("B", NTDMr(None, d, d, mr_max), budget=budget_per_task * tasks),
        "CN∞": Plan("CN∞", NTDMr(None, d, d, mr_max), combine=Combine.ALWAYS),
        "CN1T0": Plan("CN1T0", NTDMr(1, 0.0, d, mr_max), combine=Combine.THROUGHPUT),
    }


def _units(seconds: float, tur: float) -> str:
    return f"{seconds / tur:g}Tur" if tur > 0 else f"{seconds:g}s"
