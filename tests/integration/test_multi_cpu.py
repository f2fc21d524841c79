"""Jobs of several CPUs (issue 18) on real workers: a worker of four slots runs two jobs of `cpus = 2` at once,
never three, and each job sees the CPUs it holds (GRIDBOT_CPUS, OMP_NUM_THREADS); `gridbot run` sizes its
workers to the bag's jobs."""

from __future__ import annotations

import json

from tests.integration.harness import gridbot

WIDE = """\
name = "wide"
cpus = 2
command = "echo start $(date +%s.%N) cpus=$GRIDBOT_CPUS omp=$OMP_NUM_THREADS; sleep 1.5; echo end $(date +%s.%N)"
[parameters]
i = { from = 1, to = 6 }
"""


def intervals(rows: list[dict]) -> list[tuple[float, float]]:
    out = []
    for r in rows:
        words = r["stdout"].split()
        out.append((float(words[1]), float(words[words.index("end") + 1])))
    return out


def most_at_once(spans: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    now = best = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def test_a_worker_of_four_slots_runs_two_jobs_of_two_cpus_at_once(tmp_path, cluster):
    (tmp_path / "wide.toml").write_text(WIDE)
    cluster.start_server()
    cluster.start_worker("--slots", "4")
    submitted = gridbot("submit", str(tmp_path / "wide.toml"), "--server", cluster.url)
    assert submitted.returncode == 0, submitted.stderr
    done = cluster.wait_bag("wide", timeout=120)
    assert done.counts.done == 6
    with cluster.client() as c:
        rows = [{"stdout": r.stdout_tail} for r in c.results("wide")]
    assert all("cpus=2 omp=2" in r["stdout"] for r in rows), rows
    assert most_at_once(intervals(rows)) == 2


def test_gridbot_run_sizes_its_workers_to_the_bags_cpus(tmp_path):
    (tmp_path / "wide.toml").write_text(WIDE)
    proc = gridbot("run", "wide.toml", "--workers", "2", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(line) for line in (tmp_path / "results/wide/jobs.jsonl").read_text().splitlines()]
    assert {r["state"] for r in rows} == {"done"} and len(rows) == 6
    outs = [(tmp_path / f"results/wide/{r['index']}/stdout").read_text() for r in rows]
    assert all("cpus=2" in o for o in outs), outs
    assert most_at_once(intervals([{"stdout": o} for o in outs])) == 2, "two workers, one job of two CPUs each"


POOL = """\
[pools.here]
kind = "local"
max_running = 1
cpus = 2
idle_timeout = 3
min_cpu = 0
allow_root = true
"""


def test_workers_report_what_their_input_downloads_took_and_gridbot_pools_shows_the_bandwidth(tmp_path):
    from tests.integration.harness import Cluster, gridbot_json

    (tmp_path / "pools.toml").write_text(POOL)
    (tmp_path / "data.bin").write_bytes(bytes(range(256)) * 8192)  # 2 MiB
    (tmp_path / "in.toml").write_text('name = "in"\ncpus = 2\ninputs = ["data.bin"]\ncommand = "wc -c data.bin"\n'
                                      '[parameters]\ni = { from = 1, to = 3 }\n')
    cluster = Cluster(tmp_path, server_args=("--pools", str(tmp_path / "pools.toml"), "--state-dir",
                                             str(tmp_path / "state")))
    cluster.start_server()
    try:
        assert gridbot("submit", str(tmp_path / "in.toml"), "--server", cluster.url).returncode == 0
        assert cluster.wait_bag("in", timeout=120).counts.done == 3
        (pool,) = gridbot_json("pools", "--json", "--server", cluster.url)
        assert pool["bandwidth"] > 0, pool
    finally:
        cluster.stop()


ONE_JOB_PILOTS = """\
[pools.here]
kind = "local"
max_running = 2
cpus = 2
jobs_per_pilot = 1           # each pilot one job's own batch job
idle_timeout = 30
min_cpu = 0
allow_root = true
"""


def test_a_pool_of_one_job_pilots_starts_a_pilot_per_job(tmp_path):
    from tests.integration.harness import Cluster, gridbot_json

    (tmp_path / "pools.toml").write_text(ONE_JOB_PILOTS)
    (tmp_path / "w.toml").write_text('name = "w"\ncpus = 2\ncommand = "sleep 0.5"\n'
                                     '[parameters]\ni = { from = 1, to = 4 }\n')
    cluster = Cluster(tmp_path, server_args=("--pools", str(tmp_path / "pools.toml"), "--state-dir",
                                             str(tmp_path / "state")))
    cluster.start_server()
    try:
        assert gridbot("submit", str(tmp_path / "w.toml"), "--server", cluster.url).returncode == 0
        assert cluster.wait_bag("w", timeout=120).counts.done == 4
        (pool,) = gridbot_json("pools", "--json", "--server", cluster.url)
        # two pilots at most at once, idle for 30 s before they would leave: reused, they would have been 2
        assert pool["pilots_submitted"] >= 4, pool
    finally:
        cluster.stop()
