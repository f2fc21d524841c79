"""Issue 18 on a real Slurm: two partitions of different sizes as two pools, read through Slurm's own monitoring
(scontrol, squeue, sinfo, polled every 2 s). A burst of jobs of two CPUs placed by `stateful` never routes more
to a partition than it holds, while `naive`, trusting a reading that does not show its own placements yet,
sends the whole burst to the partition that looked best and its last job waits there, measured by the jobs'
queue times (first instance sent, from the bag's submission)."""

from __future__ import annotations

import time

from tests.integration.harness import gridbot
from tests.integration.test_overlay_slurm import start, wait_pilots_gone, write

POOLS = """\
[pools.fast]
kind = "slurm"
partition = "fast"           # 4 CPUs
cpus = 2                     # a pilot is one job's own batch job of 2 CPUs
max_running = 4
max_queued = 4
walltime = "30m"
idle_timeout = 2
min_cpu = 0
monitor_interval = "2s"
allow_root = true            # the tests run as root
attributes = { Speed = 2.0 }

[pools.small]
kind = "slurm"
partition = "small"          # 2 CPUs
cpus = 2
max_running = 4
max_queued = 4
walltime = "30m"
idle_timeout = 2
min_cpu = 0
monitor_interval = "2s"
allow_root = true
"""
JOB_S = 12


def wait_readings(cluster, timeout: float = 60.0) -> dict[str, object]:
    """Wait until both pools show a monitor reading with every CPU free (no pilot of an earlier run left)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with cluster.client() as c:
            readings = {p.name: p.monitor for p in c.pools()}
        if all(m is not None and m.free_cpus == m.total_cpus for m in readings.values()):
            return readings
        time.sleep(1)
    raise AssertionError(f"no full readings: {readings}")


def burst(tmp_path, cluster, placement: str) -> tuple[dict[str, int], list[float], list[str]]:
    """Three jobs of two CPUs at once; their pools, queue times and routing reasons."""
    bag = write(tmp_path, f"{placement}.toml", f'name = "{placement}"\ncommand = "sleep {JOB_S}"\ncpus = 2\n'
                                               f'[strategy]\nplacement = "{placement}"\n'
                                               '[parameters]\ni = { from = 1, to = 3 }\n')
    submitted = gridbot("submit", bag, "--server", cluster.url)
    assert submitted.returncode == 0, submitted.stderr
    done = cluster.wait_bag(placement, timeout=240)
    assert done.state == "completed" and done.counts.done == 3, done
    routed: dict[str, int] = {}
    waits, whys = [], []
    with cluster.client() as c:
        for index in (0, 1, 2):
            story = c.story(placement, index)
            moves = [d for d in story.decisions if d.action == "migrate"]
            assert moves, story
            pool = moves[0].why.split(":")[0].removeprefix("to ").strip()
            routed[pool] = routed.get(pool, 0) + 2
            whys.append(moves[0].why)
            waits.append(min(i.sent_at for i in story.instances) - done.created_at)
    return routed, sorted(waits), whys


def test_stateful_never_routes_more_to_a_partition_than_it_holds_and_naive_does(tmp_path, slurm):
    cluster = start(tmp_path, pools=POOLS)
    try:
        readings = wait_readings(cluster)
        assert {n: m.total_cpus for n, m in readings.items()} == {"fast": 4, "small": 2}
        listing = gridbot("pools", "--server", cluster.url).stdout
        assert "pool fast: 4 of 4 CPUs free" in listing and "partition fast" in listing, listing

        routed, waits, whys = burst(tmp_path, cluster, "stateful")
        assert routed == {"fast": 4, "small": 2}, (routed, whys)
        assert any("less 2 placed and not yet shown" in w for w in whys), whys
        wait_pilots_gone(cluster)
        wait_readings(cluster)
        stateful_waits = waits

        routed, waits, whys = burst(tmp_path, cluster, "naive")
        assert routed == {"fast": 6}, (routed, whys)  # 6 CPUs sent to a partition of 4
        naive_waits = waits
        print(f"queue times: stateful {stateful_waits}, naive {naive_waits}")
        # every stateful job started as soon as a pilot could; naive's third waited for a whole job to end
        assert stateful_waits[-1] < JOB_S, stateful_waits
        assert naive_waits[-1] >= stateful_waits[-1] + JOB_S * 0.75, (naive_waits, stateful_waits)
        wait_pilots_gone(cluster)
    finally:
        cluster.stop()
