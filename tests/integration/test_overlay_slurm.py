"""The overlay on a real Slurm (two partitions as two pools) and this machine's local pool."""

import time

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
walltime = "30m"
idle_timeout = 3
allow_root = true          # the tests run as root
"""


def write(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


def start(tmp_path, pools=POOLS):
    pools_file = write(tmp_path, "pools.toml", pools)
    cluster = Cluster(tmp_path, server_args=("--pools", pools_file, "--state-dir", str(tmp_path / "state"),
                                             "--heartbeat", "2"))
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
