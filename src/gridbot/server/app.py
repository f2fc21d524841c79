"""The HTTP server: the worker protocol and the submitter API over one aiohttp application.

Workers only ever connect out to the server (GridBot's pull model): `POST /v1/exchange` carries their
reports, heartbeats and requests in one round trip. The server runs a tick loop for deadline expiry
and the feeder. `EmbeddedServer` runs the same application on a thread for `gridbot run` and tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import logging
import math
import re
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from gridbot.core.changes import Changes
from gridbot.errors import GridbotError, ServerUnavailable
from gridbot.model.pacing import server_hold
from gridbot.model.records import Verdict
from gridbot.model.spec import BagSpec, Parameter, StrategyChoice
from gridbot.model.states import BagState
from gridbot.protocol import (
    MSGPACK,
    ErrorBody,
    ExchangeRequest,
    ExchangeResponse,
    InstanceInfo,
    PolicyChange,
    PoolInfo,
    QosChange,
    RegisterRequest,
    Registration,
    RetryRequest,
    SubmitRequest,
)
from gridbot.security.access import Access, ServerAccess, ephemeral_keys
from gridbot.security.keys import Principal, Role
from gridbot.server.console import PUBLIC, Console
from gridbot.server.metrics import Metrics
from gridbot.server.overlay import Overlay
from gridbot.server.service import (
    BadRequest,
    Conflict,
    NotFound,
    Service,
    job_state,
    query_whole_number,
    whole_number,
)
from gridbot.server.validate import Validation
from gridbot.store.base import BagExists, BagRow

log = logging.getLogger("gridbot.server")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SWITCH_INTERVAL = 0.0002
"""Seconds between the interpreter's thread switches while a server runs (issue 6: 15.6k -> 18.2k jobs/s
with the store on its writer thread; 1 ms gave 17.2k)."""


class _SentStrategy(StrategyChoice, frozen=True, forbid_unknown_fields=True):
    """A `[strategy]` as a client sends it: a key the server does not know is refused (`{"tial": "expert"}`
    kept GridBot's tail without a word). Made a StrategyChoice again by `_plain`."""


class _SentParameter(Parameter, frozen=True, forbid_unknown_fields=True):
    """A parameter as a client sends it: `{"name": "x", "values": ["1"], "stpe": "2"}` is refused, not taken for
    `values` alone."""


class _SentSpec(BagSpec, frozen=True, forbid_unknown_fields=True):
    """A spec as a client sends it: a key the server does not know is refused (a misspelled `instance_deadlin`
    was dropped and the default used). Made a BagSpec again by `_plain` (a subclass is not equal to its base)."""

    parameters: list[_SentParameter] = msgspec.field(default_factory=list)  # type: ignore[assignment]
    strategy: _SentStrategy = msgspec.field(default_factory=_SentStrategy)


class _SentSubmit(SubmitRequest, frozen=True, forbid_unknown_fields=True):
    spec: _SentSpec


class _SentRetry(RetryRequest, frozen=True, forbid_unknown_fields=True):
    revision: _SentSubmit | None = None


_exchange_decoder = msgspec.msgpack.Decoder(ExchangeRequest)
_submit_decoder = msgspec.msgpack.Decoder(_SentSubmit)
_policy_decoder = msgspec.json.Decoder(PolicyChange)
_register_decoder = msgspec.msgpack.Decoder(RegisterRequest)
_retry_decoder = msgspec.msgpack.Decoder(_SentRetry)
_strategy_decoder = msgspec.json.Decoder(_SentStrategy)
_qos_decoder = msgspec.json.Decoder(QosChange)
_NESTED: dict[str, type[msgspec.Struct]] = {"spec": BagSpec, "parameters": Parameter, "strategy": StrategyChoice,
                                            "revision": SubmitRequest}
"""The message a request's field holds, by the field's name: where msgspec says an unknown field is (`$.spec`),
the fields it could have meant."""


_PLAIN: dict[type, type[msgspec.Struct]] = {_SentStrategy: StrategyChoice, _SentParameter: Parameter,
                                            _SentSpec: BagSpec, _SentSubmit: SubmitRequest}
S = TypeVar("S")


def _plain(value: S) -> S:
    """A decoded request's `_Sent` messages, nested ones too, as the plain types the rest of the server and the
    store know (they only refused unknown keys; a subclass is not equal to its base), every field copied."""
    base = _PLAIN.get(type(value))
    if base is not None:
        return base(**{f: _plain(getattr(value, f)) for f in base.__struct_fields__})  # type: ignore[return-value]
    if isinstance(value, list) and value and type(value[0]) in _PLAIN:
        return [_plain(v) for v in value]  # type: ignore[return-value]
    return value


T = TypeVar("T")


class TooLarge(GridbotError):
    """A request body over its route's limit (413)."""


SMALL_BODY = 1 << 20
"""The limit of a request that carries no files or results: a registration, a policy, strategy or qos change."""


async def _read(request: web.Request, limit: int, what: str) -> bytes:
    """The request's body, refused (TooLarge) past `limit` bytes as received: a chunked or compressed body has
    no Content-Length to check first, and aiohttp's own limit is the application's, sized for submissions (the
    security review of 2026-11-29: a chunked exchange could bring 257 MiB, 2 GB once decoded)."""
    if (request.content_length or 0) > limit:
        raise TooLarge(f"{what} of {request.content_length:,} bytes is over the limit of {limit:,} bytes")
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"{what} of over {limit:,} bytes is over the limit")
        chunks.append(chunk)
    return b"".join(chunks)


def _decode(decoder: msgspec.msgpack.Decoder[T] | msgspec.json.Decoder[T], body: bytes) -> T:
    """A request body as its message type, or BadRequest saying what is wrong with it (issue 12).

    Besides msgspec's own errors (a wrong type, a value out of the range a field allows, a truncated body),
    a string that is not valid UTF-8 raises UnicodeDecodeError, and an integer too large for a field
    OverflowError: errors of the request, caught here, where only the decoder can raise them, rather than
    in the error middleware, where they would hide bugs of our own."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as e:
        text = str(e)  # it may quote the value: an enum of 100 KB was echoed whole
        unknown = re.match(r"Object contains unknown field `(.{1,80}?)`(?: - at `\$((?:\.\w+(?:\[\d+\])?)*)`)?", text)
        if unknown:
            where = re.sub(r"\[\d+\]", "", (unknown.group(2) or "").rpartition(".")[2])
            message = _NESTED.get(where) or getattr(decoder, "type", None)
            known = list(getattr(message, "__struct_fields__", ()))
            word = unknown.group(1)  # two letters swapped first: difflib takes `stop` for `stpe`
            near = [k for k in known if sorted(k) == sorted(word)][:1] or difflib.get_close_matches(word, known, n=1)
            text += f"; did you mean `{near[0]}`?" if near else "; gridbot.protocol gives the fields each request takes"
        raise BadRequest((text if len(text) <= 400 else f"{text[:200]}...{text[-150:]}") + _json_hint(decoder, body)) \
            from None
    except msgspec.DecodeError as e:
        if isinstance(decoder, msgspec.json.Decoder) and (lone := _lone_surrogate(body, str(e))):
            raise BadRequest(lone) from None
        kind = "JSON" if isinstance(decoder, msgspec.json.Decoder) else "msgpack"
        raise BadRequest(f"the body is not a valid {kind} message ({e}){_json_hint(decoder, body)}") from None
    except UnicodeDecodeError as e:
        raise BadRequest(f"a string of the request is not valid UTF-8 ({e.reason} at byte {e.start} of it)") from None
    except (ValueError, OverflowError) as e:
        raise BadRequest(f"a value of the request cannot be read: {e}") from None
    except RecursionError:
        raise BadRequest("the body is nested too deeply to read: no message of gridbot's nests more than a few "
                         "levels") from None


_ESCAPE = re.compile(rb"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)
_AT_BYTE = re.compile(r"\(byte (\d+)\)")


def _lone_surrogate(body: bytes, error: str) -> str:
    """The problem of a JSON body whose first error is a lone UTF-16 surrogate escape (`"\ud800"`: half of a
    pair, no character alone), or "". msgspec calls it 'Input data was truncated' at the end of the body, and
    'unexpected end of hex escape' or 'invalid utf-16 surrogate pair' elsewhere: nothing a client can act on."""
    escapes = [(m.start(), m.end(), int(m.group(1), 16))  # each escape once, from its backslash: `\\ud800` is none
               for m in _ESCAPE.finditer(body) if m.group(1)]
    i = 0
    while i < len(escapes):
        start, end, code = escapes[i]
        if (0xD800 <= code <= 0xDBFF and i + 1 < len(escapes) and escapes[i + 1][0] == end
                and 0xDC00 <= escapes[i + 1][2] <= 0xDFFF):
            i += 2  # a pair: one character
            continue
        if 0xD800 <= code <= 0xDFFF:
            at = _AT_BYTE.search(error)
            if at is not None and int(at.group(1)) < start:
                return ""  # the body's first error is before it
            return (f"the JSON holds an invalid string: {body[start:end].decode()} at byte {start} is a lone "
                    "UTF-16 surrogate (half of a pair, no character alone); send the character itself in UTF-8, "
                    "or both halves of its pair, as \\ud83d\\ude00")
        i += 1
    return ""


def _json_hint(decoder: object, body: bytes) -> str:
    """What to do when a route that takes msgpack was sent what looks like JSON (a `{` reads as the number 123)."""
    if isinstance(decoder, msgspec.msgpack.Decoder) and body.lstrip()[:1] in (b"{", b"["):
        return ("; the body looks like JSON, and this route takes msgpack (Content-Type: application/msgpack): "
                "gridbot.Client sends it so")
    return ""


class _MalformedRequests(logging.Filter):
    """aiohttp answers a request it cannot parse with 400 (a bad header line, a Content-Encoding it cannot
    decode, such as br or zstd without their packages, a body that does not decompress), then logs it at
    ERROR with a traceback, and once more when it drains the body: a client's fault, which any client on
    the network can repeat to fill the log. It becomes one line at WARNING, naming the problem."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError | RequestPayloadError):
            record.msg = f"{record.getMessage()}: a malformed request, answered 400: {_what(exc)}"
            record.args = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info, record.exc_text = None, None
        return True


_MALFORMED = _MalformedRequests()


def quiet_malformed_requests() -> None:
    """Log aiohttp's malformed requests as one line (`_MalformedRequests`); for every server of ours."""
    logger = logging.getLogger("aiohttp.server")
    if _MALFORMED not in logger.filters:
        logger.addFilter(_MALFORMED)


def _what(e: BaseException) -> str:
    """aiohttp's own words for a request it could not read, on one line."""
    cause = e.__cause__ if isinstance(e, RequestPayloadError) and e.__cause__ is not None else e
    what = getattr(cause, "message", "") or str(cause) or type(cause).__name__
    return " ".join(str(what).split())[:200]


def unreadable_body(e: Exception) -> str:
    """Why a request's body could not be read, for the client (aiohttp's words, then what to do)."""
    return (f"the body cannot be read ({_what(e)}): send it as it is, or compressed exactly as its "
            "Content-Encoding header says")


_mp = msgspec.msgpack.Encoder()
_js = msgspec.json.Encoder()


def _reply(request: web.Request, body: Any, status: int = 200) -> web.Response:
    if MSGPACK in request.headers.get("Accept", ""):
        return web.Response(body=_mp.encode(body), status=status, content_type=MSGPACK)
    return web.Response(body=_js.encode(body), status=status, content_type="application/json")


def _error(request: web.Request, status: int, message: str, kind: str) -> web.Response:
    return _reply(request, ErrorBody(message, kind), status)


USERS: frozenset[Role] = frozenset(("admin", "submitter"))
PERMISSIONS: dict[tuple[str, str], frozenset[Role]] = {
    ("POST", "/v1/exchange"): frozenset(("host",)),
    ("POST", "/v1/register"): frozenset(("worker",)),
    ("GET", "/v1/health"): frozenset(("admin", "submitter", "worker", "host")),
    ("GET", "/v1/bags"): USERS,
    ("POST", "/v1/bags"): USERS,
    ("GET", "/v1/bags/{bag}"): USERS,
    ("GET", "/v1/bags/{bag}/wait"): USERS,
    ("POST", "/v1/bags/{bag}/cancel"): USERS,
    ("POST", "/v1/bags/{bag}/retry"): USERS,
    ("DELETE", "/v1/bags/{bag}"): USERS,
    ("GET", "/v1/bags/{bag}/logs/{job}"): USERS,
    ("GET", "/v1/bags/{bag}/story/{job}"): USERS,
    ("GET", "/v1/bags/{bag}/policy"): USERS,
    ("GET", "/v1/bags/{bag}/spec"): USERS,
    ("POST", "/v1/bags/{bag}/policy"): USERS,
    ("POST", "/v1/bags/{bag}/strategy"): USERS,
    ("POST", "/v1/bags/{bag}/qos"): USERS,
    ("GET", "/v1/bags/{bag}/cost"): USERS,
    ("GET", "/v1/bags/{bag}/history"): USERS,
    ("GET", "/v1/bags/{bag}/instances"): USERS,
    ("GET", "/v1/bags/{bag}/jobs"): USERS,
    ("GET", "/v1/bags/{bag}/jobs/{job}/instances"): USERS,
    ("GET", "/v1/bags/{bag}/results"): USERS,
    ("GET", "/v1/bags/{bag}/inputs/{name}"): frozenset(("admin", "submitter", "host")),
    ("GET", "/v1/hosts"): USERS,
    ("GET", "/v1/pools"): USERS,
    ("GET", "/v1/levels"): USERS,
    ("GET", "/metrics"): frozenset(("admin",)),  # every owner's bag names: docs/metrics.md
    ("GET", "/v1/console/bags"): USERS,
    ("GET", "/v1/console/bags/{bag}"): USERS,
    ("GET", "/v1/console/hosts"): USERS,
    ("GET", "/v1/console/pools"): USERS,
    **{route: frozenset(("admin", "submitter", "worker", "host")) for route in PUBLIC},
}
"""Which roles may use each route. The check is made once, in the `_authenticate` middleware, before any
handler; a route missing here is refused to everyone (a new endpoint cannot be left open by mistake). The
console's shell (`console.PUBLIC`: package files, no data) is the one exception served without any key."""
PRINCIPAL = web.RequestKey("principal", Principal)
"""Where the authentication middleware leaves the caller for the handlers."""
LOCAL: Principal = Principal("admin", "", "")
"""Whoever talks to a server started without keys (`--no-auth`, loopback only)."""


def _authenticate(access: ServerAccess | None) -> Any:
    """The middleware that answers 401 to a request without a valid key and 403 to a role the route does
    not admit; otherwise it puts the caller's Principal in `request[PRINCIPAL]`."""

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if access is None:
            request[PRINCIPAL] = LOCAL
            return await handler(request)
        if _public(request):
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        principal = access.auth.authenticate(token.strip()) if scheme.lower() == "bearer" else None
        if principal is None:
            response = _error(request, 401, "a valid key is needed: pass --access FILE (the access file the "
                              "server wrote), or set GRIDBOT_ACCESS", "unauthorized")
            response.headers["WWW-Authenticate"] = 'Bearer realm="gridbot"'
            return response
        resource = request.match_info.route.resource
        method = "GET" if request.method == "HEAD" else request.method
        roles = PERMISSIONS.get((method, resource.canonical)) if resource is not None else None
        if roles is None and resource is None:
            return await handler(request)  # no such route: the router's own 404 or 405
        if roles is None or principal.role not in roles:
            article = "an" if principal.role[:1] in "aeiou" else "a"
            return _error(request, 403, f"{article} {principal.role} key may not {request.method} {request.path}",
                          "forbidden")
        request[PRINCIPAL] = principal
        return await handler(request)

    return authenticate


def _public(request: web.Request) -> bool:
    """Whether the request is for the console's shell, which a browser loads before it has asked for the key
    (matched by route, not by path prefix: only the routes listed in `console.PUBLIC`)."""
    resource = request.match_info.route.resource
    return (request.method in ("GET", "HEAD") and resource is not None
            and ("GET", resource.canonical) in PUBLIC)


def _owner(request: web.Request) -> str | None:
    """The owner whose bags the caller may see: None for an admin (or a host fetching inputs), else its name."""
    principal: Principal = request[PRINCIPAL]
    return None if principal.role in ("admin", "host") else principal.name


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map gridbot's errors to HTTP answers a client can show as they are; never leak a traceback."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        response = _error(request, e.status, _http_problem(request, e), "http")
        if "Allow" in e.headers:
            response.headers["Allow"] = e.headers["Allow"]
        return response
    except NotFound as e:
        return _error(request, 404, str(e), "not_found")
    except BagExists as e:
        return _error(request, 409, str(e), "exists")
    except Conflict as e:
        return _error(request, 409, str(e), "conflict")
    except TooLarge as e:
        return _error(request, 413, str(e), "too_large")
    except BadRequest as e:  # (a body the decoder refuses is one, in `_decode`; msgspec's errors elsewhere are ours)
        return _error(request, 400, f"bad request: {e}", "bad_request")
    except (RequestPayloadError, HttpProcessingError) as e:  # a body aiohttp cannot read: a bad gzip, a cut chunk
        return _error(request, 400, f"bad request: {unreadable_body(e)}", "bad_request")
    except ConnectionResetError:  # the client left while its body came: nobody reads the answer, nothing was done
        log.info("%s %s: the client left before its request's body had come", request.method, request.path[:200])
        return _error(request, 400, "the connection was reset while the request came", "bad_request")
    except ServerUnavailable as e:
        response = _error(request, 503, str(e), "unavailable")
        response.headers["Retry-After"] = "2"
        return response
    except GridbotError as e:
        return _error(request, 400, str(e), "error")
    except Exception:
        log.exception("internal error on %s %s", request.method, request.path)
        return _error(request, 500, "internal server error; the server log has the details", "internal")


def _http_problem(request: web.Request, e: web.HTTPException) -> str:
    """What aiohttp refused (no such route, a method the route does not take, a body too large), in the
    words of our other errors, so every 4xx has a JSON body a client can show."""
    if isinstance(e, web.HTTPNotFound):
        return f"no such route: {request.method} {request.path[:200]}; docs/architecture.md lists the API"
    if isinstance(e, web.HTTPMethodNotAllowed):
        return f"{request.method} is not allowed on {request.path[:200]}; use {', '.join(sorted(e.allowed_methods))}"
    return e.text or e.reason


GC_THRESHOLDS = (50_000, 20, 100)
"""The server's collector thresholds (Python's: 700, 10, 10). The server holds hundreds of thousands of live
objects (windows of jobs, instances, hosts, the store's batches) and allocates a few per job; with the
default, a collection every 700 allocations walked the young ones and every 7,000 the older ones, a third
of the server's time at 25,000 jobs/s: 28,000 jobs/s became 41,000 with these (dispatch capacity,
docs/performance.md). Cycles are still collected, less often."""


def tune_gc() -> None:
    """Set the long-running server's collector thresholds (GC_THRESHOLDS)."""
    import gc

    gc.set_threshold(*GC_THRESHOLDS)


class Server:
    """The aiohttp application around one Service, with its tick loop."""

    def __init__(self, service: Service, tick_interval: float = 1.0, max_request_bytes: int = 0,
                 overlay: Overlay | None = None, access: ServerAccess | None = None,
                 max_hosts_per_key: int = 10_000) -> None:
        self.service = service
        self.overlay = overlay
        self.access = access
        self.max_hosts_per_key = max_hosts_per_key
        quiet_malformed_requests()
        self.registered: dict[str, int] = {}
        """Hosts registered with each worker key since the server started."""
        self.tick_interval = tick_interval
        self._holding: asyncio.Future[None] | None = None
        """The claim's check of the last tick (`Service.hold_claim`, on an executor thread)."""
        self._flush_scheduled = False
        self._work = asyncio.Event()
        self._seen_work = 0
        self._closing = False
        self.validation = Validation(service, service.config.validators)
        limit = max_request_bytes or max(64 << 20, 2 * service.config.dispatch.max_result_bytes + (1 << 20),
                                         service.config.max_input_bytes + (1 << 20))
        self.app = web.Application(middlewares=[_errors, _authenticate(access)], client_max_size=limit)
        self.app.add_routes([
            web.post("/v1/exchange", self.exchange),
            web.post("/v1/register", self.register),
            web.get("/v1/health", self.health),
            web.get("/v1/bags", self.list_bags),
            web.post("/v1/bags", self.submit),
            web.get("/v1/bags/{bag}", self.get_bag),
            web.get("/v1/bags/{bag}/wait", self.wait_bag),
            web.post("/v1/bags/{bag}/cancel", self.cancel),
            web.post("/v1/bags/{bag}/retry", self.retry),
            web.delete("/v1/bags/{bag}", self.delete),
            web.get("/v1/bags/{bag}/logs/{job}", self.logs),
            web.get("/v1/bags/{bag}/story/{job}", self.story),
            web.get("/v1/bags/{bag}/policy", self.get_policy),
            web.get("/v1/bags/{bag}/spec", self.get_spec),
            web.post("/v1/bags/{bag}/policy", self.set_policy),
            web.post("/v1/bags/{bag}/strategy", self.set_strategy),
            web.post("/v1/bags/{bag}/qos", self.set_qos),
            web.get("/v1/bags/{bag}/cost", self.cost),
            web.get("/v1/bags/{bag}/history", self.history),
            web.get("/v1/bags/{bag}/instances", self.bag_history),
            web.get("/v1/bags/{bag}/jobs", self.jobs),
            web.get("/v1/bags/{bag}/results", self.results),
            web.get("/v1/bags/{bag}/inputs/{name}", self.input_file),
            web.get("/v1/bags/{bag}/jobs/{job}/instances", self.instances),
            web.get("/v1/hosts", self.hosts),
            web.get("/v1/pools", self.pools),
            web.get("/v1/levels", self.levels),
        ])
        self.console = Console(service, self._pool_info, _owner, _reply)
        self.app.add_routes(self.console.routes())
        self.app.on_cleanup.append(self.console.close)
        self.metrics = Metrics(service, self._pool_info)
        self.app.add_routes(self.metrics.routes())
        self.app.cleanup_ctx.append(self._ticker)
        self.app.on_shutdown.append(self._release_held)
        self._enders: dict[int, set[asyncio.Future[None]]] = {}
        """Bag -> the `wait` requests held until it ends."""
        service.commit_hooks.append(self._bags_committed)
        service.reload_hooks.append(self._bags_reloaded)

    async def _release_held(self, app: web.Application) -> None:
        """Answer the idle hosts' held requests now, with no work, and the held `wait` requests with their
        bags as they are: the server waits for every request before it stops, and a held one kept it (and
        `gridbot run`) up for as long as its backoff, 10 s."""
        self._closing = True
        self._new_work()
        for bag_id in list(self._enders):
            self._wake_enders(bag_id)

    def _bags_committed(self, batch: Changes, _took: float) -> None:
        """A commit hook (on the event loop's thread, as every commit): the `wait` requests for bags whose
        end is now durable are answered."""
        for b in batch.bags.values():
            if b.state is not BagState.ACTIVE and b.bag_id in self._enders:
                self._wake_enders(b.bag_id)

    def _bags_reloaded(self) -> None:
        """A reload hook: the `wait` requests for bags the store now holds as ended (or no longer holds) are
        answered. A batch reported failed that landed all the same fired no commit hook, and its waiters would
        otherwise hear of the end only when their hold ran out, up to MAX_WAIT seconds later."""
        for bag_id in list(self._enders):
            try:
                row = self.service.store.bag(bag_id)
            except ServerUnavailable:
                return  # the store went again: their holds run out, and the next wait reads it
            if row is None or row.state is not BagState.ACTIVE:
                self._wake_enders(bag_id)

    def _wake_enders(self, bag_id: int) -> None:
        for future in self._enders.pop(bag_id, ()):
            if not future.done():
                future.set_result(None)

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
        if self._holding is not None:  # the store closes after this: let the claim's check end first
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._holding), 15)
        if self.overlay is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.overlay.close)
        self.service.close()

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.tick_interval)
            if self._holding is None or self._holding.done():  # off the loop's thread, one at a time
                self._holding = asyncio.get_running_loop().run_in_executor(None, self.service.hold_claim)
            try:
                self.service.tick(time.time())
                self._check_work()
            except Exception:
                log.exception("tick failed; will try again")

    async def exchange(self, request: web.Request) -> web.Response:
        limit = 2 * self.service.config.dispatch.max_result_bytes + (1 << 20)
        req = _decode(_exchange_decoder, await _read(
            request, limit, "an exchange (its limit: twice the server's --max-result-size, plus 1 MiB)"))
        principal: Principal = request[PRINCIPAL]
        if principal is not LOCAL:
            if req.host.host_id != principal.host_id:
                return _error(request, 403, f"this credential belongs to host {principal.host_id}, not "
                              f"{req.host.host_id[:100]!r}", "forbidden")
            if req.host.pool != principal.name:  # the pool is the key's, whatever the worker says
                req = msgspec.structs.replace(req, host=msgspec.structs.replace(req.host, pool=principal.name))
        if req.host.account:  # a worker is its own account: only a door that knows whose host it is sets one
            req = msgspec.structs.replace(req, host=msgspec.structs.replace(req.host, account=""))
        started = time.perf_counter()
        resp = await self._answer(req)
        self.metrics.counters.exchanged(time.perf_counter() - started)
        hold = server_hold(req.want, len(req.running), len(req.reports), len(resp.assignments), len(resp.cancel),
                           resp.backoff, resp.refused)
        if hold:
            # an idle host: hold its request until work comes (a bag submitted) or the backoff has passed,
            # so it hears of new work at once and asks again right after instead of sleeping on it
            work = self._work
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(work.wait(), hold)
            if not self._still_valid(request):
                return _error(request, 401, "this host's key was revoked while its request was held", "unauthorized")
            gone = request.transport is None or request.transport.is_closing()
            if work.is_set() and not self._closing and not gone:  # a host that left gets no work
                resp = await self._answer(req)
                if not resp.assignments and not resp.cancel:
                    # woken for work another host took, or work the next tick makes (a policy change turning
                    # replication on): it asks again at once and is held again, not sleeping through it
                    resp = msgspec.structs.replace(resp, backoff=0.0)
            else:
                resp = msgspec.structs.replace(resp, backoff=0.0)
        elif hold == 0.0:
            # it has just handed in its last results and holds nothing: it asks again at once, as an idle host
            # whose request is held, rather than sleep through work that comes meanwhile (a retry, a new bag)
            resp = msgspec.structs.replace(resp, backoff=0.0)
        return web.Response(body=_mp.encode(resp), content_type=MSGPACK)

    def _still_valid(self, request: web.Request) -> bool:
        """Whether the caller's key is still in force (it may be revoked while its request is held)."""
        if self.access is None:
            return True
        token = request.headers.get("Authorization", "").partition(" ")[2].strip()
        return self.access.auth.authenticate(token, fresh=True) is not None

    async def answer(self, req: ExchangeRequest) -> ExchangeResponse:
        """An exchange decided and durable, for other doors to the same hosts' path (the volunteers' BOINC
        scheduler, gridbot.volunteer): the same service, policies and group commit as `POST /v1/exchange`."""
        return await self._answer(req)

    async def _answer(self, req: ExchangeRequest) -> ExchangeResponse:
        """Decide an exchange and wait until its changes are durable (group commit). Results that a bag's
        validator must compare are compared first, under their jobs' locks (server/validate.py)."""
        pending = self.validation.pending(req)
        if not pending:
            return await self._decided(req, None)
        async with self.validation.holding(job for job, _ in pending.values()):
            verdicts = await self.validation.verdicts(req, pending)
            return await self._decided(req, verdicts)

    async def _decided(self, req: ExchangeRequest, verdicts: dict[int, Verdict] | None) -> ExchangeResponse:
        resp, changes = self.service.decide(req, time.time(), verdicts)
        self._check_work()
        if time.monotonic() < self.service.solo_until:
            self.service.commit(changes)  # after a failed batch: alone, so a bad exchange fails alone
            return resp
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

    async def register(self, request: web.Request) -> web.Response:
        """A host joins with its pool's worker key and gets its id and credential from the server."""
        req = _decode(_register_decoder, await _read(request, SMALL_BODY, "a registration"))
        principal: Principal = request[PRINCIPAL]
        if self.access is None:
            return _error(request, 400, "this server runs without keys (--no-auth): workers need no registration",
                          "bad_request")
        count = self.registered.get(principal.key_id, 0)
        if count >= self.max_hosts_per_key:
            return _error(request, 429, f"pool '{principal.name}' has registered {count:,} hosts with this key since "
                          f"the server started, its limit (server option --max-hosts-per-key)", "too_many_hosts")
        if principal.enrollment and not self.access.auth.enroll(principal, time.time(),
                                                                self.service.store.spend_enrollment):
            return _error(request, 401, f"this enrollment token of pool '{principal.name}' has registered the "
                          f"{principal.uses} host(s) it was made for, or expired; a pilot's token is spent by its "
                          "own worker", "unauthorized")
        self.registered[principal.key_id] = count + 1
        host_id, credential = self.access.auth.host_credential(principal)
        log.info("host %r registered as %s in pool %s", req.name[:200], host_id, principal.name)
        return web.Response(body=_mp.encode(Registration(host_id, credential, principal.name)), content_type=MSGPACK)

    async def health(self, request: web.Request) -> web.Response:
        """Whether the server can work: its store answers and its dispatcher is loaded (503 otherwise)."""
        try:
            self.service.store.ping()
            self.service.ready()
        except ServerUnavailable as e:
            response = _reply(request, {"ok": False, "store": str(e)}, 503)
            response.headers["Retry-After"] = "2"
            return response
        return _reply(request, {"ok": True, "bags": len(self.service.dispatcher.view.bags())})

    def _bag(self, request: web.Request) -> BagRow:
        """The bag the route names, if the caller may see it (another submitter's bag is 'no bag')."""
        return self.service.bag(request.match_info["bag"], _owner(request))

    async def submit(self, request: web.Request) -> web.Response:
        req = _plain(_decode(_submit_decoder, await request.read()))
        principal: Principal = request[PRINCIPAL]
        info = self.service.submit(req.spec, req.lines, req.inputs, time.time(), principal.name)
        self._new_work()
        return _reply(request, info, 201)

    async def list_bags(self, request: web.Request) -> web.Response:
        return _reply(request, self.service.bags(_owner(request)))

    async def get_bag(self, request: web.Request) -> web.Response:
        return _reply(request, self.service.info(self._bag(request)))

    async def wait_bag(self, request: web.Request) -> web.Response:
        """A bag as `get_bag` gives it, once it has ended (its end committed), or when `timeout` seconds have
        passed (default and at most MAX_WAIT) with the bag still active: `gridbot wait` and `Client.wait`
        hear of the end at once, without a poll a moment (which also cost the server an answer each)."""
        timeout = _seconds(request.query, "timeout", MAX_WAIT, MAX_WAIT)
        row = self._bag(request)
        if row.state is BagState.ACTIVE and timeout > 0 and not self._closing:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            waiting = self._enders.setdefault(row.bag_id, set())
            waiting.add(future)
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(future, timeout)
            finally:
                waiting.discard(future)
                if not waiting and self._enders.get(row.bag_id) is waiting:
                    del self._enders[row.bag_id]
            row = self._bag(request)
        return _reply(request, self.service.info(row))

    async def get_policy(self, request: web.Request) -> web.Response:
        return _reply(request, self.service.policies(self._bag(request)))

    async def get_spec(self, request: web.Request) -> web.Response:
        """The bag's spec as stored (its latest revision): what `gridbot retry --each-line` revises."""
        return _reply(request, self._bag(request).spec)

    async def set_policy(self, request: web.Request) -> web.Response:
        change = _decode(_policy_decoder, await _read(request, SMALL_BODY, "a policy change"))
        info = self.service.set_policy(self._bag(request), change.name, change.text)
        self._new_work()
        return _reply(request, info)

    async def set_strategy(self, request: web.Request) -> web.Response:
        """Change a running bag's `[strategy]` (tail, placement and their options), as a policy is changed."""
        row = self._bag(request)  # another owner's bag is a 404 whatever the body
        choice = _plain(_decode(_strategy_decoder, await _read(request, SMALL_BODY, "a strategy change")))
        info = self.service.set_strategy(row, choice)
        self._new_work()
        return _reply(request, info)

    async def set_qos(self, request: web.Request) -> web.Response:
        """Change a running bag's deadline or budget (`gridbot qos`)."""
        row = self._bag(request)
        change = _decode(_qos_decoder, await _read(request, SMALL_BODY, "a deadline or budget change"))
        info = self.service.set_qos(row, change)
        self._new_work()
        return _reply(request, info)

    async def cost(self, request: web.Request) -> web.Response:
        """What a bag spent, per pool, against its budget (`gridbot cost`)."""
        return _reply(request, self.service.cost(self._bag(request), _owner(request) is None))

    async def history(self, request: web.Request) -> web.Response:
        """A running bag's instances so far, tasks left and pools, for `gridbot plan` (ExPERT's input)."""
        return _reply(request, self.service.plan_input(self._bag(request)))

    async def bag_history(self, request: web.Request) -> web.Response:
        """Every instance of a bag, running or ended, for `gridbot plan --from-bag` (ExPERT offline)."""
        return _reply(request, self.service.bag_history(self._bag(request)))

    async def cancel(self, request: web.Request) -> web.Response:
        return _reply(request, self.service.cancel(self._bag(request), time.time()))

    async def retry(self, request: web.Request) -> web.Response:
        """Queue failed jobs again, or make a new revision of the bag first (`RetryRequest`)."""
        req = _decode(_retry_decoder, await request.read())
        if req.revision is not None and req.indices is not None:  # the indices were ignored without a word
            raise BadRequest("give indices (failed jobs to queue again) or revision (a new revision, which queues "
                             "every job not done), not both")
        row = self._bag(request)
        if req.revision is not None:
            rev = _plain(req.revision)
            answer = self.service.revise(row, rev.spec, rev.lines, rev.inputs, time.time())
        else:
            answer = self.service.retry(row, req.indices, time.time())
        self._new_work()
        return _reply(request, answer)

    async def delete(self, request: web.Request) -> web.Response:
        """Remove a bag (`?force=1`: even if its results were never downloaded)."""
        force = request.query.get("force", "") in ("1", "true", "yes")
        row = self._bag(request)
        deleted = self.service.delete(row, force, time.time())
        self._wake_enders(row.bag_id)  # their bag is gone: "no bag" now, not at their timeout
        return _reply(request, deleted)

    async def logs(self, request: web.Request) -> web.Response:
        """One job of a bag, by its index in the bag (not its id), with every instance of it and its output
        tails."""
        return _reply(request, self.service.logs(self._bag(request), _path_int(request, "job")))

    async def story(self, request: web.Request) -> web.Response:
        """One job of a bag, by its index in the bag: its life, from the events and decisions the store keeps."""
        return _reply(request, self.service.story(self._bag(request), _path_int(request, "job")))

    async def jobs(self, request: web.Request) -> web.Response:
        q = request.query
        state = job_state(q.get("state"))
        return _reply(request, self.service.jobs(self._bag(request), state,
                                                 _int(q, "limit", 1000, MAX_PAGE, least=1), _int(q, "after", 0)))

    async def results(self, request: web.Request) -> web.Response:
        q = request.query
        return _reply(request, self.service.results(self._bag(request), _int(q, "after", 0),
                                                    _int(q, "limit", 200, MAX_RESULTS_PAGE, least=1), time.time()))

    async def input_file(self, request: web.Request) -> web.Response:
        """An input file of a bag: to its owner (or an admin), or to a host that holds one of its instances."""
        row = self._bag(request)
        principal: Principal = request[PRINCIPAL]
        if principal.role == "host" and not self.service.dispatcher.holds(principal.host_id, row.bag_id):
            raise NotFound(f"no bag '{request.match_info['bag'][:100]}'; `gridbot status` lists the bags")
        data = self.service.input_file(row, request.match_info["name"])
        return web.Response(body=data, content_type="application/octet-stream")

    async def instances(self, request: web.Request) -> web.Response:
        rows = self.service.instances(self._bag(request), _path_int(request, "job"))
        return _reply(request, [InstanceInfo(r.instance_id, r.host_id, r.state.value, r.sent_at, r.ended_at,
                                             r.reason, r.exit_code, r.wall_s, r.cpu_s) for r in rows])

    async def pools(self, request: web.Request) -> web.Response:
        return _reply(request, self._pool_info(time.time()))

    def _pool_info(self, now: float) -> list[PoolInfo]:
        """The overlay's pools as `gridbot pools` shows them (none without a pools file)."""
        return self.overlay.info(now) if self.overlay is not None else []

    async def levels(self, request: web.Request) -> web.Response:
        """The execution hierarchy's queues with their limits and load (`gridbot levels`)."""
        return _reply(request, self.service.levels(_owner(request)))

    async def hosts(self, request: web.Request) -> web.Response:
        return _reply(request, self.service.hosts(time.time()))


MAX_PAGE = 10_000
"""Most jobs one listing request returns (`limit=` above it is capped; page with `after=`)."""
MAX_RESULTS_PAGE = 1_000
"""Most results one request returns (each may carry outputs up to the result size limit)."""
MAX_WAIT = 30.0
"""Seconds a `wait` request is held at most (`timeout=` above it is capped): well inside an HTTP client's or
a proxy's idle timeout; the client asks again."""


def _int(query: Any, key: str, default: int, cap: int | None = None, least: int = 0) -> int:
    """A whole number from the query (`default` when absent; more than `cap` is `cap`); BadRequest names a bad
    one, and says whether it is no whole number or one out of range."""
    raw = query.get(key)
    if raw is None:
        return default
    value = query_whole_number(raw, key, least)
    return min(value, cap) if cap is not None else value


def _seconds(query: Any, key: str, default: float, cap: float) -> float:
    """A duration in seconds from the query (a number from 0 up; more than `cap` is `cap`)."""
    raw = query.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if math.isnan(value):
        raise BadRequest(f"query parameter {key}={raw[:40]!r} is not a number: give a number of seconds from 0 to "
                         f"{cap:g} (more counts as {cap:g})")
    if not 0 <= value < math.inf:
        raise BadRequest(f"query parameter {key}={raw[:40]!r} is out of range: give a number of seconds from 0 to "
                         f"{cap:g} (more counts as {cap:g})")
    return min(value, cap)


def _path_int(request: web.Request, key: str) -> int:
    value = whole_number(request.match_info[key])
    if value is None:
        raise NotFound(f"no {key} {request.match_info[key][:40]!r}: it is a whole number from 0 up")
    return value


class EmbeddedServer:
    """The server on a background thread with its own event loop, bound to 127.0.0.1 (port 0: any free)."""

    def __init__(self, service: Service, port: int = 0, tick_interval: float = 1.0,
                 keys: tuple[ServerAccess, Access] | None = None) -> None:
        server_access, self.access = keys or ephemeral_keys()
        """The keys of this run (made in memory unless given): `access` is what its clients use."""
        self.server = Server(service, tick_interval, access=server_access)
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="gridbot-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def host_credential(self, pool: str = "local") -> tuple[str, str]:
        """A new host's id and credential, as registering with `pool`'s worker key gives them (for tests and
        benchmarks that speak the worker protocol themselves)."""
        server_access = self.server.access
        assert server_access is not None
        principal = server_access.auth.authenticate(self.access.workers[pool])
        assert principal is not None
        return server_access.auth.host_credential(principal)

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
