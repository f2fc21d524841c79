"""An in-process gridbot server for fuzzing (issue 12): the real aiohttp application, authentication and
service on a real store, driven through aiohttp's test client on an event loop of its own, so that a
hypothesis example is one synchronous call and a run of hundreds of them takes seconds."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
from aiohttp import ClientTimeout
from aiohttp.test_utils import TestClient, TestServer

from gridbot.model.records import HostInfo
from gridbot.model.spec import BagSpec
from gridbot.protocol import ExchangeRequest, ExchangeResponse, SubmitRequest
from gridbot.security.access import ephemeral_keys
from gridbot.server.app import Server
from gridbot.server.service import Service, ServiceConfig
from gridbot.store.base import Store

MSGPACK = "application/msgpack"


class Reply(msgspec.Struct, frozen=True):
    """What the server answered: the status, and the body as bytes and (for errors) its message."""

    status: int
    body: bytes

    @property
    def message(self) -> str:
        """The error message: our JSON ErrorBody's, or the text of what aiohttp's HTTP parser refused before
        the application saw the request (a URL over 8 KiB)."""
        try:
            return str(json.loads(self.body).get("error", ""))
        except (ValueError, AttributeError):
            return self.body.decode(errors="replace") if self.status == 400 else ""


class App:
    """One server on `store`, with its keys (`auth=False`: a `--no-auth` server, which takes any host id)."""

    def __init__(self, store: Store, auth: bool = True, config: ServiceConfig | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        server_access, self.access = ephemeral_keys()
        self.service = Service(store, config)
        self.server = Server(self.service, tick_interval=3600.0, access=server_access if auth else None)
        self.auth = auth
        self.client: TestClient[Any, Any] = self.loop.run_until_complete(self._start())
        self.host_id, self.credential = self.new_host()

    async def _start(self) -> TestClient[Any, Any]:
        client: TestClient[Any, Any] = TestClient(TestServer(self.server.app))
        await client.start_server()
        return client

    def new_host(self) -> tuple[str, str]:
        """A registered host's id and credential (any id, and no credential, without keys)."""
        if not self.auth:
            return "fuzz-host", ""
        auth = self.server.access.auth if self.server.access is not None else None
        assert auth is not None
        principal = auth.authenticate(self.access.workers["local"])
        assert principal is not None
        return auth.host_credential(principal)

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()

    # -- requests -------------------------------------------------------------------------------------

    def call(self, method: str, path: str, body: bytes | None = None, token: str | None = None,
             content_type: str = MSGPACK, params: dict[str, str] | None = None,
             headers: dict[str, str] | None = None) -> Reply:
        """One request as `token` (the submitter's key by default), with `headers` besides; the answer as it
        came."""
        headers = {"Authorization": f"Bearer {token or self.access.submitter}", "Content-Type": content_type,
                   "Accept": "application/json", **(headers or {})}

        async def go() -> Reply:
            async with self.client.request(method, path, data=body, headers=headers, params=params,
                                           timeout=ClientTimeout(total=60)) as r:
                return Reply(r.status, await r.read())

        return self.loop.run_until_complete(go())

    def submit(self, spec: BagSpec, lines: list[str] | None = None, inputs: dict[str, bytes] | None = None) -> Reply:
        return self.call("POST", "/v1/bags", msgspec.msgpack.encode(SubmitRequest(spec, lines, inputs or {})))

    def exchange_raw(self, body: bytes) -> Reply:
        return self.call("POST", "/v1/exchange", body, token=self.credential or None)

    def exchange(self, want: int, running: list[int], reports: list[Any] | None = None) -> ExchangeResponse:
        """A well-formed exchange of this app's host, which must succeed."""
        req = ExchangeRequest(HostInfo(self.host_id, "fuzz"), want, running, reports or [])
        reply = self.exchange_raw(msgspec.msgpack.encode(req))
        assert reply.status == 200, (reply.status, reply.body[:500])
        return msgspec.msgpack.decode(reply.body, type=ExchangeResponse)

    def running(self) -> list[int]:
        """Instances the dispatcher has out on this app's host."""
        d = self.service.dispatcher
        return sorted(i for i in d.view.running_instances() if d.view.instance(i).host_id == self.host_id)

    # -- state ----------------------------------------------------------------------------------------

    def state(self) -> tuple[Any, ...]:
        """Everything a rejected request must leave as it was: the store's bags, jobs and hosts, and the
        dispatcher's counts, bags, hosts and instances (as plain values, to compare)."""
        store, d = self.service.store, self.service.dispatcher
        bags = store.bags()
        jobs = {b.bag_id: store.jobs(b.bag_id, None, b.total, 0) for b in bags}
        hosts = sorted(store.hosts(), key=lambda h: h.info.host_id)
        counts = {b.bag_id: msgspec.to_builtins(b.counts) for b in d.view.bags()}
        policies = {b.bag_id: dict(b.spec.policy) for b in d.view.bags()}
        live = {h.host_id: (h.running, msgspec.to_builtins(h.stats)) for h in d.view.known_hosts()}
        return (msgspec.to_builtins(bags), msgspec.to_builtins(jobs), msgspec.to_builtins(hosts), counts, policies,
                live, d.view.running_instances())
