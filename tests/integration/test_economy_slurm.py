"""Issue 16 on a real Slurm: a free local pool with one slot and a priced Slurm partition. A bag whose deadline
the local pool alone cannot meet gets the rest of its jobs planned on the partition (DBC cost-time), pays
for them there, and stays within its budget; `gridbot cost` bills the partition's CPU-hours."""

from __future__ import annotations

import json

import pytest

from tests.integration.harness import gridbot
from tests.integration.test_overlay_slurm import start, wait_pilots_gone, write

POOLS = """\
[pools.local]
kind = "local"
max_running = 1
idle_timeout = 3
min_cpu = 0
allow_root = true          # the tests run as root

[pools.fast]
kind = "slurm"
partition = "fast"
max_running = 2
max_queued = 2
walltime = "30m"
idle_timeout = 3
min_cpu = 0
price_per_cpu_hour = 3600.0  # 1 a second of a slot
allow_root = true
"""


def test_a_deadline_the_free_pool_cannot_meet_buys_slots_on_a_priced_partition(tmp_path, slurm):
    cluster = start(tmp_path, pools=POOLS)
    try:
        url = ["--server", cluster.url]
        # 30 jobs of a second: about 36 s on the one free slot, so a 25 s deadline needs the partition
        bag = write(tmp_path, "dbc.toml", 'name = "dbc"\ncommand = "sleep 1"\nbag_deadline = "25s"\nbudget = 40\n'
                                          '[strategy]\nplacement = "cost-time"\nruntime = 1.2\n'
                                          '[parameters]\ni = { from = 1, to = 30 }\n')
        submitted = gridbot("submit", bag, *url)
        assert submitted.returncode == 0, submitted.stderr
        done = cluster.wait_bag("dbc", timeout=180)
        assert done.state == "completed" and done.counts.done == 30
        with cluster.client() as c:
            host_pool = {h.host_id: h.pool for h in c.hosts()}
            ran = {host_pool[r.host_id] for r in c.results("dbc") if r.job.state == "done"}
        assert ran == {"local", "fast"}, ran
        wait_pilots_gone(cluster)
        cost = json.loads(gridbot("cost", "dbc", "--json", *url).stdout)
        by_pool = {p["pool"]: p for p in cost["pools"]}
        assert by_pool["local"]["cpu"] == 0 and by_pool["fast"]["cpu"] > 0
        assert by_pool["fast"]["cpu"] == pytest.approx(by_pool["fast"]["seconds"], rel=1e-9)
        assert 0 < cost["spent"] <= 40.0, cost
        status = gridbot("status", *url).stdout
        assert "bag dbc: spent" in status and "of 40.00" in status, status
    finally:
        cluster.stop()
