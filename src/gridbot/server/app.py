"""The HTTP server: the worker protocol and the submitter API over one aiohttp application.

Workers only ever connect out to the server (GridBot's pull model): `POST /v1/exchange` carries their
reports, heartbeats and requests in one round trip. The server runs a tick loop for deadline expiry
and the feeder. `EmbeddedServer` runs the same application on a thread for `gridbot run` and tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from gridbot.errors import GridbotError, ServerUnavailable
from gridbot.protocol import MSGPACK, ErrorBody, ExchangeRequest, ExchangeResponse, PolicyChange, SubmitRequest
from gridbot.server.overlay import Overlay
from gridbot.server.service import BadRequest, NotFound, Service
from gridbot.store.base import BagExists

log = logging.getLogger("gridbot.server")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
LONG_POLL_S = 30.0
"""Longest time an idle host's request is held waiting for work."""
SWITCH_INTERVAL = 0.0002
"""Seconds between the interpreter's thread switches while a server runs (issue 6: 15.6k -> 18.2k jobs/s
with the store on its writer thread; 1 ms gave 17.2k)."""

_exchange_decoder = msgspec.msgpack.Decoder(ExchangeRequest)
_submit_decoder = msgspec.msgpack.Decoder(SubmitRequest)
_policy_decoder = msgspec.json.Decoder(PolicyChange)
_mp = msgspec.msgpack.Encoder()
_js = msgspec.json.Encoder()


def _reply(request: web.Request, body: Any, status: int = 200) -> web.Response:
    if MSGPACK in request.headers.get("Accept", ""):
        return web.Response(body=_mp.encode(body), status=status, content_type=MSGPACK)
    return web.Response(body=_js.encode(body), status=status, content_type="application/json")


def _error(request: web.Request, status: int, message: str, kind: str) -> web.Response:
    return _reply(request, ErrorBody(message, kind), status)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map gridbot's errors to HTTP answers a client can show as they are; never leak a traceback."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except NotFound as e:
        return _error(request, 404, str(e), "not_found")
    except BagExists as e:
        return _error(request, 409, str(e), "exists")
    except (BadRequest, msgspec.ValidationError, msgspec.DecodeError) as e:
        return _error(request, 400, f"bad request: {e}", "bad_request")
    except ServerUnavailable as e:
        return _error(request, 503, str(e), "unavailable")
    except GridbotError as e:
        return _error(request, 400, str(e), "error")
    except Exception:
        log.exception("internal error on %s %s", request.method, request.path)
        return _error(request, 500, "internal server error; the server log has the details", "internal")


class Server:
    """The aiohttp application around one Service, with its tick loop."""

    def __init__(self, service: Service, tick_interval: float = 1.0, max_request_bytes: int = 0,
                 overlay: Overlay | None = None) -> None:
        self.service = service
        self.overlay = overlay
        self.tick_interval = tick_interval
        self._flush_scheduled = False
        self._work = asyncio.Event()
        self._seen_work = 0
        limit = max_request_bytes or max(64 << 20, 2 * service.config.dispatch.max_result_bytes + (1 << 20),
                                         service.config.max_input_bytes + (1 << 20))
        self.app = web.Application(middlewares=[_errors], client_max_size=limit)
        self.app.add_routes([
            web.post("/v1/exchange", self.exchange),
            web.get("/v1/health", self.health),
            web.get("/v1/bags", self.list_bags),
            web.post("/v1/bags", self.submit),
            web.get("/v1/bags/{bag}", self.get_bag),
            web.post("/v1/bags/{bag}/cancel", self.cancel),
            web.get("/v1/bags/{bag}/policy", self.get_policy),
            web.post("/v1/bags/{bag}/policy", self.set_policy),
            web.get("/v1/bags/{bag}/jobs", self.jobs),
            web.get("/v1/bags/{bag}/results", self.results),
            web.get("/v1/bags/{bag}/inputs/{name}", self.input_file),
            web.get("/v1/jobs/{job}/instances", self.instances),
            web.get("/v1/hosts", self.hosts),
            web.get("/v1/pools", self.pools),
        ])
        self.app.cleanup_ctx.append(self._ticker)

    async def _ticker(self, app: web.Application) -> Any:
        # the store's writer thread gives up the interpreter lock for each statement and needs it back
        # right after: at the default 5 ms it waited behind the event loop, and the loop for its commits
        sys.setswitchinterval(SWITCH_INTERVAL)
        tasks = [asyncio.create_task(self._tick_loop())]
        if self.overlay is not None:
            tasks.append(asyncio.create_task(self.overlay.run()))
        yield
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.overlay is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.overlay.close)
        self.service.close()

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.tick_interval)
            try:
                self.service.tick(time.time())
                self._check_work()
            except Exception:
                log.exception("tick failed; will try again")

    async def exchange(self, request: web.Request) -> web.Response:
        limit = 2 * self.service.config.dispatch.max_result_bytes + (1 << 20)
        if (request.content_length or 0) > limit:
            return _error(request, 413, f"an exchange of {request.content_length:,} bytes is over the limit of "
                          f"{limit:,} bytes (twice the server's --max-result-size, plus 1 MiB)", "too_large")
        req = _exchange_decoder.decode(await request.read())
        resp = await self._answer(req)
        if not resp.assignments and not resp.cancel and not req.reports and not req.running and req.want > 0 \
                and resp.backoff > 0:
            # an idle host: hold its request until work comes (a bag submitted) or the backoff has passed,
            # so it hears of new work at once and asks again right after instead of sleeping on it
            work = self._work
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(work.wait(), min(resp.backoff, LONG_POLL_S))
            resp = await self._answer(req) if work.is_set() else msgspec.structs.replace(resp, backoff=0.0)
        return web.Response(body=_mp.encode(resp), content_type=MSGPACK)

    async def _answer(self, req: ExchangeRequest) -> ExchangeResponse:
        """Decide an exchange and wait until its changes are durable (group commit)."""
        resp, changes = self.service.decide(req, time.time())
        self._check_work()
        durable: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done(error: BaseException | None) -> None:
            if durable.done():
                return
            if error is not None:
                durable.set_exception(error)
            else:
                durable.set_result(None)

        self.service.stage(changes, done)
        if not self._flush_scheduled:
            # group commit: every exchange decided before this callback runs shares one transaction
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        await durable
        return resp

    def _new_work(self) -> None:
        """Wake the idle hosts whose requests are held."""
        self._seen_work = self.service.dispatcher.work_added
        self._work.set()
        self._work = asyncio.Event()

    def _check_work(self) -> None:
        if self.service.dispatcher.work_added != self._seen_work:
            self._new_work()

    def _flush(self) -> None:
        self._flush_scheduled = False
        self.service.flush_async(asyncio.get_running_loop().call_soon_threadsafe)

    async def health(self, request: web.Request) -> web.Response:
        return _reply(request, {"ok": True, "bags": len(self.service.dispatcher.bags)})

    async def submit(self, request: web.Request) -> web.Response:
        req = _submit_decoder.decode(await request.read())
        info = self.service.submit(req.spec, req.lines, req.inputs, time.time())
        self._new_work()
        return _reply(request, info, 201)

    async def list_bags(self, request: web.Request) -> web.Response:
        return _reply(request, self.service.bags())

    async def get_bag(self, request: web.Request) -> web.Response:
        return _reply(request, self.service.info(self.service.bag(request.match_info["bag"])))

    async def get_policy(self, request: web.Request) -> web.Response:
        return _reply(request, self.service.policies(request.match_info["bag"]))

    async def set_policy(self, request: web.Request) -> web.Response:
        change = _policy_decoder.decode(await request.read())
        info = self.service.set_policy(request.match_info["bag"], change.name, change.text)
        self._new_work()
        return _reply(request, info)

    async def cancel(self, request: web.Request) -> web.Response:
        return _reply(request, self.service.cancel(request.match_info["bag"], time.time()))

    async def jobs(self, request: web.Request) -> web.Response:
        q = request.query
        return _reply(request, self.service.jobs(request.match_info["bag"], q.get("state"),
                                                 _int(q, "limit", 1000), _int(q, "after", 0)))

    async def results(self, request: web.Request) -> web.Response:
        q = request.query
        return _reply(request, self.service.results(request.match_info["bag"], _int(q, "after", 0),
                                                    _int(q, "limit", 200)))

    async def input_file(self, request: web.Request) -> web.Response:
        data = self.service.input_file(request.match_info["bag"], request.match_info["name"])
        return web.Response(body=data, content_type="application/octet-stream")

    async def instances(self, request: web.Request) -> web.Response:
        from gridbot.protocol import InstanceInfo

        rows = self.service.store.instances_of(_path_int(request, "job"))
        return _reply(request, [InstanceInfo(r.instance_id, r.host_id, r.state.value, r.sent_at, r.ended_at,
                                             r.reason, r.exit_code, r.wall_s, r.cpu_s) for r in rows])

    async def pools(self, request: web.Request) -> web.Response:
        return _reply(request, self.overlay.info(time.time()) if self.overlay is not None else [])

    async def hosts(self, request: web.Request) -> web.Response:
        return _reply(request, self.service.hosts(time.time()))


def _int(query: Any, key: str, default: int) -> int:
    raw = query.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"query parameter {key}={raw!r} is not a whole number") from None
    if value < 0:
        raise BadRequest(f"query parameter {key} must not be negative")
    return value


def _path_int(request: web.Request, key: str) -> int:
    try:
        return int(request.match_info[key])
    except ValueError:
        raise NotFound(f"no {key} '{request.match_info[key]}'") from None


class EmbeddedServer:
    """The server on a background thread with its own event loop, bound to 127.0.0.1 (port 0: any free)."""

    def __init__(self, service: Service, port: int = 0, tick_interval: float = 1.0) -> None:
        self.server = Server(service, tick_interval)
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="gridbot-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> EmbeddedServer:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise GridbotError(f"the embedded server did not start: {self._error}") from self._error
        return self

    def _main(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._start())
        except BaseException as e:
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(self._cleanup())
        loop.close()

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.server.app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        self.port = self._runner.addresses[0][1]

    async def _cleanup(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def stop(self) -> None:
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
