"""A security review of the volunteer door (gridbot.volunteer) and the web console: each test is a finding,
written as a strict xfail so that it fails (XPASS, strict) once the bug is fixed and the mark can go.

Unit level only: the volunteer pool's aiohttp application is driven with aiohttp's test client, in this
process, with a MemoryStore service; no BOINC client, no browser."""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gridbot.model.pools import parse_pools
from gridbot.model.spec import parse_spec
from gridbot.server.app import Server
from gridbot.server.service import Service
from gridbot.store.memory import MemoryStore
from gridbot.volunteer.accounts import AccountBook, Accounts, Hosts, save_accounts
from gridbot.volunteer.request import RequestError, parse_request
from gridbot.volunteer.server import VolunteerPool
from gridbot.volunteer.signing import Tokens, load_or_make_signer


def _pool(tmp: Path) -> tuple[Service, VolunteerPool, str]:
    """A volunteer pool over a fresh in-memory service, with one live account (its key returned)."""
    service = Service(MemoryStore())
    server = Server(service)
    [spec] = parse_pools('[pools.v]\nkind = "volunteer"\nport = 8471\n', "p.toml")
    accounts = Accounts()
    key = accounts.add("alice", 0.0)
    save_accounts(tmp / "volunteers.json", accounts)
    pool = VolunteerPool(server, spec, tmp / "v", AccountBook(tmp / "volunteers.json"), Hosts(tmp / "hosts.json"),
                         load_or_make_signer(tmp), Tokens.load_or_make(tmp), "127.0.0.1")
    return service, pool, key


def _request(key: str, hostid: int = 0, work: float = 100.0, extra: str = "") -> bytes:
    return (f"<scheduler_request>\n<authenticator>{key}</authenticator>\n<hostid>{hostid}</hostid>\n"
            f"<platform_name>x86_64-pc-linux-gnu</platform_name>\n<work_req_seconds>{work}</work_req_seconds>\n"
            f"<host_info><host_cpid>cpid-a</host_cpid><p_ncpus>1</p_ncpus></host_info>\n{extra}"
            "</scheduler_request>\n").encode()


def _run(coro):  # no pytest-asyncio in the venv
    return asyncio.run(coro)


# -- 1. unauthenticated CPU denial of service: quadratic regular expressions on the event loop -------------


def test_a_malformed_scheduler_request_is_read_in_linear_time():
    body = b"<scheduler_request>" + b"<result>" * 6000  # 48 KB, well under the 16 MB a request may be
    started = time.perf_counter()
    with pytest.raises(RequestError):  # no authenticator: refused, as it should be, but only after the scans
        parse_request(body)
    assert time.perf_counter() - started < 1.0  # (linear: milliseconds; the quadratic scans took seconds)


def test_an_upload_header_of_unclosed_tags_is_refused_quickly(tmp_path):
    _, pool, _ = _pool(tmp_path)

    async def go() -> tuple[int, float]:
        async with TestClient(TestServer(pool.app)) as c:
            body = b"<file_info>" + b"<name>" * 9000 + b"<data>\n"
            started = time.perf_counter()
            r = await c.post("/file_upload_handler", data=body)
            await r.read()
            return r.status, time.perf_counter() - started

    status, seconds = _run(go())
    assert 400 <= status < 500
    assert seconds < 1.0, f"one 54 KB upload header held the event loop for {seconds:.1f} s"  # (was 2 s and more)


def test_a_large_request_with_a_bad_account_key_is_refused_cheaply(tmp_path, monkeypatch):
    """(Checked by what runs, not by time: the whole body is never parsed for a stranger.)"""
    from gridbot.volunteer import server as door

    _, pool, _ = _pool(tmp_path)
    body = _request("0" * 52, extra="<x/>" * (2 << 20))  # 8 MB: half of what a request may be
    parsed: list[int] = []
    real = door.parse_request
    monkeypatch.setattr(door, "parse_request", lambda b: parsed.append(len(b)) or real(b))

    async def go() -> tuple[int, str]:
        async with TestClient(TestServer(pool.app)) as c:
            r = await c.post("/scheduler", data=body)
            return r.status, await r.text()

    status, text = _run(go())
    assert "Invalid or revoked account key" in text or status in (400, 401, 403, 413)
    assert parsed == [], "an 8 MB scheduler request with a bad account key was parsed whole before the check"


# -- 2. a 500 from an unauthenticated request ----------------------------------------------------------------


@pytest.mark.parametrize("field", ["max_nbytes", "nbytes", "offset"])
def test_an_upload_header_with_an_infinite_size_is_a_4xx(tmp_path, field):
    _, pool, _ = _pool(tmp_path)
    values = {"max_nbytes": "100", "nbytes": "1", "offset": "0", field: "1e999"}
    body = (f"<file_info><name>gb1_00000000_out</name><max_nbytes>{values['max_nbytes']}</max_nbytes>"
            f"<xml_signature>x</xml_signature></file_info><nbytes>{values['nbytes']}</nbytes>"
            f"<md5_cksum>x</md5_cksum><offset>{values['offset']}</offset><data>\nx").encode()

    async def go() -> int:
        async with TestClient(TestServer(pool.app)) as c:
            r = await c.post("/file_upload_handler", data=body)
            await r.read()
            return r.status

    assert 400 <= _run(go()) < 500


# -- 3. uploads outlive their result: tokens never expire --------------------------------------------------


def _work(reply: str) -> tuple[str, int, str]:
    """The first result's name, its output's size limit and upload token, from a scheduler reply."""
    m = re.search(r"<file_info>\s*<name>(gb\d+_[0-9a-f]{8})_out</name>.*?<max_nbytes>(\d+)</max_nbytes>\s*"
                  r"<xml_signature>\s*([0-9a-f]+)\s*</xml_signature>", reply, re.S)
    assert m is not None, reply
    return m.group(1), int(m.group(2)), m.group(3)


def _upload(name: str, max_nbytes: int, token: str, data: bytes) -> bytes:
    return (f"<data_server_request>\n<core_client_major_version>7</core_client_major_version>\n<file_upload>\n"
            f"<file_info>\n<name>{name}_out</name>\n<max_nbytes>{max_nbytes}</max_nbytes>\n"
            f"<xml_signature>\n{token}\n</xml_signature>\n</file_info>\n<nbytes>{len(data)}</nbytes>\n"
            f"<md5_cksum>{hashlib.md5(data).hexdigest()}</md5_cksum>\n<offset>0</offset>\n<data>\n").encode() + data


def test_an_upload_for_a_result_already_reported_is_refused(tmp_path):
    service, pool, key = _pool(tmp_path)
    spec = parse_spec('command = "echo {i}"\noutputs = ["o"]\n[parameters]\ni = { from = 1, to = 2 }\n', "s.toml", "s")
    service.submit(spec, None, {}, time.time())
    result = b"gridbot-result 1\nstatus 0\nfile stdout 0\n\nfile stderr 0\n\nfile 0 2\nok\nend\n"

    async def go() -> tuple[str, int, str, bool]:
        async with TestClient(TestServer(pool.app)) as c:
            r = await c.post("/scheduler", data=_request(key))
            reply = await r.text()
            hostid = int(re.search(r"<hostid>(\d+)</hostid>", reply).group(1))
            name, max_nbytes, token = _work(reply)
            r = await c.post("/file_upload_handler", data=_upload(name, max_nbytes, token, result))
            assert "<status>0</status>" in await r.text()
            report = (f"<result><name>{name}</name><state>5</state><exit_status>0</exit_status>"
                      "<final_cpu_time>1</final_cpu_time><final_elapsed_time>1</final_elapsed_time></result>")
            r = await c.post("/scheduler", data=_request(key, hostid, 0.0, report))
            assert f"<result_ack>\n    <name>{name}</name>" in await r.text()
            assert not (pool.uploads / f"{name}_out").exists()  # reported: its upload was removed
            # the same upload again, after the result ended
            r = await c.post("/file_upload_handler", data=_upload(name, max_nbytes, token, b"x" * 1000))
            return await r.text(), r.status, name, (pool.uploads / f"{name}_out").exists()

    text, status, name, kept = _run(go())
    assert not kept, f"an upload for ended result {name} was kept ({status}: {text.strip()})"
    assert "<status>-1</status>" in text


# -- 4. the DOCTYPE check looks at the first 4 KB only --------------------------------------------------------


def test_a_doctype_after_four_kilobytes_is_refused():
    body = (b"<?xml version='1.0'?><!--" + b"x" * 5000 + b"--><!DOCTYPE scheduler_request SYSTEM "
            b"'http://127.0.0.1:9/x.dtd'><scheduler_request><authenticator>k</authenticator></scheduler_request>")
    with pytest.raises(RequestError):
        parse_request(body)


# -- 5. one BOINC client attached to two volunteer pools of one server -------------------------------------


def test_a_client_attached_to_two_volunteer_pools_keeps_the_jobs_of_both(tmp_path):
    service = Service(MemoryStore())
    server = Server(service)
    specs = parse_pools('[pools.a]\nkind = "volunteer"\nport = 8471\n[pools.b]\nkind = "volunteer"\nport = 8472\n',
                        "p.toml")
    accounts = Accounts()
    key = accounts.add("alice", 0.0)
    save_accounts(tmp_path / "volunteers.json", accounts)
    book, hosts = AccountBook(tmp_path / "volunteers.json"), Hosts(tmp_path / "hosts.json")
    signer, tokens = load_or_make_signer(tmp_path), Tokens.load_or_make(tmp_path)
    a, b = (VolunteerPool(server, spec, tmp_path / spec.name, book, hosts, signer, tokens, "127.0.0.1")
            for spec in specs)
    spec = parse_spec('command = "echo {i}"\n[parameters]\ni = { from = 1, to = 8 }\n', "s.toml", "s")
    service.submit(spec, None, {}, time.time())

    async def go() -> list[tuple[int, str | None]]:
        async with TestClient(TestServer(a.app)) as ca, TestClient(TestServer(b.app)) as cb:
            r = await ca.post("/scheduler", data=_request(key))  # project A: a new host, work
            reply = await r.text()
            held = [int(n) for n in re.findall(r"<result>\s*<name>gb(\d+)_", reply)]
            assert held, reply
            hostid = int(re.search(r"<hostid>(\d+)</hostid>", reply).group(1))
            others = "<other_results>" + "".join(f"<other_result><name>{n}</name></other_result>" for n in
                                                 re.findall(r"<result>\s*<name>(gb\d+_[0-9a-f]{8})</name>", reply))
            # A again, acknowledging what it holds (the answer reached it), then B for the first time
            await (await ca.post("/scheduler", data=_request(key, hostid, 0.0, others + "</other_results>"))).read()
            await (await cb.post("/scheduler", data=_request(key, 0, 100.0))).read()
            view = service.dispatcher.view
            states = {iid: (i.state.value if (i := view.instance(iid)) is not None else None) for iid in held}
            return [(iid, state) for iid, state in states.items() if state != "running"]

    lost = _run(go())
    assert not lost, f"project B's first RPC took back the instances the client runs for project A: {lost}"


# -- 6. the console's read-only SQLite connection, by a URI built from the path unquoted ---------------------


def test_the_console_reads_a_sqlite_store_in_a_folder_with_a_hash(tmp_path):
    from gridbot.server.aggregates import aggregates_of
    from gridbot.store.sql import SQLiteStore

    folder = tmp_path / "run#1"
    folder.mkdir()
    store = SQLiteStore(folder / "gridbot.db")
    store.migrate()
    service = Service(store)
    spec = parse_spec('command = "echo {i}"\n[parameters]\ni = { from = 1, to = 2 }\n', "s.toml", "s")
    info = service.submit(spec, None, {}, 1000.0)
    aggregates = aggregates_of(store)
    assert aggregates is not None
    try:
        aggregates.bag(info.bag_id, 1000.0, 10.0, 4)
    finally:
        aggregates.close()
        store.close()
    assert not (tmp_path / "run").exists(), "a stray database file was made beside the state folder"


# -- 7. one scheduler request may carry any number of full-size results ------------------------------------


def test_one_scheduler_request_carries_no_more_result_bytes_than_an_exchange_may(tmp_path):
    from gridbot.core.config import DispatchConfig
    from gridbot.server.service import ServiceConfig

    limit = 4096
    service = Service(MemoryStore(), ServiceConfig(dispatch=DispatchConfig(max_result_bytes=limit)))
    server = Server(service)
    [spec] = parse_pools('[pools.v]\nkind = "volunteer"\nport = 8471\n', "p.toml")
    accounts = Accounts()
    key = accounts.add("alice", 0.0)
    save_accounts(tmp_path / "volunteers.json", accounts)
    pool = VolunteerPool(server, spec, tmp_path / "v", AccountBook(tmp_path / "volunteers.json"),
                         Hosts(tmp_path / "hosts.json"), load_or_make_signer(tmp_path), Tokens.load_or_make(tmp_path),
                         "127.0.0.1")
    bag = parse_spec('command = "echo {i}"\noutputs = ["o"]\n[parameters]\ni = { from = 1, to = 12 }\n', "s.toml", "s")
    service.submit(bag, None, {}, time.time())
    seen: list[int] = []
    answer = server.answer

    async def spy(req):
        seen.append(sum(r.result_bytes for r in req.reports))
        seen.extend(r.result_bytes for r in req.reports)
        return await answer(req)

    server.answer = spy  # type: ignore[method-assign]
    output = b"y" * 130_000  # each over max_result_bytes, each within the upload's limit

    async def go() -> None:
        async with TestClient(TestServer(pool.app)) as c:
            wanted = _request(key).replace(b"<p_ncpus>1</p_ncpus>", b"<p_ncpus>12</p_ncpus>").replace(
                b"<work_req_seconds>", b"<cpu_req_instances>12</cpu_req_instances><work_req_seconds>")
            reply = await (await c.post("/scheduler", data=wanted)).text()
            hostid = int(re.search(r"<hostid>(\d+)</hostid>", reply).group(1))
            works = re.findall(r"<file_info>\s*<name>(gb\d+_[0-9a-f]{8})_out</name>.*?<max_nbytes>(\d+)</max_nbytes>\s*"
                               r"<xml_signature>\s*([0-9a-f]+)\s*</xml_signature>", reply, re.S)
            assert len(works) >= 10, reply[:2000]
            data = (b"gridbot-result 1\nstatus 0\nfile stdout 0\n\nfile stderr 0\n\n"
                    + f"file 0 {len(output)}\n".encode() + output + b"\nend\n")
            for name, max_nbytes, token in works:
                r = await c.post("/file_upload_handler", data=_upload(name, int(max_nbytes), token, data))
                assert "<status>0</status>" in await r.text()
            reports = "".join(f"<result><name>{name}</name><state>5</state><exit_status>0</exit_status></result>"
                              for name, _, _ in works)
            seen.clear()
            await (await c.post("/scheduler", data=_request(key, hostid, 0.0, reports))).read()

    _run(go())
    total, each = seen[0], seen[1:]
    assert total <= 2 * limit + (1 << 20), f"one scheduler request put {total:,} bytes of results in one exchange"
    assert max(each) <= limit, f"a result of {max(each):,} bytes was taken, over max_result_bytes = {limit:,}"
