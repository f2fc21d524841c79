"""The paths issue 6 made fast, checked for what they must keep doing: the noop executor, prefetch sized
from the jobs' run time, idle hosts' requests held until work comes, and the store's writer thread."""

from __future__ import annotations

import asyncio
import gc
import signal
import threading
import time
import urllib.request
from pathlib import Path

import msgspec
import pytest

from gridbot.client import Client
from gridbot.core.changes import Changes, JobUpdate
from gridbot.errors import ServerUnavailable
from gridbot.model.pacing import PREFETCH_MAX
from gridbot.model.records import Assignment, HostInfo, Outcome
from gridbot.model.spec import parse_spec
from gridbot.model.states import InstanceState, JobState
from gridbot.protocol import MSGPACK, ExchangeRequest, ExchangeResponse
from gridbot.server.app import EmbeddedServer
from gridbot.server.service import Service
from gridbot.store.sql import SQLiteStore
from gridbot.worker.worker import Worker, WorkerConfig
from tests.integration.harness import Cluster


def sweep(name: str, jobs: int, command: str = "true") -> str:
    return f'name = "{name}"\ncommand = "{command}"\n[parameters]\ni = {{ from = 1, to = {jobs} }}\n'


def service(tmp_path: Path) -> Service:
    store = SQLiteStore(tmp_path / "g.db")
    store.migrate()
    return Service(store)


def run_worker(config: WorkerConfig) -> Worker:
    worker = Worker(config)
    asyncio.run(worker.run())
    return worker


def test_the_noop_executor_completes_a_bag_without_running_anything(tmp_path):
    svc = service(tmp_path)
    marker = tmp_path / "ran"
    svc.submit(parse_spec(sweep("n", 500, f"touch {marker}"), "n.toml", "n"), None, {}, time.time())
    with EmbeddedServer(svc, tick_interval=0.2) as srv:
        run_worker(WorkerConfig(srv.url, slots=100, executor="noop", idle_timeout=1, state_dir=tmp_path / "s",
                                key=srv.access.workers["local"],
                                workdir=tmp_path / "w"))
        with Client(srv.url, access=srv.access, admin=True) as c:
            info = c.bag("n")
    assert info.state == "completed" and info.counts.done == 500 and info.counts.instances == 500
    assert not marker.exists(), "noop reports success without running the command"
    assert len(svc.store.jobs(1, JobState.DONE, limit=1000)) == 500


def test_an_unknown_executor_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"unknown executor 'fast'.*shell, noop"):
        Worker(WorkerConfig("http://127.0.0.1:1", executor="fast", state_dir=tmp_path))


def test_prefetch_follows_the_jobs_run_time_within_bounds(tmp_path):
    w = Worker(WorkerConfig("http://127.0.0.1:1", slots=2, prefetch=1, prefetch_seconds=1.0, state_dir=tmp_path,
                            allow_root=True))
    try:
        assert w.pacing.prefetch() == 1, "nothing run yet: the configured prefetch"
        w.pacing.avg_wall = 0.1
        assert w.pacing.prefetch() == 20, "two slots, 1 s of work of 0.1 s jobs"
        w.pacing.avg_wall = 0.0001
        assert w.pacing.prefetch() == PREFETCH_MAX
        w.pacing.avg_wall = 600.0
        assert w.pacing.prefetch() == 1, "long jobs: one at a time beyond the slots, never less than asked"
    finally:
        w.identity.release()


def test_short_jobs_travel_in_bundles(tmp_path):
    """With prefetch from the run time, 400 jobs of `true` take far fewer round trips than jobs; without,
    about one per job."""
    counts = {}
    for name, extra in (("plain", {}), ("bundled", {"prefetch_seconds": 1.0})):
        svc = service(tmp_path / name)
        svc.submit(parse_spec(sweep(name, 400), f"{name}.toml", name), None, {}, time.time())
        with EmbeddedServer(svc, tick_interval=0.2) as srv:
            worker = run_worker(WorkerConfig(srv.url, slots=1, prefetch=1, idle_timeout=1,
                                             key=srv.access.workers["local"], state_dir=tmp_path / name / "s",
                                             workdir=tmp_path / name / "w",
                                             allow_root=True, **extra))
            with Client(srv.url, access=srv.access, admin=True) as c:
                assert c.bag(name).counts.done == 400
        counts[name] = worker.exchanges
    print("round trips:", counts)
    assert counts["bundled"] * 4 < counts["plain"], counts
    # a job prefetched behind the running one can end before the next exchange on a loaded machine: then one
    # exchange reports two (399 seen once in a full run; 402 alone)
    assert counts["plain"] >= 360, counts


class CountingEvent(asyncio.Event):
    """An asyncio.Event that counts the times it was set."""

    def __init__(self) -> None:
        super().__init__()
        self.sets = 0

    def set(self) -> None:
        self.sets += 1
        super().set()


def test_a_jobs_end_wakes_the_loop_only_when_it_must_talk(tmp_path):
    """With work waiting on the host, a short job's end does not wake the worker's loop (its report waits for
    company): 400 bundled jobs wake it about once per round trip, not once per job; and the last result of
    the bag still goes at once, so the bag completes."""
    svc = service(tmp_path)
    svc.submit(parse_spec(sweep("b", 400), "b.toml", "b"), None, {}, time.time())
    with EmbeddedServer(svc, tick_interval=0.2) as srv:
        worker = Worker(WorkerConfig(srv.url, slots=1, prefetch=1, prefetch_seconds=1.0, idle_timeout=1,
                                     key=srv.access.workers["local"], state_dir=tmp_path / "s",
                                     workdir=tmp_path / "w", allow_root=True))
        wake = worker.wake = CountingEvent()
        asyncio.run(worker.run())
        with Client(srv.url, access=srv.access, admin=True) as c:
            assert c.bag("b").counts.done == 400
    print("wakes:", wake.sets, "round trips:", worker.exchanges)
    assert wake.sets < 100, f"the loop was woken {wake.sets} times for 400 jobs"


def test_the_slots_held_by_waiting_instances_follow_arrivals_starts_and_cancels(tmp_path):
    """The worker keeps the slots its waiting instances will need as a count (a sum over hundreds held, at
    every wake, was dearer than a short job); it must match the queue through arrivals, starts and cancels."""
    w = Worker(WorkerConfig("http://127.0.0.1:1", slots=4, state_dir=tmp_path, allow_root=True,
                            workdir=tmp_path / "w"))
    try:
        assert w.threads.take(4)  # every slot taken: nothing starts
        job = {"bag_id": 1, "bag_name": "b", "command": "true", "env": {}, "inputs": [], "outputs": [],
               "instance_deadline": 0.0}
        sent = [Assignment(instance_id=i, job_id=i, index=i, cpus=1 + i % 3, **job) for i in range(1, 7)]
        w._accept(ExchangeResponse(sent, [], 0.0, 30.0, 1 << 20))
        assert w.waiting_cpus == sum(a.cpus for a in sent) == 12
        w._accept(ExchangeResponse([], [2, 5], 0.0, 30.0, 1 << 20))
        assert w.waiting_cpus == sum(a.cpus for a in w.waiting) == 12 - 3 - 3

        async def start() -> None:
            w.threads.give(4)
            w._start_ready()  # 1 (2 slots) and 3 (1 slot, a slot thread's) start; 4 needs 2 of the 1 left
            assert [a.instance_id for a in w.waiting] == [4, 6]
            assert w.waiting_cpus == sum(a.cpus for a in w.waiting) == 2 + 1
            assert w.busy == 3 and list(w.running) == [1]
            await asyncio.gather(*w.running.values())
            while w.threads.running or w.threads.queue:
                await asyncio.sleep(0.01)

        asyncio.run(start())
    finally:
        w.threads.close()
        w.identity.release()


@pytest.mark.parametrize("threads", [True, False], ids=["slot-threads", "event-loop"])
def test_the_slot_of_a_job_the_server_took_back_runs_the_next_waiting_job_at_once(tmp_path, threads):
    """A running instance the server cancels is killed and not reported; its slot starts the next instance
    held on the host at once, not at the worker's next exchange (a heartbeat later). On both paths: a slot
    thread's job and one of the event loop's."""
    w = Worker(WorkerConfig("http://127.0.0.1:1", slots=1, state_dir=tmp_path, allow_root=True,
                            workdir=tmp_path / "w", slot_threads=threads))
    job = {"bag_id": 1, "bag_name": "b", "env": {}, "inputs": [], "outputs": [], "instance_deadline": 0.0}
    long = Assignment(instance_id=1, job_id=1, index=0, command="sleep 30", **job)
    short = Assignment(instance_id=2, job_id=2, index=1, command="true", **job)

    async def cancel_the_first() -> float:
        w._accept(ExchangeResponse([long, short], [], 0.0, 30.0, 1 << 20))
        if threads:
            assert not w.running and not w.waiting and sorted(w.threads.held_ids()) == [1, 2]
        else:
            assert list(w.running) == [1] and [a.instance_id for a in w.waiting] == [2]
        await asyncio.sleep(0.2)
        start = time.monotonic()
        w._accept(ExchangeResponse([], [1], 0.0, 30.0, 1 << 20))
        while not any(r.instance_id == 2 for r in w.reports) and time.monotonic() - start < 10:
            await asyncio.sleep(0.02)
        return time.monotonic() - start

    try:
        took = asyncio.run(cancel_the_first())
    finally:
        w.threads.close()
        w.identity.release()
    assert [(r.instance_id, r.outcome) for r in w.reports] == [(2, Outcome.SUCCESS)], w.reports
    assert took < 5, f"the next job ran {took:.1f} s after the first was taken back"


def test_an_idle_worker_hears_of_a_new_bag_at_once(tmp_path):
    """A worker that found no work is held by the server instead of sleeping its backoff (10 s with no
    bag at all), so the first result of a bag submitted later comes within a fraction of that."""
    cluster = Cluster(tmp_path)
    try:
        cluster.start_server()
        cluster.start_worker("--slots", "1")
        time.sleep(2.0)  # the worker has asked, found nothing and is waiting
        spec = tmp_path / "one.toml"
        spec.write_text(sweep("one", 1))
        with cluster.client() as c:
            start = time.monotonic()
            c.submit_file(spec)
            info = c.wait("one", poll=0.05, timeout=30)
            took = time.monotonic() - start
    finally:
        cluster.stop()
    assert info.state == "completed"
    assert took < 3.0, f"the first result took {took:.1f} s; an idle worker sleeping its backoff takes ~10 s"


def test_workers_sharing_a_workdir_keep_their_jobs_apart(tmp_path):
    """Job directories are reused per slot: two workers in one workdir (as `gridbot run` starts them)
    must not run in each other's, or outputs vanish and inputs go missing."""
    (tmp_path / "data.txt").write_text("x" * 100)
    spec = tmp_path / "io.toml"
    spec.write_text('name = "io"\ncommand = "cat data.txt > out.txt; sleep 0.05; echo {i} >> out.txt"\n'
                    'inputs = ["data.txt"]\noutputs = ["out.txt"]\n[parameters]\ni = { from = 1, to = 200 }\n')
    cluster = Cluster(tmp_path)
    try:
        cluster.start_server()
        shared = str(tmp_path / "shared-work")
        for n in range(2):
            cluster.start_worker("--slots", "2", "--prefetch-seconds", "1", "--workdir", shared, name=f"s{n}")
        with cluster.client() as c:
            c.submit_file(spec)
            info = c.wait("io", poll=0.2, timeout=120)
            results = c.download_results("io", tmp_path / "results")
    finally:
        cluster.stop()
    assert info.state == "completed" and info.counts.done == 200 and info.counts.failed == 0, info.counts
    assert results == 200
    for d in sorted(p for p in (tmp_path / "results").iterdir() if p.is_dir()):
        text = (d / "out.txt").read_text()
        assert text == "x" * 100 + str(int(d.name) + 1) + "\n", (d.name, text)


def test_an_idle_worker_stops_at_once_though_its_request_is_held(tmp_path):
    cluster = Cluster(tmp_path)
    try:
        cluster.start_server()
        worker = cluster.start_worker("--slots", "1")
        time.sleep(2.0)  # its request is held: no bag at all, so up to the 10 s empty backoff
        start = time.monotonic()
        worker.signal(signal.SIGTERM)
        code = worker.wait(30)
        took = time.monotonic() - start
    finally:
        cluster.stop()
    assert code == 0
    assert took < 5.0, f"the worker took {took:.1f} s to stop; it waited for its held request"


def test_a_held_request_still_answers_after_its_backoff(tmp_path):
    """With no bag at all, a held request is answered (with nothing) once the backoff has passed."""
    svc = service(tmp_path)
    with EmbeddedServer(svc) as srv:
        host_id, credential = srv.host_credential()
        body = msgspec.msgpack.encode(ExchangeRequest(HostInfo(host_id, "h"), 1, []))
        req = urllib.request.Request(f"{srv.url}/v1/exchange", body, {"Content-Type": MSGPACK,
                                                                      "Authorization": f"Bearer {credential}"})
        start = time.monotonic()
        with urllib.request.urlopen(req, timeout=60) as r:
            resp = msgspec.msgpack.decode(r.read(), type=ExchangeResponse)
        held = time.monotonic() - start
    assert resp.assignments == [] and resp.backoff == 0.0
    assert 5.0 < held < 20.0, f"held {held:.1f} s; the empty backoff is 10 s"


def test_the_writer_thread_batch_lands_before_a_flush_and_a_failure_fails_later_exchanges_too(tmp_path,
                                                                                              monkeypatch):
    svc = service(tmp_path)
    svc.submit(parse_spec(sweep("w", 40), "w.toml", "w"), None, {}, 0.0)
    told: list[BaseException | None] = []
    posted: list = []
    _, changes = svc.decide(ExchangeRequest(HostInfo("h1", "h1"), 2, []), 1.0)
    svc.stage(changes, told.append)
    svc.flush_async(posted.append)
    _, changes = svc.decide(ExchangeRequest(HostInfo("h2", "h2"), 2, []), 1.0)
    svc.stage(changes, told.append)
    assert told == [], "nothing is answered before its batch is durable"
    svc.flush()  # lands the batch in flight first, then the later one
    assert told == [None, None]
    for cb in posted:  # the writer's late notice changes nothing
        cb()
    assert told == [None, None] and len(svc.store.jobs(1, JobState.RUNNING)) == 4

    def broken(changes):
        raise OSError("disk full")

    release = threading.Event()

    def slow_broken(changes):
        release.wait(10)
        broken(changes)

    monkeypatch.setattr(svc.store, "apply", slow_broken)
    told.clear()
    posted.clear()
    _, changes = svc.decide(ExchangeRequest(HostInfo("h3", "h3"), 2, []), 2.0)
    svc.stage(changes, told.append)
    svc.flush_async(posted.append)
    _, changes = svc.decide(ExchangeRequest(HostInfo("h4", "h4"), 2, []), 2.0)
    svc.stage(changes, told.append)  # decided on the state the failing batch assumed
    release.set()
    deadline = time.monotonic() + 10
    while not posted and time.monotonic() < deadline:
        time.sleep(0.01)
    monkeypatch.undo()
    for cb in posted:
        cb()
    assert len(told) == 2 and all(isinstance(e, ServerUnavailable) for e in told)
    assert len(svc.store.jobs(1, JobState.RUNNING)) == 4, "nothing of the failed batch reached the store"
    resp = svc.exchange(ExchangeRequest(HostInfo("h5", "h5"), 2, []), 3.0)
    assert len(resp.assignments) == 2, "the dispatcher was rebuilt from the store and goes on"
    assert {i.state for i in svc.store.instances_of(resp.assignments[0].job_id)} >= {InstanceState.RUNNING}


def test_a_landed_batch_is_freed_at_once_not_left_to_the_collector(tmp_path):
    """A batch applied on the writer thread leaves no reference cycle behind: its changes (thousands of objects
    an exchange at full speed) are freed when it lands. A cycle through the writer's future kept each batch
    until the collector's oldest generation came round, whose passes grew with the bag: dispatch fell from
    43,800 to 30,300 jobs/s between the first 200,000 results of a bag and results 2,000,000 to 2,200,000."""
    svc = service(tmp_path)
    svc.submit(parse_spec(sweep("w", 400), "w.toml", "w"), None, {}, 0.0)
    told: list[BaseException | None] = []
    posted: list = []
    gc.collect()
    gc.disable()
    try:
        for n in range(3):
            _, changes = svc.decide(ExchangeRequest(HostInfo(f"h{n}", f"h{n}"), 50, []), 1.0)
            svc.stage(changes, told.append)
            svc.flush_async(posted.append)
            deadline = time.monotonic() + 10
            while not posted and time.monotonic() < deadline:
                time.sleep(0.01)
            for cb in posted:  # the event loop's turn: the batch settles, its waiter is told
                cb()
            posted.clear()
        del changes
        assert told == [None] * 3
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, (Changes, JobUpdate))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not left, f"{len(left)} objects of landed batches were only freed by the collector"
