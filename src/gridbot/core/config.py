"""The dispatcher's knobs, declared once: the server's options and the simulator's `[server]` keys are
built from these fields."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DispatchConfig:
    """Knobs of the dispatcher; the defaults suit a server with hundreds of hosts."""

    buffer_size: int = 20_000
    """Queued jobs held in memory over all bags; each of n bags gets at least 1/n of it."""
    max_assign: int = 1_000
    """Most instances sent in one answer, whatever a host asks for."""
    host_timeout: float = 600.0
    """A host silent this long loses its running instances (they become overdue and are re-queued)."""
    max_result_bytes: int = 16 * 1024 * 1024
    """Largest result (outputs and output tails) accepted; a larger one fails its instance."""
    backoff_idle: float = 2.0
    """Seconds a host is told to wait when bags are active but nothing is queued for it."""
    backoff_empty: float = 10.0
    """Seconds a host is told to wait when no bag is active."""
    backoff_max: float = 4.0
    """A host that keeps getting nothing while bags are active is told to wait twice as long each time,
    from `backoff_idle` up to this, so a tail with thousands of idle pilots asks less often. Kept short:
    an idle host is also what picks up a replica or a re-queued job (a deployment of thousands of hosts
    may raise it; the simulator's large scenarios use 10 s)."""
    check_invariants: bool = False
    """Check counters against the state after every event (tests turn it on)."""
    tail_threshold: int = 0
    """A bag is in its tail when fewer of its jobs than this are queued (0: its share of the buffer)."""
    tail_sticky: bool = False
    """Once in the tail, stay there even if re-queued jobs fill the queue again."""
    replicate_below: int = 1
    """Speculative replication runs for a bag only while fewer than this many of its jobs are queued."""
    max_replicas: int = 5
    """A job never has more instances out at once than this, whatever ReplicationRequirements says."""
    replica_queue: int = 100
    """Most replicas waiting to be sent per bag; more are chosen as these go out."""
    seed: int = 1
    """Seed of the sampling of replication candidates (runs are reproducible)."""
    buffer_ttl: float = 600.0
    """A bag whose window matched no host for this long, while other bags wait for room, is parked: its
    window is emptied for the others and refilled after as long again (the paper's time-to-live)."""
    failover_after: int = 0
    """A job that failed this many times runs only on hosts of `reliable_pools` (0: never)."""
    reliable_pools: frozenset[str] = frozenset()
    """Pools marked reliable: the paper's dedicated fail-over cluster."""
    retry_same_host_after: float = 60.0
    """A re-queued job avoids the hosts it failed on for this long, while a live host it did not fail on
    exists, so another host gets a chance (with none, it is retried at once)."""
