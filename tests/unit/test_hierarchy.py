"""The grid execution hierarchy (issue 17; Silberstein et al., HPDC'06): the queues as a pools file and a
scenario declare them, and each of the paper's procedures (ProcessNewTask, EnforceQueueLimits, the migration
policies, load sharing) through the real dispatcher, with hosts of its pools asking for work."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from gridbot.core.config import DispatchConfig
from gridbot.core.dispatcher import Dispatcher
from gridbot.model.hierarchy import POLICIES, QueueSpec
from gridbot.model.pools import parse_pools_file
from gridbot.model.records import HostInfo, InstanceReport, Outcome
from gridbot.model.spec import BagSpec, SpecError, StrategyChoice, parse_spec
from gridbot.model.states import BagState, JobState
from gridbot.schedulers import registry
from gridbot.schedulers.base import StrategyError
from gridbot.schedulers.hierarchy import Hierarchy, HierarchyPlacement
from gridbot.sim.engine import simulate
from gridbot.sim.scenario import parse_scenario

from .core_harness import CoreSim

# -- parsing: the pools file ------------------------------------------------------------------------------

POOLS = """\
[pools.server]
kind = "local"

[pools.technion]
kind = "slurm"
partition = "t"

[pools.madison]
kind = "slurm"
partition = "m"
"""

GOOD = POOLS + """
[queues.q1]
level = 1
pools = ["server"]
queue_time_limit = "6m"
exec_time_limit = "3m"
max_cpus = 2
performance = 1.5
max_bags = 2

[queues.q2]
level = 2
pools = ["technion"]
queue_time_limit = "320m"
exec_time_limit = "160m"
max_cpus = 100
policies = ["overdue", "task_potential_overdue"]

[queues.q4]
level = 3
pools = ["madison"]
queue_time_limit = "2d"
exec_time_limit = "2d"
max_cpus = 500
at_lowest = "run"
"""


def test_a_pools_file_with_queues_parses():
    pools, queues = parse_pools_file(GOOD, "pools.toml")
    assert [p.name for p in pools] == ["server", "technion", "madison"]
    q1, q2, q4 = queues
    assert (q1.name, q1.level, q1.pools, q1.queue_time_limit, q1.exec_time_limit, q1.max_cpus) == (
        "q1", 1, ("server",), 360.0, 180.0, 2)
    assert (q1.performance, q1.max_bags, q1.policies, q1.at_lowest) == (1.5, 2, frozenset(POLICIES), "terminate")
    assert (q2.level, q2.queue_time_limit, q2.exec_time_limit, q2.max_cpus) == (2, 19200.0, 9600.0, 100)
    assert q2.policies == frozenset({"overdue", "task_potential_overdue"})
    assert (q2.performance, q2.max_bags) == (None, None), "P measured, no length limit unless given"
    assert (q4.level, q4.queue_time_limit, q4.at_lowest) == (3, 172800.0, "run")


def test_a_pools_file_without_queues_has_none():
    assert parse_pools_file(POOLS, "pools.toml")[1] == []


def test_the_docs_table_2_example_parses():
    text = Path(__file__).parents[2].joinpath("docs", "hierarchy.md").read_text()
    block = re.search(r"```toml\n(.*?)```", text, re.S)
    assert block is not None
    pools = "".join(f'[pools.{p}]\nkind = "local"\n' for p in ("server", "technion", "madison", "madison-long"))
    queues = parse_pools_file(pools + block.group(1), "pools.toml")[1]
    assert [(q.name, q.level) for q in queues] == [("q1", 1), ("q2", 2), ("q3", 2), ("q4", 3)]
    assert "task_potential_overdue" not in queues[3].policies


QUEUE = """\
[pools.a]
kind = "local"
[pools.b]
kind = "local"
[queues.q1]
level = 1
pools = ["a"]
queue_time_limit = "10m"
exec_time_limit = "5m"
max_cpus = 2
"""
"""Line 5 is [queues.q1], 6 level, 7 pools, 8 queue_time_limit, 9 exec_time_limit, 10 max_cpus; 11 is the
first line added."""


def _replace(old: str, new: str) -> str:
    assert old in QUEUE
    return QUEUE.replace(old, new)




@pytest.mark.parametrize(("text", "line", "message", "hint"), [
    pytest.param(QUEUE + "exec_limit = 3\n", 11, "queue 'q1': unknown key 'exec_limit'", "exec_time_limit",
                 id="unknown key"),
    pytest.param(QUEUE + 'exec_time_limits = "1m"\n', 11, "unknown key 'exec_time_limits'", "exec_time_limit",
                 id="unknown key near one"),
    pytest.param(_replace('exec_time_limit = "5m"', 'exec_time_limit = "20m"'), 9,
                 "exec_time_limit (1200 s) is above queue_time_limit (600 s)", "Te <= Tq", id="Te > Tq"),
    pytest.param(_replace('pools = ["a"]', 'pools = ["c"]'), 7, "pool 'c' is not in the pools file",
                 "a, b", id="unknown pool"),
    pytest.param(_replace('pools = ["a"]', 'pools = ["aa"]'), 7, "pool 'aa' is not in the pools file",
                 "'a'", id="unknown pool near one"),
    pytest.param(_replace("max_cpus = 2\n", ""), 5, "'max_cpus' is missing", "max_cpus = 2", id="no max_cpus"),
    pytest.param(_replace('pools = ["a"]\n', ""), 5, "'pools' is missing", 'pools = ["server"]', id="no pools"),
    pytest.param(_replace("level = 1\n", ""), 5, "'level' is missing", "level = 1", id="no level"),
    pytest.param(_replace('queue_time_limit = "10m"\n', ""), 5, "'queue_time_limit' is missing",
                 "queue_time_limit", id="no Tq"),
    pytest.param(_replace('exec_time_limit = "5m"\n', ""), 5, "'exec_time_limit' is missing",
                 "exec_time_limit", id="no Te"),
    pytest.param(QUEUE + 'policies = ["overdo"]\n', 11, "'policies' must list some of: overload", "policies =",
                 id="unknown policy"),
    pytest.param(QUEUE + 'policies = "overdue"\n', 11, "'policies' must list", "policies =", id="policies string"),
    pytest.param(QUEUE + 'at_lowest = "kill"\n', 11, "'at_lowest' must be one of terminate, run", "terminate",
                 id="at_lowest"),
    pytest.param(QUEUE + '[queues.q1b]\nlevel = 1\npools = ["a"]\nqueue_time_limit = 60\nexec_time_limit = 60\n'
                 "max_cpus = 1\n", 13, "pool 'a' is in queues 'q1' and 'q1b' of the same level 1",
                 "share load by moving bags", id="one level sharing a pool"),
    pytest.param(_replace('pools = ["a"]', 'pools = ["a", "a"]'), 7, "pool 'a' is listed twice in queue 'q1'",
                 "list it once", id="a pool listed twice (review: said 'in queues q1 and q1')"),
    pytest.param(_replace("level = 1", "level = 2"), 5, "the top level is 2, not 1", "number the levels from 1",
                 id="top level not 1"),
    pytest.param(_replace('pools = ["a"]', "pools = []"), 7, "'pools' must be a list", 'pools = ["cluster"]',
                 id="no pool listed"),
    pytest.param(_replace('exec_time_limit = "5m"', 'exec_time_limit = "soon"'), 9, "'exec_time_limit' = 'soon'",
                 'exec_time_limit = "10m"', id="bad duration"),
    pytest.param(_replace("level = 1", "level = 0"), 6, "'level' must be a whole number of at least 1",
                 "level", id="level 0"),
    pytest.param(_replace("max_cpus = 2", "max_cpus = 0"), 10, "'max_cpus' must be a whole number of at least 1",
                 "max_cpus", id="max_cpus 0"),
    pytest.param(QUEUE + "performance = 0\n", 11, "'performance' must be a positive number", "performance",
                 id="performance 0"),
    pytest.param(QUEUE + "max_bags = 0\n", 11, "'max_bags' must be a whole number of at least 1", "max_bags",
                 id="max_bags 0"),
    pytest.param(QUEUE.replace("[queues.q1]", "[queues]\nq1 = 3\n[queues.q2]"), 6, "queue 'q1' must be a table",
                 "[queues.q1]", id="queue not a table"),
    pytest.param("queues = 3\n" + QUEUE.split("[queues.q1]")[0], 1, "'queues' must hold one table per queue",
                 "[queues.q1]", id="queues not a table"),
])
def test_a_bad_queue_is_refused_with_its_line_and_a_hint(text, line, message, hint):
    with pytest.raises(SpecError) as e:
        parse_pools_file(text, "pools.toml")
    problems = [p for p in e.value.problems if message in p.message]
    assert problems, [p.message for p in e.value.problems]
    assert problems[0].line == line, problems[0]
    assert problems[0].hint, f"no hint for: {problems[0].message}"
    assert hint in problems[0].hint, problems[0]


def test_every_problem_of_a_queue_is_reported_at_once():
    text = _replace('pools = ["a"]', 'pools = ["c"]') + 'at_lowest = "kill"\nwhatever = 1\n'
    with pytest.raises(SpecError) as e:
        parse_pools_file(text, "pools.toml")
    assert len(e.value.problems) == 3, e.value.problems
    assert "pools.toml:7" in str(e.value)


def test_queues_of_different_levels_may_share_a_pool():
    text = QUEUE + '[queues.q2]\nlevel = 2\npools = ["a", "b"]\nqueue_time_limit = 60\nexec_time_limit = 60\n' \
                   "max_cpus = 1\n"
    assert [q.name for q in parse_pools_file(text, "pools.toml")[1]] == ["q1", "q2"]


def test_two_queues_of_one_level_sharing_a_pool_are_refused_also_when_an_upper_level_has_it_too():
    text = QUEUE + "".join(f'[queues.{n}]\nlevel = 2\npools = ["a"]\nqueue_time_limit = 60\nexec_time_limit = 60\n'
                           "max_cpus = 1\n" for n in ("q2", "q3"))
    with pytest.raises(SpecError, match="pool 'a' is in queues 'q2' and 'q3' of the same level 2"):
        parse_pools_file(text, "pools.toml")


# -- parsing: a scenario ------------------------------------------------------------------------------------

SCENARIO = """\
[simulation]
seed = 2

[pools.small]
kind = "cluster"
size = 2

[pools.big]
kind = "grid"
size = 20

[queues.q1]
level = 1
pools = ["small"]
queue_time_limit = "6m"
exec_time_limit = "3m"
max_cpus = 2

[queues.q2]
level = 2
pools = ["big"]
queue_time_limit = "2h"
exec_time_limit = "1h"
max_cpus = 20

[bags.short]
jobs = 2
runtime = "30s"

[bags.other]
jobs = 2
runtime = "30s"
[bags.other.strategy]
complexity = 60

[bags.plain]
jobs = 2
runtime = "30s"
[bags.plain.strategy]
placement = "gridbot"
"""


def test_a_scenario_with_queues_parses_and_its_bags_are_placed_by_the_hierarchy():
    sc = parse_scenario(SCENARIO, "sc.toml")
    assert [(q.name, q.level, q.pools, q.max_cpus) for q in sc.queues] == [
        ("q1", 1, ("small",), 2), ("q2", 2, ("big",), 20)]
    by_name = {b.name: b for b in sc.bags}
    assert by_name["short"].strategy.placement == "hierarchy", "GridBot's default becomes the hierarchy"
    assert by_name["other"].strategy.placement == "hierarchy"
    assert by_name["other"].strategy.options == {"complexity": 60}
    assert by_name["plain"].strategy.placement == "hierarchy", "a named gridbot too, as on a server (the spec " \
        "cannot tell it from left out)"


def test_a_scenario_without_queues_keeps_gridbots_placement_and_refuses_the_hierarchys():
    flat = SCENARIO.split("[queues.q1]")[0] + "[bags.short]\njobs = 2\nruntime = \"30s\"\n"
    assert parse_scenario(flat, "sc.toml").bags[0].strategy.placement == "gridbot"
    asks = flat + '[bags.short.strategy]\nplacement = "hierarchy"\n'
    with pytest.raises(SpecError) as e:
        parse_scenario(asks, "sc.toml")
    [problem] = e.value.problems
    assert "placement 'hierarchy' needs queues" in problem.message
    assert problem.line == asks.splitlines().index("[bags.short.strategy]") + 1


@pytest.mark.parametrize(("old", "new", "message", "line"), [
    ('pools = ["small"]', 'pools = ["smal"]', "pool 'smal' is not in the pools file", 14),
    ('exec_time_limit = "3m"', 'exec_time_limit = "1h"', "is above queue_time_limit", 16),
    ("level = 1", "level = 3", "the top level is 2, not 1", 12),
    ("max_cpus = 2\n", "max_cpus = 2\nlevle = 1\n", "unknown key 'levle'", 18),
])
def test_a_scenarios_bad_queue_is_refused_with_its_line(old, new, message, line):
    text = SCENARIO.replace(old, new, 1)
    with pytest.raises(SpecError) as e:
        parse_scenario(text, "sc.toml")
    found = [p for p in e.value.problems if message in p.message]
    assert found and found[0].line == line, e.value.problems
    assert found[0].hint


# -- the registry -----------------------------------------------------------------------------------------

def _spec(placement: str = "gridbot", **options) -> BagSpec:
    return BagSpec(name="s", command="x", strategy=StrategyChoice(placement=placement, options=options))


def test_check_bag_refuses_the_hierarchys_placement_where_there_are_no_queues():
    with pytest.raises(StrategyError, match=r"placement 'hierarchy' needs queues.*\[queues.NAME\]"):
        registry.check_bag(_spec("hierarchy"), hierarchy=False)
    registry.check_bag(_spec("hierarchy"), hierarchy=True)
    registry.check_bag(_spec("hierarchy"))  # not known here (a client checking a spec)
    registry.check_bag(_spec("gridbot"), hierarchy=False)


@pytest.mark.parametrize(("options", "word"), [
    ({"complexity": -1.0}, "complexity"), ({"beta": 0.0}, "beta"), ({"beta": 1.5}, "beta"),
    ({"min_results": 0}, "min_results"), ({"preempt": 1}, "preempt"), ({"complexty": 5.0}, "complexity"),
])
def test_check_bag_refuses_bad_hierarchy_options(options, word):
    with pytest.raises(StrategyError, match=word):
        registry.check_bag(_spec("hierarchy", **options), hierarchy=True)


def test_check_bag_takes_the_hierarchys_options():
    registry.check_bag(_spec("hierarchy", complexity=3600, beta=0.5, min_results=5, preempt=False), hierarchy=True)


def test_default_placement_switches_gridbot_to_the_hierarchy_only_where_there_are_queues():
    assert registry.default_placement(_spec("gridbot"), True).strategy.placement == "hierarchy"
    assert registry.default_placement(_spec("gridbot"), False).strategy.placement == "gridbot"
    for other in ("cost-time", "hierarchy"):
        assert registry.default_placement(_spec(other), True).strategy.placement == other
    spec = _spec("gridbot", complexity=10.0)
    assert registry.default_placement(spec, True).strategy.options == {"complexity": 10.0}


def test_the_factory_shares_one_hierarchy_and_needs_queues_for_it():
    made = registry.factory(1, [QueueSpec("q1", 1, ("s",), 60.0, 60.0, 1)])
    assert isinstance(made.hierarchy, Hierarchy)
    a = made(1, _spec("hierarchy")).placement
    b = made(2, _spec("hierarchy")).placement
    assert isinstance(a, HierarchyPlacement) and isinstance(b, HierarchyPlacement)
    assert a.h is b.h is made.hierarchy
    assert registry.factory(1).hierarchy is None
    with pytest.raises(StrategyError, match="placement 'hierarchy' needs queues"):
        registry.factory(1)(1, _spec("hierarchy"))
    assert registry.factory(1)(1, _spec("gridbot")).placement.name == "gridbot"


# -- through the dispatcher -------------------------------------------------------------------------------

ADS = {p: {"Name": p, "MaxRunning": n, "Cpus": 1} for p, n in
       (("s", 2), ("s2", 2), ("m", 4), ("m2", 4), ("b", 8))}


def host(name: str, pool: str, slots: int = 1) -> HostInfo:
    return HostInfo(name, name, "Linux", slots, 0, slots, pool)


HOSTS = {p: [host(f"{p}{i}", p) for i in range(4)] for p in ADS}

Q1 = QueueSpec("q1", 1, ("s",), 600.0, 300.0, 2, 1.0)
"""C_e = 300 x 2 = 600, C_q = 1200 (P = 1, beta = 1)."""
Q2 = QueueSpec("q2", 2, ("m",), 3600.0, 3600.0, 4, 1.0)
"""C_e = C_q = 14,400."""
Q3 = QueueSpec("q3", 3, ("b",), 86400.0, 86400.0, 8, 1.0)
"""C_e = C_q = 691,200."""


def q(name: str, level: int, pools: tuple[str, ...], tq: float, te: float, n: int, **kw) -> QueueSpec:
    return QueueSpec(name, level, pools, tq, te, n, kw.pop("performance", 1.0), **kw)


def make(*queues: QueueSpec, ads=ADS) -> CoreSim:
    """The dispatcher as the server makes it on a pools file with these queues (default Q1, Q2, Q3)."""
    made = registry.factory(1, list(queues or (Q1, Q2, Q3)))
    sim = CoreSim(strategies=made, host_timeout=1e9, buffer_ttl=1e9)
    sim.d.pool_ads = ads
    sim.hierarchy = made.hierarchy  # type: ignore[attr-defined]
    return sim


def hbag(sim: CoreSim, name: str, jobs: int, **options) -> int:
    """A bag placed by the hierarchy, with these `[strategy]` options."""
    text = '[strategy]\nplacement = "hierarchy"\n'
    for k, v in options.items():
        text += f"{k} = {str(v).lower() if isinstance(v, bool) else v}\n"
    return sim.bag(name, jobs, strategy=text)


def hier(sim: CoreSim) -> Hierarchy:
    """The hierarchy every bag of the dispatcher shares."""
    h = sim.hierarchy  # type: ignore[attr-defined]
    assert isinstance(h, Hierarchy)
    return h


def where(sim: CoreSim, bag: int, now: float):
    report = sim.d.level(bag, now)
    assert report is not None
    return report


def moves(sim: CoreSim, bag: int, now: float) -> list[tuple[str, str, str]]:
    """The bag's migrations: (from, to, policy)."""
    return [(f, t, why.split(":")[0]) for _, f, t, why in where(sim, bag, now).migrations]


def ask_pool(sim: CoreSim, pool: str, now: float, want: int = 1) -> dict[int, int]:
    """Every host of the pool asks for `want`: instances sent per bag."""
    got: dict[int, int] = {}
    for h in HOSTS[pool]:
        for a in sim.ask(h, want, now):
            got[a.bag_id] = got.get(a.bag_id, 0) + 1
    return got


def ask_all(sim: CoreSim, now: float, want: int = 1) -> dict[str, dict[int, int]]:
    return {p: ask_pool(sim, p, now, want) for p in ADS}


def finish(sim: CoreSim, h: HostInfo, now: float, wall: float) -> None:
    """The host reports its instances done (sent `wall` seconds before `now`)."""
    sim.finish_all(h, now, wall=wall)


def test_a_bag_enters_level_1_and_gets_hosts_of_its_queues_pools_only_at_most_n_at_once():
    sim = make()
    a = hbag(sim, "a", 10)
    sim.tick(0.0)
    r = where(sim, a, 0.0)
    assert (r.queue, r.level, r.position, r.complexity, r.source, r.migrations, r.ended) == (
        "q1", 1, 1, None, "unknown", [], "")
    assert sim.d.view.pilots_wanted(a, list(ADS), 0.0) == {"s": 2}, "N slots, on the queue's pools only"
    assert ask_all(sim, 0.0) == {"s": {a: 2}, "s2": {}, "m": {}, "m2": {}, "b": {}}
    assert sim.d.view.bag(a).running == 2
    sim.finish_all(HOSTS["s"][0], 50.0, wall=50.0)
    assert ask_pool(sim, "s", 51.0) == {a: 1}, "one slot freed, one more"


def test_a_host_with_many_slots_gets_at_most_n_instances_of_a_bag():
    sim = make()
    a = hbag(sim, "a", 10)
    big = host("s-big", "s", 8)
    assert len(sim.ask(big, 8, 0.0)) == 2
    assert sim.ask(big, 8, 1.0) == []
    assert where(sim, a, 1.0).queue == "q1"


def test_bags_in_a_queue_are_fcfs_and_a_later_bag_backfills_the_slots_the_head_leaves():
    sim = make()
    a = hbag(sim, "a", 10)
    b = hbag(sim, "b", 10)
    sim.tick(0.0)
    assert (where(sim, a, 0.0).position, where(sim, b, 0.0).position) == (1, 2)
    assert any("waits in queue q1 (level 1) behind 1 bag(s)" in n for n in sim.d.diagnostics(b, 0.0))
    got = [(h.name, [x.bag_id for x in sim.ask(h, 1, 0.0)]) for h in HOSTS["s"]]
    assert got == [("s0", [a]), ("s1", [a]), ("s2", [b]), ("s3", [b])], "the head first, up to N; then the next"


def test_a_later_bag_gets_what_a_small_head_bag_does_not_use():
    sim = make()
    a = hbag(sim, "a", 1)
    b = hbag(sim, "b", 10)
    sim.tick(0.0)
    got = [[x.bag_id for x in sim.ask(h, 1, 0.0)] for h in HOSTS["s"][:3]]
    assert got == [[a], [b], [b]]


def test_on_a_pool_two_levels_share_the_upper_levels_bag_ranks_first():
    shared = q("q2", 2, ("s", "m"), 3600.0, 3600.0, 4)
    sim = make(Q1, shared)
    low = hbag(sim, "low", 10, complexity=5000)  # above q1's C_e: enters level 2; older than `top`
    top = hbag(sim, "top", 10)
    sim.tick(0.0)
    assert (where(sim, low, 0.0).queue, where(sim, top, 0.0).queue) == ("q2", "q1")
    got = [[x.bag_id for x in sim.ask(h, 1, 0.0)] for h in HOSTS["s"][:3]]
    assert got == [[top], [top], [low]], "level 1 first on the shared pool, up to its N; then level 2"
    assert ask_pool(sim, "m", 0.0) == {low: 3}, "level 2 also on its own pool, up to its N (4)"


# -- ProcessNewTask -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("complexity", "queue"), [(500, "q1"), (600, "q1"), (601, "q2"), (14400, "q2"),
                                                   (14401, "q3"), (691200, "q3")])
def test_a_given_complexity_enters_the_first_level_whose_ce_fits(complexity, queue):
    sim = make()
    a = hbag(sim, "a", 10, complexity=complexity)
    sim.tick(0.0)
    r = where(sim, a, 0.0)
    assert (r.queue, r.complexity, r.source, r.migrations) == (queue, complexity, "given", [])
    got = ask_all(sim, 0.0)
    assert {p for p, bags in got.items() if bags} == {(Q1.pools + Q2.pools + Q3.pools)[int(queue[1]) - 1]}


def test_a_complexity_above_every_level_is_rejected_at_the_lowest():
    sim = make()
    a = hbag(sim, "a", 3, complexity=1e7)
    sim.tick(0.0)
    r = where(sim, a, 0.0)
    assert r.queue == "q3" and r.ended.startswith("complexity mismatch at the lowest level")
    assert ask_all(sim, 0.5) == {p: {} for p in ADS}, "an ended bag gets no host"
    sim.tick(1.0)
    assert sim.store.bag(a).state is BagState.CANCELLED
    assert all("complexity mismatch" in (j.reason or "") for j in sim.store.jobs(a))
    assert sim.d.level(a, 1.0) is None


def test_a_given_complexity_enters_a_queue_of_its_level_that_fits_it():
    small = q("q2a", 2, ("m",), 1000.0, 1000.0, 4)  # C_e 4,000
    large = q("q2b", 2, ("m2",), 3600.0, 3600.0, 4)  # C_e 14,400
    sim = make(Q1, small, large, Q3)
    a = hbag(sim, "a", 10, complexity=10000)
    sim.tick(0.0)
    assert (where(sim, a, 0.0).queue, moves(sim, a, 0.0)) == ("q2b", [])


def test_an_unknown_complexity_enters_the_top_level():
    sim = make(Q1, Q2)
    a = hbag(sim, "a", 100000)  # very long, but nothing says so yet
    sim.tick(0.0)
    assert (where(sim, a, 0.0).queue, where(sim, a, 0.0).source) == ("q1", "unknown")


def test_overload_at_max_bags_moves_the_arriving_bag_to_another_queue_of_its_level_then_down():
    q1 = q("q1", 1, ("s",), 600.0, 300.0, 2, max_bags=1)
    q1b = q("q1b", 1, ("s2",), 600.0, 300.0, 2, max_bags=1)
    sim = make(q1, q1b, Q2, Q3)
    a, b, c = (hbag(sim, n, 4) for n in "abc")
    sim.tick(0.0)
    assert (where(sim, a, 0.0).queue, moves(sim, a, 0.0)) == ("q1", [])
    assert (where(sim, b, 0.0).queue, moves(sim, b, 0.0)) == ("q1b", [("q1", "q1b", "overload")])
    assert (where(sim, c, 0.0).queue, moves(sim, c, 0.0)) == ("q2", [("q1", "q2", "overload")])
    assert "holds 1 bags" in where(sim, c, 0.0).migrations[0][3]
    assert ask_pool(sim, "s2", 0.0) == {b: 2} and ask_pool(sim, "m", 0.0) == {c: 4}


def test_an_overloaded_bag_is_not_moved_to_a_queue_of_its_level_that_it_does_not_fit():
    """Found by review: overload moved a bag to another queue of its level with room, whose complexity mismatch
    sent it back, and on, until Python's recursion limit ended the placement with the bag where it did not fit."""
    both = frozenset({"overload", "complexity_mismatch"})
    p = q("p", 1, ("s",), 600.0, 600.0, 2, max_bags=1, policies=both)  # C_e 1200
    r = q("r", 1, ("s2",), 150.0, 150.0, 2, policies=both)  # C_e 300
    sim = make(p, r, Q2)
    a = hbag(sim, "a", 2, complexity=100)
    b = hbag(sim, "b", 2, complexity=1000)
    sim.tick(0.0)
    assert where(sim, a, 0.0).queue == "p"
    assert (where(sim, b, 0.0).queue, moves(sim, b, 0.0)) == ("q2", [("p", "q2", "overload")])


def test_overload_when_the_queues_work_is_over_cq():
    sim = make()
    bags = [hbag(sim, n, 4, complexity=500) for n in "abcd"]
    sim.tick(0.0)
    # arrivals see Q = 500, 1000, 1500: only the fourth finds the queue over its C_q of 1200
    assert [where(sim, x, 0.0).queue for x in bags] == ["q1", "q1", "q1", "q2"]
    assert moves(sim, bags[3], 0.0) == [("q1", "q2", "overload")]
    assert "over its C_q" in where(sim, bags[3], 0.0).migrations[0][3]


def test_an_overloaded_lowest_level_rejects_the_bag():
    low = q("q1", 1, ("s",), 600.0, 300.0, 2, max_bags=1)
    sim = make(low)
    a, b = hbag(sim, "a", 2), hbag(sim, "b", 2)
    sim.tick(0.0)
    assert where(sim, a, 0.0).ended == ""
    assert where(sim, b, 0.0).ended.startswith("overload at the lowest level")
    sim.tick(1.0)
    assert sim.store.bag(b).state is BagState.CANCELLED
    assert sim.store.bag(a).state is BagState.ACTIVE


# -- EnforceQueueLimits -------------------------------------------------------------------------------------

def test_overdue_after_te_moves_a_running_bag_down_but_not_while_it_is_alone_in_its_queue():
    sim = make()
    a = hbag(sim, "a", 4)
    sim.tick(0.0)
    assert ask_pool(sim, "s", 0.0) == {a: 2}
    sim.tick(1.0)
    for t in (200.0, 400.0, 800.0):
        sim.tick(t)
        assert (where(sim, a, t).queue, moves(sim, a, t)) == ("q1", []), "alone: it stays past Te and Tq"
    assert where(sim, a, 800.0).running_for == 800.0, "from its first instance's send, at 0"
    b = hbag(sim, "b", 4)
    sim.tick(801.0)  # (b is taken up after a's turn)
    sim.tick(802.0)
    assert moves(sim, a, 802.0) == [("q1", "q2", "overdue")]
    assert where(sim, a, 802.0).queue == "q2"
    assert where(sim, b, 802.0).queue == "q1"


def test_overdue_after_tq_moves_a_bag_that_never_ran():
    sim = make(q("q1", 1, ("s",), 600.0, 600.0, 2), Q2)
    a, b, c = (hbag(sim, n, 2) for n in "abc")
    sim.tick(0.0)
    assert [[x.bag_id for x in sim.ask(h, 1, 0.0)] for h in HOSTS["s"][:2]] == [[a], [a]], "b and c wait"
    sim.tick(1.0)
    sim.tick(601.0)
    assert moves(sim, a, 601.0) == [("q1", "q2", "overdue")]
    assert moves(sim, b, 601.0) == [("q1", "q2", "overdue")]
    assert "601 s in queue q1 (Tq 600 s), 0 s running there" in where(sim, b, 601.0).migrations[0][3]
    assert (where(sim, c, 601.0).queue, moves(sim, c, 601.0)) == ("q1", []), "left alone in its queue"


def _slow_start(sim: CoreSim, bag: int, run: float) -> None:
    """Two instances sent at 0 on the s hosts, reported done after `run` seconds, and two more sent then."""
    assert [[x.bag_id for x in sim.ask(h, 1, 0.0)] for h in HOSTS["s"][:2]] == [[bag], [bag]]
    sim.tick(1.0)
    for h in HOSTS["s"][:2]:
        finish(sim, h, run, run)
        assert [x.bag_id for x in sim.ask(h, 1, run)] == [bag]


def test_task_potential_overdue_from_measured_run_times():
    sim = make()
    a = hbag(sim, "a", 10, min_results=2)
    sim.tick(0.0)
    _slow_start(sim, a, 200.0)
    sim.tick(201.0)
    # 2 results of 200 s: 8 jobs left are 1,600 CPU-s; q1 does (300 - 200) x 2 = 200 in what is left of Te
    r = where(sim, a, 201.0)
    assert (r.queue, r.complexity, r.source) == ("q2", 1598.0, "measured"), "the two running have run 1 s"
    assert moves(sim, a, 201.0) == [("q1", "q2", "task potential overdue")]


def test_a_moved_bag_carries_its_complexity_and_a_mismatch_on_arrival_moves_it_on():
    sim = make()
    a = hbag(sim, "a", 10, min_results=2)
    sim.tick(0.0)
    _slow_start(sim, a, 2000.0)  # alone in q1: past Te, but not overdue
    sim.tick(2001.0)
    # 8 jobs of 2,000 s left: 16,000 CPU-s, over q2's C_e (14,400) on arrival there
    r = where(sim, a, 2001.0)
    assert (r.queue, r.complexity) == ("q3", 15998.0), "(the two running have run 1 s)"
    assert moves(sim, a, 2001.0) == [("q1", "q2", "task potential overdue"), ("q2", "q3", "complexity mismatch")]


def test_fast_jobs_stay_in_their_queue():
    sim = make()
    a = hbag(sim, "a", 10, min_results=2)
    sim.tick(0.0)
    _slow_start(sim, a, 20.0)
    sim.tick(21.0)
    r = where(sim, a, 21.0)
    assert (r.queue, r.complexity, r.source, r.migrations) == ("q1", 158.0, "measured", []), \
        "(the running ones have run 1 s)"


def test_queue_potential_overdue_moves_the_bag_the_work_ahead_leaves_no_room_for():
    sim = make()
    bags = [hbag(sim, n, 4, complexity=500) for n in "abc"]
    sim.tick(0.0)
    assert [where(sim, x, 0.0).queue for x in bags] == ["q1", "q1", "q1"], "arrivals saw Q of 500 and 1000"
    sim.tick(1.0)
    assert [where(sim, x, 1.0).queue for x in bags] == ["q1", "q1", "q2"]
    assert moves(sim, bags[2], 1.0) == [("q1", "q2", "queue potential overdue")]
    assert hier(sim).load["q1"] == 1000.0, "Q: the work of the bags kept"


def test_measured_work_counts_beta_as_the_limits_do():
    sim = make(q("q1", 1, ("s",), 700.0, 700.0, 2), Q2)
    a = hbag(sim, "a", 10, min_results=2, beta=0.5)
    sim.tick(0.0)
    _slow_start(sim, a, 100.0)
    sim.tick(101.0)
    # 8 jobs of 100 s left on 2 slots end at 500, within Te (700): 8 x 100 x 0.5 = 400 CPU-s <= (700 - 100) x 2 x 0.5
    r = where(sim, a, 101.0)
    assert (r.queue, r.complexity, r.migrations) == ("q1", 399.0, []), "(the running ones have run 1 s)"


def test_a_given_complexity_shrinks_with_the_jobs_done():
    sim = make()
    a = hbag(sim, "a", 4, complexity=400)
    sim.tick(0.0)
    assert ask_pool(sim, "s", 0.0) == {a: 2}
    finish(sim, HOSTS["s"][0], 10.0, 10.0)
    sim.tick(11.0)
    # 100 a job: two queued, and the running one has 89 s left of its share (a running job's progress counts)
    assert (where(sim, a, 11.0).complexity, where(sim, a, 11.0).source) == (289.0, "given")


# -- migration: preemption ----------------------------------------------------------------------------------

def _moved_running(preempt: bool | None) -> tuple[CoreSim, int]:
    """A bag with 2 results and 2 instances running on s0 and s1 that task potential overdue moves to q2 at 201."""
    sim = make()
    options = {"min_results": 2} | ({} if preempt is None else {"preempt": preempt})
    a = hbag(sim, "a", 10, **options)
    sim.tick(0.0)
    _slow_start(sim, a, 200.0)
    sim.tick(201.0)
    assert where(sim, a, 201.0).queue == "q2"
    return sim, a


def test_a_migrated_bags_running_instances_are_preempted_and_queued_again_for_the_new_queues_pools():
    sim, a = _moved_running(None)
    bag = sim.d.view.bag(a)
    assert (bag.running, bag.counts.done, bag.counts.failed) == (0, 2, 0), "results kept, nothing failed"
    for h in HOSTS["s"][:2]:
        answer = sim.exchange(h, 1, 202.0)
        assert len(answer.cancel) == 1, "the host is told to kill it"
        assert answer.assignments == [], "nothing of the bag on its old queue's pools"
    withdrawn = [j for j in (sim.d.view.job(i) for i in range(1, 11)) if j is not None]
    assert len(withdrawn) == 2
    anywhere = frozenset(p for queue in hier(sim).queues for p in queue.pools)
    assert all(j.state is JobState.QUEUED and j.failures == 0 and j.pools == anywhere for j in withdrawn), \
        "queued again for the hierarchy's pools: rank keeps them to the new queue's"
    story = sim.store.story(withdrawn[0].job_id)
    assert story is not None
    [moved] = [d for d in story.decisions if d.action == "migrate"]
    assert moved.strategy == "placement=hierarchy"
    assert "the bag moved to queue q2 (task potential overdue: " in moved.why, "its story says why it moved"
    assert ask_pool(sim, "m", 203.0) == {a: 4}, "its new queue's pools, up to its N there"
    assert {j.job_id for j in withdrawn} <= {j.job_id for j in sim.d.view.running_jobs(a)}
    assert all(j.failures == 0 for j in sim.store.jobs(a))


def test_with_preempt_false_running_instances_finish_where_they_are():
    sim, a = _moved_running(False)
    bag = sim.d.view.bag(a)
    assert (bag.running, bag.counts.done) == (2, 2)
    for h in HOSTS["s"][:2]:
        assert sim.exchange(h, 0, 202.0).cancel == []
    assert ask_pool(sim, "m", 203.0) == {a: 4}, "the rest starts on the new queue's pools"
    for h in HOSTS["s"][:2]:
        finish(sim, h, 400.0, 200.0)
    bag = sim.d.view.bag(a)
    assert (bag.counts.done, bag.counts.failed, bag.running) == (4, 0, 4)
    assert ask_pool(sim, "s", 401.0) == {}, "no new instance on the old queue's pools"


def test_jobs_preempted_by_one_migration_run_after_the_next():
    sim = make()
    a = hbag(sim, "a", 2)
    b = hbag(sim, "b", 2)
    sim.tick(0.0)
    assert ask_pool(sim, "s", 0.0) == {a: 2, b: 2}
    sim.tick(1.0)
    sim.tick(400.0)  # both past Te; a, at the head, moves first (b, then alone, stays)
    assert moves(sim, a, 400.0) == [("q1", "q2", "overdue")]
    c = hbag(sim, "c", 4, complexity=5000)  # a second bag in q2, so that a is not alone there
    sim.tick(401.0)
    sim.tick(4100.0)  # a never ran in q2: past its Tq
    assert where(sim, a, 4100.0).queue == "q3"
    assert where(sim, c, 4100.0).queue in ("q2", "q3")
    assert ask_pool(sim, "b", 4101.0).get(a, 0) == 2, sim.d.diagnostics(a, 4101.0)


# -- the lowest level ---------------------------------------------------------------------------------------

def _lowest(at_lowest: str, policies=POLICIES) -> tuple[CoreSim, int]:
    """Two levels; a bag of given complexity 2,000 (4 jobs of 500) in the lowest (Te 1,000 s, N 2: C_e 2,000),
    one job done at 100, one running since 0; at te = 501 what is left of Te (2 slots x 499 s) cannot do the
    1,000 CPU-s of the two jobs queued."""
    low = q("low", 2, ("m",), 1000.0, 1000.0, 2, at_lowest=at_lowest, policies=frozenset(policies))
    sim = make(Q1, low)
    a = hbag(sim, "a", 4, complexity=2000)
    sim.tick(0.0)
    assert where(sim, a, 0.0).queue == "low"
    assert ask_pool(sim, "m", 0.0) == {a: 2}
    sim.tick(1.0)
    finish(sim, HOSTS["m"][0], 100.0, 100.0)
    sim.tick(101.0)
    assert where(sim, a, 101.0).complexity == 1399.0  # 2 queued x 500, and 399 s left of the running one
    sim.tick(501.0)
    return sim, a


def test_at_the_lowest_level_terminate_ends_the_bag_keeping_its_results():
    sim, a = _lowest("terminate")
    assert where(sim, a, 500.0).ended.startswith("task potential overdue at the lowest level")
    sim.tick(501.0)
    row = sim.store.bag(a)
    assert row.state is BagState.CANCELLED
    assert (row.counts.done, row.counts.cancelled, row.counts.failed) == (1, 3, 0)
    assert len(sim.store.results(a)) == 1, "the result stays"
    cancelled = sim.store.jobs(a, JobState.CANCELLED)
    assert len(cancelled) == 3
    assert all("ended by placement=hierarchy: task potential overdue at the lowest level" in (j.reason or "")
               for j in cancelled)
    assert len(sim.exchange(HOSTS["m"][1], 0, 502.0).cancel) == 1, "its running instance is killed"
    assert sim.d.level(a, 502.0) is None


def test_at_the_lowest_level_overdue_terminates_once_another_bag_is_there():
    low = q("low", 2, ("m",), 1000.0, 500.0, 2, at_lowest="terminate", policies=frozenset({"overdue"}))
    sim = make(Q1, low)
    a = hbag(sim, "a", 4, complexity=700)
    sim.tick(0.0)
    assert ask_pool(sim, "m", 0.0) == {a: 2}
    sim.tick(1.0)
    sim.tick(600.0)
    assert where(sim, a, 600.0).ended == "", "alone in the queue: not yet"
    hbag(sim, "b", 4, complexity=700)
    sim.tick(601.0)
    sim.tick(602.0)
    assert where(sim, a, 602.0).ended.startswith("overdue at the lowest level")
    sim.tick(603.0)
    assert sim.store.bag(a).state is BagState.CANCELLED
    assert all("overdue at the lowest level" in (j.reason or "") for j in sim.store.jobs(a, JobState.CANCELLED))


def test_at_the_lowest_level_run_leaves_the_bag_running():
    sim, a = _lowest("run")
    sim.tick(501.0)
    r = where(sim, a, 501.0)
    assert (r.queue, r.ended) == ("low", "")
    assert sim.store.bag(a).state is BagState.ACTIVE
    assert ask_pool(sim, "m", 502.0) == {a: 1}, "it goes on: a second slot of its N"
    for h in HOSTS["m"]:
        finish(sim, h, 600.0, 100.0)
    assert sim.store.bag(a).counts.done == 3


def test_a_bag_left_to_run_at_the_lowest_level_still_counts_in_its_queues_work():
    sim, a = _lowest("run")
    sim.tick(501.0)
    assert hier(sim).load["low"] == pytest.approx(where(sim, a, 501.0).complexity)


def test_a_queue_whose_bags_ended_between_steps_is_not_overloaded_by_their_work():
    """Found on 2026-11-29: the hierarchy steps only while one of its bags runs, so Q kept the work of the bags
    that ended since, and the next bag to arrive at the idle queue was moved on for an overload of no one's work
    (`gridbot levels` showed that work too)."""
    sim = make(q("q1", 1, ("s",), 600.0, 300.0, 2, policies=frozenset({"overload"})), Q2)
    a, b, c = (hbag(sim, name, 1, complexity=500) for name in "abc")
    sim.tick(0.0)
    assert hier(sim).load["q1"] == 1500.0 > 1200.0  # (C_q = 600 s x 2 CPUs)
    assert [x.bag_id for h in HOSTS["s"][:2] for x in sim.ask(h, 1, 0.0)] == [a, b]  # (first come, first served)
    for h in HOSTS["s"][:2]:
        finish(sim, h, 10.0, wall=10.0)
    assert sim.store.bag(a).state is BagState.COMPLETED and sim.store.bag(b).state is BagState.COMPLETED
    view = sim.d.view
    assert hier(sim).work(view, Q1) == 500.0, "c's work alone"
    d = hbag(sim, "d", 1, complexity=100)
    sim.tick(20.0)
    assert (where(sim, d, 20.0).queue, moves(sim, d, 20.0)) == ("q1", [])
    assert where(sim, c, 20.0).queue == "q1"
    assert hier(sim).load["q1"] == 600.0


# -- switching policies off ---------------------------------------------------------------------------------

def _all_but(policy: str) -> frozenset[str]:
    return frozenset(POLICIES) - {policy}


def _overload(policies: frozenset[str]) -> tuple[CoreSim, int, float]:
    sim = make(q("q1", 1, ("s",), 600.0, 300.0, 2, max_bags=1, policies=policies), Q2)
    hbag(sim, "a", 4)
    b = hbag(sim, "b", 4)
    sim.tick(0.0)
    return sim, b, 0.0


def _mismatch(policies: frozenset[str]) -> tuple[CoreSim, int, float]:
    sim = make(Q1, q("low", 2, ("m",), 3600.0, 3600.0, 4, policies=policies))
    a = hbag(sim, "a", 4, complexity=1e7)
    sim.tick(0.0)
    return sim, a, 0.0


def _overdue(policies: frozenset[str]) -> tuple[CoreSim, int, float]:
    sim = make(q("q1", 1, ("s",), 600.0, 300.0, 2, policies=policies), Q2)
    a = hbag(sim, "a", 4)
    hbag(sim, "b", 4)
    sim.tick(0.0)
    ask_pool(sim, "s", 0.0)
    sim.tick(1.0)
    sim.tick(400.0)
    return sim, a, 400.0


def _task_potential(policies: frozenset[str]) -> tuple[CoreSim, int, float]:
    sim = make(q("q1", 1, ("s",), 600.0, 300.0, 2, policies=policies), Q2)
    a = hbag(sim, "a", 10, min_results=2)
    sim.tick(0.0)
    _slow_start(sim, a, 200.0)
    sim.tick(201.0)
    return sim, a, 201.0


def _queue_potential(policies: frozenset[str]) -> tuple[CoreSim, int, float]:
    sim = make(q("q1", 1, ("s",), 600.0, 300.0, 2, policies=policies), Q2)
    bags = [hbag(sim, n, 4, complexity=500) for n in "abc"]
    sim.tick(0.0)
    sim.tick(1.0)
    return sim, bags[2], 1.0


SCENES = {"overload": _overload, "complexity_mismatch": _mismatch, "overdue": _overdue,
          "task_potential_overdue": _task_potential, "queue_potential_overdue": _queue_potential}


def _fired(sim: CoreSim, bag: int, now: float) -> list[str]:
    r = where(sim, bag, now)
    return [why.split(":")[0].removesuffix(" at the lowest level") for _, _, _, why in r.migrations]


@pytest.mark.parametrize("policy", POLICIES)
def test_each_policy_fires_when_on(policy):
    sim, bag, now = SCENES[policy](frozenset(POLICIES))
    assert _fired(sim, bag, now)[:1] == [policy.replace("_", " ")]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_switched_off_policy_never_fires(policy):
    sim, bag, now = SCENES[policy](_all_but(policy))
    assert policy.replace("_", " ") not in _fired(sim, bag, now)
    for t in (now + 1, now + 2, now + 1000):
        sim.tick(t)
        if sim.d.level(bag, t) is not None:
            assert policy.replace("_", " ") not in _fired(sim, bag, t)


@pytest.mark.parametrize("policy", POLICIES)
def test_with_every_policy_off_nothing_moves(policy):
    sim, bag, now = SCENES[policy](frozenset())
    assert _fired(sim, bag, now) == []
    r = where(sim, bag, now)
    assert r.level == 1 or policy == "complexity_mismatch"


# -- load sharing -------------------------------------------------------------------------------------------

def _two_level_2_queues() -> tuple[CoreSim, list[int]]:
    """Level 2: q2a (pool m) and q2b (pool m2), both N 4; bags c (started in q2a), x (14,000 CPU-s, in q2b),
    then b1 and b2 waiting in q2a behind c, of 5,000 CPU-s each."""
    q2a = q("q2a", 2, ("m",), 7200.0, 3600.0, 4)
    q2b = q("q2b", 2, ("m2",), 7200.0, 3600.0, 4)
    sim = make(Q1, q2a, q2b)
    c = hbag(sim, "c", 10, complexity=5000)
    x = hbag(sim, "x", 10, complexity=14000)  # more than c and b1 together: b2 enters q2a
    b1 = hbag(sim, "b1", 10, complexity=5000)
    b2 = hbag(sim, "b2", 10, complexity=5000)
    sim.tick(0.0)
    assert [where(sim, i, 0.0).queue for i in (c, x, b1, b2)] == ["q2a", "q2b", "q2a", "q2a"]
    assert ask_pool(sim, "m", 0.0) == {c: 4}
    assert ask_pool(sim, "m2", 0.0) == {x: 4}
    sim.tick(1.0)
    assert [where(sim, i, 1.0).queue for i in (c, x, b1, b2)] == ["q2a", "q2b", "q2a", "q2a"], "no gain yet"
    return sim, [c, x, b1, b2]


def test_load_sharing_moves_a_waiting_bag_to_the_less_loaded_queue_of_its_level():
    sim, (c, x, b1, b2) = _two_level_2_queues()
    sim.store.apply(sim.d.cancel_bag(x, 2.0))
    sim.tick(3.0)
    assert where(sim, c, 3.0).queue == "q2a", "a started bag stays"
    # b1: 10,000 CPU-s in q2a with c ahead (2,500 s at 4/s) against 5,000 in the emptied q2b (1,250 s)
    assert (where(sim, b1, 3.0).queue, moves(sim, b1, 3.0)) == ("q2b", [("q2a", "q2b", "load sharing")])
    assert "would end in 1,250 s in queue q2b against 2,497 s here" in where(sim, b1, 3.0).migrations[0][3]
    # b2: 2,500 s either way now
    assert (where(sim, b2, 3.0).queue, moves(sim, b2, 3.0)) == ("q2a", []), "it would end no sooner in q2b"
    assert ask_pool(sim, "m2", 4.0) == {b1: 4}


def test_load_sharing_counts_a_moved_bags_work_once_in_its_new_queue_and_not_in_its_old_one():
    q2a = q("q2a", 2, ("m",), 7200.0, 3600.0, 4)
    q2b = q("q2b", 2, ("m2",), 7200.0, 3600.0, 6)
    sim = make(Q1, q2a, q2b)
    c = hbag(sim, "c", 10, complexity=5000)
    sim.tick(0.0)  # enters q2a (both empty: by name), then moves to the faster q2b: 833 s there against 1,250
    assert moves(sim, c, 0.0) == [("q2a", "q2b", "load sharing")]
    assert (hier(sim).load["q2a"], hier(sim).load["q2b"]) == (0.0, 5000.0)


# -- the level report and the queues --------------------------------------------------------------------------

def test_the_level_report_tells_queue_level_position_complexity_times_and_moves():
    sim = make()
    a = hbag(sim, "a", 10, min_results=2)
    b = hbag(sim, "b", 10)
    sim.tick(0.0)
    assert where(sim, b, 0.0).position == 2
    assert [[x.bag_id for x in sim.ask(h, 1, 0.0)] for h in HOSTS["s"][:2]] == [[a], [a]]
    sim.tick(1.0)
    sim.tick(150.0)
    r = where(sim, a, 150.0)
    assert (r.queue, r.level, r.position, r.queued_for) == ("q1", 1, 1, 150.0)
    assert 149.0 <= r.running_for <= 150.0
    assert (r.complexity, r.source, r.migrations) == (None, "unknown", [])
    for h in HOSTS["s"][:2]:
        finish(sim, h, 200.0, 200.0)
    sim.tick(201.0)
    r = where(sim, a, 201.0)
    assert (r.queue, r.level, r.position, r.complexity, r.source) == ("q2", 2, 1, 1600.0, "measured")
    assert r.queued_for == 0.0 and r.running_for == 0.0, "its clocks start again in its new queue"
    [(when, src, dst, why)] = r.migrations
    assert (when, src, dst) == (201.0, "q1", "q2") and why.startswith("task potential overdue: ")
    assert where(sim, b, 201.0).position == 1
    assert sim.d.level(999, 201.0) is None


def test_te_counts_from_the_first_instance_sent_in_the_queue():
    sim = make()
    a = hbag(sim, "a", 10)
    sim.tick(0.0)
    assert ask_pool(sim, "s", 5.0) == {a: 2}
    sim.tick(60.0)
    assert where(sim, a, 60.0).running_for == 55.0


def test_tq_of_the_first_queue_counts_from_the_bags_submission():
    sim = make()
    a = hbag(sim, "a", 10)  # submitted at 0 (created_at)
    sim.tick(30.0)
    assert where(sim, a, 30.0).queued_for == 30.0


def test_a_bag_of_another_placement_has_no_level():
    sim = make()
    plain = sim.bag("plain", 2)
    sim.tick(0.0)
    assert sim.d.level(plain, 0.0) is None


def test_ended_bags_leave_their_queue():
    sim = make()
    a, b, c = hbag(sim, "a", 2), hbag(sim, "b", 2), hbag(sim, "c", 2)
    sim.tick(0.0)
    assert hier(sim).order["q1"] == [a, b, c]
    assert ask_pool(sim, "s", 0.0) == {a: 2, b: 2}
    for h in HOSTS["s"][:2]:
        finish(sim, h, 50.0, 50.0)
    assert sim.store.bag(a).state is BagState.COMPLETED
    sim.store.apply(sim.d.cancel_bag(b, 51.0))
    sim.tick(52.0)
    assert hier(sim).order["q1"] == [c]
    assert a not in hier(sim).bags and b not in hier(sim).bags
    assert (sim.d.level(a, 52.0), sim.d.level(b, 52.0)) == (None, None)
    assert where(sim, c, 52.0).position == 1


def test_a_bag_arriving_after_the_queues_only_bag_ended_does_not_find_it_there():
    sim = make(q("q1", 1, ("s",), 600.0, 300.0, 2, max_bags=1), Q2)
    a = hbag(sim, "a", 2)
    sim.tick(0.0)
    assert ask_pool(sim, "s", 0.0) == {a: 2}
    for h in HOSTS["s"][:2]:
        finish(sim, h, 50.0, 50.0)
    assert sim.store.bag(a).state is BagState.COMPLETED
    sim.tick(60.0)
    b = hbag(sim, "b", 2)
    sim.tick(70.0)
    assert (where(sim, b, 70.0).queue, moves(sim, b, 70.0)) == ("q1", [])


def test_a_bag_ended_at_the_lowest_level_leaves_its_queue_even_when_no_other_bag_is_there():
    sim, a = _lowest("terminate")
    sim.tick(501.0)
    assert sim.store.bag(a).state is BagState.CANCELLED
    sim.tick(502.0)
    assert (hier(sim).order["low"], hier(sim).load["low"]) == ([], 0.0)


# -- a bag's [strategy] changed while it runs (Dispatcher.set_strategy: `gridbot strategy`) ------------------

def _with_options(sim: CoreSim, bag: int, placement: str = "hierarchy", **options) -> BagSpec:
    spec = sim.store.bag(bag).spec
    return msgspec.structs.replace(spec, strategy=StrategyChoice(placement=placement, options=options))


def _moved_and_running() -> tuple[CoreSim, int]:
    """b, overloaded from q1 (max_bags 1) to q2 at 0, runs 4 instances on m."""
    sim = make(q("q1", 1, ("s",), 600.0, 300.0, 2, max_bags=1), Q2, Q3)
    hbag(sim, "a", 4)
    b = hbag(sim, "b", 10)
    sim.tick(0.0)
    assert moves(sim, b, 0.0) == [("q1", "q2", "overload")]
    assert ask_pool(sim, "m", 1.0) == {b: 4}
    sim.tick(2.0)
    assert sim.d.view.bag(b).running == 4
    return sim, b


def test_a_new_strategy_for_a_moved_bag_does_not_preempt_its_instances_in_its_own_queue():
    sim, b = _moved_and_running()
    sim.d.set_strategy(b, _with_options(sim, b), 10.0)
    sim.tick(11.0)
    assert sim.d.view.bag(b).running == 4
    assert all(sim.exchange(h, 0, 12.0).cancel == [] for h in HOSTS["m"])


def test_a_new_strategy_gives_the_bag_its_new_complexity():
    sim, b = _moved_and_running()
    sim.d.set_strategy(b, _with_options(sim, b, complexity=100000.0), 10.0)
    sim.tick(11.0)
    r = where(sim, b, 11.0)
    assert (r.complexity, r.source) == (pytest.approx(100000.0, abs=100.0), "given")  # (less what has run)


def test_a_bag_switched_to_another_placement_leaves_its_queue():
    sim = make(q("q1", 1, ("s",), 600.0, 300.0, 2, max_bags=1), Q2, Q3)
    a = hbag(sim, "a", 4)
    sim.tick(0.0)
    sim.d.set_strategy(a, _with_options(sim, a, placement="gridbot"), 1.0)
    sim.tick(2.0)
    b = hbag(sim, "b", 4)
    sim.tick(3.0)
    assert hier(sim).order["q1"] == [b]
    assert (where(sim, b, 3.0).queue, moves(sim, b, 3.0)) == ("q1", [])


def test_the_queues_speed_comes_from_its_pools_ads_when_not_given():
    ads = {**ADS, "s": {**ADS["s"], "Speed": 2.0}}
    sim = make(q("q1", 1, ("s",), 600.0, 300.0, 2, performance=None), Q2, ads=ads)
    a = hbag(sim, "a", 4, complexity=1000)  # above 600 at speed 1, within 300 x 2 x 2 at speed 2
    sim.tick(0.0)
    assert where(sim, a, 0.0).queue == "q1"
    h = hier(sim)
    assert h.phi(sim.d.view, h.by_name["q1"], 300.0, 1.0) == 1200.0
    assert h.phi(sim.d.view, h.by_name["q1"], 300.0, 0.5) == 600.0, "beta scales it"


def test_beta_lowers_the_limits_a_bag_is_held_to():
    sim = make()
    a = hbag(sim, "a", 4, complexity=500, beta=0.5)  # q1's C_e is 300 for it
    sim.tick(0.0)
    assert where(sim, a, 0.0).queue == "q2"


def _restarted(sim: CoreSim, *queues: QueueSpec) -> CoreSim:
    """A server restarted on the same store: a new dispatcher (and hierarchy) restored from its snapshot."""
    fresh = make(*queues)
    fresh.store, fresh.held = sim.store, sim.held
    made = registry.factory(1, list(queues or (Q1, Q2, Q3)))
    fresh.d = Dispatcher(DispatchConfig(check_invariants=True, host_timeout=1e9, buffer_ttl=1e9), made)
    fresh.d.pool_ads = ADS
    fresh.d.restore(sim.store.snapshot())
    fresh.hierarchy = made.hierarchy  # type: ignore[attr-defined]
    return fresh


def test_a_restored_bag_with_a_given_complexity_enters_its_level_again():
    sim = make()
    a = hbag(sim, "a", 4, complexity=5000)
    sim.tick(0.0)
    assert where(sim, a, 0.0).queue == "q2"
    fresh = _restarted(sim)
    fresh.tick(10.0)
    assert where(fresh, a, 10.0).queue == "q2", "its given complexity sends it to level 2 again"


def test_a_restored_bag_that_had_moved_down_on_its_measured_work_goes_down_again():
    sim = make()
    a = hbag(sim, "a", 10, min_results=2)
    sim.tick(0.0)
    _slow_start(sim, a, 200.0)
    sim.tick(201.0)
    assert (where(sim, a, 201.0).queue, where(sim, a, 201.0).source) == ("q2", "measured")
    fresh = _restarted(sim)
    fresh.tick(300.0)
    fresh.tick(301.0)
    assert where(fresh, a, 301.0).level >= 2


def test_the_spec_takes_the_hierarchys_options():
    spec = parse_spec('command = "x {i}"\n[parameters]\ni = [1, 2]\n[strategy]\nplacement = "hierarchy"\n'
                      "complexity = 3600\nbeta = 0.8\npreempt = false\n", "s.toml", "s")
    assert spec.strategy.placement == "hierarchy"
    assert spec.strategy.options == {"complexity": 3600, "beta": 0.8, "preempt": False}
    registry.check_bag(spec, hierarchy=True)


def test_a_report_of_an_unknown_instance_does_not_disturb_the_hierarchy():
    sim = make()
    a = hbag(sim, "a", 2)
    sim.tick(0.0)
    sim.ask(HOSTS["s"][0], 1, 0.0, [InstanceReport(999, Outcome.SUCCESS, 0, 1.0, 1.0)])
    sim.tick(1.0)
    assert where(sim, a, 1.0).queue == "q1"


def test_bags_replayed_from_a_log_are_placed_by_the_hierarchy_and_can_be_given_a_strategy():
    """A stream of bags from an SWF log (issue 17): with queues, `[swf_bags]` bags are the hierarchy's; a
    `strategy` table gives them its options, or another placement."""
    queues = SCENARIO[SCENARIO.index("[queues.q1]"):SCENARIO.index("[bags.short]")]
    head = SCENARIO[:SCENARIO.index("[queues.q1]")] + queues
    sc = parse_scenario(head + '[swf_bags.nasa]\nswf = "NASA-iPSC"\ncount = 3\nmax_jobs = 8\n'
                        '[swf_bags.nasa.strategy]\ncomplexity = 120\n', "sc.toml")
    assert len(sc.bags) == 3
    assert {(b.strategy.placement, b.strategy.options["complexity"]) for b in sc.bags} == {("hierarchy", 120)}
    plain = parse_scenario(head + '[swf_bags.nasa]\nswf = "NASA-iPSC"\ncount = 2\n'
                           '[swf_bags.nasa.strategy]\nplacement = "naive"\n', "sc.toml")
    assert {b.strategy.placement for b in plain.bags} == {"naive"}
    r = simulate(parse_scenario(head + '[swf_bags.nasa]\nswf = "NASA-iPSC"\ncount = 3\nmax_jobs = 4\n', "sc.toml"))
    done = [b for b in r.bags if b.state == "completed"]
    assert done and all(b.level is not None and b.level["queue"] in ("q1", "q2") for b in done)
