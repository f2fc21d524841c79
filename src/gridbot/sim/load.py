"""The load a simulated run puts on the server, and what the dispatcher spent on it (SC'09 section 7,
"Number of job requests": GridBot's server saw up to 4 requests/s handing out 20 jobs/s, and 18
requests/s handing out 93 jobs/s, with no loss of throughput).

`measure` runs a scenario as `engine.simulate` does, counting every exchange of a host with the server
and the instances it was sent, per window of simulated time, and timing the dispatcher's own calls
(`request_work` and the periodic `tick`) on the wall clock. The simulator leaves out the server's
HTTP and store (docs/simulation.md), so the time per request is the dispatcher's alone; the whole
server's rates are measured by `make bench` (docs/performance.md).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gridbot.core.changes import Changes
from gridbot.core.dispatcher import WorkAnswer
from gridbot.model.records import HostInfo, InstanceReport
from gridbot.sim.engine import Simulation
from gridbot.sim.metrics import Results
from gridbot.sim.scenario import Scenario


@dataclass
class Load:
    """Requests (exchanges of hosts with the server) and instances sent, per window of `window` seconds
    of simulated time, and the wall-clock seconds the dispatcher spent."""

    window: float
    requests: Counter[int] = field(default_factory=Counter)
    """Every exchange: asking for work, reporting, or a heartbeat."""
    served: Counter[int] = field(default_factory=Counter)
    """Exchanges that were sent work (the paper's job requests: jobs sent / Concurrency)."""
    jobs: Counter[int] = field(default_factory=Counter)
    dispatch_s: float = 0.0
    """Wall-clock seconds in `request_work`."""
    tick_s: float = 0.0
    """Wall-clock seconds in `tick` (deadlines, silent hosts, replication)."""

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    def peak(self, counts: Counter[int], after: float = 0.0) -> float:
        """The most per second over one window (`requests`, `served` or `jobs`) starting `after` seconds
        or later (a run's first minutes see every volunteer host of a community pool ask at once)."""
        return max((n for w, n in counts.items() if w * self.window >= after), default=0) / self.window

    def mean(self, counts: Counter[int]) -> float:
        """The mean per second over the windows in which jobs were sent."""
        busy = [w for w, n in self.jobs.items() if n]
        return sum(counts[w] for w in busy) / (len(busy) * self.window) if busy else 0.0

    def us_per_request(self) -> float:
        """The dispatcher's wall-clock microseconds per request, ticks included."""
        n = self.total_requests
        return 1e6 * (self.dispatch_s + self.tick_s) / n if n else 0.0


def measure(scenario: Scenario, seed: int | None = None, window: float = 60.0) -> tuple[Results, Load]:
    """Run the scenario once, as `engine.simulate`, and return its Results with the Load it made."""
    sim = Simulation(scenario, seed)
    load = Load(window)
    d = sim.dispatcher
    request_work, tick = d.request_work, d.tick

    def timed_request(info: HostInfo, want: int, running: Any, now: float,
                      reports: Sequence[InstanceReport] = ()) -> tuple[WorkAnswer, Changes]:
        started = time.perf_counter()
        answer, changes = request_work(info, want, running, now, reports)
        load.dispatch_s += time.perf_counter() - started
        w = int(now // window)
        load.requests[w] += 1
        if answer.assignments:
            load.served[w] += 1
            load.jobs[w] += len(answer.assignments)
        return answer, changes

    def timed_tick(now: float) -> Changes:
        started = time.perf_counter()
        changes = tick(now)
        load.tick_s += time.perf_counter() - started
        return changes

    setattr(d, "request_work", timed_request)  # noqa: B010  (the instance's, for this run only)
    setattr(d, "tick", timed_tick)  # noqa: B010
    return sim.run(), load
