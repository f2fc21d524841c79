"""The server's loop in miniature for unit tests: the dispatcher, a memory store, hosts holding their work.

Every Changes batch is applied before the next event, exactly as the server does.
"""

from __future__ import annotations

import msgspec

from gridbot.core.changes import BagSnapshot
from gridbot.core.config import DispatchConfig
from gridbot.core.dispatcher import Dispatcher, WorkAnswer
from gridbot.model.records import Assignment, HostInfo, InstanceReport, Outcome
from gridbot.model.spec import parse_spec
from gridbot.schedulers.registry import factory
from gridbot.store.memory import MemoryStore


class CoreSim:
    """A dispatcher with invariant checks on, fed from a memory store."""

    def __init__(self, strategies=None, **cfg) -> None:
        self.store = MemoryStore()
        self.d = Dispatcher(DispatchConfig(check_invariants=True, **cfg), strategies or factory())
        self.held: dict[str, set[int]] = {}

    def bag(self, name: str, n: int, policy: dict | None = None, deadline: float = 3600, max_failures: int = 3,
            strategy: str = "") -> int:
        spec = parse_spec(f'command = "job {{i}}"\ninstance_deadline = {deadline}\nmax_failures = {max_failures}\n'
                          f'[parameters]\ni = {{ from = 0, to = {n - 1} }}\n{strategy}', "t", name)
        spec = msgspec.structs.replace(spec, policy=policy or {})
        row = self.store.create_bag(spec, None, {}, 0.0)
        self.d.add_bag(BagSnapshot(row.bag_id, row.spec, row.counts, row.created_at))
        return row.bag_id

    def feed(self) -> None:
        for req in self.d.needs_feed():
            self.d.feed(req.bag_id, self.store.queued_jobs(req.bag_id, req.after, req.limit), req.limit)

    def exchange(self, h: HostInfo, want: int, now: float, reports=()) -> WorkAnswer:
        """One exchange of host `h`: it reports, lists what it still holds, and asks for `want` more."""
        self.feed()
        held = self.held.setdefault(h.host_id, set())
        held -= {r.instance_id for r in reports}
        answer, changes = self.d.request_work(h, want, sorted(held), now, list(reports))
        self.store.apply(changes)
        held.update(a.instance_id for a in answer.assignments)
        held -= set(answer.cancel)
        return answer

    def ask(self, h: HostInfo, want: int, now: float, reports=()) -> list[Assignment]:
        return self.exchange(h, want, now, reports).assignments

    def tick(self, now: float) -> None:
        self.store.apply(self.d.tick(now))

    def finish_all(self, h: HostInfo, now: float, outcome: Outcome = Outcome.SUCCESS, wall: float = 100.0):
        """Host `h` reports everything it holds with `outcome`."""
        reports = [InstanceReport(i, outcome, 0 if outcome is Outcome.SUCCESS else 1, wall, wall,
                                  "" if outcome is Outcome.SUCCESS else "exit code 1")
                   for i in sorted(self.held.get(h.host_id, ()))]
        return self.ask(h, 0, now, reports)
