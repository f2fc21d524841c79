"""A stock BOINC client's side of the scheduler RPC, for the simulator's volunteer hosts (community pools).

The simulated host asks as the real client does (docs/volunteers.md, ../shared/reference/boinc-client-protocol.md
section 5), and the server's side is the very arithmetic of gridbot's BOINC door (`model.volunteer`):

- It keeps a buffer of work: when the work it holds, estimated, falls under `min_buffer` seconds per CPU (or a
  CPU is idle) it asks for enough to fill `min_buffer + extra_buffer` per CPU (`work_req_seconds`) and for its
  idle CPUs (`cpu_req_instances`); the server turns that into instances by its runtime estimate. BOINC's
  defaults: 0.1 and 0.5 days. Jobs wait in the client's queue and run one per CPU, first come first run.
- A finished result is reported at once: gridbot's BOINC door marks every result `<report_immediately/>`. A
  stock BOINC server does not (`report_immediately = false` in a scenario): the result then waits for the next
  RPC, which the client starts for want of work, an hour after the result was ready, at once when its deadline
  is within a day, or when the server's `next_rpc_delay` (the heartbeat it sends in every reply) has passed
  since the last one; results then come back in batches.
- A request that got no work puts fetching into a backoff doubling from 10 minutes up to a day (drawn from its
  upper half); the heartbeat RPCs still ask. The server's `request_delay` is a least gap between two RPCs.
- A queued job whose deadline passes before it starts is aborted by the client (reported as such).

Pure: no clock, no I/O; the engine calls it at its events.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

DAY = 86400.0


@dataclass(frozen=True)
class ClientConfig:
    """The client's preferences that shape its requests (BOINC's defaults)."""

    min_buffer: float = 0.1 * DAY
    """`work_buf_min_days`: it asks for work when it holds less than this per CPU."""
    extra_buffer: float = 0.5 * DAY
    """`work_buf_additional_days`: it then asks for this much more per CPU."""
    report_immediately: bool = True
    """The server marks results `<report_immediately/>` (gridbot's BOINC door does)."""
    report_within: float = 3600.0
    """Else a ready result starts an RPC of its own after this long."""
    backoff_min: float = 600.0
    backoff_max: float = DAY


@dataclass
class BoincClient:
    """When one host contacts the server and what it asks for."""

    config: ClientConfig
    ncpus: int
    not_before: float = 0.0
    """The server's `request_delay`: no RPC before this."""
    heartbeat_at: float = float("inf")
    """The last RPC plus the server's `next_rpc_delay`."""
    fetch_after: float = 0.0
    """Work-fetch backoff: no RPC for work alone before this."""
    backoff: float = 0.0

    def needs_work(self, held_seconds: float, idle_cpus: int) -> bool:
        """Whether it wants more work: a CPU idle, or less than the low mark of work held."""
        return idle_cpus > 0 or held_seconds < self.ncpus * self.config.min_buffer

    def request(self, held_seconds: float, idle_cpus: int) -> tuple[float, int]:
        """(work_req_seconds, cpu_req_instances) of an RPC now: (0, 0) when it wants nothing."""
        if not self.needs_work(held_seconds, idle_cpus):
            return 0.0, 0
        fill = self.ncpus * (self.config.min_buffer + self.config.extra_buffer) - held_seconds
        return max(1.0, fill), idle_cpus

    def next_rpc(self, now: float, held_seconds: float, idle_cpus: int, oldest_ready: float | None,
                 earliest_deadline: float | None) -> float:
        """When its next RPC is due: for work (out of backoff), to report (at once when the server asks for it,
        else an hour after the oldest ready result, or at once if a ready result's deadline is within a day), or
        for the heartbeat."""
        due = self.heartbeat_at
        if self.needs_work(held_seconds, idle_cpus):
            due = min(due, max(now, self.fetch_after))
        if oldest_ready is not None:
            due = min(due, now if self.config.report_immediately else oldest_ready + self.config.report_within)
            if earliest_deadline is not None and earliest_deadline - now < DAY:
                due = now
        return max(due, self.not_before)

    def answered(self, now: float, asked: bool, got: int, request_delay: float, next_rpc_delay: float,
                 uniform: Callable[[float, float], float]) -> None:
        """The server's reply: its delays, and the work-fetch backoff after a request that got nothing."""
        self.not_before = now + request_delay
        self.heartbeat_at = now + next_rpc_delay if next_rpc_delay > 0 else float("inf")
        if got:
            self.backoff, self.fetch_after = 0.0, 0.0
        elif asked:
            self.backoff = min(self.config.backoff_max, max(self.config.backoff_min, 2 * self.backoff))
            self.fetch_after = now + uniform(self.backoff / 2, self.backoff)
