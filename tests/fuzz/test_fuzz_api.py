"""Issue 12: property-based fuzzing of every request the server takes, on the real application (keys,
middlewares, service, dispatcher) and real stores. Whatever is sent: no answer is 5xx, a refusal says
what is wrong, and a refused request leaves bags, jobs, hosts and the dispatcher as they were."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gridbot.core.config import DispatchConfig
from gridbot.model.spec import BagSpec, Parameter, check_spec
from gridbot.protocol import SubmitRequest
from gridbot.server.service import ServiceConfig
from gridbot.store.base import Store
from gridbot.store.memory import MemoryStore
from gridbot.store.sql import PostgresStore, SQLiteStore
from tests.fuzz import strategies as fs
from tests.fuzz.harness import App, Reply

FUZZ = settings(deadline=None, database=None, max_examples=120,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large, HealthCheck.large_base_example])
CONFIG = ServiceConfig(DispatchConfig(check_invariants=True, backoff_idle=0.0, backoff_max=0.0, backoff_empty=0.0),
                       max_jobs=2_000)
"""Invariants checked after every event; no long poll (an idle host is answered at once); small bags."""
BASE = BagSpec("base", "echo {x}", [Parameter("x", start="1", stop="1000", step="1")])


def open_store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    store: Store
    if kind == "memory":
        store = MemoryStore()
    elif kind == "sqlite":
        store = SQLiteStore(tmp_path / "gridbot.db")
    else:
        store = PostgresStore(request.getfixturevalue("pg_url"))
    store.migrate()
    return store


@pytest.fixture
def make_app(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A factory of in-process servers with bag `base` submitted; closed at the end of the test."""
    apps: list[App] = []

    def make(kind: str, auth: bool = True) -> App:
        app = App(open_store(kind, tmp_path, request), auth=auth, config=CONFIG)
        assert app.submit(BASE).status == 201
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()
        app.service.store.close()


def refused_cleanly(app: App, before: tuple[Any, ...], reply: Reply, what: object) -> None:
    """The property of every request: not a 5xx; a refusal has a message and changed nothing."""
    assert reply.status < 500, (reply.status, reply.body[:300], repr(what)[:600])
    if reply.status >= 400:
        assert reply.message, (reply.status, reply.body[:300])
        assert len(reply.message) < 4000, "an error message fit to read, not an echo of the input"
        assert app.state() == before, ("a refused request changed the server's state", reply.message)


def keep_busy(app: App) -> list[int]:
    """Make sure the app's host holds a few instances, for reports to refer to (a new bag when all ran)."""
    running = app.running()
    if len(running) < 3:
        if not app.exchange(4, running).assignments and not app.running():
            assert app.submit(msgspec.structs.replace(BASE, name=f"more{len(app.service.store.bags())}")).status == 201
            app.exchange(4, [])
        running = app.running()
    return running


STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("auth", [True, False], ids=["keys", "no-auth"])
def test_exchange(make_app, kind, auth):
    """ExchangeRequest with HostInfo and InstanceReports: hostile values in every field, reports for the
    host's real instances (so they reach the store), damaged msgpack."""
    app = make_app(kind, auth)

    @settings(FUZZ, max_examples=200)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        msg = data.draw(fs.exchange(app.host_id))
        body = data.draw(fs.damage)(fs.bind(msg, keep_busy(app)))
        before = app.state()
        reply = app.exchange_raw(body)
        refused_cleanly(app, before, reply, msg)
        if reply.status == 200:
            app.state()  # what was stored reads back
            assert app.call("GET", "/v1/hosts").status == 200

    run()


@pytest.mark.parametrize("kind", STORES)
def test_submit(make_app, kind):
    """SubmitRequest with BagSpec and Parameters: an accepted bag is stored as sent, and lists and renders."""
    app = make_app(kind)
    names = iter(range(10**9))

    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        msg = data.draw(fs.submit("bag"))
        if isinstance(msg, dict) and isinstance(msg.get("spec"), dict) and msg["spec"].get("name") == "bag":
            msg["spec"]["name"] = f"bag{next(names)}"  # (drawn the same every time; unique when sent)
        body = data.draw(fs.damage)(msg)
        before = app.state()
        reply = app.call("POST", "/v1/bags", body)
        refused_cleanly(app, before, reply, msg)
        if reply.status == 201:
            name = json.loads(reply.body)["name"]
            row = app.service.store.bag(name)
            assert row is not None
            sent = msgspec.msgpack.decode(body, type=SubmitRequest)
            assert row.spec == sent.spec, "the spec reads back as it was sent"
            assert check_spec(row.spec, sent.lines, CONFIG.max_jobs) == []
            for path in (f"/v1/bags/{quote(name)}", f"/v1/bags/{quote(name)}/jobs",
                         f"/v1/bags/{quote(name)}/policy"):
                got = app.call("GET", path)
                assert got.status == 200, (path, got.status, got.body[:300])
            assert app.call("POST", f"/v1/bags/{quote(name)}/cancel").status == 200

    run()


def test_policy_change(make_app):
    """PolicyChange on a live bag: refused with a reason, or accepted and then every bag still served."""
    app = make_app("sqlite")
    assert app.submit(msgspec.structs.replace(BASE, name="other")).status == 201

    @FUZZ
    @given(name=fs.policy_names, text=fs.policy_texts, raw=st.integers(0, 9))
    def run(name: str, text: str, raw: int) -> None:
        body = json.dumps({"name": name, "text": text}).encode() if raw else text.encode(errors="replace")
        before = app.state()
        reply = app.call("POST", "/v1/bags/base/policy", body, content_type="application/json")
        refused_cleanly(app, before, reply, (name, text))
        # a fresh host asking for one job gets one: no policy of one bag stalls the others
        app.host_id, app.credential = app.new_host()
        got = app.exchange(1, [])
        assert len(got.assignments) == 1, (name, text, app.service.dispatcher.diagnostics(1, time.time()))
        app.exchange(0, [], [_done(a.instance_id) for a in got.assignments])

    run()


def test_retry(make_app):
    """RetryRequest: indices to queue again, or a revision of the bag (a SubmitRequest of its own)."""
    app = make_app("sqlite")
    held = keep_busy(app)
    app.exchange(0, [], [_failed(i) for i in held])  # some failed jobs to retry

    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        msg = data.draw(fs.retry("base"))
        body = data.draw(fs.damage)(msg)
        before = app.state()
        reply = app.call("POST", "/v1/bags/base/retry", body)
        refused_cleanly(app, before, reply, msg)

    run()


def _failed(instance_id: int) -> Any:
    from gridbot.model.records import InstanceReport, Outcome

    return InstanceReport(instance_id, Outcome.FAILURE, 1, reason="exit code 1")


def _done(instance_id: int) -> Any:
    from gridbot.model.records import InstanceReport, Outcome

    return InstanceReport(instance_id, Outcome.SUCCESS, 0)


def test_register(make_app):
    """RegisterRequest with any body: registered, or refused with a reason."""
    app = make_app("sqlite")

    @settings(FUZZ, max_examples=60)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        msg = data.draw(st.one_of(st.fixed_dictionaries({"name": fs.texts}), fs.anything))
        body = data.draw(fs.damage)(msg)
        before = app.state()
        reply = app.call("POST", "/v1/register", body, token=app.access.workers["local"])
        refused_cleanly(app, before, reply, msg)

    run()


SEGMENTS = ["base", "1", "0", "-1", "99999999999999999999999", str(2**63), str(2**63 - 1), "²", "١", "nope", "%00",
            "..", "a%2Fb", "x" * 5000, "%ff", "%C0%AF", "base%0A"]
QUERY = ["0", "1", "-1", "10000", "99999999999999999999", "1e3", "1_000", " 7", "١", "x", "", "%00", "9" * 5000,
         "queued", "done", "nope"]
GETS = ["/v1/bags/{b}", "/v1/bags/{b}/jobs", "/v1/bags/{b}/results", "/v1/bags/{b}/policy",
        "/v1/bags/{b}/jobs/{j}/instances", "/v1/bags/{b}/inputs/{j}", "/v1/bags/{b}/logs/{j}", "/v1/bags",
        "/v1/hosts", "/v1/pools", "/v1/health"]


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_get_routes(make_app, kind):
    """The GET routes with any path segments and query parameters: never a 5xx, never a change (and the
    bag routes that change a bag, with bags that do not exist)."""
    app = make_app(kind)
    keep_busy(app)
    segment = st.one_of(st.sampled_from(SEGMENTS), st.text(max_size=10).map(lambda s: quote(s, safe="")))
    query = st.dictionaries(st.sampled_from(["state", "limit", "after", "x"]),
                            st.one_of(st.sampled_from(QUERY), st.text(max_size=6)), max_size=3)

    routes = st.one_of(st.tuples(st.just("GET"), st.sampled_from(GETS)),
                       st.tuples(st.sampled_from(["DELETE", "POST"]), st.just("/v1/bags/{b}x")),
                       st.tuples(st.just("POST"), st.sampled_from(["/v1/bags/{b}x/cancel", "/v1/bags/{b}x/retry"])))

    @FUZZ
    @given(route=routes, bag=segment, job=segment, params=query, admin=st.booleans())
    def run(route: tuple[str, str], bag: str, job: str, params: dict[str, str], admin: bool) -> None:
        method, path = route[0], route[1].format(b=bag, j=job)
        before = app.state()
        reply = app.call(method, path, b"" if method == "POST" else None, params=params,
                         token=app.access.admin if admin else None)
        refused_cleanly(app, before, reply, (method, path, params))
        assert app.state() == before, "a GET (or a change of no bag) changed the server's state"

    run()


@pytest.mark.parametrize("path", ["/v1/exchange", "/v1/bags", "/v1/bags/base/policy", "/v1/register",
                                  "/v1/bags/base/cancel", "/v1/bags/base/retry"])
def test_garbage_bodies(make_app, path):
    """Any bytes at all to every POST route (with the right key for it)."""
    app = make_app("memory")
    token = {"/v1/exchange": app.credential, "/v1/register": app.access.workers["local"]}.get(path)

    @settings(FUZZ, max_examples=40)
    @given(body=st.one_of(st.binary(max_size=64), fs.anything.map(msgspec.msgpack.encode),
                          fs.anything.map(lambda v: msgspec.json.encode(v) if _json_ok(v) else b"{")))
    def run(body: bytes) -> None:
        before = app.state()
        reply = app.call("POST", path, body, token=token)
        if path.endswith("/cancel") and reply.status == 200:
            return  # cancel takes no body
        refused_cleanly(app, before, reply, body)

    run()


def _json_ok(value: object) -> bool:
    try:
        msgspec.json.encode(value)
    except (TypeError, ValueError):
        return False
    return True
