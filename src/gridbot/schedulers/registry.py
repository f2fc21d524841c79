"""The registry of strategies by name, and the factory the server and the simulator give the dispatcher.

Adding a strategy is one module (a subclass of `TailStrategy` or `Placement`) and one line below.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

import msgspec

from gridbot.core.strategy import BagStrategies
from gridbot.model.hierarchy import QueueSpec
from gridbot.model.spec import BagSpec, StrategyChoice, closest
from gridbot.schedulers.base import Placement, StrategyError, TailStrategy
from gridbot.schedulers.economy import PLACEMENTS as DBC_PLACEMENTS
from gridbot.schedulers.expert.tail import ExpertTail
from gridbot.schedulers.hierarchy import Hierarchy, HierarchyPlacement
from gridbot.schedulers.placement import GridBotPlacement
from gridbot.schedulers.replication import GridBotTail
from gridbot.schedulers.selection import PLACEMENTS as SELECTION_PLACEMENTS
from gridbot.schedulers.selection import Selector, StatefulPlacement

TAILS: dict[str, type[TailStrategy]] = {
    GridBotTail.name: GridBotTail,
    ExpertTail.name: ExpertTail,
}
PLACEMENTS: dict[str, type[Placement]] = {
    GridBotPlacement.name: GridBotPlacement,
    HierarchyPlacement.name: HierarchyPlacement,
    **{p.name: p for p in DBC_PLACEMENTS},
    **{p.name: p for p in SELECTION_PLACEMENTS},
}


def check_bag(spec: BagSpec, hierarchy: bool | None = None) -> None:
    """`check` the bag's `[strategy]`, and refuse a deadline or a budget its placement would not keep, and the
    hierarchy's placement where there are no queues (`hierarchy`: whether there are; None: not known here)."""
    check(spec.strategy)
    if hierarchy is False and spec.strategy.placement == HierarchyPlacement.name:
        raise StrategyError("placement 'hierarchy' needs queues, and this server has none: declare [queues.NAME] "
                            "in its pools file (docs/hierarchy.md), or choose another placement")
    qos = [k for k, v in (("bag_deadline", spec.bag_deadline), ("bag_deadline", spec.bag_deadline_at),
                          ("budget", spec.budget)) if v is not None]
    if qos and not PLACEMENTS[spec.strategy.placement].counts_money:
        takes = ", ".join(n for n, p in PLACEMENTS.items() if p.counts_money)
        raise StrategyError(f"placement {spec.strategy.placement!r} does not keep a bag's {qos[0]}: set "
                            f"[strategy] placement to one that does ({takes})")


def check(choice: StrategyChoice) -> None:
    """Refuse (StrategyError, naming the fix) a `[strategy]` table naming an unknown strategy, or options
    neither of its strategies takes, or an option of the wrong type."""
    tail = _lookup("tail", choice.tail, TAILS)
    placement = _lookup("placement", choice.placement, PLACEMENTS)
    known: dict[str, object] = {**tail.options, **placement.options}
    for key, value in choice.options.items():
        if key not in known:
            takes = ", ".join(sorted(known)) or "no options"
            hint = closest(key, list(known))
            owners = [n for n, p in PLACEMENTS.items() if key in p.options]
            if not hint and owners:
                needs = " (which needs a server with queues)" if owners[0] == HierarchyPlacement.name else ""
                hint = f"it is an option of placement = {owners[0]!r}{needs}: name that placement in [strategy], or " \
                       "remove it;"
            raise StrategyError(f"strategy option '{key}' is not an option of tail = {choice.tail!r} or placement = "
                                f"{choice.placement!r}: {hint + ' ' if hint else ''}they take {takes}")
        default = known[key]
        if not _same_type(value, default):
            raise StrategyError(f"strategy option '{key}' must be {type(default).__name__} like its default "
                                f"{default!r}, not {value!r}")
    tail.validate(choice.options)
    placement.validate(choice.options)


class Factory:
    """Makes a bag's strategies from its spec (checked at submission with `check_bag`); `seed` seeds the
    strategies' random draws, different per bag. With `queues` (the pools file's hierarchy) every bag whose
    placement is "hierarchy" shares one `Hierarchy` (`hierarchy`), and the bags of one stateful selection
    `stream` one record of placed work (`selectors`)."""

    def __init__(self, seed: int = 1, queues: Sequence[QueueSpec] = ()) -> None:
        self.seed = seed
        self.hierarchy = Hierarchy(queues) if queues else None
        self.selectors: dict[tuple[str, str], Selector] = {}

    def __call__(self, bag_id: int, spec: BagSpec) -> BagStrategies:
        choice = spec.strategy
        bag_seed = self.seed + (bag_id - 1) * 7919
        tail = _lookup("tail", choice.tail, TAILS)(bag_id, bag_seed, choice.options)
        cls = _lookup("placement", choice.placement, PLACEMENTS)
        if cls is HierarchyPlacement:
            placement: Placement = HierarchyPlacement(bag_id, bag_seed, choice.options, self.hierarchy)
        elif issubclass(cls, StatefulPlacement):
            stream = str(choice.options.get("stream", ""))
            selector = self.selectors.setdefault((cls.name, stream), Selector())
            placement = cls(bag_id, bag_seed, choice.options, selector)
        else:
            placement = cls(bag_id, bag_seed, choice.options)
        return BagStrategies(tail, placement)


def factory(seed: int = 1, queues: Sequence[QueueSpec] = ()) -> Factory:
    """The factory the server and the simulator give the dispatcher (`Factory`)."""
    return Factory(seed, queues)


def default_placement(spec: BagSpec, hierarchy: bool) -> BagSpec:
    """The spec, with placement "hierarchy" where the server has queues and the bag names GridBot's default
    placement: on such a server every bag is served at its level unless it asks otherwise."""
    if not hierarchy or spec.strategy.placement != "gridbot":
        return spec
    return msgspec.structs.replace(spec, strategy=msgspec.structs.replace(spec.strategy, placement="hierarchy"))


S = TypeVar("S")


def _lookup(role: str, name: str, table: Mapping[str, type[S]]) -> type[S]:
    cls = table.get(name)
    if cls is None:
        hint = closest(name, list(table))
        raise StrategyError(f"unknown {role} strategy {name!r} in [strategy]; "
                            + (f"{hint} " if hint else "")
                            + f"the {role} strategies are: {', '.join(sorted(table))}")
    return cls


def _same_type(value: object, default: object) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, int | float)
    return type(value) is type(default)
