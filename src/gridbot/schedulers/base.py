"""The `Strategy` interface: what a bag's tail strategy and placement may decide, with "no opinion" defaults.

A strategy reads the dispatcher's `DispatchView` and the time it is given, and returns decisions; the
core's kernel applies them. Subclass `TailStrategy` or `Placement`, override what the strategy decides,
and register the class in `gridbot.schedulers.registry`. One instance is made per bag, with the bag's
options (`[strategy]` keys other than `tail` and `placement`), so a strategy may keep state about its
bag (what it spent, what it learnt), but never about other bags.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from gridbot.core.strategy import Choice, LevelReport, Migration, QosReport, TailPlan
from gridbot.core.view import BagView, DispatchView, HostView
from gridbot.errors import GridbotError
from gridbot.model.spec import StrategyOption


class StrategyError(GridbotError, ValueError):
    """A bag names a strategy that does not exist, or gives it options it does not take."""


class Strategy:
    """What every strategy has: a registered name, the options it takes, and the bag it serves."""

    name: ClassVar[str] = ""
    options: ClassVar[Mapping[str, StrategyOption]] = {}
    """The options the strategy takes, with their defaults (a given option must have the default's type;
    an int is accepted for a float)."""

    def __init__(self, bag_id: int, seed: int, options: Mapping[str, StrategyOption]) -> None:
        self.bag_id = bag_id
        self.seed = seed
        """A seed for the strategy's own SplitMix, if it draws random numbers (runs are reproducible)."""
        self.settings: dict[str, StrategyOption] = {**self.options, **{k: v for k, v in options.items()
                                                                      if k in self.options}}

    @classmethod
    def validate(cls, options: Mapping[str, StrategyOption]) -> None:
        """Refuse (StrategyError, naming the fix) option values of the right type that the strategy cannot
        use; called at submission, after the registry checked names and types."""

    def number(self, key: str) -> float:
        """A numeric option's value."""
        value = self.settings[key]
        assert isinstance(value, int | float) and not isinstance(value, bool)
        return float(value)


class TailStrategy(Strategy):
    """When the bag is in its tail, which running jobs get one more instance, and instance deadlines.

    Defaults: the bag is in its tail once none of its jobs is queued (every job has been sent at least
    once: ExPERT's definition), no replicas, and the policies' deadline.
    """

    sets_deadline: ClassVar[bool] = False
    """Set when `deadline` is overridden (the kernel then calls it for every instance)."""

    def in_tail(self, view: DispatchView, bag: BagView, now: float) -> bool:
        return bag.queued == 0

    def replicas(self, view: DispatchView, bag: BagView, room: int, now: float) -> Sequence[Choice]:
        return ()

    def deadline(self, view: DispatchView, bag: BagView, host: HostView, deadline: float, now: float) -> float:
        return deadline

    def pilots(self, view: DispatchView, bag: BagView, pools: Sequence[str], now: float) -> Mapping[str, int] | None:
        return None

    def summary(self, bag: BagView) -> TailPlan | None:
        return None

    def notes(self, view: DispatchView, bag: BagView, now: float) -> list[str]:
        return []


class Placement(Strategy):
    """How much the bag wants a host, pilots per pool, jobs moved between pools.

    Defaults: the policies' Rank as it is, the overlay's planner decides pilots, nothing moves, no bound per
    host, nothing to say of the bag's deadline and budget.
    """

    counts_money: ClassVar[bool] = False
    """It keeps a bag within its budget and plans for its deadline (a bag with either needs such a placement)."""

    host_dependent: ClassVar[bool] = False
    """Set when `rank` is overridden (the kernel then calls it for every request)."""

    places_jobs: ClassVar[bool] = False
    """Set when `migrate` routes every job before it may be sent (a job not routed yet waits for it)."""

    def rank(self, view: DispatchView, bag: BagView, host: HostView, rank: float, now: float) -> float | None:
        return rank

    def pilots(self, view: DispatchView, bag: BagView, pools: Sequence[str], now: float) -> Mapping[str, int] | None:
        return None

    def migrate(self, view: DispatchView, bag: BagView, now: float) -> Sequence[Migration]:
        return ()

    def limit(self, view: DispatchView, bag: BagView, host: HostView, now: float) -> int | None:
        return None

    def notes(self, view: DispatchView, bag: BagView, now: float) -> list[str]:
        return []

    def qos(self, view: DispatchView, bag: BagView, now: float) -> QosReport | None:
        return None

    def level(self, view: DispatchView, bag: BagView, now: float) -> LevelReport | None:
        return None

    def terminate(self, view: DispatchView, bag: BagView, now: float) -> str | None:
        return None
