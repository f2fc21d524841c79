"""Bad input from the network against the BOINC side of a volunteer pool (gridbot.volunteer), found by a review
of the port (2026-11-27). Each test failed on the code before its fix.

In-process, as tests/unit/test_security_review.py drives the door: the pool's aiohttp application behind
aiohttp's test client, over a MemoryStore service; no BOINC client, no server process (the stock client's
own runs are tests/integration/test_volunteer.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gridbot.core.config import DispatchConfig
from gridbot.model.pools import parse_pools
from gridbot.model.spec import parse_spec
from gridbot.server.app import Server
from gridbot.server.service import Service, ServiceConfig
from gridbot.store.memory import MemoryStore
from gridbot.volunteer.accounts import AccountBook, Accounts, Hosts, save_accounts
from gridbot.volunteer.request import parse_request
from gridbot.volunteer.server import VolunteerPool
from gridbot.volunteer.signing import Tokens, load_or_make_signer

WORK_RE = re.compile(r"<file_info>\s*<name>(gb\d+_[0-9a-f]{8})_out</name>.*?<max_nbytes>(\d+)</max_nbytes>\s*"
                     r"<xml_signature>\s*([0-9a-f]+)\s*</xml_signature>", re.S)


def _pool(tmp: Path, jobs: int = 2, max_result_bytes: int | None = None) -> tuple[Service, VolunteerPool, str]:
    """A volunteer pool over a fresh in-memory service with a bag of `jobs` jobs and one live account."""
    config = ServiceConfig(dispatch=DispatchConfig(max_result_bytes=max_result_bytes)) if max_result_bytes else None
    service = Service(MemoryStore(), config) if config else Service(MemoryStore())
    [spec] = parse_pools('[pools.v]\nkind = "volunteer"\nport = 8471\n', "p.toml")
    accounts = Accounts()
    key = accounts.add("alice", 0.0)
    save_accounts(tmp / "volunteers.json", accounts)
    pool = VolunteerPool(Server(service), spec, tmp / "v", AccountBook(tmp / "volunteers.json"),
                         Hosts(tmp / "hosts.json"), load_or_make_signer(tmp), Tokens.load_or_make(tmp), "127.0.0.1")
    bag = parse_spec(f'command = "echo {{i}}"\noutputs = ["o"]\n[parameters]\ni = {{ from = 1, to = {jobs} }}\n',
                     "s.toml", "s")
    service.submit(bag, None, {}, time.time())
    return service, pool, key


def _request(key: str, hostid: int = 0, ncpus: int = 1, work: float = 100.0, extra: str = "") -> bytes:
    return (f"<scheduler_request>\n<authenticator>{key}</authenticator>\n<hostid>{hostid}</hostid>\n"
            f"<platform_name>x86_64-pc-linux-gnu</platform_name>\n<work_req_seconds>{work}</work_req_seconds>\n"
            f"<cpu_req_instances>{ncpus if work else 0}</cpu_req_instances>\n"
            f"<host_info><host_cpid>cpid-a</host_cpid><p_ncpus>{ncpus}</p_ncpus></host_info>\n{extra}"
            "</scheduler_request>\n").encode()


def _header(name: str, token: str, max_nbytes: int | str, nbytes: int, offset: int = 0, md5: str = "") -> bytes:
    return (f"<data_server_request>\n<core_client_major_version>7</core_client_major_version>\n<file_upload>\n"
            f"<file_info>\n<name>{name}</name>\n<xml_signature>\n{token}\n</xml_signature>\n"
            f"<max_nbytes>{max_nbytes}</max_nbytes>\n</file_info>\n<nbytes>{nbytes}</nbytes>\n"
            f"<md5_cksum>{md5}</md5_cksum>\n<offset>{offset}</offset>\n<data>\n").encode()


def _result_file(output: bytes) -> bytes:
    """What the wrapper uploads: a result with one output file."""
    return (b"gridbot-result 1\nstatus 0\nfile stdout 0\n\nfile stderr 0\n\n"
            + f"file 0 {len(output)}\n".encode() + output + b"\nend\n")


def _run(coro):  # no pytest-asyncio in the venv
    return asyncio.run(coro)


async def _first_work(c: TestClient, key: str, ncpus: int = 1) -> tuple[int, list[tuple[str, int, str]]]:
    """A first scheduler RPC: the host id and each result's (name, upload limit, upload token)."""
    r = await c.post("/scheduler", data=_request(key, ncpus=ncpus, work=1000.0))
    reply = await r.text()
    assert r.status == 200, reply
    hostid = int(re.search(r"<hostid>(\d+)</hostid>", reply).group(1))  # type: ignore[union-attr]
    works = [(n, int(m), t) for n, m, t in WORK_RE.findall(reply)]
    assert works, reply
    return hostid, works


# -- 1. one scheduler RPC holds every reported result in memory at once ----------------------------------------


def test_one_scheduler_rpc_holds_no_more_results_in_memory_than_an_exchange_may(tmp_path):
    """`_exchange` reads the upload of every reported result (up to 5,000) before `_answer` splits them into
    parts of `max_result_bytes`: N results of 16 MB (the default) are N x 16 MB in memory, and as much again in
    the msgspec round trip. A volunteer that says it has many CPUs holds many instances and can exhaust the
    server's memory with one request. (Scaled down: 40 results of 60 KB under a limit of 64 KB.) Now a request's
    reports are taken up to about the limit, the others left unacknowledged for the next request, which the
    client is told to make at once; every result arrives, over several requests."""
    limit, n = 64 << 10, 40
    service, pool, key = _pool(tmp_path, jobs=n, max_result_bytes=limit)
    held: list[int] = []
    real = pool._exchange

    def spy(*args, **kwargs):
        exchange, foreign, deferred = real(*args, **kwargs)
        held.append(sum(r.result_bytes for r in exchange.reports))
        return exchange, foreign, deferred

    pool._exchange = spy  # type: ignore[method-assign]
    data = _result_file(b"y" * (limit - 4096))

    async def go() -> tuple[int, int, bool]:
        async with TestClient(TestServer(pool.app)) as c:
            hostid, works = await _first_work(c, key, ncpus=n)
            assert len(works) == n
            for name, max_nbytes, token in works:
                r = await c.post("/file_upload_handler", data=_header(f"{name}_out", token, max_nbytes, len(data),
                                                                      md5=hashlib.md5(data).hexdigest()) + data)
                assert "<status>0</status>" in await r.text()
            left, requests, prompt = [name for name, _, _ in works], 0, True
            while left and requests < n:
                reports = "".join(f"<result><name>{name}</name><state>5</state><exit_status>0</exit_status>"
                                  "</result>" for name in left)
                r = await c.post("/scheduler", data=_request(key, hostid, n, 100.0, reports))  # and asks for more
                reply = await r.text()
                assert r.status == 200, reply
                acked = set(re.findall(r"<result_ack>\s*<name>([^<]+)</name>", reply))
                left = [name for name in left if name not in acked]
                # told to come back at once, and no minimum delay (no work was left to give) holding it back
                prompt &= not left or ("<next_rpc_delay>1</next_rpc_delay>" in reply and "<request_delay>" not in reply)
                requests += 1
            return requests, len(left), prompt

    requests, left, prompt = _run(go())
    assert left == 0 and requests > 1 and prompt
    assert max(held) <= 2 * limit, (f"one scheduler request made the server hold {max(held):,} bytes of results at "
                                    f"once ({max(held) / limit:.0f} x max_result_bytes = {limit:,})")
    row = service.store.bag(1)
    assert row is not None and row.counts.done == n


# -- 2. a stranger's scheduler request is read whole (16 MB, no time limit) before its key is checked -------------


def test_a_request_with_a_bad_key_is_answered_without_waiting_for_its_whole_body(tmp_path):
    """The key is looked for in the first 64 KB, but only after `request.read()` took the whole body: an
    unauthenticated sender pins up to 16 MB per connection for as long as it keeps the body open (no read
    timeout), so a few hundred slow connections exhaust the server's memory."""
    _, pool, _ = _pool(tmp_path)
    head = _request("0" * 52).removesuffix(b"</scheduler_request>\n") + b"<x/>" * 4096

    async def go() -> bool:
        async with TestClient(TestServer(pool.app)) as c:
            gate = asyncio.Event()

            async def body():
                yield head
                await gate.wait()  # the rest of a 16 MB body, never sent in time
                yield b"</scheduler_request>\n"

            task = asyncio.create_task(c.post("/scheduler", data=body()))
            done, _ = await asyncio.wait({task}, timeout=3)
            gate.set()
            r = await task
            await r.read()
            return bool(done)

    assert _run(go()), "a request whose first 64 KB carry a bad account key was held until its body ended"


# -- 3. concurrent work on one resumable upload: a 500 ------------------------------------------------------------


@pytest.mark.parametrize("meanwhile", ["report", "second upload"])
def test_a_large_upload_overtaken_by_a_report_or_a_second_upload_is_not_a_500(tmp_path, meanwhile, caplog):
    """`_receive` writes `NAME.part` across awaits. If the result is reported meanwhile (`_forget` unlinks the part)
    or a second upload of the same file completes first (`os.replace` moves it), the first upload ends with
    FileNotFoundError at `part.read_bytes()`: 500 and a traceback in the log. Two concurrent uploads also write
    through one inode: the first can write into the file the second has already checked and renamed."""
    _, pool, key = _pool(tmp_path)
    data = b"z" * (2 << 20)  # over SPOOLED_UPLOAD_BYTES: a file in the upload folder, not the spool
    md5 = hashlib.md5(data).hexdigest()

    async def go() -> int:
        async with TestClient(TestServer(pool.app)) as c:
            hostid, [(name, max_nbytes, token), *_] = await _first_work(c, key)
            gate = asyncio.Event()

            async def body():
                yield _header(f"{name}_out", token, max_nbytes, len(data), md5=md5) + data[:1 << 20]
                await gate.wait()
                yield data[1 << 20:]

            first = asyncio.create_task(c.post("/file_upload_handler", data=body()))
            await asyncio.sleep(0.3)
            if meanwhile == "report":
                rep = f"<result><name>{name}</name><state>3</state><exit_status>1</exit_status></result>"
                await (await c.post("/scheduler", data=_request(key, hostid, 1, 0.0, rep))).read()
            else:
                r = await c.post("/file_upload_handler",
                                 data=_header(f"{name}_out", token, max_nbytes, len(data), md5=md5) + data)
                await r.read()
            gate.set()
            r = await first
            await r.read()
            return r.status

    with caplog.at_level(logging.ERROR, logger="gridbot.volunteer"):
        status = _run(go())
    assert status != 500 and "internal error" not in caplog.text, caplog.text[-2000:]


# -- 4. the DOCTYPE check refuses requests that declare nothing -----------------------------------------------


def test_a_doctype_in_the_text_of_a_results_stderr_does_not_refuse_the_request():
    """`<!doctype`/`<!entity` is looked for anywhere in the body, so a result whose stderr (a CDATA section the
    client copies from the task's stderr.txt) holds that text makes the request a 400; the client sends the
    same report at every RPC, so that host can neither report nor get work again."""
    body = (b"<scheduler_request><authenticator>k</authenticator><result><name>gb1_00000000</name><state>3</state>"
            b"<stderr_out><![CDATA[<stderr_txt>\n<!DOCTYPE html><html>502 Bad Gateway</html>\n</stderr_txt>]]>"
            b"</stderr_out></result></scheduler_request>")
    req = parse_request(body)
    assert "502 Bad Gateway" in req.results[0].stderr_out


def test_a_doctype_is_still_refused_wherever_it_hides():
    """The fix for the test above must keep refusing real declarations (this passes today: keep it passing)."""
    from gridbot.volunteer.request import RequestError

    for body in (b'<!DOCTYPE x [<!ENTITY a "b">]><scheduler_request>&a;</scheduler_request>',
                 b'<!-- <scheduler_request --><!DOCTYPE x [<!ENTITY a "b">]><scheduler_request>'
                 b"<authenticator>&a;</authenticator></scheduler_request>",
                 b"<?xml version='1.0'?>\n<!doctype scheduler_request SYSTEM 'http://127.0.0.1:9/x'>"
                 b"<scheduler_request><authenticator>k</authenticator></scheduler_request>"):
        with pytest.raises(RequestError):
            parse_request(body)


# -- 5. the reply echoes whatever names a request reports -------------------------------------------------------


def test_the_reply_acknowledges_only_results_the_server_made(tmp_path):
    """Every reported `<name>` is echoed in a `<result_ack>` (64 KB each, raw `&` escaped to five bytes: a 3.6 MB
    request gets an 18 MB reply), including names no server made and control characters the reply's XML may not
    hold."""
    _, pool, key = _pool(tmp_path)
    junk = "".join("<result><name>" + "&" * 60_000 + "</name></result>" for _ in range(20))

    async def go() -> tuple[int, int, int]:
        async with TestClient(TestServer(pool.app)) as c:
            body = _request(key, work=0.0, extra=junk)
            r = await c.post("/scheduler", data=body)
            return r.status, len(body), len(await r.read())

    status, sent, got = _run(go())
    assert status == 200
    assert got < sent, f"a request of {sent:,} bytes got a reply of {got:,} bytes (acks of names no server made)"


def test_an_accounts_request_that_never_ends_or_grows_past_the_limit_is_refused(tmp_path, monkeypatch):
    """Once the key is accepted the rest is read with a limit of size (a chunked body declares none) and of time."""
    import gridbot.volunteer.server as volunteer_server

    monkeypatch.setattr(volunteer_server, "IDLE_SECONDS", 0.5)
    monkeypatch.setattr(volunteer_server, "MAX_REQUEST_BYTES", 1 << 20)
    _, pool, key = _pool(tmp_path)
    head = _request(key).removesuffix(b"</scheduler_request>\n")

    async def go() -> tuple[int, int]:
        async with TestClient(TestServer(pool.app)) as c:
            gate = asyncio.Event()

            async def slow():
                yield head
                await gate.wait()
                yield b"</scheduler_request>\n"

            async def huge():
                yield head
                for _ in range(40):
                    yield b"<x/>" * 8192

            task = asyncio.create_task(c.post("/scheduler", data=slow()))
            done, _ = await asyncio.wait({task}, timeout=5)
            gate.set()
            slow_status = (await task).status
            assert done, "the slow request was not answered in time"
            r = await c.post("/scheduler", data=huge())
            await r.read()
            return slow_status, r.status

    assert _run(go()) == (408, 413)


def test_unclosed_cdata_is_read_in_one_pass():
    """Found by review: the loose parser's check removed CDATA sections with a regular expression that took
    quadratic time on a body of unclosed `<![CDATA[` (4.5 s for 108 KB, on the server's event loop; 16 MB would
    have taken hours)."""
    from gridbot.volunteer.request import _without_cdata

    assert _without_cdata("a<![CDATA[<!DOCTYPE x>]]>b<![CDATA[c]]>d") == "abd"
    assert _without_cdata("a<![CDATA[x]]>b<![CDATA[never closed") == "ab"
    body = b"<scheduler_request><authenticator>k</authenticator>" + b"<![CDATA[" * 20_000
    assert parse_request(body).authenticator == "k"


def test_a_stalled_upload_keeps_what_came_and_frees_its_file_for_the_next_try(tmp_path, monkeypatch):
    import gridbot.volunteer.server as volunteer_server

    monkeypatch.setattr(volunteer_server, "IDLE_SECONDS", 0.5)
    _, pool, key = _pool(tmp_path)
    data = b"z" * (2 << 20)
    md5 = hashlib.md5(data).hexdigest()

    async def go() -> tuple[str, str]:
        async with TestClient(TestServer(pool.app)) as c:
            _, [(name, max_nbytes, token), *_] = await _first_work(c, key)
            gate = asyncio.Event()

            async def stalls():
                yield _header(f"{name}_out", token, max_nbytes, len(data), md5=md5) + data[:1 << 20]
                await gate.wait()

            r = await asyncio.wait_for(c.post("/file_upload_handler", data=stalls()), 10)
            first = await r.text()
            gate.set()
            r = await c.post("/file_upload_handler",
                             data=_header(f"{name}_out", token, max_nbytes, len(data), 1 << 20, md5) + data[1 << 20:])
            return first, await r.text()

    first, second = _run(go())
    assert "<status>1</status>" in first and "resume" in first
    assert "<status>0</status>" in second, second


def test_an_upload_whose_header_stalls_is_answered(tmp_path, monkeypatch):
    """Anyone may open the upload door: a header that never ends held the connection for as long as it stayed
    open (found in the last read of the idle-timeout fix)."""
    import gridbot.volunteer.server as volunteer_server

    monkeypatch.setattr(volunteer_server, "IDLE_SECONDS", 0.5)
    _, pool, _ = _pool(tmp_path)

    async def go() -> int:
        async with TestClient(TestServer(pool.app)) as c:
            gate = asyncio.Event()

            async def stalls():
                yield b"<data_server_request>\n<core_client_major_version>7</core_client_major_version>\n"
                await gate.wait()

            r = await asyncio.wait_for(c.post("/file_upload_handler", data=stalls()), 10)
            gate.set()
            return r.status

    assert _run(go()) == 408


def test_an_upload_header_with_a_negative_offset_is_told_so(tmp_path):
    """Audit: `<offset>-1</offset>` was answered "offset -1 is past the 0 bytes received"."""
    _, pool, key = _pool(tmp_path)

    async def go() -> list[tuple[int, str]]:
        async with TestClient(TestServer(pool.app)) as c:
            _, [(name, max_nbytes, token), *_] = await _first_work(c, key)
            out = []
            for offset in (-1, 5):
                header = _header(f"{name}_out", token, max_nbytes, 1, offset)
                r = await c.post("/file_upload_handler", data=header + b"x")
                out.append((r.status, await r.text()))
            return out

    negative, past = _run(go())
    assert negative[0] == 400 and "offset -1 is negative: an upload resumes at 0 or more" in negative[1], negative
    assert past[0] == 400 and "offset 5 is past the 0 bytes received" in past[1], past


def test_an_upload_header_with_a_huge_size_is_answered_in_a_few_digits(tmp_path):
    """Audit: `<nbytes>1e300</nbytes>` got a 413 that echoed a 301-digit number."""
    _, pool, key = _pool(tmp_path)

    async def go() -> list[tuple[int, str]]:
        async with TestClient(TestServer(pool.app)) as c:
            _, [(name, max_nbytes, token), *_] = await _first_work(c, key)
            out = []
            for nbytes in ("1e300", "-1e300"):
                header = _header(f"{name}_out", token, max_nbytes, 0).replace(
                    b"<nbytes>0</nbytes>", f"<nbytes>{nbytes}</nbytes>".encode())
                r = await c.post("/file_upload_handler", data=header + b"x")
                out.append((r.status, await r.text()))
            return out

    huge, below = _run(go())
    assert huge[0] == 413 and "a file of 1e+300 bytes is over its limit of" in huge[1], huge
    assert below[0] == 400 and "nbytes is -1e+300: a file's size is 0 or more" in below[1], below
    assert not re.search(r"\d{20}", huge[1] + below[1])
