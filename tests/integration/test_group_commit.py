"""Group commit: exchanges decided together share one transaction, nothing is answered before it is
durable, and a failed transaction fails every exchange in it and leaves the store as it was."""

from __future__ import annotations

import asyncio

import aiohttp
import msgspec
import pytest

from gridbot.core.changes import Changes, JobUpdate
from gridbot.core.config import DispatchConfig
from gridbot.errors import ServerUnavailable
from gridbot.model.records import HostInfo, InstanceReport, Outcome
from gridbot.model.spec import parse_spec
from gridbot.model.states import JobState
from gridbot.protocol import MSGPACK, ExchangeRequest, ExchangeResponse
from gridbot.server.app import EmbeddedServer
from gridbot.server.service import Service, ServiceConfig
from gridbot.store.sql import SQLiteStore

SPEC = 'command = "true"\n[parameters]\ni = { from = 1, to = 40 }\n'


def host(n: int) -> HostInfo:
    return HostInfo(f"h{n}", f"h{n}", "Linux", 1, 0, 1, "local")


THREE_SLOTS = HostInfo("h3", "h3", "Linux", 3, 0, 3, "local")


def test_merge_keeps_a_result_that_a_later_update_leaves_out():
    first = Changes(jobs={1: JobUpdate(1, JobState.DONE, 0, 1, "", 7)})
    later = Changes(jobs={1: JobUpdate(1, JobState.DONE, 1, 1, "late report failed", None)})
    merged = first.merge(later)
    assert merged.jobs[1].result_instance == 7 and merged.jobs[1].reason == "late report failed"


def test_staged_exchanges_share_one_transaction_and_are_durable_after_it(tmp_path):
    store = SQLiteStore(tmp_path / "g.db")
    store.migrate()
    service = Service(store)
    service.submit(parse_spec(SPEC, "s.toml", "s"), None, {}, 0.0)
    told: list[BaseException | None] = []
    answers = []
    for n in range(5):
        resp, changes = service.decide(ExchangeRequest(host(n), 1, []), 1.0)
        service.stage(changes, told.append)
        answers.append(resp)
    assert told == [], "nothing is durable, so nobody may be answered yet"
    before = service.batches
    service.flush()
    assert service.batches == before + 1 and told == [None] * 5
    sent = [a.assignments[0].instance_id for a in answers]
    assert all(store.instances_of(a.assignments[0].job_id)[0].instance_id == i for a, i in zip(answers, sent,
                                                                                                 strict=True))


def test_a_window_refills_from_committed_rows_without_flushing_staged_exchanges(tmp_path):
    store = SQLiteStore(tmp_path / "g.db")
    store.migrate()
    service = Service(store, ServiceConfig(dispatch=DispatchConfig(buffer_size=4)))
    service.submit(parse_spec(SPEC, "s.toml", "s"), None, {}, 0.0)
    told: list[BaseException | None] = []
    resp, changes = service.decide(ExchangeRequest(THREE_SLOTS, 3, []), 1.0)
    service.stage(changes, told.append)
    assert [a.index for a in resp.assignments] == [0, 1, 2]
    service.feed()
    assert told == [], "the refill reads after the window's cursor: the staged batch need not land first"
    [bag] = service.dispatcher._s.bags.values()  # the window's jobs themselves
    assert [j.index for j in bag.window.buffer] == [3, 4, 5, 6], "the sent jobs, not yet stored, are not re-read"
    service.flush()
    assert told == [None] and store.bag("s").counts.running == 3


def test_a_window_read_again_from_its_start_waits_for_staged_exchanges(tmp_path):
    store = SQLiteStore(tmp_path / "g.db")
    store.migrate()
    service = Service(store, ServiceConfig(dispatch=DispatchConfig(buffer_size=4)))
    service.submit(parse_spec(SPEC, "s.toml", "s"), None, {}, 0.0)
    _, changes = service.decide(ExchangeRequest(THREE_SLOTS, 3, []), 1.0)
    told: list[BaseException | None] = []
    service.stage(changes, told.append)
    [bag] = service.dispatcher._s.bags.values()
    bag.window.reset()  # what parking a window does
    service.feed()
    assert told == [None], "read over jobs already sent: the staged batch landed first"
    assert [j.index for j in bag.window.buffer] == [3], "no sent job came back into the window"


def test_a_failed_transaction_fails_every_exchange_in_it_and_stores_none(tmp_path, monkeypatch):
    store = SQLiteStore(tmp_path / "g.db")
    store.migrate()
    service = Service(store)
    service.submit(parse_spec(SPEC, "s.toml", "s"), None, {}, 0.0)
    told: list[BaseException | None] = []
    for n in range(3):
        _, changes = service.decide(ExchangeRequest(host(n), 1, []), 1.0)
        service.stage(changes, told.append)

    def broken(changes):
        raise OSError("disk full")

    monkeypatch.setattr(store, "apply", broken)
    with pytest.raises(ServerUnavailable):
        service.flush()
    assert len(told) == 3 and all(isinstance(e, ServerUnavailable) for e in told)
    monkeypatch.undo()
    assert store.jobs(1, JobState.RUNNING) == [], "nothing of the failed batch reached the store"
    resp = service.exchange(ExchangeRequest(host(9), 1, []), 2.0)
    assert len(resp.assignments) == 1, "the dispatcher was rebuilt from the store and goes on"


def test_concurrent_exchanges_over_http_are_grouped(tmp_path):
    store = SQLiteStore(tmp_path / "g.db")
    store.migrate()
    service = Service(store)
    service.submit(parse_spec(SPEC, "s.toml", "s"), None, {}, 0.0)
    server = EmbeddedServer(service)
    server.start()
    url = f"http://127.0.0.1:{server.port}/v1/exchange"
    enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(ExchangeResponse)
    hosts = [server.host_credential() for _ in range(20)]

    async def one(session: aiohttp.ClientSession, n: int, reports: list[InstanceReport], held: list[int]):
        host_id, credential = hosts[n]
        body = enc.encode(ExchangeRequest(HostInfo(host_id, f"h{n}", "Linux", 1, 0, 1, "local"), 1, held, reports))
        async with session.post(url, data=body, headers={"Content-Type": MSGPACK,
                                                         "Authorization": f"Bearer {credential}"}) as r:
            assert r.status == 200
            return dec.decode(await r.read())

    async def main() -> int:
        async with aiohttp.ClientSession() as session:
            first = await asyncio.gather(*(one(session, n, [], []) for n in range(20)))
            before = service.batches
            reports = [[InstanceReport(a.assignments[0].instance_id, Outcome.SUCCESS, 0, 1.0, 1.0)] for a in first]
            await asyncio.gather(*(one(session, n, reports[n], []) for n in range(20)))
            return service.batches - before

    try:
        batches = asyncio.run(main())
    finally:
        server.stop()
    print(f"20 concurrent exchanges took {batches} transactions")
    assert batches < 20, "twenty exchanges arriving together must not take twenty transactions"
    assert len(store.jobs(1, JobState.DONE, limit=100)) == 20, "every acknowledged result is in the store"
