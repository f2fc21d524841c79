"""Scenario files: what a user writes is read as meant, and every mistake is named with its line and a fix."""

from __future__ import annotations

import pytest

from gridbot.model.spec import SpecError
from gridbot.sim.scenario import parse_scenario

GOOD = """
[simulation]
seed = 4
latency = "0.5s"

[server]
host_timeout = "1h"
reliable_pools = ["technion"]

[pools.osg]
kind = "grid"
size = [[0, 10], ["2h", 40]]
queue_wait = { dist = "exponential", mean = "5m" }
preemption = 0.1

[pools.technion]
kind = "cluster"
size = 5

[pools.superlink]
kind = "community"
size = { min = 10, max = 30, every = "1h" }
hosts = 100
turnaround_ratio = { dist = "uniform", low = 0.01, high = 1 }
availability = { fta = "overnet03" }

[bags.b]
jobs = 100
copies = 3
runtime = { trace = "blastall" }

[bags.b.policy]
Rank = "{copy}"
"""


def test_a_scenario_reads_as_written():
    sc = parse_scenario(GOOD, "good.toml")
    assert sc.seed == 4 and sc.latency == 0.5 and sc.dispatch.host_timeout == 3600
    assert sc.heartbeat == 1800  # half the host timeout
    assert sc.dispatch.reliable_pools == frozenset({"technion"})
    osg, technion, superlink = sc.pools
    assert [(s.at, s.size) for s in osg.size] == [(0, 10), (7200, 40)]
    assert osg.hosts == 40 and osg.queue_wait.mean == 300
    assert technion.spec.reliability == "reliable" and superlink.spec.reliability == "volunteer"
    assert superlink.volunteer and superlink.fluctuate == (10, 30, 3600.0)
    assert [b.name for b in sc.bags] == ["b-1", "b-2", "b-3"]
    assert [b.policy["Rank"] for b in sc.bags] == ["1", "2", "3"]


@pytest.mark.parametrize(("text", "line", "words"), [
    ('[pools.p]\nkind = "grid"\nsize = 5\nsise = 4\n[bags.b]\njobs = 1\nruntime = 1\n', 4, "did you mean 'size'"),
    ('[pools.p]\nkind = "grd"\nsize = 5\n[bags.b]\njobs = 1\nruntime = 1\n', 2, "did you mean 'grid'"),
    ('[pools.p]\nkind = "grid"\n[bags.b]\njobs = 1\nruntime = 1\n', 1, "has no size"),
    ('[pools.p]\nsize = 5\n[bags.b]\njobs = 1\nruntime = { dist = "unifrm", low = 1, high = 2 }\n', 5,
     "unknown distribution 'unifrm'"),
    ('[pools.p]\nsize = 5\n[bags.b]\njobs = 1\nruntime = { dist = "uniform", low = 1 }\n', 5, "needs 'high'"),
    ('[pools.p]\nsize = 5\n[bags.b]\njobs = 1\nruntime = { fta = "nope" }\n', 5, "there are g5k06"),
    ('[pools.p]\nsize = 5\n[bags.b]\njobs = 0\nruntime = 1\n', 4, "at least 1"),
    ('[pools.p]\nsize = 5\n[bags.b]\njobs = 1\nruntime = 1\n[bags.b.policy]\nJobRequirments = "true"\n', 7,
     "did you mean JobRequirements"),
    ('[pools.p]\nsize = 5\n[bags.b]\njobs = 1\nruntime = 1\n[bags.b.policy]\nRank = "Host.Speeed"\n', 7, "Rank"),
    ('[simulation]\nheartbeat = "20m"\n[pools.p]\nsize = 5\n[bags.b]\njobs = 1\nruntime = 1\n', 2,
     "shorter than the server's host_timeout"),
    ('[server]\nreliable_pools = ["tech"]\n[pools.technion]\nsize = 5\n[bags.b]\njobs = 1\nruntime = 1\n', 2,
     "did you mean 'technion'"),
    ('[pools.p]\nsize = 5\nhosts = 2\n[bags.b]\njobs = 1\nruntime = 1\n', 3, "raise hosts"),
    ('[pools.p]\nsize = 5\nturnaround_ratio = 3\n[bags.b]\njobs = 1\nruntime = 1\n', 3, "must lie in (0, 1]"),
    ('[pools.p]\nsize = [[0, 5], ["1h"]]\n[bags.b]\njobs = 1\nruntime = 1\n', 2, "each step is [time, size]"),
    ('[bags.b]\njobs = 1\nruntime = 1\n', None, "no pool"),
    ('[pools.p]\nsize = 5\n[bags.b]\njobs = 1\nruntime = "10 minutes"\n', 5, "not a duration"),
    ('[pools.p]\nsize = 5\n[bags.b]\njobs = 1\nruntime = { trace = "blast" }\n', 5, "blastall (2,200)"),
    # each host is simulated: a pool of 10^12 ran out of memory with a traceback
    ('[pools.p]\nsize = 1000000000000\n[bags.b]\njobs = 1\nruntime = 1\n', 2, "over the simulator's 2,000,000"),
    ('[pools.p]\nsize = 5\nhosts = 3000000\n[bags.b]\njobs = 1\nruntime = 1\n', 3, "simulate a sample"),
    ('[pools.p]\nsize = 1500000\n[pools.q]\nsize = 1500000\n[bags.b]\njobs = 1\nruntime = 1\n', 1,
     "3,000,000 hosts together"),
    ('[pools.p]\nkind = "cluster"\ncluster_cpus = 4\nsize = 4\n[[pools.p.external]]\nruntime = 1\n'
     'count = 100000000000\n[bags.b]\njobs = 1\nruntime = 1\n', 7, "at most 2,000,000"),
    ('[pools.p]\nkind = "cluster"\ncluster_cpus = 4\nsize = 4\n[[pools.p.external]]\nruntime = 1\ncount = 1500000\n'
     '[[pools.p.external]]\nruntime = 1\ncount = 1500000\n[bags.b]\njobs = 1\nruntime = 1\n', 1,
     "3,000,000 jobs together"),
    # the line of the table of an array of tables at fault, not the first one's (nor line 1)
    ('[pools.p]\nkind = "cluster"\ncluster_cpus = 4\nsize = 4\n[[pools.p.external]]\nruntime = 1\n'
     '[[pools.p.external]]\nruntime = 1\ncpus = 9\n[bags.b]\njobs = 1\nruntime = 1\n', 9, "never fits"),
    ('[pools.p]\nkind = "cluster"\ncluster_cpus = 4\nsize = 4\n[[pools.p.external]]\nruntime = 1\n'
     '[[pools.p.external]]\ncpus = 2\n[bags.b]\njobs = 1\nruntime = 1\n', 7, "has no runtime"),
])
def test_each_mistake_is_named_with_its_line(text, line, words):
    with pytest.raises(SpecError) as e:
        parse_scenario(text, "bad.toml")
    problem = next(p for p in e.value.problems if words in p.message or words in p.hint)
    assert problem.line == line, e.value.problems


def test_every_problem_is_reported_at_once():
    text = '[pools.p]\nkind = "grd"\nsize = -1\n[bags.b]\njobs = "many"\nruntime = { dist = "x" }\n'
    with pytest.raises(SpecError) as e:
        parse_scenario(text, "bad.toml")
    assert len(e.value.problems) >= 4


def test_toml_syntax_errors_are_reported_not_raised_raw():
    with pytest.raises(SpecError, match="TOML syntax error"):
        parse_scenario("[pools.p\nsize = 5", "bad.toml")


def test_a_pool_size_replayed_from_a_trace_file(tmp_path):
    (tmp_path / "sizes.csv").write_text("time,size\n0,5\n3600,50\n7200,20\n")
    text = '[pools.p]\nsize = { trace = "sizes.csv" }\n[bags.b]\njobs = 1\nruntime = 1\n'
    sc = parse_scenario(text, str(tmp_path / "s.toml"))
    assert [(s.at, s.size) for s in sc.pools[0].size] == [(0, 5), (3600, 50), (7200, 20)]
    assert sc.pools[0].hosts == 50
    (tmp_path / "sizes.csv").write_text("time,size\n0,5\n3600,many\n")
    with pytest.raises(SpecError, match=r"sizes.csv:3: expected 'time,size'"):
        parse_scenario(text, str(tmp_path / "s.toml"))


def test_bags_from_an_swf_log_arrive_when_its_jobs_were_submitted():
    text = ('[pools.p]\nsize = 10\n[swf_bags.nasa]\nswf = "NASA-iPSC"\nskip = 1\ncount = 5\ntime_scale = 0.5\n'
            'max_jobs = 64\n')
    sc = parse_scenario(text, "s.toml")
    assert len(sc.bags) == 5
    assert sc.bags[0].name == "nasa-2" and sc.bags[0].arrival == 0
    assert [b.arrival for b in sc.bags] == sorted(b.arrival for b in sc.bags)
    assert all(1 <= b.jobs <= 64 for b in sc.bags) and all(b.runtime.mean > 0 for b in sc.bags)
    with pytest.raises(SpecError, match=r"no SWF log 'nope\.swf': not one shipped .* nor a file in the scenario's"):
        parse_scenario('[pools.p]\nsize = 10\n[swf_bags.x]\nswf = "nope.swf"\n', "s.toml")


def test_preemption_is_a_rate_or_a_lifetime_distribution():
    """Issue 14: a number keeps its meaning (pilots killed per hour of life: exponential lifetimes); a table
    is the distribution of a pilot's life, such as the decreasing hazard of a Condor pool's machines."""
    import math

    base = '[pools.p]\nsize = 5\npreemption = {}\n[bags.b]\njobs = 1\nruntime = 1\n'
    rate = parse_scenario(base.format("0.5"), "s.toml").pools[0].preemption
    assert rate is not None and rate.mean == 7200
    assert parse_scenario(base.format("0"), "s.toml").pools[0].preemption is None
    weibull = parse_scenario(base.format('{ dist = "weibull", shape = 0.5, scale = "90h" }'), "s.toml")
    assert weibull.pools[0].preemption.mean == 90 * 3600 * math.gamma(3)
    condor = parse_scenario(base.format('{ fta = "nd07cpu" }'), "s.toml").pools[0].preemption
    assert condor is not None and "nd07cpu" in condor.describe
    for bad, words in (('"30m"', "must be a rate"), ("-0.1", "must be a rate"),
                       ('{ dist = "weibull", shape = 0 , scale = "1h" }', "shape must be more than zero"),
                       ('{ dist = "constant", value = 0 }', "is a life of 0: every pilot")):
        with pytest.raises(SpecError, match=words):
            parse_scenario(base.format(bad), "s.toml")


@pytest.mark.parametrize("life", ["0", '{ dist = "constant", value = 0 }', '{ dist = "empirical", values = [0, 0] }'])
def test_an_availability_of_zero_is_refused_not_simulated_to_the_horizon(life):
    """The audit of 2026-11-29: every pilot ended the moment it started, and the simulation ran to its horizon
    saying that no worker was connected."""
    with pytest.raises(SpecError, match=r"is a life of .*would end the moment it started"):
        parse_scenario(f'[pools.p]\nsize = 5\navailability = {life}\n[bags.b]\njobs = 1\nruntime = 1\n', "s.toml")
    half_normal = '{ dist = "normal", mean = 0, sd = "10h" }'  # (review: its draws, clipped at 0, live ~8 h)
    sc = parse_scenario(f'[pools.p]\nsize = 5\navailability = {half_normal}\n[bags.b]\njobs = 1\nruntime = 1\n',
                        "s.toml")
    assert sc.pools[0].availability is not None


# job submit wait run procs cpu mem req-procs req-time req-mem status user group exe queue partition prec think
LOG = """; a small SWF log
1     0 0  600 1 -1 -1 1 -1 -1 1 7 1 1 1 1 -1 -1
2    30 0  600 1 -1 -1 1 -1 -1 1 7 1 1 1 1 -1 -1
3    60 0  120 1 -1 -1 1 -1 -1 0 7 1 1 1 1 -1 -1
4    90 0   50 1 -1 -1 1 -1 -1 5 7 1 1 1 1 -1 -1
5   100 0  900 2 -1 -1 2 -1 -1 1 9 1 1 2 2 -1 -1
6  4000 0  300 1 -1 -1 1 -1 -1 1 7 1 1 1 1 -1 -1
7  4010 0  300 1 -1 -1 1 -1 -1 1 7 1 1 1 1 -1 -1
8  4020 0 1800 1 1 1024 1 -1 -1 1 11 1 1 -1 1 -1 -1 {1241} q_2h 1:ppn=1
"""


def swf_scenario(tmp_path, keys: str) -> list:
    (tmp_path / "log.swf").write_text(LOG)
    text = f'[pools.p]\nsize = 10\n[swf_bags.log]\nswf = "log.swf"\n{keys}\n'
    return parse_scenario(text, str(tmp_path / "s.toml")).bags


def test_swf_replay_leaves_out_killed_jobs_and_filters_by_user_queue_and_partition(tmp_path):
    """Issue 14: a failed (0) or cancelled (5) job's run time was cut short; it is not a run time."""
    assert [b.name for b in swf_scenario(tmp_path, "")] == ["log-1", "log-2", "log-5", "log-6", "log-7", "log-8"]
    assert len(swf_scenario(tmp_path, "status = [1, 0, 5]")) == 8
    assert [b.name for b in swf_scenario(tmp_path, "user = 7")] == ["log-1", "log-2", "log-6", "log-7"]
    assert [b.name for b in swf_scenario(tmp_path, "queue = [2]")] == ["log-5"]
    assert [b.name for b in swf_scenario(tmp_path, 'queue = "q_2h"')] == ["log-8"]  # Alea's queue names
    assert [b.name for b in swf_scenario(tmp_path, "partition = 2")] == ["log-5"]
    text = f'[pools.p]\nsize = 1\n[bags.b]\njobs = 1\nruntime = {{ swf = "{tmp_path / "log.swf"}", FILTER }}\n'
    assert parse_scenario(text.replace("FILTER", "user = 9"), "s.toml").bags[0].runtime.mean == 900
    assert parse_scenario(text.replace("FILTER", "status = 5"), "s.toml").bags[0].runtime.mean == 50
    with pytest.raises(SpecError, match="user must be a whole number"):
        swf_scenario(tmp_path, 'user = "alice"')
    with pytest.raises(SpecError, match=r"no job with a positive run time.*filter"):
        swf_scenario(tmp_path, "user = 3")


def test_a_users_burst_of_jobs_is_replayed_as_one_bag(tmp_path):
    """Issue 14: a user sends a bag of tasks to a batch queue as a burst of jobs, not one bag per line."""
    first, second = swf_scenario(tmp_path, 'user = 7\nburst = "10m"')
    assert (first.name, first.jobs, first.runtimes, first.arrival) == ("log-1", 2, (600.0, 600.0), 0)
    assert (second.name, second.jobs, second.runtimes, second.arrival) == ("log-6", 2, (300.0, 300.0), 4000)
    everyone = swf_scenario(tmp_path, 'burst = "10m"')
    assert [(b.name, b.jobs) for b in everyone] == [("log-1", 2), ("log-5", 2), ("log-6", 2), ("log-8", 1)]
    assert [b.name for b in swf_scenario(tmp_path, 'burst = "10m"\nskip = 1\ncount = 2')] == ["log-5", "log-6"]


def test_mistakes_that_ran_without_a_word_are_refused():
    """Issue 14: a Deadline that is not a positive number fell back to instance_deadline silently, and a
    negative spread was drawn as a positive one."""
    base = '[pools.p]\nsize = 5\n{pool}[bags.b]\njobs = 1\nruntime = {runtime}\n{policy}'
    for pool, runtime, policy, line, words in (
        ("", "1", '[bags.b.policy]\nDeadline = "-5"\n', 7, "Deadline = '-5': is -5 on every host"),
        ("", "1", '[bags.b.policy]\nDeadline = "0"\n', 7, "above 0"),
        ("", "1", '[bags.b.policy]\nDeadline = "undefined"\n', 7, "is UNDEFINED on every host"),
        ("", '{ dist = "lognormal", mu = 5, sigma = -1 }', "", 5, "sigma is a spread and cannot be negative"),
        ('speed = { dist = "normal", mean = 1, sd = -0.2 }\n', "1", "", 3, "sd is a spread and cannot be negative"),
        # found by the bad-input hunt: these ran into the ClassAd library's 64-bit integers mid-run, a traceback
        ("cpus = 99999999999999999999999\n", "1", "", 3, "at most 65,536"),
        ("level = 99999999999999999999999\n", "1", "", 3, "at most 9,007,199,254,740,992"),
        ("prefetch = 99999999999999999999999\n", "1", "", 3, "at most 9,007,199,254,740,992"),
        ("[pools.p.attributes]\nBig = 99999999999999999999999\n", "1", "", 3, "beyond what a ClassAd integer holds"),
    ):
        with pytest.raises(SpecError) as e:
            parse_scenario(base.format(pool=pool, runtime=runtime, policy=policy), "bad.toml")
        problem = next(p for p in e.value.problems if words in p.message)
        assert problem.line == line, e.value.problems
    good = parse_scenario(base.format(pool="", runtime="1", policy='[bags.b.policy]\nDeadline = "Host.Slots * 60"\n'),
                          "good.toml")
    assert good.bags[0].policy == {"Deadline": "Host.Slots * 60"}


def test_replaying_jobs_longer_than_their_deadlines_allow_warns(tmp_path):
    """Issue 14: with the defaults (3 failures, 1-day deadline), every job of a log running over 3 days was
    declared lost three times and failed for good, without a word."""
    (tmp_path / "long.swf").write_text("1 0 0 360000 1 -1 -1 1 -1 -1 1 7 1 1 1 1 -1 -1\n"
                                       "2 9 0 3600 1 -1 -1 1 -1 -1 1 7 1 1 1 1 -1 -1\n")
    text = '[pools.p]\nsize = 10\n[swf_bags.log]\nswf = "long.swf"\n'
    sc = parse_scenario(text, str(tmp_path / "s.toml"))
    (warning,) = sc.warnings
    assert "1 of the 2 jobs replayed run longer than max_failures x instance_deadline (3 x 1 d)" in warning.message
    assert warning.line == 3 and 'instance_deadline = "5d"' in warning.hint
    assert parse_scenario(text + 'instance_deadline = "5d"\n', str(tmp_path / "s.toml")).warnings == []


def test_a_simulated_bag_names_its_strategies_as_a_spec_does():
    base = '[pools.p]\nsize = 1\n[bags.b]\njobs = 2\nruntime = "1m"\n{strategy}'
    table = '[bags.b.strategy]\ntail = "gridbot"\nplacement = "gridbot"\n'
    good = parse_scenario(base.format(strategy=table), "s.toml")
    assert (good.bags[0].strategy.tail, good.bags[0].strategy.placement) == ("gridbot", "gridbot")
    with pytest.raises(SpecError, match="unknown tail strategy 'expert-x'"):
        parse_scenario(base.format(strategy='[bags.b.strategy]\ntail = "expert-x"\n'), "bad.toml")
    with pytest.raises(SpecError, match="strategy placement must be the name of a strategy"):
        parse_scenario(base.format(strategy='[bags.b.strategy]\nplacement = 3\n'), "bad.toml")


def test_a_failure_spread_is_a_positive_gamma_shape():
    """`failure_spread` is the shape of each machine's factor on the pool's rates; anything else is named."""
    base = '[pools.p]\nsize = 5\nfailure_rate = 0.1\nfailure_spread = {}\n[bags.b]\njobs = 1\nruntime = 1\n'
    assert parse_scenario(base.format("0.75"), "s.toml").pools[0].failure_spread == 0.75
    assert parse_scenario(base.replace("failure_spread = {}\n", ""), "s.toml").pools[0].failure_spread == 0.0
    for bad in ("0", "-1", '"wide"', "true", "inf"):
        with pytest.raises(SpecError, match=r"failure_spread: must be a positive number.*0\.75") as e:
            parse_scenario(base.format(bad), "s.toml")
        assert e.value.problems[0].line == 4
