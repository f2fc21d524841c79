"""The dispatcher's knobs, declared once: the server's options and the simulator's `[server]` keys are
built from these fields (`knobs()`; cli/options.py makes the options, sim/scenario.py reads the keys)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

Kind = Literal["count", "seconds", "flag", "pools", "size"]


@dataclass(frozen=True)
class Knob:
    """How one field of DispatchConfig is set from outside, kept in the field's metadata.

    `kind` says what a value is and how it is checked, the same way for the option and the key: `count` a
    whole number of at least `low`; `seconds` a time above zero and at least `low` (an option takes a
    number, a scenario also "10m"); `flag` true or false; `pools` a set of pool names; `size` bytes
    (an option takes 16M).
    """

    kind: Kind
    help: str
    """One line for `gridbot server --help`; the field's docstring says more."""
    option: str = ""
    """The `gridbot server` option ("": none)."""
    scenario: bool = True
    """Whether a scenario's `[server]` table takes the field's name as a key."""
    low: float = 0
    name: str = ""
    """The field's name (filled in by `knobs()`)."""
    default: Any = None
    """The field's default (filled in by `knobs()`)."""


def _knob(kind: Kind, help: str, option: str = "", scenario: bool = True, low: float = 0) -> dict[str, Knob]:
    return {"knob": Knob(kind, help, option, scenario, low)}


@dataclass(frozen=True)
class DispatchConfig:
    """Knobs of the dispatcher; the defaults suit a server with hundreds of hosts.

    Every field but `check_invariants` and `seed` is a scenario's `[server]` key (`seed` comes from the
    scenario's own), and every one but those and `max_result_bytes` (the simulator has no results) is a
    `gridbot server` option too: see each field's `Knob`.
    """

    buffer_size: int = field(default=20_000, metadata=_knob(
        "count", "Queued jobs held in memory for dispatch (shared among bags).", "--buffer-size", low=1))
    """Queued jobs held in memory over all bags; each of n bags gets at least 1/n of it."""
    max_assign: int = field(default=1_000, metadata=_knob(
        "count", "Most instances sent in one answer, whatever a host asks for (a host with more slots gets as many "
        "as its slots).", "--max-assign", low=1))
    """Most instances sent in one answer, whatever a host asks for; a host that says it has more slots gets as many
    as its slots, so that one answer can fill it (what a host may hold in all is its bags' Concurrency)."""
    host_timeout: float = field(default=600.0, metadata=_knob(
        "seconds", "Seconds of silence after which a host's instances are re-queued.", "--host-timeout", low=1))
    """A host silent this long loses its running instances (they become overdue and are re-queued)."""
    max_result_bytes: int = field(default=16 * 1024 * 1024, metadata=_knob(
        "size", "Largest result a job may return: its outputs and the last 64K of its stdout and of its stderr "
        "(at least 1K; 0 failed every job that printed anything).", "--max-result-size", scenario=False, low=1024))
    """Largest result (outputs and output tails) accepted; a larger one fails its instance."""
    backoff_idle: float = field(default=2.0, metadata=_knob(
        "seconds", "Seconds a host waits before asking again when bags are active but nothing is queued for it "
        "(doubled each time it gets nothing, up to --backoff-max).", "--backoff-idle"))
    """Seconds a host is told to wait when bags are active but nothing is queued for it."""
    backoff_empty: float = field(default=10.0, metadata=_knob(
        "seconds", "Seconds a host waits before asking again when no bag is active.", "--backoff-empty"))
    """Seconds a host is told to wait when no bag is active."""
    backoff_max: float = field(default=4.0, metadata=_knob(
        "seconds", "Longest wait of a host that keeps getting nothing while bags are active (thousands of "
        "hosts may raise it).", "--backoff-max"))
    """A host that keeps getting nothing while bags are active is told to wait twice as long each time,
    from `backoff_idle` up to this, so a tail with thousands of idle pilots asks less often. Kept short:
    an idle host is also what picks up a replica or a re-queued job (a deployment of thousands of hosts
    may raise it; the simulator's large scenarios use 10 s)."""
    check_invariants: bool = False
    """Check counters against the state after every event (tests turn it on)."""
    tail_threshold: int = field(default=0, metadata=_knob(
        "count", "A bag is in its Tail with fewer jobs queued than this (0: its share of the buffer, at most "
        "the most of its jobs that ran at once).", "--tail-threshold"))
    """A bag is in its tail when fewer of its jobs than this are queued (0: its share of the buffer, at most
    the most of its jobs that ran at once, so a bag smaller than its share is not in its tail from the start:
    schedulers/replication.py)."""
    tail_sticky: bool = field(default=False, metadata=_knob(
        "flag", "Once in the Tail, a bag stays there.", "--tail-sticky"))
    """Once in the tail, stay there even if re-queued jobs fill the queue again."""
    replicate_below: int = field(default=1, metadata=_knob(
        "count", "Replicate a bag's running jobs only while fewer of its jobs than this are queued (0: never).",
        "--replicate-below"))
    """Speculative replication runs for a bag only while fewer than this many of its jobs are queued."""
    replicas_first: bool = field(default=False, metadata=_knob(
        "flag", "Send a bag's replicas before its queued jobs, not after them.", "--replicas-first"))
    """Replicas chosen for a bag are sent after its queued jobs, so they never delay a first instance; with
    this they go first, competing with the jobs not yet run, as in GridBot once its replicas were queued
    (SC'09 section 7; experiments/replication shows what that costs)."""
    replicas_mixed: bool = field(default=False, metadata=_knob(
        "flag", "Send a bag's replicas and queued jobs mixed, in proportion to how many of each wait, not the "
        "replicas after the jobs.", "--replicas-mixed"))
    """Each instance a host gets is a replica with the chance that a slot drawn from the bag's waiting replicas
    and its jobs waiting to be sent (in the buffer, or re-queued) holds one, as GridBot's BOINC scheduler scanned
    its shared-memory buffer from a random slot (BOINC's sched_array.cpp), where replicas sat among the unsent
    jobs (experiments/replication_order). Not with `replicas_first`; a bag with a quorum sends its copies first
    whatever this says."""
    let_replicas_finish: bool = field(default=False, metadata=_knob(
        "flag", "Let a job's other instances run on after its first result (their results are discarded) "
        "instead of cancelling them.", "--let-replicas-finish"))
    """A job's other instances are cancelled on their hosts when it has a result; with this they run on and
    their results are discarded when they come, as in the BOINC server GridBot was built on (SC'09 section 7:
    the Waste column; experiments/replication)."""
    max_replicas: int = field(default=5, metadata=_knob(
        "count", "Most instances of one job out at once.", "--max-replicas", low=1))
    """A job never has more instances out at once than this, whatever ReplicationRequirements says."""
    replica_queue: int = field(default=100, metadata=_knob(
        "count", "Most replicas waiting to be sent per bag.", "--replica-queue", low=1))
    """Most replicas waiting to be sent per bag; more are chosen as these go out."""
    refused_pilots: int = field(default=10, metadata=_knob(
        "count", "After this many pilots of a pool in a row refused by a bag (each left at once), the bag gets one "
        "pilot of that pool at a time, --refused-backoff apart and doubling (0: never hold back).",
        "--refused-pilots"))
    """After this many pilots of one pool in a row left because a bag with work refused their hosts (its
    JobRequirements or a Concurrency of 0, and no other bag would take them; a placement's refusal does not
    count, as a placement asks for each pool's pilots itself), the overlay sends that bag one pilot of the pool
    at a time, `refused_backoff` apart, the wait doubled after each one refused up to an hour; a host of the
    pool that matches the bag, or a change of its policies, ends it. A pool on which no machine suits the bag
    then costs a pilot an hour, not one every few seconds (each billed, on a cloud), while a pool where one
    machine in a few suits it is hardly slowed (`records.Refusals`)."""
    refused_backoff: float = field(default=60.0, metadata=_knob(
        "seconds", "First wait between two pilots of a pool whose pilots a bag keeps refusing (see "
        "--refused-pilots).", "--refused-backoff"))
    """The first wait of `refused_pilots`' backoff; each pilot refused after it doubles it, up to an hour."""
    seed: int = 1
    """Seed of the sampling of replication candidates (runs are reproducible)."""
    buffer_ttl: float = field(default=600.0, metadata=_knob(
        "seconds", "Seconds a bag matching no host keeps its share of the buffer while others wait.",
        "--buffer-ttl", low=1))
    """A bag whose window matched no host for this long, while other bags wait for room, is parked: its
    window is emptied for the others and refilled after as long again (the paper's time-to-live)."""
    failover_after: int = field(default=0, metadata=_knob(
        "count", "Jobs that failed this many times run only on reliable pools (0: never).", "--failover-after"))
    """A job that failed this many times runs only on hosts of `reliable_pools` (0: never)."""
    reliable_pools: frozenset[str] = field(default=frozenset(), metadata=_knob(
        "pools", "A pool whose hosts are reliable (Host.Reliable; the fail-over pool). Repeatable.",
        "--reliable-pool"))
    """Pools marked reliable: the paper's dedicated fail-over cluster."""
    retry_same_host_after: float = field(default=60.0, metadata=_knob(
        "seconds", "Seconds a re-queued job avoids the hosts it failed on, while another host is live.",
        "--retry-same-host-after"))
    """A re-queued job avoids the hosts it failed on for this long, while a live host it did not fail on
    exists, so another host gets a chance (with none, it is retried at once)."""

    def __post_init__(self) -> None:
        # (the option and the scenario key say so in their own words first; this keeps code that builds a
        # config directly from a setting that one of the two would silently override)
        if (conflict := knob_conflict(vars(self))) is not None:
            raise ValueError(conflict)


def knob_conflict(values: dict[str, Any]) -> str | None:
    """Why these knob values cannot go together (None: they can)."""
    if values.get("replicas_first") and values.get("replicas_mixed"):
        return "replicas_first sends replicas before the queued jobs and replicas_mixed mixes them in: give one"
    return None


def knobs() -> tuple[Knob, ...]:
    """The fields of DispatchConfig set from outside, in their order, each with its name and default."""
    return tuple(replace(f.metadata["knob"], name=f.name, default=f.default)
                 for f in fields(DispatchConfig) if "knob" in f.metadata)
