"""What the core asks of a bag's strategies, and the decisions they give back.

The core calls strategies but never imports them: `gridbot.schedulers` implements these protocols (its
`Strategy` classes and registry), and the server and the simulator pass the registry's factory to the
`Dispatcher`, so both run exactly the same decisions. A strategy reads the `DispatchView` and the time it
is given, and answers; it changes nothing itself, the kernel applies what it returns.

Each bag has two, named in its spec's `[strategy]` table:
- its tail strategy: when the bag is in its tail, which running jobs get one more instance, and each
  instance's deadline;
- its placement: how much the bag wants a host that asks for work (or not at all), pilots wanted per
  pool, and jobs to move to other pools or levels.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar, NamedTuple, Protocol

import msgspec

from gridbot.model.spec import BagSpec

if TYPE_CHECKING:
    from gridbot.core.view import BagView, DispatchView, HostView


class Choice(NamedTuple):
    """A job chosen by a strategy, and why (the job's story shows it)."""

    job_id: int
    why: str
    pools: frozenset[str] | None = None
    """Pools its replica may go to (None: any its policies accept). A job queued again (its instances lost
    or failed) is routed by a choice with pools: it waits for a host of those pools."""


class Migration(NamedTuple):
    """Move a job to other pools: its running instances are withdrawn (no failure) and it is queued again
    for hosts of `pools` only."""

    job_id: int
    pools: frozenset[str]
    why: str


class TailPlan(msgspec.Struct, frozen=True):
    """What a tail strategy planned for its bag's tail and how the tail went (ExPERT's; `gridbot status`
    shows it). Times are seconds, costs per tail task in the pools' currency."""

    strategy: str
    """The strategy in force, as its strategy says it ("N=3 T=1Tur D=2Tur Mr=0.1")."""
    utility: str
    tail_start: float
    """When the tail began (T_tail, the server's clock)."""
    planned_at: float
    plans: int
    """How many times the tail was planned (the statistics changed enough to plan it again)."""
    tasks: int
    """Tasks left when the tail began."""
    predicted_makespan: float
    """Of the tail, from `tail_start` (inf: never ends)."""
    predicted_cost: float
    makespan_error: float
    """One standard deviation: of the estimate's repetitions and of the pools' measured reliability."""
    cost_error: float
    characterization: str
    frontier: list[tuple[str, float, float]] = msgspec.field(default_factory=list)
    """The Pareto frontier: (strategy, tail makespan, cost per task), fastest first."""
    done: int = 0
    """Tail tasks done so far."""
    elapsed: float = 0.0
    """Seconds since `tail_start`, as of the last look."""
    actual_cost: float | None = None
    """Measured so far: results returned since the tail began, priced, per tail task."""
    actual_makespan: float | None = None
    """Measured once every tail task has ended: its last result's time, from `tail_start`."""
    makespan_range: tuple[float, float] | None = None
    """The shortest and longest of the tails the estimate simulated, from `tail_start` (a tail's makespan is
    skewed, often bimodal: this, not the standard deviation, is what a measured tail can be held to)."""
    cost_range: tuple[float, float] | None = None
    """The cheapest and dearest of the simulated tails, per tail task."""
    range_share: float = 0.0
    """The share of tails the ranges hold on average ((n - 1) / (n + 1) for n draws)."""


class QosReport(msgspec.Struct, frozen=True):
    """A bag's deadline and budget, what it spent, and what its placement projects (`gridbot status`, `gridbot
    cost`). Money in the pools' currency; times on the server's clock."""

    strategy: str
    deadline_at: float | None
    budget: float | None
    spent: float
    committed: float
    """What the running instances will cost when they end, as estimated (their pools' cost per job)."""
    projected_cost: float
    """Spent, committed, and what the jobs left will cost as planned."""
    projected_finish: float | None
    """When the last job planned would end (None: nothing planned, or no rate known yet)."""
    planned: dict[str, int]
    """Jobs not yet started, planned per pool."""
    unplanned: int
    """Jobs no pool can take within the deadline and budget."""
    seconds_per_job: dict[str, float]
    """Per pool, the time one job takes on one slot, as measured (or extrapolated from the pools' speeds)."""
    cost_per_job: dict[str, float]
    planned_at: float


class LevelReport(msgspec.Struct, frozen=True):
    """Where the grid execution hierarchy holds a bag (`gridbot status`): its queue and level, its estimated
    complexity, how long it has been there, and its migrations so far (the bag's story of moves)."""

    queue: str
    level: int
    position: int
    """Its place in the queue's FCFS order (1: the head)."""
    complexity: float | None
    """Its remaining work as estimated, in CPU-seconds of a speed-1 CPU (None: unknown yet)."""
    source: str
    """Where the estimate comes from: "given", "measured", or "unknown"."""
    queued_for: float
    """Seconds since it entered its queue (the paper's t_q)."""
    running_for: float
    """Seconds since its first instance was sent in this queue (t_e; 0 before)."""
    migrations: list[tuple[float, str, str, str]] = msgspec.field(default_factory=list)
    """(when, from queue, to queue, why), oldest first."""
    ended: str = ""
    """Why the hierarchy ended it ("": it did not)."""


class TailStrategy(Protocol):
    """When a bag is in its tail, which of its running jobs get another instance, and instance deadlines."""

    name: ClassVar[str]
    sets_deadline: ClassVar[bool]
    """`deadline` may change the policies' deadline (the kernel calls it for every instance sent)."""

    def in_tail(self, view: DispatchView, bag: BagView, now: float) -> bool:
        """Whether the bag is in its tail phase now (the policies' `Bag.Tail`)."""
        ...

    def replicas(self, view: DispatchView, bag: BagView, room: int, now: float) -> Sequence[Choice]:
        """Up to `room` running jobs of the bag to give one more instance, now (called on every tick)."""
        ...

    def deadline(self, view: DispatchView, bag: BagView, host: HostView, deadline: float, now: float) -> float:
        """Seconds an instance sent now to `host` may run before it counts as lost; `deadline` is what the
        bag's policies say."""
        ...

    def pilots(self, view: DispatchView, bag: BagView, pools: Sequence[str], now: float) -> Mapping[str, int] | None:
        """Slots the bag wants per pool for its tail (e.g. ExPERT's Mr on the reliable pool); None: no
        opinion (the placement's, or the overlay planner's, applies)."""
        ...

    def summary(self, bag: BagView) -> TailPlan | None:
        """What the strategy planned for the bag's tail and how it went (None: nothing to show). It may be
        asked after the bag ended, with the bag's last view."""
        ...

    def notes(self, view: DispatchView, bag: BagView, now: float) -> list[str]:
        """Sentences for the bag's owner about a tail the strategy cannot serve as asked (e.g. no replica
        strategy keeps to the bag's utility), shown with the bag's diagnostics and kept when it ends."""
        ...


class PlacementStrategy(Protocol):
    """How much a bag wants a host, the pilots it wants per pool, and jobs it moves between pools."""

    name: ClassVar[str]
    host_dependent: ClassVar[bool]
    """`rank` depends on more than the policies' rank (the kernel then calls it for every request)."""
    places_jobs: ClassVar[bool]
    """It routes every job to a pool (`migrate`) before the job may be sent: a queued job it has not routed yet
    waits (stateful selection places each job as it arrives)."""

    def rank(self, view: DispatchView, bag: BagView, host: HostView, rank: float, now: float) -> float | None:
        """The bag's rank on a host asking for work, higher served first, given its policies' `rank`; None
        refuses the host (the bag's policies have already accepted it)."""
        ...

    def pilots(self, view: DispatchView, bag: BagView, pools: Sequence[str], now: float) -> Mapping[str, int] | None:
        """Slots the bag wants per pool among `pools` (those its GridPolicy accepts); None leaves it to the
        overlay's planner, which spreads the bag's queued jobs over those pools."""
        ...

    def migrate(self, view: DispatchView, bag: BagView, now: float) -> Sequence[Migration]:
        """Jobs of the bag to move to other pools or levels now (called on every tick)."""
        ...

    def limit(self, view: DispatchView, bag: BagView, host: HostView, now: float) -> int | None:
        """At most how many more instances of the bag the host may get in this request (its replicas too),
        e.g. what the bag's budget still pays for there; None: no bound (called when `host_dependent`)."""
        ...

    def notes(self, view: DispatchView, bag: BagView, now: float) -> list[str]:
        """Sentences for the bag's owner about what the placement sees coming (e.g. a deadline the budget
        cannot meet), shown with the bag's diagnostics."""
        ...

    def qos(self, view: DispatchView, bag: BagView, now: float) -> QosReport | None:
        """The bag's deadline and budget as the placement plans them (None: it does not plan for them)."""
        ...

    def level(self, view: DispatchView, bag: BagView, now: float) -> LevelReport | None:
        """Where the execution hierarchy holds the bag (None: the placement has no levels)."""
        ...

    def terminate(self, view: DispatchView, bag: BagView, now: float) -> str | None:
        """A reason to end the bag now, its unfinished jobs cancelled and its results kept (the hierarchy's
        lowest level ends a bag that violates its limits); None: go on. Called on every tick."""
        ...


class BagStrategies(NamedTuple):
    """A bag's two strategies, made for it when it is added."""

    tail: TailStrategy
    placement: PlacementStrategy


StrategyFactory = Callable[[int, BagSpec], BagStrategies]
"""Makes the strategies a bag's spec names (`gridbot.schedulers.registry.factory`)."""
