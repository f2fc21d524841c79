"""Issue 17 on real pools: a local pool on level 1 and a Slurm partition on level 2 of the execution hierarchy.

- a bag whose owner underestimated its complexity enters level 1, runs there, and moves to level 2 when its
  measured run times show it cannot end within level 1's limits: its results from level 1 stay, every job
  is done once, and its move is in `gridbot status`;
- a short bag submitted while that long bag runs on level 2 runs on level 1 at once: the long one does not
  delay it."""

from __future__ import annotations

import time

from tests.integration.harness import gridbot, gridbot_json
from tests.integration.test_overlay_slurm import start, wait_pilots_gone, write

HERE = """\
[pools.here]
kind = "local"
max_running = 1
idle_timeout = 5
min_cpu = 0
allow_root = true          # the tests run as root

"""
FAST = """\
[pools.fast]
kind = "slurm"
partition = "fast"
max_running = 2
max_queued = 2
walltime = "30m"
idle_timeout = 5
min_cpu = 0
allow_root = true

"""
TOP = """\
[queues.top]
level = 1
pools = ["here"]
queue_time_limit = "60s"
exec_time_limit = "30s"
max_cpus = 1
"""
BIG = """\
[queues.big]
level = 2
pools = ["fast"]
queue_time_limit = "30m"
exec_time_limit = "30m"
max_cpus = 2
"""
POOLS = HERE + FAST + TOP + "\n" + BIG
"""The two levels: the local pool under queue top, the Slurm partition under queue big."""


def test_an_underestimated_bag_moves_down_and_a_short_one_is_not_delayed(tmp_path, slurm):
    cluster = start(tmp_path, pools=POOLS)
    try:
        url = ["--server", cluster.url]
        levels = gridbot("levels", *url)
        assert "top" in levels.stdout and "big" in levels.stdout, levels.stdout
        # 10 jobs of 4 s, said to be 10 CPU-seconds: it fits level 1 (C_e = 30 s x 1 slot) until its first
        # three results measure 40 s of work left, which cannot end within Te there
        long = write(tmp_path, "long.toml", 'name = "long"\ncommand = "sleep 4"\n[strategy]\nplacement = "hierarchy"\n'
                                            'complexity = 10\n[parameters]\ni = { from = 1, to = 10 }\n')
        gridbot_json("submit", long, *url)
        deadline = time.monotonic() + 120
        moved = None
        while time.monotonic() < deadline:
            with cluster.client() as c:
                info = c.bag("long")
            if info.level is not None and info.level.queue == "big":
                moved = info
                break
            time.sleep(1)
        assert moved is not None, f"the long bag never moved to level 2: {info.level}"
        assert moved.level.migrations and moved.level.migrations[0][1:3] == ("top", "big")
        assert "potential overdue" in moved.level.migrations[0][3] or "overdue" in moved.level.migrations[0][3]
        done_before = moved.counts.done
        assert done_before >= 3, "its first results came from level 1"

        short = write(tmp_path, "short.toml", 'name = "short"\ncommand = "sleep 1"\n')
        submitted = time.monotonic()
        gridbot_json("submit", short, *url)
        quick = cluster.wait_bag("short", timeout=60)
        took = time.monotonic() - submitted
        with cluster.client() as c:
            still = c.bag("long")
        assert quick.state == "completed" and took < 20, took
        assert still.state == "active", "the short bag finished while the long one still ran on level 2"
        status = gridbot("status", *url).stdout
        assert "bag long: level 2, queue big" in status and "top -> big" in status, status

        done = cluster.wait_bag("long", timeout=180)
        assert done.state == "completed" and done.counts.done == 10
        with cluster.client() as c:
            host_pool = {h.host_id: h.pool for h in c.hosts()}
            results = c.results("long")
            short_pool = {host_pool[r.host_id] for r in c.results("short")}
        pools = [host_pool[r.host_id] for r in results if r.job.state == "done"]
        assert len(pools) == 10 and pools.count("here") >= done_before and "fast" in pools, pools
        assert short_pool == {"here"}

        # a bag with an estimator: it runs once on a worker (the companion bag big.estimate) while the bag waits
        # (up to all of level 1's Te here); its bound, 1000 CPU-s, is over level 1's C_e (30 s x 1 slot) and
        # within level 2's (30 min x 2), so the bag goes to level 2 without running on level 1
        big = write(tmp_path, "big.toml", 'name = "big"\ncommand = "sleep 1"\n[strategy]\nplacement = "hierarchy"\n'
                                          'estimator = "echo upper bound: 1000"\nestimate_share = 1.0\n'
                                          '[parameters]\ni = { from = 1, to = 3 }\n')
        gridbot_json("submit", big, *url)
        estimated = cluster.wait_bag("big", timeout=120)
        with cluster.client() as c:
            companion = c.bag("big.estimate")
            host_pool = {h.host_id: h.pool for h in c.hosts()}
            ran = {host_pool[r.host_id] for r in c.results("big")}
            estimator_ran = {host_pool[r.host_id] for r in c.results("big.estimate")}
        assert companion.state == "completed" and estimated.state == "completed" and ran == {"fast"}, ran
        assert estimator_ran == {"here"}, "the estimator ran on level 1, as a job"
        wait_pilots_gone(cluster)
    finally:
        cluster.stop()


LOCAL_QUEUE = HERE + TOP
"""Level 1 alone: the local pool under queue top."""


def test_a_bag_that_names_no_placement_may_give_the_hierarchys_options_to_a_server_with_queues(tmp_path):
    """Found by the second walkthrough of 2026-11-29: `[strategy] complexity = 10` (docs/hierarchy.md) was refused
    by `gridbot submit` itself, as an option of GridBot's placement, before any server could place the bag."""
    cluster = start(tmp_path, pools=LOCAL_QUEUE)
    try:
        spec = write(tmp_path, "c.toml", 'name = "c"\ncommand = "true"\n[strategy]\ncomplexity = 10\n'
                                         '[parameters]\ni = { from = 1, to = 3 }\n')
        gridbot_json("submit", spec, "--server", cluster.url)
        deadline, level = time.monotonic() + 20, None
        while level is None and time.monotonic() < deadline:  # a bag takes its level at the next tick
            with cluster.client() as c:
                level = c.bag("c").level
            time.sleep(0.3)
        assert level is not None and level.queue == "top" and level.complexity == 10.0, level
        assert cluster.wait_bag("c", timeout=60).counts.done == 3
        with cluster.client() as c:
            (top,) = c.levels()
        # (a queue's work is its bags' remaining work: none once its last bag is done, although the hierarchy
        # steps only while some bag of it runs)
        assert top.name == "top" and top.bags == [] and top.work == 0.0 and top.running == 0, top
    finally:
        cluster.stop()
    (tmp_path / "flat").mkdir()
    flat = start(tmp_path / "flat", pools='[pools.here]\nkind = "local"\nallow_root = true\n')
    try:
        proc = gridbot("submit", spec, "--server", flat.url)
        assert proc.returncode == 2 and "complexity" in proc.stderr and "hierarchy" in proc.stderr, proc.stderr
    finally:
        flat.stop()
