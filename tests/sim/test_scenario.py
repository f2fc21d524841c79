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
    with pytest.raises(SpecError, match=r"no trace file 'nope\.swf'"):
        parse_scenario('[pools.p]\nsize = 10\n[swf_bags.x]\nswf = "nope.swf"\n', "s.toml")
