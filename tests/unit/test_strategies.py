"""The strategy seam: a bag's `[strategy]`, the registry, and decisions the kernel applies and traces."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gridbot.core.strategy import Choice, Migration
from gridbot.model.records import HostInfo, InstanceReport, Outcome
from gridbot.model.spec import SpecError, StrategyChoice, parse_spec
from gridbot.model.states import InstanceState
from gridbot.schedulers import registry
from gridbot.schedulers.base import Placement, StrategyError, TailStrategy
from gridbot.schedulers.overlay import bag_demands
from gridbot.server.service import BadRequest, Service, ServiceConfig
from gridbot.store.sql import SQLiteStore

from .core_harness import CoreSim

DOCS = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
BASE = 'command = "x {i}"\n[parameters]\ni = [1, 2]\n'


def host(name: str, pool: str, slots: int = 1) -> HostInfo:
    return HostInfo(name, name, "Linux", slots, 0, slots, pool)


def done(a, wall: float = 10.0) -> InstanceReport:
    return InstanceReport(a.instance_id, Outcome.SUCCESS, 0, wall, wall)


# -- the spec and the registry ------------------------------------------------------------------------

def test_a_spec_names_its_strategies_and_gridbots_are_the_default():
    assert parse_spec(BASE, "s.toml", "s").strategy == StrategyChoice("gridbot", "gridbot", {})
    spec = parse_spec(BASE + '[strategy]\ntail = "gridbot"\nplacement = "gridbot"\nratio = 0.5\n', "s.toml", "s")
    assert spec.strategy == StrategyChoice("gridbot", "gridbot", {"ratio": 0.5})


@pytest.mark.parametrize(("table", "says"), [
    ("tail = 5", "strategy tail must be the name of a strategy"),
    ('placement = "no spaces allowed"', "strategy placement must be the name of a strategy"),
    ("options = [1, 2]", "strategy option 'options' must be a string, a number or true/false"),
    ('"bad-key" = 1', "strategy option 'bad-key' is not a valid name"),
    ("complexity = 1e400", "strategy option 'complexity' = inf is not a finite number"),  # said: not a number
    ("complexity = nan", "strategy option 'complexity' = nan is not a finite number"),
])
def test_a_malformed_strategy_table_names_the_key_and_the_fix(table, says):
    with pytest.raises(SpecError, match=re.escape(says)):
        parse_spec(BASE + "[strategy]\n" + table + "\n", "s.toml", "s")


def test_the_registry_refuses_unknown_strategies_and_options_saying_what_exists():
    registry.check(StrategyChoice())
    with pytest.raises(StrategyError, match=r"unknown tail strategy 'gridbt'.*did you mean 'gridbot'.*gridbot"):
        registry.check(StrategyChoice(tail="gridbt"))
    with pytest.raises(StrategyError, match=r"unknown placement strategy 'dbc'.*the placement strategies are: "
                                           r"conservative-time, cost, cost-time, gridbot, hierarchy, naive, "
                                           r"stateful, time"):
        registry.check(StrategyChoice(placement="dbc"))
    with pytest.raises(StrategyError, match=r"strategy option 'budget' is not an option .* they take no options"):
        registry.check(StrategyChoice(options={"budget": 10}))


def test_the_server_refuses_a_bag_naming_an_unknown_strategy_and_stores_nothing(tmp_path):
    store = SQLiteStore(tmp_path / "g.db")
    store.migrate()
    service = Service(store, ServiceConfig())
    spec = parse_spec(BASE + '[strategy]\ntail = "expertt"\n', "s.toml", "s")
    with pytest.raises(BadRequest, match="unknown tail strategy 'expertt'"):
        service.submit(spec, None, {}, 0.0)
    assert store.bags() == []


def test_the_server_refuses_an_expert_utility_that_is_no_finite_number(tmp_path):
    """Audit: a bag's `utility = "1/0"` was only syntax-checked, so the server took it (on submission and as a new
    strategy) and its ExPERT tail never chose a strategy, without a word."""
    store = SQLiteStore(tmp_path / "g.db")
    store.migrate()
    service = Service(store, ServiceConfig())
    spec = parse_spec(BASE + '[strategy]\ntail = "expert"\nutility = "1/0"\n', "s.toml", "s")
    with pytest.raises(BadRequest, match=r"tail = 'expert': utility '1/0' is not a finite number at any makespan "
                                         r"and cost tried"):
        service.submit(spec, None, {}, 0.0)
    assert store.bags() == []
    info = service.submit(parse_spec(BASE, "s.toml", "s"), None, {}, 0.0)
    with pytest.raises(BadRequest, match=r"utility '1/0' is not a finite number"):
        service.set_strategy(service.bag(info.bag_id), StrategyChoice("expert", options={"utility": "1/0"}))
    assert service.bag(info.bag_id).spec.strategy == StrategyChoice()


# -- the worked example of docs/architecture.md ---------------------------------------------------------

def docs_example() -> type[Placement]:
    """The placement of docs/architecture.md, run as the page prints it."""
    [code] = [b for b in re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S) if "class FastestPool" in b]
    scope: dict[str, object] = {}
    exec(compile(code, str(DOCS), "exec"), scope)
    cls = scope["FastestPool"]
    assert isinstance(cls, type) and issubclass(cls, Placement)
    return cls


def test_the_documented_placement_prefers_the_pool_whose_results_come_back_soonest(monkeypatch):
    fastest = docs_example()
    monkeypatch.setitem(registry.PLACEMENTS, fastest.name, fastest)
    sim = CoreSim()
    sim.d.pool_ads = {"slow": {"Name": "slow"}, "fast": {"Name": "fast"}}
    bag = sim.bag("b", 20, strategy='[strategy]\nplacement = "fastest-pool"\n')
    slow, fast = host("s1", "slow"), host("f1", "fast")
    # nothing seen yet: both pools are served, and the fast one hands its result back sooner
    [a] = sim.ask(slow, 1, 0.0)
    [b] = sim.ask(fast, 1, 0.0)
    sim.ask(fast, 0, 5.0, [done(b, 5.0)])
    sim.ask(slow, 0, 50.0, [done(a, 50.0)])
    pools = sim.d.view.pools(50.0)
    assert pools["fast"].mean_turnaround == 5.0 and pools["slow"].mean_turnaround == 50.0
    assert sim.ask(slow, 1, 51.0) == [], "a slow host is refused while the fast pool has an idle slot"
    assert len(sim.ask(fast, 1, 51.0)) == 1
    assert len(sim.ask(slow, 1, 52.0)) == 1, "with the fast pool busy, the slow one is used"
    [demand] = bag_demands(sim.d.view, ["slow", "fast"], 52.0)
    assert demand.bag_id == bag and demand.pools == frozenset({"fast"}), "pilots are asked of the fast pool only"


# -- decisions the kernel applies -----------------------------------------------------------------------

class MoveToB(Placement):
    """Moves every running job off pool a, once."""

    name = "move-to-b"

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.moved = False

    def migrate(self, view, bag, now):
        if self.moved:
            return ()
        self.moved = True
        return [Migration(j.job_id, frozenset({"b"}), "pool a is draining")
                for j in view.running_jobs(bag.bag_id)
                if any(view.host(i.host_id).pool == "a" for i in view.instances(j.job_id))]


def test_a_placement_moves_a_running_job_to_another_pool_without_a_failure(monkeypatch):
    monkeypatch.setitem(registry.PLACEMENTS, MoveToB.name, MoveToB)
    sim = CoreSim()
    sim.bag("b", 1, strategy='[strategy]\nplacement = "move-to-b"\n')
    on_a, on_b, other_a = host("a1", "a"), host("b1", "b"), host("a2", "a")
    [first] = sim.ask(on_a, 1, 0.0)
    changes = sim.d.tick(1.0)
    sim.store.apply(changes)
    [decision] = changes.decisions
    assert (decision.job_id, decision.strategy, decision.action) == (first.job_id, "placement=move-to-b", "migrate")
    assert "pool a is draining" in decision.why and decision.event_id == changes.events[0].event_id
    assert [(u.instance_id, u.state) for u in changes.instances] == [(first.instance_id, InstanceState.CANCELLED)]
    assert sim.exchange(on_a, 0, 2.0).cancel == [first.instance_id], "its host is told to kill it"
    assert sim.ask(other_a, 1, 3.0) == [], "the job waits for a host of pool b"
    [again] = sim.ask(on_b, 1, 4.0)
    assert again.job_id == first.job_id
    assert sim.store.jobs(1, None, 10, 0)[0].failures == 0, "a move is no failure"


class NeverOnA(Placement):
    name = "never-on-a"
    host_dependent = True

    def rank(self, view, bag, host, rank, now):
        return None if host.pool == "a" else rank


def test_a_placement_may_refuse_a_host_that_the_policies_accept(monkeypatch):
    monkeypatch.setitem(registry.PLACEMENTS, NeverOnA.name, NeverOnA)
    sim = CoreSim()
    sim.bag("picky", 2, strategy='[strategy]\nplacement = "never-on-a"\n')
    other = sim.bag("easy", 1)
    [got] = sim.ask(host("a1", "a", 2), 2, 0.0)
    assert got.bag_id == other, "the refusing bag's jobs are not sent to pool a; the other bag's are"
    assert {a.bag_id for a in sim.ask(host("b1", "b", 2), 2, 0.0)} == {sim.d.view.bags()[0].bag_id}


# -- events ---------------------------------------------------------------------------------------------

def test_every_change_carries_the_event_that_caused_it():
    sim = CoreSim(host_timeout=1e9)
    sim.bag("b", 2, deadline=10)
    h = host("h1", "a", 2)
    sim.feed()
    answer, sent = sim.d.request_work(h, 2, [], 0.0)
    sim.store.apply(sent)
    [event] = sent.events
    assert (event.kind, event.source) == ("request", "h1")
    assert {n.event_id for n in sent.new_instances} == {event.event_id}
    _, idle = sim.d.request_work(h, 0, [a.instance_id for a in answer.assignments], 1.0)
    assert idle.events == [], "an exchange that moved no instance leaves no event behind"
    late = sim.d.tick(20.0)
    [tick] = late.events
    assert tick.kind == "tick" and tick.event_id > event.event_id
    assert {u.event_id for u in late.instances} == {tick.event_id}
    assert {u.state for u in late.instances} == {InstanceState.OVERDUE}


def test_gridbots_replicas_are_decisions_of_its_tail_strategy():
    sim = CoreSim()
    sim.bag("b", 1, {"ReplicationRequirements": "true"})
    [a] = sim.ask(host("h1", "a"), 1, 0.0)
    changes = sim.d.tick(1.0)
    [decision] = changes.decisions
    assert (decision.job_id, decision.strategy, decision.action) == (a.job_id, "tail=gridbot", "replicate")
    assert "ReplicationRequirements holds" in decision.why


class ReplicaOnB(TailStrategy):
    """Every running job gets one replica, on pool b only."""

    name = "replica-on-b"

    def replicas(self, view, bag, room, now):
        return [Choice(j.job_id, "try b", frozenset({"b"})) for j in view.running_jobs(bag.bag_id)
                if len(j.live) == 1][:room]


def test_a_tail_strategy_may_send_a_replica_to_some_pools_only(monkeypatch):
    monkeypatch.setitem(registry.TAILS, ReplicaOnB.name, ReplicaOnB)
    sim = CoreSim()
    sim.bag("b", 1, strategy='[strategy]\ntail = "replica-on-b"\n')
    [first] = sim.ask(host("a1", "a"), 1, 0.0)
    [decision] = sim.d.tick(1.0).decisions
    assert decision.why == "try b (on b)"
    assert sim.ask(host("a2", "a"), 1, 2.0) == [], "the replica waits for a host of pool b"
    [replica] = sim.ask(host("b1", "b"), 1, 3.0)
    assert replica.job_id == first.job_id and replica.instance_id != first.instance_id


def test_a_bag_remembers_its_ended_and_lost_instances_for_its_tail_strategy():
    sim = CoreSim(host_timeout=1e9)
    bag = sim.bag("b", 3, deadline=10)
    h = host("h1", "a", 3)
    a, b, c = sim.ask(h, 3, 0.0)
    sim.ask(h, 0, 4.0, [done(a, 4.0), InstanceReport(b.instance_id, Outcome.FAILURE, 1, 4.0, 4.0, "x")])
    sim.tick(20.0)  # c is lost: past its deadline
    assert [(e.instance_id, e.ended_at, e.success, e.pool) for e in sim.d.view.history(bag)] == [
        (a.instance_id, 4.0, True, "a"), (b.instance_id, 4.0, False, "a"), (c.instance_id, None, False, "a")]
    sim.ask(h, 0, 25.0, [done(c, 25.0)])  # its late report replaces the loss
    last = sim.d.view.history(bag)[-1]
    assert (last.instance_id, last.ended_at, last.success) == (c.instance_id, 25.0, True)


class Broken(TailStrategy):
    """A tail strategy with a bug in every answer."""

    name = "broken"
    sets_deadline = True

    def in_tail(self, view, bag, now):
        raise ZeroDivisionError("in_tail")

    def replicas(self, view, bag, room, now):
        raise RuntimeError("replicas")

    def deadline(self, view, bag, host, deadline, now):
        raise KeyError("deadline")


def test_a_strategy_that_raises_does_not_stop_the_dispatcher_or_the_other_bags(monkeypatch):
    monkeypatch.setitem(registry.TAILS, Broken.name, Broken)
    sim = CoreSim()
    bad = sim.bag("bad", 1, {"ReplicationRequirements": "true"}, strategy='[strategy]\ntail = "broken"\n')
    good = sim.bag("good", 1, {"ReplicationRequirements": "true"})
    sent = sim.ask(host("h1", "a", 2), 2, 0.0)
    assert {a.bag_id for a in sent} == {bad, good}, "the broken bag still runs, with its policies' deadline"
    assert [a.instance_deadline for a in sent if a.bag_id == bad] == [3600.0]
    changes = sim.d.tick(1.0)
    assert [d.bag_id for d in changes.decisions] == [good], "the other bag still gets its replica"
    [why] = [m for m in sim.d.diagnostics(bad, 1.0) if "tail=broken" in m]
    assert "RuntimeError: replicas" in why or "ZeroDivisionError" in why
