"""Waiting for a bag's end: the server holds the request until the end is committed (`GET /v1/bags/{bag}/wait`),
so `Client.wait`, `gridbot wait` and `gridbot run` hear of it at once, without polling."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gridbot.client import ApiError, Client
from gridbot.core.changes import Changes
from gridbot.errors import ServerUnavailable
from gridbot.model.spec import parse_spec
from gridbot.security.access import read_access
from gridbot.server.app import EmbeddedServer
from gridbot.server.service import Service
from gridbot.store.sql import SQLiteStore
from tests.integration.harness import Cluster, gridbot


def _bag(tmp: Path, name: str, command: str, jobs: int = 1, extra: str = "") -> Path:
    spec = tmp / f"{name}.toml"
    spec.write_text(f'name = "{name}"\ncommand = "{command}"\n{extra}[parameters]\ni = {{ from = 1, to = {jobs} }}\n')
    return spec


def _held(cluster: Cluster, bag: str, hold: float) -> tuple[list[object], threading.Thread]:
    """A `wait` held by the server on another thread: ([the bag it answered with, seconds it took], thread)."""
    out: list[object] = []

    def ask() -> None:
        started = time.monotonic()
        with cluster.client() as c:
            out.append(c.bag_once_ended(bag, hold))
        out.append(time.monotonic() - started)

    thread = threading.Thread(target=ask)
    thread.start()
    return out, thread


def test_a_held_wait_is_answered_when_the_bag_ends_not_when_it_times_out(cluster: Cluster, tmp_path: Path):
    cluster.start_server()
    with cluster.client() as c:
        c.submit_file(_bag(tmp_path, "idle", "true"))
        started = time.monotonic()
        assert c.bag_once_ended("idle", 0.4).state == "active"  # no worker: still running when the time is up
        assert time.monotonic() - started >= 0.4
        assert c.bag_once_ended("idle", 0).state == "active"
        out, thread = _held(cluster, "idle", 25)
        time.sleep(0.5)
        assert thread.is_alive(), "held while the bag runs"
        assert c.cancel("idle").state == "cancelled"
        thread.join(10)
        info, took = out
        assert info.state == "cancelled" and took < 10  # type: ignore[attr-defined]
        started = time.monotonic()
        assert c.bag_once_ended("idle", 25).state == "cancelled"  # ended already: answered at once
        assert time.monotonic() - started < 5


def test_client_wait_returns_at_the_end_and_gives_progress_meanwhile(cluster: Cluster, tmp_path: Path):
    cluster.start_server()
    cluster.start_worker("--slots", "2")
    with cluster.client() as c:
        c.submit_file(_bag(tmp_path, "short", "sleep 0.2", jobs=6))
        seen: list[str] = []
        final = c.wait("short", poll=0.3, timeout=60, on_update=lambda b: seen.append(b.state))
        assert final.state == "completed" and final.counts.done == 6
        assert seen[-1] == "completed" and len(seen) >= 2
        c.submit_file(_bag(tmp_path, "later", "sleep 1"))
        started = time.monotonic()
        assert c.wait("later", timeout=60).state == "completed"
        assert time.monotonic() - started < 30  # not the server's 25 s hold: it answered at the end
        c.submit_file(_bag(tmp_path, "long", "sleep 30"))
        with pytest.raises(TimeoutError, match="still active"):
            c.wait("long", timeout=0.5)


def test_a_wait_with_a_bad_timeout_or_for_another_owners_bag_is_refused(cluster: Cluster, tmp_path: Path):
    cluster.start_server()
    with cluster.client() as c:
        c.submit_file(_bag(tmp_path, "b", "true"))
    key = read_access(cluster.access).submitter
    for bad in ("abc", "-1", "nan", "inf", ""):
        req = urllib.request.Request(f"{cluster.url}/v1/bags/b/wait?timeout={bad}",
                                     headers={"Authorization": f"Bearer {key}"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=10)
        body = json.loads(err.value.read())
        assert err.value.code == 400 and "timeout=" in body["error"] and "seconds from 0 to 30" in body["error"], bad
    bob = tmp_path / "bob.json"
    assert gridbot("access", "add-submitter", "bob", "--out", str(bob), "--access-file",
                   str(cluster.access)).returncode == 0
    from gridbot.client import Client

    with Client(cluster.url, access=bob) as b, pytest.raises(ApiError) as err:
        b.wait("b", timeout=1)
    assert err.value.status == 404 and "no bag" in str(err.value)


def test_a_wait_held_for_a_bag_that_is_deleted_meanwhile_says_there_is_no_bag_at_once(cluster: Cluster,
                                                                                        tmp_path: Path):
    """(The delete cancels the running bag first, and that commit already answers the held waits; the
    server also answers them after the delete itself, for a bag with nothing left to cancel.)"""
    cluster.start_server()
    with cluster.client() as c:
        c.submit_file(_bag(tmp_path, "gone2", "true"))
    errors: list[BaseException] = []

    def ask() -> None:
        with cluster.client() as c, pytest.raises(ApiError) as err:
            c.wait("gone2", timeout=25)
        errors.append(err.value)

    thread = threading.Thread(target=ask)
    thread.start()
    time.sleep(0.5)
    started = time.monotonic()
    with cluster.client() as c:
        c.delete("gone2", force=True)
    thread.join(15)
    assert errors and errors[0].status == 404 and "no bag" in str(errors[0])  # type: ignore[attr-defined]
    assert time.monotonic() - started < 10


def test_a_client_asks_a_server_without_the_wait_route_the_old_way(monkeypatch: pytest.MonkeyPatch):
    """A server older than the route answers its router's 404 (not the JSON "no bag" of the route): the
    client then reads the bag and waits out the hold itself. (A stub of such a server: no older release of
    gridbot is installed here to run.)"""
    import http.server

    import msgspec

    from gridbot.client import Client
    from gridbot.protocol import MSGPACK
    from gridbot.security.access import Access

    asked: list[str] = []
    states = iter(["active", "completed", "active", "active", "completed"])

    class Old(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            if "/wait" in self.path:
                self.send_response(404)
                self.send_header("Content-Type", "text/plain")
                body = b"404: Not Found"
            else:
                body = msgspec.msgpack.encode({"bag_id": 1, "name": "b", "state": next(states), "total": 1,
                                               "counts": {}, "created_at": 0.0, "finished_at": None,
                                               "spec_hash": ""})
                self.send_response(200)
                self.send_header("Content-Type", MSGPACK)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Old)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with Client(f"http://127.0.0.1:{server.server_address[1]}", access=Access()) as c:
            assert c.wait("b", poll=0.2, timeout=10, on_update=lambda b: None).state == "completed"
            started = time.monotonic()
            assert c.wait("b", timeout=60).state == "completed"  # looks every OLD_POLL, not every 25 s hold
            took = time.monotonic() - started
    finally:
        server.shutdown()
    assert [p.split("?")[0] for p in asked] == ["/v1/bags/b/wait"] + ["/v1/bags/b"] * 5
    assert 1.5 < took < 10, took


def test_a_stopping_server_answers_held_waits_at_once(cluster: Cluster, tmp_path: Path):
    cluster.start_server()
    with cluster.client() as c:
        c.submit_file(_bag(tmp_path, "idle", "true"))
    out, thread = _held(cluster, "idle", 25)
    time.sleep(0.5)
    started = time.monotonic()
    assert cluster.server is not None
    cluster.server.stop()
    thread.join(15)
    assert not thread.is_alive()
    assert time.monotonic() - started < 10, "the held wait kept the server from stopping"
    assert out and out[0].state == "active"  # type: ignore[attr-defined]


def test_gridbot_wait_says_how_the_bag_ended_in_its_exit_code(cluster: Cluster, tmp_path: Path):
    cluster.start_server()
    cluster.start_worker()
    gridbot("submit", str(_bag(tmp_path, "ok", "true", jobs=3)), check=True)
    gridbot("submit", str(_bag(tmp_path, "bad", "exit 3", extra="max_failures = 1\n")), check=True)
    done = gridbot("wait", "ok", "--timeout", "2m")
    assert done.returncode == 0 and "is completed: 3 of 3 jobs done, 0 failed" in done.stdout, done.stderr
    failed = gridbot("wait", "bad", "--json", "--timeout", "2m")
    assert failed.returncode == 3, failed.stderr
    assert json.loads(failed.stdout)["state"] == "failed"
    gridbot("submit", str(_bag(tmp_path, "slow", "sleep 60")), check=True)
    started = time.monotonic()
    late = gridbot("wait", "slow", "--timeout", "1")
    assert late.returncode == 4 and "is active after --timeout 1:" in late.stdout, late.stderr
    assert time.monotonic() - started < 20
    wrong = gridbot("wait", "slow", "--timeout", "soon")
    assert wrong.returncode == 2 and "--timeout" in wrong.stderr
    missing = gridbot("wait", "nope")
    assert missing.returncode == 2 and "no bag" in missing.stderr


def test_gridbot_wait_for_several_bags_says_how_each_ended(cluster: Cluster, tmp_path: Path):
    """A sweep of several bags, one `gridbot wait`: each bag's line, exit 0 only if all completed, 3 if one
    failed, 4 if one still runs at the --timeout they share; a bag that does not exist is said before any wait."""
    cluster.start_server()
    cluster.start_worker()
    for name, command, extra in (("a", "true", ""), ("b", "true", ""), ("bad", "exit 3", "max_failures = 1\n")):
        gridbot("submit", str(_bag(tmp_path, name, command, jobs=2, extra=extra)), check=True)
    both = gridbot("wait", "a", "b", "--timeout", "2m")
    assert both.returncode == 0, both.stderr
    assert "'a' is completed: 2 of 2" in both.stdout and "'b' is completed: 2 of 2" in both.stdout, both.stdout
    one_failed = gridbot("wait", "a", "bad", "--json", "--timeout", "2m")
    assert one_failed.returncode == 3, one_failed.stderr
    assert [b["state"] for b in json.loads(one_failed.stdout)] == ["completed", "failed"]
    gridbot("submit", str(_bag(tmp_path, "slow", "sleep 60")), check=True)
    started = time.monotonic()
    late = gridbot("wait", "bad", "slow", "--timeout", "2")
    assert late.returncode == 4 and "'slow' is active after --timeout 2:" in late.stdout, late.stdout
    assert time.monotonic() - started < 20, "one --timeout for all the bags"
    started = time.monotonic()
    missing = gridbot("wait", "slow", "nope")
    assert missing.returncode == 2 and "no bag" in missing.stderr and time.monotonic() - started < 20


def test_a_wait_hears_of_an_end_whose_commit_was_reported_failed_but_landed(tmp_path: Path):
    """A batch the store reports failed may have landed all the same (the connection lost right after its
    COMMIT): no commit hook hears of it, and the dispatcher's reload from the store answers the waits for
    bags that ended there, not their hold's end (25 s here)."""
    store = SQLiteStore(tmp_path / "g.db")
    store.migrate()
    service = Service(store)
    service.submit(parse_spec('command = "true"\n[parameters]\ni = { from = 1, to = 3 }\n', "s.toml", "s"),
                   None, {}, 0.0)
    real = store.apply
    lose_next = threading.Event()

    def lands_then_fails(changes: Changes) -> None:
        real(changes)
        if lose_next.is_set():
            lose_next.clear()
            raise OSError("the connection was lost after COMMIT")

    store.apply = lands_then_fails  # type: ignore[method-assign]
    with EmbeddedServer(service) as srv, Client(srv.url, access=srv.access, admin=True) as c:
        out: list[object] = []

        def ask() -> None:
            started = time.monotonic()
            with Client(srv.url, access=srv.access, admin=True) as waiter:
                out.append(waiter.bag_once_ended("s", 25))
            out.append(time.monotonic() - started)

        thread = threading.Thread(target=ask)
        thread.start()
        deadline = time.monotonic() + 10
        while not srv.server._enders and time.monotonic() < deadline:
            time.sleep(0.02)
        assert srv.server._enders, "the wait is held"
        lose_next.set()
        with contextlib.suppress(ServerUnavailable):  # the cancel is told the store failed
            c.cancel("s")
        thread.join(20)
        assert not lose_next.is_set(), "the cancel's batch went through the failing apply"
        assert service.commit_failures == 1
        assert len(out) == 2, "no answer 20 s after the cancel: the reload did not wake the wait"
        info, took = out
        assert info.state == "cancelled"  # type: ignore[attr-defined]
        assert took < 10, f"heard of the end {took:.1f} s after asking: at its hold's end, not at the reload"
