"""The simulator's volunteer hosts speak BOINC's scheduler RPC (`sim.boinc`), answered by the BOINC door's own
arithmetic (`model.volunteer`): a work buffer asked for in seconds, results reported in batches, backoff after
empty answers, and queued jobs aborted at their deadline."""

from __future__ import annotations

import random

from gridbot.model.spec import SpecError
from gridbot.model.volunteer import instances_for, runtime_estimate, volunteer_prefetch
from gridbot.sim.boinc import DAY, BoincClient, ClientConfig
from gridbot.sim.engine import Simulation, simulate
from gridbot.sim.scenario import parse_scenario


def test_a_client_asks_for_its_buffer_in_seconds_and_the_server_turns_them_into_jobs():
    c = BoincClient(ClientConfig(), ncpus=4)
    assert c.needs_work(held_seconds=0, idle_cpus=4)
    seconds, idle = c.request(held_seconds=0, idle_cpus=4)
    assert seconds == 4 * 0.6 * DAY and idle == 4
    # full: 0.1 day per CPU held and no CPU idle, it asks for nothing
    assert c.request(held_seconds=4 * 0.1 * DAY, idle_cpus=0) == (0.0, 0)
    # the door: seconds over the runtime estimate, at least one per idle CPU, capped
    assert instances_for(seconds, 0.0, idle, 600.0, 1000) == 346
    assert instances_for(0.0, 0.0, 0, 600.0, 1000) == 0
    assert instances_for(1.0, 0.0, 3, 600.0, 1000) == 3
    assert runtime_estimate([0.0, 400.0, 800.0], 300.0) == 600.0 and runtime_estimate([], 300.0) == 300.0
    assert volunteer_prefetch(346, 4) == 16 and volunteer_prefetch(4, 4) == 0


def test_empty_answers_back_off_and_the_heartbeat_and_reports_still_bring_it_back():
    c = BoincClient(ClientConfig(report_immediately=False), ncpus=1)  # a stock BOINC server's results
    rng = random.Random(1)
    c.answered(0.0, asked=True, got=0, request_delay=10.0, next_rpc_delay=0.0, uniform=rng.uniform)
    first = c.fetch_after
    assert 300.0 <= first <= 600.0
    c.answered(first, asked=True, got=0, request_delay=10.0, next_rpc_delay=0.0, uniform=rng.uniform)
    assert c.backoff == 1200.0 and c.fetch_after - first >= 600.0
    for _ in range(20):
        c.answered(0.0, asked=True, got=0, request_delay=0.0, next_rpc_delay=0.0, uniform=rng.uniform)
    assert c.backoff == DAY
    assert c.next_rpc(0.0, 0.0, 1, None, None) == c.fetch_after  # for work: not before the backoff
    # a ready result goes out an hour after it was ready, or at once when its deadline is within a day
    assert c.next_rpc(100.0, 0.0, 1, 50.0, 10 * DAY) == 3650.0
    assert c.next_rpc(100.0, 0.0, 1, 50.0, 100.0 + DAY / 2) == 100.0
    door = BoincClient(ClientConfig(), ncpus=1)  # gridbot's door marks every result report_immediately
    assert door.next_rpc(100.0, DAY, 0, 50.0, 10 * DAY) == 100.0
    c.answered(200.0, asked=True, got=3, request_delay=30.0, next_rpc_delay=60.0, uniform=rng.uniform)
    assert c.backoff == 0.0 and c.next_rpc(200.0, 0.0, 1, None, None) == 230.0  # the request_delay
    assert c.next_rpc(200.0, DAY, 0, None, None) == 260.0  # full: its heartbeat


SCENARIO = """
[simulation]
seed = 3
horizon = "{horizon}"

[server]
host_timeout = "4d"

[pools.v]
kind = "community"
size = 10
hosts = 10
work_buffer_min = "{low}"
work_buffer_extra = "{extra}"
runtime_estimate = "10m"

[bags.b]
jobs = 200
runtime = "10m"
instance_deadline = "{deadline}"

[bags.b.policy]
ReplicationRequirements = "false"
"""


def _scenario(low: str = "0.1d", extra: str = "0.5d", deadline: str = "3d", horizon: str = "10d"):
    return parse_scenario(SCENARIO.format(low=low, extra=extra, deadline=deadline, horizon=horizon), "v.toml")


def test_a_volunteer_holds_a_batch_of_jobs_as_its_buffer_asks_and_none_without_one():
    for low, extra, queued in (("0.1d", "0.5d", 4), ("0s", "0s", 0)):
        sim = Simulation(_scenario(low, extra, horizon="1m"))
        sim.run()
        hosts = list(sim.pools["v"].pilots.values())
        assert len(hosts) == 10
        assert all(len(h.running) == 1 and len(h.waiting) == queued for h in hosts), (low, extra)


def test_a_job_not_started_by_its_deadline_is_aborted_by_the_client_and_runs_again():
    tight = simulate(_scenario(deadline="25m"))
    b = tight.bag("b")
    assert b.state == "completed" and b.done == 200
    assert b.instances > 200, "queued behind two others, a job misses its 25-minute deadline and is sent again"
    loose = simulate(_scenario()).bag("b")
    assert loose.state == "completed" and loose.instances == 200
    unbuffered = simulate(_scenario("0s", "0s", deadline="25m")).bag("b")
    assert unbuffered.instances == 200, "one job at a time: none waits past its deadline"


def test_community_pool_keys_are_checked():
    import pytest

    from gridbot.model.spec import SpecError

    with pytest.raises(SpecError, match="applies to community pools"):
        parse_scenario('[pools.g]\nkind = "grid"\nsize = 1\nwork_buffer_min = "1h"\n', "g.toml")
    with pytest.raises(SpecError, match="runtime_estimate"):
        parse_scenario('[pools.v]\nkind = "community"\nsize = 1\nruntime_estimate = "0s"\n', "v.toml")


HOST_TRACE = """
[simulation]
seed = 3
horizon = "5d"

[server]
host_timeout = "2d"

[pools.v]
kind = "community"
size = {{ hosts = "volunteers.csv" }}
work_buffer_min = "0s"
work_buffer_extra = "0s"
runtime_estimate = "50m"

[bags.b]
jobs = 3
runtime = "50m"
instance_deadline = "1d"

[bags.b.policy]
ReplicationRequirements = "false"
"""


def test_named_volunteers_come_back_as_themselves_and_the_server_hears_of_their_lost_jobs_then(tmp_path):
    # a runs a job from 0, takes the third at 50 min and leaves at 1 h with it; it is back at 2 h
    (tmp_path / "volunteers.csv").write_text("host,start,end\na,0,3600\nb,0,172800\na,7200,10800\na,10800,14400\n")
    sc = parse_scenario(HOST_TRACE.format(), str(tmp_path / "s.toml"))
    pool = sc.pools[0]
    assert pool.hosts == 2 and [(s.host, s.start, s.end) for s in pool.sessions] == [
        ("a", 0, 3600), ("b", 0, 172800), ("a", 7200, 14400)], "a's two sessions back to back are one"
    assert [(s.at, s.size) for s in pool.size] == [(0, 2), (3600, 1), (7200, 2), (14400, 1), (172800, 0)]
    sim = Simulation(sc)
    back = sim.run().bag("b")
    assert back.state == "completed" and back.done == 3
    assert back.makespan is not None and 7200 < back.makespan < 7200 + 3600, \
        "a came back at 2 h without the job it left with: the server ran it again then, not at its deadline"
    assert sorted(m.info.host_id for m in sim.pools["v"].machines) == ["v:a", "v:b"]
    # the same sessions, but the second comes from another volunteer: nobody tells the server the job is lost
    (tmp_path / "volunteers.csv").write_text("host,start,end\na,0,3600\nb,0,172800\nc,7200,14400\n")
    other = simulate(parse_scenario(HOST_TRACE.format(), str(tmp_path / "s.toml"))).bag("b")
    assert other.state == "completed" and other.makespan is not None and 86400 < other.makespan < 86400 + 7200, \
        "found lost only at its one-day deadline"


def test_named_volunteers_are_no_other_pools_hosts(tmp_path):
    """A trace's names may hold '-' (node-12, UUIDs): host x-0 of pool v is not host 0 of a pool named v-x."""
    (tmp_path / "volunteers.csv").write_text("host,start,end\nx-0,0,86400\n")
    text = HOST_TRACE.format().replace("jobs = 3\n", "jobs = 20\n") + (
        '\n[pools.v-x]\nkind = "community"\nsize = 1\nwork_buffer_min = "0s"\nwork_buffer_extra = "0s"\n')
    sim = Simulation(parse_scenario(text, str(tmp_path / "s.toml")))
    bag = sim.run().bag("b")
    assert bag.state == "completed" and bag.done == 20 and bag.instances == 20, "two hosts, each its own"
    assert [m.info.host_id for m in sim.pools["v"].machines] == ["v:x-0"]
    assert [m.info.host_id for m in sim.pools["v-x"].machines] == ["v-x-0"]


def test_a_host_trace_is_checked():
    def problems(csv: str, extra: str = "", kind: str = "community") -> str:
        import pathlib
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            (pathlib.Path(d) / "volunteers.csv").write_text(csv)
            text = HOST_TRACE.format().replace('kind = "community"', f'kind = "{kind}"').replace(
                "[pools.v]\n", f"[pools.v]\n{extra}")
            if kind != "community":
                text = "\n".join(ln for ln in text.splitlines() if not ln.startswith(("work_buffer", "runtime_est")))
            try:
                parse_scenario(text, f"{d}/s.toml")
            except SpecError as e:
                return str(e)
        return ""

    good = "host,start,end\na,0,3600\n"
    assert problems(good) == ""
    assert "volunteers.csv:3: host 'a' is online from 1800 s, but its session of line 2 lasts until 3600 s" in \
        problems(good + "a,1800,7200\n")
    assert "volunteers.csv:2: a session needs a host name and 0 <= start < end" in problems("host,start,end\na,5,5\n")
    assert "expected 'host,start,end'" in problems(good + "b,soon,7200\n")
    assert "a trace of named hosts online is for community pools" in problems(good, kind="grid")
    assert "so 'availability' has no say" in problems(good, extra='availability = "1h"\n')
    assert "so 'hosts' has no say" in problems(good, extra="hosts = 5\n")
