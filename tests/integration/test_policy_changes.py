"""Issue 13: a policy changed on a running bag steers the next decisions, for every policy the spec allows
(JobRequirements, Rank, Concurrency, Deadline, ReplicationRequirements, GridPolicy), on a real server with
a SQLite store and real workers; and a Rank that depends on the host (the paper's motivating case).

Each test notes the time just before it asks for the change and just after the server answered: what was
sent before the first followed the old policy, what was sent after the second follows the new one
(`sent_at` is the server's clock, on this machine)."""

import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import pytest

from gridbot.client import Client
from gridbot.model.spec import BagSpec, parse_spec
from tests.integration.harness import Cluster


@dataclass(frozen=True, order=True)
class Send:
    """One instance as the server recorded it: when it was sent, of which bag and job, to which host."""

    sent_at: float
    ended_at: float
    bag: str
    index: int
    host: str
    """The worker's --name (the slot part of the host's name)."""
    pool: str


def spec(name: str, jobs: int, command: str, extra: str = "", **policy: str) -> BagSpec:
    """A bag of `jobs` jobs (parameter i from 0) running `command`, with these policies."""
    text = f"command = '{command}'\n{extra}[parameters]\ni = {{ from = 0, to = {jobs - 1} }}\n"
    return msgspec.structs.replace(parse_spec(text, name, name), policy=policy)


def until(what: str, cond: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


def change(c: Client, bag: str, name: str, text: str) -> tuple[float, float]:
    """Change one policy of a running bag; (just before, just after) on the server's clock."""
    asked = time.time()
    c.set_policy(bag, name, text)
    return asked, time.time()


def sends(c: Client, *bags: str) -> list[Send]:
    """Every instance of the bags, in the order they were sent."""
    hosts = {h.host_id: h for h in c.hosts()}
    out = []
    for bag in bags:
        for job in c.jobs(bag, limit=10_000):
            for i in c.instances(bag, job.job_id):
                h = hosts[i.host_id]
                out.append(Send(i.sent_at, i.ended_at or float("inf"), bag, job.index, h.name.rsplit("/", 1)[-1],
                                h.pool))
    return sorted(out)


def held_at(sent: list[Send], s: Send) -> int:
    """Instances its host held when `s` was sent, `s` included (one ended in the same exchange is not)."""
    return sum(1 for o in sent if o.host == s.host and o.sent_at <= s.sent_at < o.ended_at)


@pytest.fixture
def cluster(tmp_path):
    cluster = Cluster(tmp_path)
    cluster.start_server()
    yield cluster
    cluster.stop()


def pools_cluster(tmp_path, pools: str, *server_args: str) -> Cluster:
    (tmp_path / "pools.toml").write_text(pools)
    cluster = Cluster(tmp_path, server_args=("--pools", str(tmp_path / "pools.toml"),
                                             "--state-dir", str(tmp_path / "state"), *server_args))
    cluster.start_server()
    return cluster


LOCAL_POOLS = """\
[pools.a]
kind = "local"
max_running = 2
idle_timeout = 2
min_cpu = 0
allow_root = true          # the tests run as root

[pools.b]
kind = "local"
max_running = 1
cpus = 4
idle_timeout = 2
min_cpu = 0
allow_root = true
"""


def test_grid_policy_changed_on_a_running_bag_moves_its_jobs_and_pilots_to_the_pools_it_now_accepts(tmp_path):
    """The issue's case: the pool GridPolicy now excludes gets no new instance of the bag, and the overlay
    submits pilots to the pool it now accepts (a GridPolicy answer cached per pool would keep both as they
    were: the first import's Dispatcher.set_policy kept `pool_ok`; 71e4e86 clears it, untested until now).
    Pool b's pilot has 4 slots so the rest of the bag is quick."""
    cluster = pools_cluster(tmp_path, LOCAL_POOLS)
    try:
        with cluster.client() as c:
            c.submit(spec("g", 24, "sleep 0.3", GridPolicy='Pool.Name == "a"'))
            until("pool a's pilots ran 2 jobs", lambda: c.bag("g").counts.done >= 2)
            before = {p.name: p.pilots_submitted for p in c.pools()}
            asked, changed = change(c, "g", "GridPolicy", 'Pool.Name == "b"')
            assert c.wait("g", poll=0.1, timeout=60).state == "completed"
            after = {p.name: p.pilots_submitted for p in c.pools()}
            sent = sends(c, "g")
    finally:
        cluster.stop()
    assert before == {"a": 2, "b": 0}, "the old policy: pilots for pool a only"
    assert after["a"] == 2 and after["b"] >= 1, f"the new policy: pilots for pool b, none more for a: {after}"
    assert {s.pool for s in sent if s.sent_at < asked} == {"a"}
    late = [s for s in sent if s.sent_at > changed]
    assert late and {s.pool for s in late} == {"b"}, "no instance went to pool a's hosts after the change"


def test_job_requirements_changed_on_a_running_bag_keeps_new_instances_off_a_host(cluster):
    with cluster.client() as c:
        c.submit(spec("j", 14, "sleep 0.2", Concurrency="1"))
        cluster.start_worker("--slots", "1", name="keep")
        cluster.start_worker("--slots", "1", name="drop")
        until("both hosts ran a job", lambda: sum(1 for h in c.hosts() if h.done) == 2)
        asked, changed = change(c, "j", "JobRequirements", '!regexp("/drop$", Host.Name)')
        assert c.wait("j", poll=0.1, timeout=60).state == "completed"
        sent = sends(c, "j")
    assert {s.host for s in sent if s.sent_at < asked} == {"keep", "drop"}
    late = [s for s in sent if s.sent_at > changed]
    assert late and {s.host for s in late} == {"keep"}


def test_rank_changed_on_a_running_bag_reorders_it_before_another(cluster):
    """y is ranked below x, then above it: the host serves x first, then every job of y, then the rest of x."""
    with cluster.client() as c:
        c.submit(spec("x", 10, "sleep 0.1", Rank="2"))
        c.submit(spec("y", 10, "sleep 0.1", Rank="1"))
        cluster.start_worker("--slots", "1")
        until("x ran 2 jobs", lambda: c.bag("x").counts.done >= 2)
        asked, changed = change(c, "y", "Rank", "3")
        for bag in ("x", "y"):
            assert c.wait(bag, poll=0.1, timeout=60).state == "completed"
        sent = sends(c, "x", "y")
    assert {s.bag for s in sent if s.sent_at < asked} == {"x"}
    late = [s.bag for s in sent if s.sent_at > changed]
    assert late[0] == "y" and late == sorted(late, key=lambda bag: bag != "y"), late


def test_concurrency_changed_on_a_running_bag_changes_how_many_instances_a_host_holds(cluster):
    """A worker with 4 slots holds one instance at a time under Concurrency 1, then four under 4."""
    with cluster.client() as c:
        c.submit(spec("k", 32, "sleep 0.3", Concurrency="1"))
        cluster.start_worker("--slots", "4")
        until("3 jobs done", lambda: c.bag("k").counts.done >= 3)
        asked, changed = change(c, "k", "Concurrency", "4")
        assert c.wait("k", poll=0.1, timeout=60).state == "completed"
        sent = sends(c, "k")
    assert max(held_at(sent, s) for s in sent if s.sent_at < asked) == 1
    assert max(held_at(sent, s) for s in sent if s.sent_at > changed) == 4


def test_deadline_changed_on_a_running_bag_applies_to_the_instances_sent_after(cluster):
    """Job 0 (3 s) goes out under Deadline 60 and keeps it; job 1 (10 s) goes out after Deadline became 1,
    is counted as lost a second later, and with max_failures = 1 fails for good: the bag ends in seconds."""
    with cluster.client() as c:
        c.submit(spec("d", 2, "sleep $(( 3 + {i} * 7 ))", "max_failures = 1\n", Deadline="60", Concurrency="1"))
        cluster.start_worker("--slots", "1")
        until("job 0 running", lambda: c.bag("d").counts.running == 1)
        change(c, "d", "Deadline", "1")
        info = c.wait("d", poll=0.1, timeout=9)
        jobs = {j.index: j for j in c.jobs("d")}
    assert info.state == "failed" and info.counts.overdue == 1
    assert jobs[0].state == "done", "an instance keeps the deadline it was sent with"
    assert jobs[1].state == "failed" and "instance deadline passed" in (jobs[1].reason or "")


def _straggler(tmp_path, name: str, replication: str) -> BagSpec:
    """4 jobs of 0.2 s, except job 0, which takes 30 s on its first try (a straggling host)."""
    marker = tmp_path / f"{name}.first"
    command = f"if [ {{i}} = 0 ] && mkdir {marker} 2>/dev/null; then sleep 30; else sleep 0.2; fi"
    return spec(name, 4, command, ReplicationRequirements=replication, Concurrency="1")


def test_replication_turned_on_for_a_running_bag_copies_its_straggler(cluster, tmp_path):
    with cluster.client() as c:
        c.submit(_straggler(tmp_path, "on", "false"))
        cluster.start_worker("--slots", "1", name="w0")
        cluster.start_worker("--slots", "1", name="w1")
        until("the straggler alone left", lambda: c.bag("on").counts.done == 3)
        time.sleep(1.5)  # a tick or more: none replicates under "false"
        assert c.bag("on").counts.replicas == 0
        _, changed = change(c, "on", "ReplicationRequirements", "NumberOfReplicas < 2")
        info = c.wait("on", poll=0.1, timeout=20)
        took = time.time() - changed
    assert info.state == "completed" and info.counts.replicas == 1
    assert took < 10, "the replica finished the bag, not the straggler's 30 s"


def test_replication_turned_off_for_a_running_bag_sends_no_replica_it_had_chosen(cluster):
    """Both jobs run, one per host (Concurrency 1), so the replicas chosen at the next tick wait for a host.
    Replication is then turned off: when job 0 ends (3 s), its host must not get a copy of job 1 (6 s). The
    workers wait for the bag, so both jobs start together."""
    with cluster.client() as c:
        cluster.start_worker("--slots", "1", name="w0")
        cluster.start_worker("--slots", "1", name="w1")
        until("both workers registered", lambda: len(c.hosts()) == 2)
        c.submit(spec("off", 2, "sleep $(( 3 + {i} * 3 ))", ReplicationRequirements="NumberOfReplicas < 2",
                      Concurrency="1"))
        until("both jobs running", lambda: c.bag("off").counts.running == 2)
        time.sleep(1.3)  # a tick chooses replicas of both; neither host may take one yet
        change(c, "off", "ReplicationRequirements", "false")
        info = c.wait("off", poll=0.1, timeout=20)
    assert info.state == "completed"
    assert info.counts.replicas == 0, "a replica chosen under the old policy was sent after it was turned off"


STATIC_POOLS = """\
[pools.technion]
kind = "static"

[pools.grid]
kind = "static"
"""


def test_a_rank_that_depends_on_the_host_puts_the_owners_bag_first_on_the_owners_cluster(tmp_path):
    """The paper's motivating case: bag home is ranked higher on its owner's cluster (pool technion) than bag
    away is, and lower elsewhere; technion's host serves home first while the grid's host serves away first."""
    cluster = pools_cluster(tmp_path, STATIC_POOLS)
    try:
        with cluster.client() as c:
            c.submit(spec("home", 10, "sleep 0.2", Rank='Host.Pool == "technion" ? 10 : 0'))
            c.submit(spec("away", 10, "sleep 0.2", Rank="5"))
            cluster.start_worker("--slots", "1", "--pool", "technion", name="t")
            cluster.start_worker("--slots", "1", "--pool", "grid", name="g")
            for bag in ("home", "away"):
                assert c.wait(bag, poll=0.1, timeout=60).state == "completed"
            sent = sends(c, "home", "away")
    finally:
        cluster.stop()
    for host, first in (("t", "home"), ("g", "away")):
        order = [s.bag for s in sent if s.host == host]
        assert order[0] == first and order == sorted(order, key=lambda b: b != first), (host, order)


REFUSING_POOL = """\
[pools.a]
kind = "local"
max_running = 2
idle_timeout = 300
min_cpu = 0
allow_root = true
"""


def test_a_pool_whose_pilots_the_bag_refuses_is_held_back_until_its_policy_is_fixed(tmp_path):
    """A bag whose JobRequirements no machine of the pool meets: each pilot leaves at once, refused, and without a
    hold the overlay would start two more every few seconds for as long as the bag waits (on a cloud, each billed).
    After --refused-pilots of them the pool is held back for the bag, `gridbot status` says so and why, and the
    owner's fix of the policy sends pilots again at once."""
    cluster = pools_cluster(tmp_path, REFUSING_POOL, "--refused-pilots", "3", "--refused-backoff", "600")
    try:
        with cluster.client() as c:
            c.submit(spec("big", 4, "true", JobRequirements="Host.Memory > 100000000"))
            until("the pool is held back", lambda: any("pool a:" in d for d in c.bag("big").diagnostics), 60)
            held = {p.name: p.pilots_submitted for p in c.pools()}["a"]
            said = [d for d in c.bag("big").diagnostics if "pool a:" in d]
            time.sleep(10)
            later = {p.name: p.pilots_submitted for p in c.pools()}["a"]
            change(c, "big", "JobRequirements", "true")
            assert c.wait("big", poll=0.1, timeout=60).counts.done == 4, "the fixed bag runs on the pool's new pilots"
    finally:
        cluster.stop()
    assert 3 <= held <= 5, f"{held} pilots: the 3 refused and at most the 2 already on their way"
    assert later == held, f"none more in 10 s while held back: {held} then {later}"
    assert "left refused by this bag" in said[0] and "Host.Memory > 100000000" in said[0] \
        and "next pilot for this bag in" in said[0], said
