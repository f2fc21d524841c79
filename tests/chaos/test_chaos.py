"""Issue 12's chaos suite: real servers, workers and databases, with faults injected on loopback.

Each test runs a bag of short jobs under a fault and asserts what a user counts on: no acknowledged
result lost (every report a worker logged as acknowledged is in the store as a kept or wasted result),
no failure charged that the fault did not cause, every job done exactly once with its own output, and
the workers alive. Each prints its figures (wall time, retries, what was lost and re-run) for the note.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import time
from pathlib import Path

import pytest

from tests.chaos.proxy import CuttableProxy
from tests.integration.harness import Cluster, Proc

CUT_SECONDS = float(os.environ.get("GRIDBOT_CHAOS_CUT", "120"))
"""How long the network is cut (the issue asks for 2 minutes; set lower to try the suite quickly)."""


def _bag(tmp: Path, name: str, jobs: int, seconds: float = 0.2) -> Path:
    spec = tmp / f"{name}.toml"
    spec.write_text(f'name = "{name}"\ncommand = "sleep {seconds} && echo job-{{i}}"\nmax_failures = 10\n'
                    f'[parameters]\ni = {{ from = 0, to = {jobs - 1} }}\n')
    return spec


def _acknowledged(workers: list[Proc]) -> set[int]:
    """Instances whose reports the workers were told are durable (from their debug logs)."""
    out: set[int] = set()
    for w in workers:
        for ids in re.findall(r"acknowledged reports \[([0-9, ]*)\]", w.log):
            out.update(int(i) for i in ids.split(",") if i.strip())
    return out


def _verify(cluster: Cluster, bag: str, jobs: int, workers: list[Proc], lossy_hosts: frozenset[str] = frozenset(),
            timeout: float = 240) -> dict[str, float]:
    """Wait for the bag, then check every promise; return the figures."""
    start = time.monotonic()
    try:
        info = cluster.wait_bag(bag, timeout=timeout)
    except TimeoutError as e:  # CI keeps no files: show what the server said
        assert cluster.server is not None
        said = [line for line in cluster.server.log.splitlines() if " DEBUG " not in line]
        raise AssertionError(f"{e}; the server's log ends:\n" + "\n".join(said[-40:])) from e
    with cluster.client(admin=True) as c:
        assert info.state == "completed" and info.counts.done == jobs and info.counts.failed == 0, info
        results = {r.job.index: r for r in c.results(bag)}
        assert sorted(results) == list(range(jobs)), "every job has a kept result"
        for i, r in results.items():
            assert r.stdout_tail == f"job-{i}\n", f"job {i} kept another job's output: {r.stdout_tail!r}"
        states: dict[int, tuple[str, str]] = {}
        for job in c.jobs(bag, limit=jobs):
            for inst in c.instances(bag, job.job_id):
                states[inst.instance_id] = (inst.state, inst.host_id)
        acked = _acknowledged(workers)
        lost = sorted(i for i in acked if states.get(i, ("missing", ""))[0] not in ("done", "wasted"))
        assert not lost, f"acknowledged results not kept: {lost[:10]}"
        failed_elsewhere = [(i, s, h) for i, (s, h) in states.items()
                            if s in ("failed", "overdue") and h not in lossy_hosts]
        assert not failed_elsewhere, f"failures charged that no fault caused: {failed_elsewhere[:5]}"
        hosts = {h.host_id: h for h in c.hosts()}
        blamed = [h.name for h in hosts.values() if h.failed and h.host_id not in lossy_hosts]
        assert not blamed, f"hosts charged with failures they did not cause: {blamed}"
    done_once = sum(1 for s, _ in states.values() if s == "done")
    assert done_once == jobs, f"{done_once} instances kept as the result of {jobs} jobs"
    return {"jobs": jobs, "acknowledged": len(acked), "instances": len(states),
            "lost_or_failed": sum(1 for s, _ in states.values() if s in ("failed", "overdue")),
            "wasted": sum(1 for s, _ in states.values() if s == "wasted"),
            "wait_s": round(time.monotonic() - start, 1)}


def _health(cluster: Cluster) -> dict:
    import json
    import urllib.request

    from gridbot.security.access import read_access

    req = urllib.request.Request(f"{cluster.url}/v1/health", headers={
        "Authorization": f"Bearer {read_access(cluster.access).admin}", "Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _workers_alive(workers: list[Proc]) -> None:
    dead = [w.args for w in workers if w.proc is not None and w.proc.poll() is not None]
    assert not dead, f"workers exited: {dead}"


def _host_ids(cluster: Cluster, names: list[str]) -> frozenset[str]:
    with cluster.client(admin=True) as c:
        return frozenset(h.host_id for h in c.hosts() if h.name.rsplit("/", 1)[-1] in names)


def _running(cluster: Cluster, bag: str, at_least: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    with cluster.client() as c:
        while c.bag(bag).counts.done < at_least:
            assert time.monotonic() < deadline, "the bag did not get going"
            time.sleep(0.1)


def _kill9_server_under_load(cluster: Cluster, tmp: Path) -> dict[str, float]:
    cluster.start_server()
    workers = [cluster.start_worker("--slots", "2", "--idle-timeout", "0") for _ in range(3)]
    with cluster.client() as c:
        c.submit_file(_bag(tmp, "k", 600, 0.05))
    resumed = []
    for round_, down in enumerate((1.0, 8.0)):  # the second outage lasts past the 5 s host timeout
        _running(cluster, "k", 100 + 200 * round_)
        assert cluster.server is not None
        cluster.server.signal(signal.SIGKILL)
        cluster.server.wait(10)
        time.sleep(down)
        cluster.start_server()
        with cluster.client() as c:
            before, started = c.bag("k").counts.done, time.monotonic()
            while c.bag("k").counts.done == before and time.monotonic() - started < 60:
                time.sleep(0.05)
        resumed.append(round(time.monotonic() - started, 2))
    figures = _verify(cluster, "k", 600, workers)
    _workers_alive(workers)
    return {**figures, "first_result_after_restart_s": resumed}


@pytest.mark.slow
def test_kill_9_of_the_server_under_load_on_sqlite(tmp_path):
    cluster = Cluster(tmp_path, server_args=("--heartbeat", "1", "--host-timeout", "5"))
    try:
        print("kill -9 x2, SQLite:", _kill9_server_under_load(cluster, tmp_path))
    finally:
        cluster.stop()


@pytest.mark.slow
@pytest.mark.postgres
def test_kill_9_of_the_server_under_load_on_postgresql(tmp_path, pg_url):
    cluster = Cluster(tmp_path, db=pg_url, server_args=("--heartbeat", "1", "--host-timeout", "5"))
    try:
        print("kill -9 x2, PostgreSQL:", _kill9_server_under_load(cluster, tmp_path))
    finally:
        cluster.stop()


@pytest.mark.slow
@pytest.mark.postgres
def test_the_servers_postgresql_connections_are_terminated_under_load(tmp_path, pg_url):
    import psycopg

    cluster = Cluster(tmp_path, db=pg_url, server_args=("--heartbeat", "1"))
    try:
        cluster.start_server()
        workers = [cluster.start_worker("--slots", "2", "--idle-timeout", "0") for _ in range(3)]
        with cluster.client() as c:
            c.submit_file(_bag(tmp_path, "t", 500, 0.05))
        database = pg_url.rsplit("/", 1)[1]
        killed = 0
        for target in (100, 250):
            _running(cluster, "t", target)
            with psycopg.connect(pg_url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as admin:
                rows = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                                     "AND pid <> pg_backend_pid()", (database,)).fetchall()
                killed += len(rows)
        figures = _verify(cluster, "t", 500, workers)
        _workers_alive(workers)
        assert _health(cluster)["ok"] is True, "the server is healthy again"
        assert killed >= 4, "the test terminated the server's connections"
        print("PostgreSQL connections terminated:", killed, figures)
    finally:
        cluster.stop()


@pytest.mark.slow
@pytest.mark.postgres
def test_a_postgresql_store_whose_backends_are_terminated_in_a_loop_always_recovers(pg_url):
    """The race behind stop 30's CI failure, hit on purpose: backends terminated every few milliseconds
    while the store writes batches whose one-row updates go through psycopg's pipeline (`executemany`).
    Now and then the driver fails to leave pipeline mode and keeps the connection, not marked broken;
    before the fix, every later write failed and the server answered 503 for good. Each failure must be
    StoreUnavailable and a write must succeed again soon (3 s: a stuck connection stays stuck for good)."""
    import logging
    import threading

    import psycopg

    from gridbot.core.changes import Changes, JobUpdate
    from gridbot.model.spec import parse_spec
    from gridbot.model.states import JobState
    from gridbot.store.base import StoreUnavailable
    from gridbot.store.sql import open_store

    store = open_store(pg_url)
    store.claim()
    database, stop, kills = pg_url.rsplit("/", 1)[1], threading.Event(), [0]

    def kill() -> None:
        with psycopg.connect(pg_url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as admin:
            while not stop.wait(random.uniform(0.001, 0.02)):
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (database,))
                kills[0] += 1

    killer = threading.Thread(target=kill)
    quiet = logging.getLogger("psycopg").level
    logging.getLogger("psycopg").setLevel(logging.ERROR)  # each rollback on a dead connection warns
    try:
        spec = parse_spec('command = "echo {i}"\n[parameters]\ni = { from = 0, to = 9 }\n', "s", "s")
        bag = store.create_bag(spec, None, {}, 1.0).bag_id
        job = store.queued_jobs(bag, 0, 1)[0].job_id
        killer.start()
        written = failed = longest = 0
        last = time.monotonic()
        end = last + 10
        while time.monotonic() < end:
            try:
                store.apply(Changes(jobs={job: JobUpdate(job, JobState.QUEUED, 0, written + 1)}))
                written += 1
                last = time.monotonic()
            except StoreUnavailable:
                failed += 1
                longest = max(longest, time.monotonic() - last)
                assert longest < 3.0, f"no write succeeded for {longest:.1f} s: the store does not recover"
        stop.set()
        killer.join()
        assert kills[0] > 100 and failed > 20, (kills, failed)
        attempts = -1
        for _ in range(3):  # the reading connection may have been terminated last
            with contextlib.suppress(StoreUnavailable):
                attempts = store.jobs(bag)[0].attempts
                break
        # a write refused as its commit's answer was lost may be there too
        assert attempts in (written, written + 1), "every acknowledged write is there"
        print(f"backends terminated {kills[0]} times: {written} writes, {failed} refused, longest gap "
              f"{longest * 1000:.0f} ms")
    finally:
        stop.set()
        if killer.is_alive():
            killer.join()
        logging.getLogger("psycopg").setLevel(quiet)
        store.close()


@pytest.mark.slow
def test_a_server_stopped_longer_than_the_host_timeout_blames_nobody(tmp_path):
    cluster = Cluster(tmp_path, server_args=("--heartbeat", "1", "--host-timeout", "5"))
    try:
        cluster.start_server()
        workers = [cluster.start_worker("--slots", "2", "--idle-timeout", "0") for _ in range(2)]
        with cluster.client() as c:
            c.submit_file(_bag(tmp_path, "p", 60, 2.0))
        _running(cluster, "p", 4)
        assert cluster.server is not None
        cluster.server.signal(signal.SIGSTOP)
        time.sleep(12)  # more than twice the host timeout: every host and instance would be blamed
        cluster.server.signal(signal.SIGCONT)
        figures = _verify(cluster, "p", 60, workers)
        _workers_alive(workers)
        assert "did not run for" in cluster.server.log
        print("SIGSTOP 12 s with a 5 s host timeout:", figures)
    finally:
        cluster.stop()


@pytest.mark.slow
def test_killing_30_percent_of_the_workers_loses_only_their_running_instances(tmp_path):
    cluster = Cluster(tmp_path, server_args=("--heartbeat", "1", "--host-timeout", "4"))
    try:
        cluster.start_server()
        names = [f"w{n}" for n in range(10)]
        workers = [cluster.start_worker("--slots", "1", "--idle-timeout", "0", name=n) for n in names]
        with cluster.client() as c:
            c.submit_file(_bag(tmp_path, "w", 300, 0.3))
        _running(cluster, "w", 40)
        victims = random.Random(12).sample(range(10), 3)
        for v in victims:
            workers[v].signal(signal.SIGKILL)
        survivors = [w for i, w in enumerate(workers) if i not in victims]
        lossy = _host_ids(cluster, [names[v] for v in victims])
        figures = _verify(cluster, "w", 300, workers, lossy_hosts=lossy)
        _workers_alive(survivors)
        print("3 of 10 workers killed:", figures)
    finally:
        cluster.stop()


@pytest.mark.slow
def test_a_network_cut_between_workers_and_server_loses_nothing(tmp_path):
    """Workers finish their jobs during a cut of CUT_SECONDS and hand the results in after it; one worker
    is restarted during the cut and hands in what its previous run finished."""
    cluster = Cluster(tmp_path, server_args=("--heartbeat", "1"))
    proxy = None
    try:
        cluster.start_server()
        proxy = CuttableProxy(cluster.port).start()
        direct, cluster.url = cluster.url, proxy.url  # the workers reach the server through the proxy
        workers = [cluster.start_worker("--slots", "2", "--idle-timeout", "0", "--prefetch", "4", name=f"c{n}")
                   for n in range(3)]
        cluster.url = direct
        with cluster.client() as c:
            c.submit_file(_bag(tmp_path, "n", 120, 1.0))
        _running(cluster, "n", 10)
        proxy.cut()
        cut_at = time.monotonic()
        time.sleep(min(10.0, CUT_SECONDS / 4))
        workers[0].signal(signal.SIGTERM)  # a worker restarted during the cut
        assert workers[0].wait(30) == 0
        cluster.url = proxy.url
        workers.append(cluster.start_worker("--slots", "2", "--idle-timeout", "0", "--prefetch", "4", name="c0"))
        cluster.url = direct
        with cluster.client() as c:
            during = c.bag("n").counts.done
        time.sleep(max(0.0, CUT_SECONDS - (time.monotonic() - cut_at)))
        proxy.restore()
        figures = _verify(cluster, "n", 120, workers[1:] + workers[:1])
        _workers_alive(workers[1:])
        spooled = sum(w.log.count("results kept for the next run") + w.log.count("handing in") for w in workers)
        assert "handing in" in workers[-1].log, "the restarted worker handed in its earlier run's results"
        print(f"network cut {CUT_SECONDS:.0f} s, one worker restarted during it: done at the server when the "
              f"worker restarted {during}, spool messages {spooled},", figures)
    finally:
        if proxy is not None:
            proxy.stop()
        cluster.stop()


def test_the_proxy_cuts_and_restores(tmp_path):
    """The chaos suite's own tool: nothing passes during a cut, everything after."""
    import http.server
    import threading
    import urllib.request

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    proxy = CuttableProxy(httpd.server_address[1]).start()
    try:
        assert urllib.request.urlopen(proxy.url, timeout=5).status == 200
        proxy.cut()
        with pytest.raises(OSError):
            urllib.request.urlopen(proxy.url, timeout=1)
        proxy.restore()
        time.sleep(0.1)
        assert urllib.request.urlopen(proxy.url, timeout=5).status == 200
    finally:
        proxy.stop()
        httpd.shutdown()

