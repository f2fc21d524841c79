"""The overlay on a real Slurm (two partitions as two pools) and this machine's local pool."""

import contextlib
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.harness import Cluster, gridbot, gridbot_json

POOLS = """\
[pools.local]
kind = "local"
max_running = 1
max_queued = 0
idle_timeout = 3
allow_root = true          # the tests run as root

[pools.fast]
kind = "slurm"
partition = "fast"
max_running = 2
max_queued = 2
walltime = "30m"
idle_timeout = 3
allow_root = true          # the tests run as root

[pools.big]
kind = "slurm"
partition = "big"
max_running = 2
max_queued = 2
walltime = 0               # no --time of ours: the partition's default limit
idle_timeout = 3
allow_root = true          # the tests run as root
"""


def write(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


def start(tmp_path, pools=POOLS, cancel_pilots=True):
    pools_file = write(tmp_path, "pools.toml", pools)
    cluster = Cluster(tmp_path, server_args=("--pools", pools_file, "--state-dir", str(tmp_path / "state"),
                                             "--heartbeat", "2"))
    cluster.cancel_pilots = cancel_pilots
    cluster.start_server()
    return cluster


def pools_of_done_jobs(cluster, bag):
    with cluster.client() as c:
        host_pool = {h.host_id: h.pool for h in c.hosts()}
        return {host_pool[r.host_id] for r in c.results(bag) if r.job.state == "done"}


def wait_pilots_gone(cluster, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with cluster.client() as c:
            pools = c.pools()
        if all(p.pilots_queued == 0 and p.pilots_running == 0 for p in pools):
            return pools
        time.sleep(1)
    raise AssertionError(f"pilots still alive: {pools}")


def test_a_bag_runs_on_local_and_both_partitions_and_a_grid_policy_keeps_one_out(tmp_path, slurm):
    cluster = start(tmp_path)
    try:
        url = ["--server", cluster.url]
        time.sleep(4)
        with cluster.client() as c:
            assert sum(p.pilots_submitted for p in c.pools()) == 0, "no demand, no pilots"
        big = write(tmp_path, "all.toml", 'name = "all"\ncommand = "sleep 0.2"\n'
                                          '[parameters]\ni = { from = 1, to = 300 }\n')
        only = write(tmp_path, "notbig.toml", 'name = "notbig"\ncommand = "sleep 0.2"\n'
                                              '[policy]\nGridPolicy = "Pool.Name != \\"big\\""\n'
                                              '[parameters]\ni = { from = 1, to = 40 }\n')
        gridbot_json("submit", big, *url)
        gridbot_json("submit", only, *url)
        assert cluster.wait_bag("all", timeout=240).counts.done == 300
        assert cluster.wait_bag("notbig", timeout=120).counts.done == 40
        assert pools_of_done_jobs(cluster, "all") == {"local", "fast", "big"}
        with cluster.client() as c:
            assert sum(p.throughput for p in c.pools()) > 0, "throughput is sampled by the overlay loop"
        assert "big" not in pools_of_done_jobs(cluster, "notbig")
        ended = wait_pilots_gone(cluster)
        submitted = sum(p.pilots_submitted for p in ended)
        time.sleep(8)
        with cluster.client() as c:
            assert sum(p.pilots_submitted for p in c.pools()) == submitted, "no pilots without demand"
        assert all(p.pilots_failed == 0 for p in ended), ended
        table = gridbot("pools", *url).stdout
        assert "fast" in table and "slurm" in table and "JOBS DONE" in table
    finally:
        cluster.stop()


@pytest.mark.slow
def test_slurm_controller_down_for_45_s_marks_no_pilot_failed(tmp_path, slurm):
    cluster = start(tmp_path, POOLS.replace("[pools.local]\nkind = \"local\"\nmax_running = 1",
                                            "[pools.local]\nkind = \"local\"\nmax_running = 0"))
    try:
        bag = write(tmp_path, "b.toml", 'name = "b"\ncommand = "sleep 0.5"\n[parameters]\ni = { from = 1, to = 200 }\n')
        gridbot_json("submit", bag, "--server", cluster.url)
        with cluster.client() as c:
            deadline = time.monotonic() + 60
            while c.bag("b").counts.done < 20 and time.monotonic() < deadline:
                time.sleep(0.5)
            slurm.controller("stop")
            try:
                time.sleep(45)
                during = c.bag("b").counts.done
            finally:
                slurm.controller("start")
        info = cluster.wait_bag("b", timeout=240)
        assert info.counts.done == 200 and during > 20, "pilots kept working while the controller was down"
        pools = wait_pilots_gone(cluster, 90)
        assert all(p.pilots_failed == 0 for p in pools), pools
    finally:
        cluster.stop()


STUCK = """\
[pools.fast]
kind = "slurm"
partition = "fast"
max_running = 1
max_queued = 1
walltime = "30m"
idle_timeout = 3
queue_patience = "8s"
allow_root = true          # the tests run as root

[pools.local]
kind = "local"
max_running = 1
max_queued = 0
idle_timeout = 3
allow_root = true          # the tests run as root
"""


def test_a_pilot_stuck_in_a_down_partition_stops_holding_the_bag_after_queue_patience(tmp_path, slurm):
    """A pilot pending in a partition that is down counted as the bag's capacity for as long as it pended, so
    the local pool, free, was never asked. With `queue_patience = "8s"` it is shown stale after 8 s, the
    local pool runs the bag, and the stuck pilot is cancelled once nothing needs it."""
    def partition(state):
        subprocess.run(["scontrol", "update", "PartitionName=fast", f"State={state}"], check=True, timeout=30)

    partition("DOWN")
    cluster = start(tmp_path, STUCK)
    try:
        # one job: the pools are alike but for their names, and the overlay fills `fast` first
        bag = write(tmp_path, "b.toml", 'name = "b"\ncommand = "true"\n[parameters]\ni = { from = 1, to = 1 }\n')
        gridbot_json("submit", bag, "--server", cluster.url)
        stale_seen = False
        with cluster.client() as c:
            deadline = time.monotonic() + 60
            while c.bag("b").state != "completed" and time.monotonic() < deadline:
                fast = next(p for p in c.pools() if p.name == "fast")
                stale_seen |= fast.pilots_stale == 1
                time.sleep(0.5)
        info = cluster.wait_bag("b", timeout=5)
        assert info.state == "completed" and pools_of_done_jobs(cluster, "b") == {"local"}
        assert stale_seen, "`gridbot pools` showed the pending pilot as stale"
        pools = {p.name: p for p in wait_pilots_gone(cluster, 60)}
        assert pools["fast"].pilots_submitted == 1, "one pilot to the down partition, not one every step"
        log = cluster.server.log
        assert "pool fast: cancelled 1 queued pilots (demand dropped; 1 queued past queue_patience)" in log, log
    finally:
        cluster.stop()
        partition("UP")


def test_pools_that_are_not_there_are_reported_and_the_others_work(tmp_path, slurm):
    pools = POOLS + ('\n[pools.ghost]\nkind = "slurm"\npartition = "nosuchpartition"\nmax_running = 2\n'
                     '\n[pools.nopbs]\nkind = "pbs"\npartition = "workq"\nmax_running = 2\n')
    cluster = start(tmp_path, pools)
    try:
        bag = write(tmp_path, "b.toml", 'name = "b"\ncommand = "sleep 0.1"\n[parameters]\ni = { from = 1, to = 60 }\n')
        gridbot_json("submit", bag, "--server", cluster.url)
        assert cluster.wait_bag("b", timeout=120).counts.done == 60
        with cluster.client() as c:
            pools = {p.name: p for p in c.pools()}
        assert pools["ghost"].pilots_running == 0 and "pool 'ghost'" in pools["ghost"].error
        assert "next try in" in pools["ghost"].error, "a failing pool is backed off, not retried in a loop"
        assert pools["nopbs"].pilots_running == 0 and "pool 'nopbs'" in pools["nopbs"].error
        assert pools["fast"].jobs_done + pools["big"].jobs_done + pools["local"].jobs_done == 60
        listing = gridbot("pools", "--server", cluster.url).stdout
        assert "pool ghost:" in listing and "pool nopbs:" in listing
    finally:
        cluster.stop()


def test_a_bad_pools_file_is_refused_at_start(tmp_path):
    path = write(tmp_path, "p.toml", '[pools.x]\nkind = "slurmm"\n')
    proc = gridbot("server", "--pools", path, "--port", "0", "--db", f"sqlite:///{tmp_path}/db.db")
    assert proc.returncode == 2 and "p.toml:2: pool 'x' has unknown kind 'slurmm'" in proc.stderr


def wait_pools(cluster, ok, what, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with cluster.client() as c:
            pools = {p.name: p for p in c.pools()}
        if ok(pools):
            return pools
        time.sleep(0.5)
    raise AssertionError(f"not {what} within {timeout} s: {pools}")


def stored_pilots(cluster, state):
    with contextlib.closing(sqlite3.connect(cluster.db.removeprefix("sqlite:///"))) as db:
        return [r[0] for r in db.execute("SELECT native_id FROM pilots WHERE state = ? ORDER BY id", (state,))]


def wait_stored(cluster, running, queued=None, timeout=20):
    """The pilots the store has running and queued, once there are `running` and `queued` (None: any) of them: the
    server shows a pilot's new state before its overlay step has written it, so the store may lag `wait_pools`."""
    deadline = time.monotonic() + timeout
    while True:
        got = stored_pilots(cluster, "running"), stored_pilots(cluster, "queued")
        if (len(got[0]) == running and queued in (None, len(got[1]))) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def squeue():
    out = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True, check=True).stdout
    return dict(line.split() for line in out.splitlines())


def alive(pid):
    """Whether process `pid` runs (a zombie, which nobody has waited for yet, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def restart(cluster, cancel_pilots):
    cluster.server.stop()
    assert "Traceback" not in cluster.server.log, cluster.server.log
    cluster.cancel_pilots = cancel_pilots
    cluster.start_server()


RESTART = """\
[pools.{name}]
kind = "{kind}"{partition}
cpus = {cpus}
max_running = 2
max_queued = 2
walltime = "30m"
idle_timeout = 20
min_cpu = 0
allow_root = true          # the tests run as root
"""
BAG = 'name = "b"\ncommand = "sleep 0.2"\n[parameters]\ni = {{ from = 1, to = {n} }}\n'


def test_slurm_pilots_outlive_a_clean_stop_and_a_restarted_server_counts_and_keeps_them(tmp_path, slurm):
    """Issue 13: pilots live in the store. A clean stop leaves the Slurm jobs where they are, running or
    pending; the next server takes them up (no pilot beyond max_running) and they serve it; with
    --cancel-pilots-on-exit they go. Two pilots of 3 CPUs do not fit the partition's 4 at once: one waits."""
    pools = RESTART.format(name="fast", kind="slurm", partition='\npartition = "fast"', cpus=3)
    cluster = start(tmp_path, pools, cancel_pilots=False)
    try:
        gridbot_json("submit", write(tmp_path, "b.toml", BAG.format(n=150)), "--server", cluster.url)
        wait_pools(cluster, lambda p: (p["fast"].pilots_running, p["fast"].pilots_queued) == (1, 1),
                   "one pilot running and one queued")
        (running,), (queued,) = wait_stored(cluster, 1, 1)
        restart(cluster, cancel_pilots=True)
        ours = {running, queued}  # other tests' jobs may be in the queue too
        assert {j: squeue().get(j) for j in ours} == {running: "RUNNING", queued: "PENDING"}, "none cancelled"
        with cluster.client() as c:
            done = c.bag("b").counts.done
        wait_pools(cluster, lambda p: p["fast"].pilots_running == 1, "the running pilot taken up", 20)
        time.sleep(4)  # more than one step of the overlay, which would submit here if it did not count them
        with cluster.client() as c:
            fast = next(p for p in c.pools() if p.name == "fast")
            assert (fast.pilots_running, fast.pilots_queued, fast.pilots_submitted) == (1, 1, 0), fast
            assert c.bag("b").counts.done > done, "the pilot taken up goes on serving"
        assert set(squeue()) & ours == ours
        assert cluster.wait_bag("b", timeout=120).counts.done == 150
        cluster.server.stop()
        deadline = time.monotonic() + 20
        while set(squeue()) & ours and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not set(squeue()) & ours, "--cancel-pilots-on-exit cancels them"
        assert (stored_pilots(cluster, "completed"), stored_pilots(cluster, "cancelled")) == ([running], [queued])
    finally:
        cluster.stop()


def test_local_pilots_outlive_a_clean_stop_and_a_restarted_server_counts_them(tmp_path):
    """Issue 13, the local pool: the workers run on after a clean stop, the next server finds them by pid."""
    cluster = start(tmp_path, RESTART.format(name="here", kind="local", partition="", cpus=1), cancel_pilots=False)
    try:
        gridbot_json("submit", write(tmp_path, "b.toml", BAG.format(n=60)), "--server", cluster.url)
        wait_pools(cluster, lambda p: p["here"].pilots_running == 2, "two pilots running")
        pids = [int(i.removeprefix("local-")) for i in wait_stored(cluster, 2)[0]]
        restart(cluster, cancel_pilots=True)
        assert len(pids) == 2 and all(alive(pid) for pid in pids), "a clean stop stops none"
        wait_pools(cluster, lambda p: p["here"].pilots_running == 2, "the two pilots taken up", 20)
        time.sleep(3)
        with cluster.client() as c:
            here = next(p for p in c.pools() if p.name == "here")
        assert (here.pilots_running, here.pilots_submitted) == (2, 0), here
        assert cluster.wait_bag("b", timeout=60).counts.done == 60
        cluster.server.stop()
        assert not [pid for pid in pids if alive(pid)], "--cancel-pilots-on-exit stops them"
    finally:
        cluster.stop()


def test_a_pool_whose_pilots_cannot_start_backs_off_and_says_why(tmp_path):
    """Found by the walkthrough of 2026-11-29: a local pool without run_as or allow_root, on a server run as
    root, had every pilot exit at once and was sent two more every 3 s, forever, with no error anywhere."""
    cluster = start(tmp_path, '[pools.here]\nkind = "local"\nmax_running = 2\nmax_queued = 0\n')
    try:
        gridbot_json("submit", write(tmp_path, "b.toml", BAG.format(n=5)), "--server", cluster.url)
        pools = wait_pools(cluster, lambda p: "pilots in a row ended without taking work" in p["here"].error,
                           "the pool's error", 30)
        error = pools["here"].error
        assert "--run-as" in error and "here-" in error, error  # the last line of the pilot's own log
        # the security review of 2026-11-29: its jobs would run as the server's user, who reads the admin key
        assert "warning: pool 'here' runs its jobs as this server's own user" in cluster.server.log
        submitted = pools["here"].pilots_submitted
        time.sleep(8)  # the overlay steps every 3 s; the pool's next pilot waits 15 s
        with cluster.client() as c:
            here = next(p for p in c.pools() if p.name == "here")
        assert here.pilots_submitted == submitted, (submitted, here)
        status = gridbot("status", "--server", cluster.url).stdout
        assert "pilots in a row ended without taking work" in " ".join(status.split()), status
    finally:
        cluster.stop()
