"""The BOINC side of a volunteer pool: master page, scheduler RPC, downloads and the upload handler.

One aiohttp application per volunteer pool, on the pool's own port, in the server's event loop. Its
scheduler hands every request to `Server.answer`, the path `POST /v1/exchange` takes, so a BOINC host is a
gridbot host of the pool like any other: same policies, replication, deadlines and statistics.

Doors and who may use them (docs/volunteers.md):
- `GET PATH` (master page) and `GET PATH/get_project_config.php`: public, by BOINC's design; they hold only
  the scheduler's URL and the project's name.
- `POST PATH/scheduler`: authenticated by the account's authenticator inside the request's XML.
- `GET PATH/download/TOKEN/NAME`: public but unguessable: TOKEN is an HMAC of NAME under the server's
  secret, handed out only in a scheduler reply (BOINC's downloads are plain GETs the client cannot sign).
- `POST PATH/file_upload_handler`: each upload carries the token its result's reply gave for exactly that
  file name and size limit (`<xml_signature>`); anything else is refused with 403/413 before a byte is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from gridbot.core.view import DispatchView
from gridbot.errors import GridbotError, ServerUnavailable
from gridbot.model.pools import PoolSpec
from gridbot.model.records import MAX_PILOT_CPUS, Assignment, HostInfo, InstanceReport, Outcome
from gridbot.model.volunteer import (
    VolunteerSettings,
    empty_delay,
    instances_for,
    rpc_delay,
    runtime_estimate,
    volunteer_prefetch,
)
from gridbot.protocol import ExchangeRequest, ExchangeResponse
from gridbot.server.app import Server, unreadable_body
from gridbot.volunteer.accounts import ACCOUNTS_NAME, HOSTS_NAME, AccountBook, AccountError, Hosts
from gridbot.volunteer.jobs import (
    JOB_META,
    JOB_SUFFIX,
    OUTPUT_SUFFIX,
    RESULT_RE,
    InputFile,
    Spool,
    input_file_name,
    instance_of,
    job_file,
    report_of,
    result_name,
)
from gridbot.volunteer.reply import FileInfo, Reply, Work
from gridbot.volunteer.request import RequestError, SchedulerRequest, first_block, parse_request
from gridbot.volunteer.signing import CodeSigner, Tokens, load_or_make_signer
from gridbot.volunteer.wrapper import APP_NAME, TAIL_BYTES, WRAPPER_BYTES, WRAPPER_NAME, WRAPPER_VERSION

log = logging.getLogger("gridbot.volunteer")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_REQUEST_BYTES = 16 << 20
"""Largest scheduler request read (a client reporting hundreds of results with their stderr)."""
AUTH_HEAD_BYTES = 64 << 10
"""Where the account key must be found, from the start of a scheduler request (the client writes it near the top)."""
IDLE_SECONDS = 30.0
"""Longest wait for the next bytes of a request's body (a scheduler request's, an upload's): a sender that
stalls is answered (408; a stalled upload keeps what came, to resume), one that is slow but sending is not."""
MAX_HEADER_BYTES = 64 << 10
SPOOLED_UPLOAD_BYTES = 1 << 20
"""Uploads up to this size, sent whole in one request, are kept in the spool; larger or resumed ones in files."""
AUTH_DELAY = 3600.0
"""Seconds a client with a refused account key is asked to wait before it tries again."""
DOWN_DELAY = 60.0
SWEEP_EVERY = 300.0
NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,200}\Z")
_exchange = msgspec.msgpack.Decoder(ExchangeRequest)
_encode = msgspec.msgpack.Encoder()
_LABEL_BAD = re.compile(r"[\x00-\x1f\x7f]")
NOT_POSIX = ("windows",)


def _label(text: str, fallback: str) -> str:
    """A name fit for `HostInfo` (no control characters, at most 255 characters)."""
    return _LABEL_BAD.sub(" ", text).strip()[:255] or fallback


def _xml_response(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type="text/xml")


_EMPTY_SUFFIX = re.compile(r"\s*bytes\s*=\s*-0+\s*")
"""A Range of the last 0 bytes, which aiohttp reads as `bytes=0-` (the whole file); RFC 9110 says 416."""


def _ranged(request: web.Request, data: bytes) -> web.Response:
    """`data` as a download, its Range honoured (the client resumes a download with `bytes=N-`)."""
    headers = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes"}
    total = len(data)
    try:
        wanted = request.http_range
    except ValueError:
        wanted = slice(total, None)  # unreadable: answered as one past the end
    if wanted.start is None and wanted.stop is None:
        return web.Response(body=data, headers=headers)
    start, stop, _ = wanted.indices(total)
    if start >= stop or _EMPTY_SUFFIX.fullmatch(request.headers.get("Range", "")):  # `bytes=-0`: the last 0 bytes
        return web.Response(status=416, headers={"Content-Range": f"bytes */{total}"})
    return web.Response(body=data[start:stop], status=206,
                        headers={**headers, "Content-Range": f"bytes {start}-{stop - 1}/{total}"})


def _upload_reply(status: int, message: str = "", http: int = 200, size: int | None = None) -> web.Response:
    """A `<data_server_reply>`: 0 done, 1 try again, -1 refused for good (the client gives the file up)."""
    body = f"<data_server_reply>\n    <status>{status}</status>\n"
    if size is not None:
        body += f"    <file_size>{size}</file_size>\n"
    if message:
        body += f"    <message>{escape(message)}</message>\n"
    return _xml_response((body + "</data_server_reply>\n").encode(), http)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """No traceback to a client: a bug of ours is logged and answered 500, aiohttp's own 4xx pass through."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except (RequestPayloadError, HttpProcessingError) as e:  # a body aiohttp cannot read: a bad gzip, a cut chunk
        return web.Response(status=400, text=unreadable_body(e))
    except ConnectionResetError:  # the sender left while its body came: nobody reads the answer
        return web.Response(status=400, text="the connection was reset while the request came")
    except Exception:
        log.exception("volunteer side: internal error on %s %s", request.method, request.path[:200])
        return web.Response(status=500, text="internal server error; the server log has the details")


@dataclass
class _Staged:
    """A bag's inputs as BOINC files, by input name (made once per bag revision)."""

    files: dict[str, InputFile]


class VolunteerPool:
    """One volunteer pool's BOINC project."""

    def __init__(self, server: Server, spec: PoolSpec, folder: Path, book: AccountBook, hosts: Hosts,
                 signer: CodeSigner, tokens: Tokens, listen: str, tls: ssl.SSLContext | None = None) -> None:
        self.server = server
        self.tls = tls
        """The server's TLS context (its --tls), served on this port too: the account key travels in every
        scheduler request, and whoever answers a client's first contact owns its trust."""
        self.spec = spec
        self.settings = VolunteerSettings.of(spec.options)
        self.book, self.hosts, self.signer, self.tokens = book, hosts, signer, tokens
        self.listen = self.settings.listen or listen
        self.port = self.settings.port
        self.folder = folder
        self.downloads, self.uploads = folder / "download", folder / "upload"
        for d in (self.downloads, self.uploads):
            d.mkdir(parents=True, exist_ok=True)
        self.spool = Spool(folder / "spool")  # job files and uploads of the instances out
        self._filed = self._upload_files()
        self._receiving: set[str] = set()
        """Uploads being received now, by file name: a second one of the same file is told to come back."""
        (self.downloads / WRAPPER_NAME).write_bytes(WRAPPER_BYTES)
        self.wrapper = FileInfo(WRAPPER_NAME, nbytes=len(WRAPPER_BYTES), md5=hashlib.md5(WRAPPER_BYTES).hexdigest(),
                                executable=True, signature=signer.sign(WRAPPER_BYTES))
        self._inputs: dict[tuple[int, int], _Staged] = {}
        self._last_sweep = time.monotonic()
        path = self.settings.path
        self.app = web.Application(middlewares=[_errors], client_max_size=MAX_REQUEST_BYTES)
        self.app.add_routes([
            web.get(path, self.master),
            web.get(f"{path}get_project_config.php", self.project_config),
            web.post(f"{path}scheduler", self.scheduler),
            web.get(f"{path}download/{{token}}/{{name}}", self.download),
            web.post(f"{path}file_upload_handler", self.upload),
        ])
        self._runner: web.AppRunner | None = None

    # -- addresses ------------------------------------------------------------------------------------

    @property
    def master_url(self) -> str:
        """The URL volunteers attach to (`boinccmd --project_attach URL KEY`)."""
        if self.settings.url:
            return self.settings.url
        host = "127.0.0.1" if self.listen in ("", "0.0.0.0", "::", "localhost") else self.listen
        return f"{'https' if self.tls is not None else 'http'}://{host}:{self.port}{self.settings.path}"

    def _url(self, tail: str) -> str:
        return self.master_url + tail

    def download_url(self, name: str) -> str:
        return self._url(f"download/{self.tokens.make('download', name, length=24)}/{name}")

    async def start(self) -> None:
        """Listen on the pool's port (0: a free one, then known as `port`)."""
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.listen or "127.0.0.1", self.port, ssl_context=self.tls)
        try:
            await site.start()
        except OSError as e:
            raise GridbotError(f"volunteer pool '{self.spec.name}' cannot listen on {self.listen}:{self.port}: "
                               f"{e.strerror}; change its port in the pools file") from e
        if self.port == 0:
            self.port = self._runner.addresses[0][1]
        if not self.settings.url and self.listen in ("0.0.0.0", "::"):
            log.warning("volunteer pool %s listens on all addresses but its master URL says 127.0.0.1: set its "
                        "url to the address volunteers reach (a TLS proxy's, docs/volunteers.md)", self.spec.name)
        log.info("volunteer pool %s: attach BOINC clients to %s", self.spec.name, self.master_url)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        self.spool.close()

    # -- public pages ---------------------------------------------------------------------------------

    async def master(self, request: web.Request) -> web.Response:
        """The master page: the scheduler's URL in both forms the client looks for, each on its own line."""
        url = escape(self._url("scheduler"))
        name = escape(self.settings.project_name)
        page = (f"<html>\n<head>\n<title>{name}</title>\n<link rel=\"boinc_scheduler\" href=\"{url}\">\n</head>\n"
                f"<body>\n<!--\n<scheduler>{url}</scheduler>\n-->\n<h1>{name}</h1>\n<p>A gridbot volunteer pool: "
                "attach a BOINC client to this URL with the account key the project's operator gave you.</p>\n"
                "</body>\n</html>\n")
        return web.Response(text=page, content_type="text/html")

    async def project_config(self, request: web.Request) -> web.Response:
        """What the BOINC Manager's "add project" asks first (accounts are made by the operator only)."""
        body = (f"<project_config>\n<name>{escape(self.settings.project_name)}</name>\n"
                f"<master_url>{escape(self.master_url)}</master_url>\n<account_creation_disabled/>\n"
                "<client_account_creation_disabled/>\n<min_passwd_length>1</min_passwd_length>\n</project_config>\n")
        return _xml_response(body.encode())

    # -- the scheduler --------------------------------------------------------------------------------

    async def scheduler(self, request: web.Request) -> web.Response:
        """One scheduler RPC: authenticate, take the reports, ask the dispatcher for work, answer in XML."""
        if (request.content_length or 0) > MAX_REQUEST_BYTES:
            return self._refuse(413, f"a scheduler request of over {MAX_REQUEST_BYTES:,} bytes")
        # the account key first, from the head of the body, before the rest is read or parsed: a stranger's
        # request of megabytes, or one kept open, costs the server a few kilobytes (the client writes it near
        # the top)
        try:
            head = await _read_head(request, b"</authenticator>", AUTH_HEAD_BYTES)
        except TimeoutError:
            return self._refuse(408, f"the scheduler request stalled for {IDLE_SECONDS:g} s before its key")
        key = first_block(head[:AUTH_HEAD_BYTES].decode("utf-8", "replace"), "authenticator")
        if key is None:
            return self._refuse(400, "a scheduler request must carry its account key (<authenticator>) near "
                                     "its start")
        reply = Reply(self.settings.project_name, next_rpc_delay=self._rpc_delay())
        account = self.book.authenticate(key.strip())
        if account is None:
            reply.request_delay = AUTH_DELAY
            reply.messages.append(("high", "Invalid or revoked account key for this gridbot project: ask its "
                                           "operator for one (`gridbot volunteers add NAME`), then detach and "
                                           "attach again with it."))
            return _xml_response(reply.xml())
        try:
            body = head + await _read_rest(request, MAX_REQUEST_BYTES - len(head))
        except _TooLarge:
            return self._refuse(413, f"a scheduler request of over {MAX_REQUEST_BYTES:,} bytes")
        except TimeoutError:
            return self._refuse(408, f"the scheduler request stalled for {IDLE_SECONDS:g} s")
        try:
            req = parse_request(body)
        except RequestError as e:
            return self._refuse(400, str(e))
        now = time.time()
        try:
            vhost, new = self.hosts.resolve(account, req.hostid, req.cpid, self.spec.name, now)
        except AccountError as e:
            reply.request_delay = AUTH_DELAY
            reply.messages.append(("high", str(e)))
            return _xml_response(reply.xml())
        if new:
            reply.hostid = vhost.hostid
        self.hosts.note(vhost, _label(req.domain_name, ""), req.ncpus, req.fpops)
        if not req.has_code_sign_key:
            reply.code_sign_key = self.signer.public_text
        posix = not req.platform.lower().startswith(NOT_POSIX) and bool(req.platform)
        try:
            exchange, foreign, deferred = self._exchange(req, vhost.hostid, account.account_id, posix)
        except msgspec.ValidationError as e:
            return self._refuse(400, f"a value of the request is out of range: {str(e)[:200]}")
        try:
            answer = await self._answer(exchange)
        except ServerUnavailable as e:
            reply.request_delay = DOWN_DELAY
            reply.messages.append(("low", f"the gridbot server is busy or its store is down ({e}); trying later"))
            return _xml_response(reply.xml())  # no acks: the reports were not kept, the client sends them again
        except GridbotError as e:
            log.warning("volunteer host boinc-%d: its exchange was refused (%s)", vhost.hostid, e)
            reply.request_delay = DOWN_DELAY
            reply.messages.append(("high", f"the gridbot server refused this request: {str(e)[:300]}"))
            return _xml_response(reply.xml(), 400)
        # a stock client holds only results some gridbot server made: a name of another shape is acknowledged to
        # no one (64 KB names made the reply five times the request)
        reply.acks = [r.name for r in req.results if RESULT_RE.match(r.name) and r.name not in deferred]
        if deferred:  # left for the next request, which the client makes at once
            reply.next_rpc_delay = 1.0
        for report in exchange.reports:
            if report.instance_id not in foreign:
                self._forget(report.instance_id)
        reply.aborts = [result_name(self.tokens, iid) for iid in answer.cancel]
        if not posix and exchange.want == 0 and (req.work_req_seconds > 0 or req.cpu_req_secs > 0):
            reply.messages.append(("notice", f"gridbot's application is a POSIX shell script; platform "
                                             f"{req.platform[:60]!r} gets no work (Linux, macOS and BSD do)"))
        if answer.assignments:
            self._add_work(reply, answer.assignments, req)
        elif exchange.want and not deferred:  # a minimum delay would hold back the request told to come at once
            reply.request_delay = empty_delay(answer.backoff)
        self._sweep()
        return _xml_response(reply.xml())

    async def _answer(self, exchange: ExchangeRequest) -> ExchangeResponse:
        """The exchange answered, its reports in parts of at most `max_result_bytes` of results each (one result
        alone may be that big), as a worker batches them: one scheduler request may report thousands of results,
        and one exchange must not hold them all in memory and in one commit. The parts before the last ask for
        nothing and list the instances reported in later parts as still running (else they would be lost)."""
        limit = self.server.service.config.dispatch.max_result_bytes
        parts: list[list[InstanceReport]] = [[]]
        size = 0
        for r in exchange.reports:
            if parts[-1] and size + r.result_bytes > limit:
                parts.append([])
                size = 0
            parts[-1].append(r)
            size += r.result_bytes
        cancel: set[int] = set()
        answer: ExchangeResponse | None = None
        for n, part in enumerate(parts):
            last = n == len(parts) - 1
            later = [r.instance_id for p in parts[n + 1:] for r in p]
            answer = await self.server.answer(msgspec.structs.replace(
                exchange, reports=part, want=exchange.want if last else 0,
                running=exchange.running if last else [*exchange.running, *later]))
            cancel.update(answer.cancel)
        assert answer is not None
        return msgspec.structs.replace(answer, cancel=sorted(cancel))

    def _refuse(self, status: int, why: str) -> web.Response:
        """A request that is not one: the client backs off, anyone else reads why."""
        reply = Reply(self.settings.project_name, request_delay=DOWN_DELAY)
        reply.messages.append(("high", f"bad scheduler request: {why}"))
        return _xml_response(reply.xml(), status)

    def _rpc_delay(self) -> float:
        """Seconds between a client's contacts: its heartbeat, well inside the server's host timeout."""
        return rpc_delay(self.settings.next_rpc_delay, self.server.service.config.dispatch.host_timeout)

    def _exchange(self, req: SchedulerRequest, hostid: int, account: str,
                  posix: bool) -> tuple[ExchangeRequest, set[int], set[str]]:
        """The scheduler request as the worker protocol's exchange, validated as a worker's would be; the
        instances it reports that another host holds (their files are left alone); and the names of results
        left for the next request: the reports taken hold about one `max_result_bytes` of uploads (a client
        reporting hundreds of 16 MB results at once made the server read them all, and copy them twice)."""
        reports = []
        foreign: set[int] = set()
        deferred: set[str] = set()
        held_bytes = 0
        limit = self.server.service.config.dispatch.max_result_bytes
        view = self.server.service.dispatcher.view
        for r in req.results:
            iid = instance_of(self.tokens, r.name)
            if iid is None:
                continue
            if held_bytes > limit:
                deferred.add(r.name)
                continue
            held = view.instance(iid)
            if held is not None and held.host_id != f"boinc-{hostid}":
                # another host's result: the dispatcher refuses it (and counts it against this host); its
                # upload is neither read nor removed
                reports.append(InstanceReport(iid, Outcome.FAILURE, reason="reported by another host"))
                foreign.add(iid)
                continue
            report = self._report(iid, r.name, r.state, r.exit_status, r.cpu_time, r.elapsed_time, r.stderr_out)
            held_bytes += report.result_bytes
            reports.append(report)
        running = [iid for name in req.other_results if (iid := instance_of(self.tokens, name)) is not None]
        want = self._want(req) if posix else 0
        ncpus = max(1, min(req.ncpus, MAX_PILOT_CPUS))
        info = HostInfo(f"boinc-{hostid}", _label(req.domain_name, f"boinc-{hostid}"),
                        _label(req.platform, ""), ncpus, int(req.memory_bytes // (1 << 20)), ncpus, self.spec.name,
                        volunteer_prefetch(want, ncpus), _label(req.cpid, "boinc")[:64],
                        account=f"volunteer:{account}",  # a quorum never counts two results of one account
                        speed=req.fpops / 1e9)  # the client's benchmark: Host.Speed, GFLOPS of one CPU
        running += [iid for name in deferred if (iid := instance_of(self.tokens, name)) is not None]
        exchange = ExchangeRequest(info, want, running, reports)
        return _exchange.decode(_encode.encode(exchange)), foreign, deferred  # the limits a worker's message has

    def _want(self, req: SchedulerRequest) -> int:
        """Instances for a request of so many seconds of work: by the active bags' mean run time (the pool's
        `runtime_estimate` before any job has ended), at least one per idle CPU the client names."""
        return instances_for(req.work_req_seconds, req.cpu_req_secs, req.cpu_req_instances, self._runtime(),
                             self.server.service.config.dispatch.max_assign)

    def _runtime(self) -> float:
        """The mean run time of the active bags' jobs so far (the pool's estimate without one)."""
        return runtime_estimate([b.mean_run_time for b in self.server.service.dispatcher.view.bags()],
                                self.settings.runtime_estimate)

    def _report(self, iid: int, name: str, state: int, exit_status: int, cpu: float, wall: float,
                stderr_out: str) -> InstanceReport:
        """A reported result as an instance report, with the file its client uploaded."""
        meta = self._meta(name)
        uploaded = self.spool.get(f"{name}{OUTPUT_SUFFIX}")
        if uploaded is None and f"{name}{OUTPUT_SUFFIX}" in self._filed:  # a large or resumed upload
            with contextlib.suppress(OSError):
                uploaded = (self.uploads / f"{name}{OUTPUT_SUFFIX}").read_bytes()
        cap = self.server.service.config.dispatch.max_result_bytes
        r = report_of(iid, state, exit_status, cpu, wall, stderr_out, uploaded, meta, cap + 2 * TAIL_BYTES)
        if r.result_bytes > cap:  # as the dispatcher would judge it, before it is held in the exchange
            tail = max(256, cap // 4)
            r = InstanceReport(iid, Outcome.FAILURE, r.exit_code, r.wall_s, r.cpu_s,
                               f"its result of {r.result_bytes:,} bytes (outputs, stdout and stderr) is over the "
                               f"server's limit of {cap:,} bytes (the server's --max-result-size)",
                               r.stdout_tail[-tail:], r.stderr_tail[-tail:])
        return r

    def _meta(self, name: str) -> list[str]:
        """The declared outputs of the instance behind result `name`, from its job file's first line."""
        try:
            job = self.spool.get(f"{name}{JOB_SUFFIX}")
            if job is None:
                return []
            first = job[:job.find(b"\n")]
            return [str(o) for o in json.loads(first.removeprefix(JOB_META))["outputs"]]
        except (OSError, ValueError, KeyError, TypeError):
            return []

    def _forget(self, iid: int) -> None:
        """Remove what was kept for a reported instance: its job file (with its declared outputs) and upload."""
        name = result_name(self.tokens, iid)
        self.spool.drop(f"{name}{JOB_SUFFIX}")
        output = f"{name}{OUTPUT_SUFFIX}"
        if not self.spool.drop(output) and output in self._filed:
            self._filed.discard(output)
            for path in (self.uploads / output, self.uploads / f"{output}.part"):
                with contextlib.suppress(OSError):
                    path.unlink()

    def _add_work(self, reply: Reply, assignments: Sequence[Assignment], req: SchedulerRequest) -> None:
        """Each instance as a workunit, its files, and the app that runs it."""
        flops = req.fpops
        est = self._runtime()
        main = dataclasses.replace(self.wrapper, url=self.download_url(WRAPPER_NAME))
        reply.app = (APP_NAME, WRAPPER_VERSION, req.platform, main, flops)
        max_nbytes = self.server.service.config.dispatch.max_result_bytes + 2 * TAIL_BYTES + (64 << 10)
        now = time.time()
        seen: set[str] = set()
        for a in assignments:
            name = result_name(self.tokens, a.instance_id)
            try:
                staged = self._stage_inputs(a)
                job = job_file(a, [f"gridbot_in_{k}" for k in range(len(staged))])
                self.spool.put(f"{name}{JOB_SUFFIX}", job)  # its first line keeps the declared outputs
            except (OSError, GridbotError) as e:
                # left out of the reply: the client never lists it, and the next contact gives it back
                log.warning("instance %d cannot be served (%s); it is given back at the host's next contact",
                            a.instance_id, e)
                continue
            job_info = FileInfo(f"{name}{JOB_SUFFIX}", self.download_url(f"{name}{JOB_SUFFIX}"), len(job),
                                hashlib.md5(job).hexdigest())
            files = [job_info, *staged]
            for f in files:
                if f.name not in seen:
                    seen.add(f.name)
                    reply.files.append(f)
            output = f"{name}{OUTPUT_SUFFIX}"
            reply.files.append(FileInfo(output, upload_url=self._url("file_upload_handler"), max_nbytes=max_nbytes,
                                        upload_token=self.tokens.make("upload", output, max_nbytes)))
            span = max(60.0, a.instance_deadline - now)
            seconds = min(est, span)
            reply.work.append(Work(
                name, f"{name}_wu", [(job_info.name, "gridbot_job"),
                                     *((f.name, f"gridbot_in_{k}") for k, f in enumerate(staged))],
                output, int(a.instance_deadline), seconds * flops, 2 * max(span, a.timeout or 0.0) * flops,
                float(a.limits.memory) if a.limits is not None and a.limits.memory else 1e8, 4e9))

    def _stage_inputs(self, a: Assignment) -> list[FileInfo]:
        """The instance's inputs as download files (written to the download folder once per bag revision)."""
        key = (a.bag_id, a.revision)
        staged = self._inputs.get(key)
        if staged is None:
            staged = self._inputs[key] = _Staged({})
        out = []
        store = self.server.service.store
        for position, input_name in enumerate(a.inputs):
            f = staged.files.get(input_name)
            if f is None:
                data = store.input_file(a.bag_id, input_name)
                if data is None:
                    raise GridbotError(f"bag {a.bag_id} has no input '{input_name[:100]}'")
                f = InputFile(input_file_name(a.bag_id, position, data), len(data), hashlib.md5(data).hexdigest())
                path = self.downloads / f.name
                if not path.exists():
                    tmp = path.with_name(f".{f.name}.tmp")
                    tmp.write_bytes(data)
                    os.replace(tmp, path)
                staged.files[input_name] = f
            out.append(FileInfo(f.name, self.download_url(f.name), f.nbytes, f.md5))
        return out

    def _upload_files(self) -> set[str]:
        """The uploads kept as files (whole or in part), by name: the others are not looked for on disk."""
        return {p.name.removesuffix(".part") for p in self.uploads.iterdir()}

    @staticmethod
    def _gone(name: str, view: DispatchView) -> bool:
        """Whether file `name` belongs to an instance (`gb42_...`) or a bag's input (`gbi7_...`) the dispatcher no
        longer holds."""
        m = re.match(r"gb([0-9]+)_", name)
        bag = re.match(r"gbi([0-9]+)_", name)
        return (m is not None and view.instance(int(m.group(1))) is None) or (
            bag is not None and int(bag.group(1)) not in view)

    def _sweep(self) -> None:
        """Every few minutes: drop the files of instances and bags the dispatcher no longer holds."""
        if time.monotonic() - self._last_sweep < SWEEP_EVERY:
            return
        self._last_sweep = time.monotonic()
        view = self.server.service.dispatcher.view
        for kept in self.spool.older(SWEEP_EVERY):
            if self._gone(kept, view):
                self.spool.drop(kept)
        try:
            self.spool.compact()
        except OSError as e:
            log.warning("volunteer pool %s cannot compact its spool (%s)", self.spec.name, e.strerror)
        for folder in (self.downloads, self.uploads):
            for path in folder.iterdir():
                if self._gone(path.name, view) and time.time() - path.stat().st_mtime > SWEEP_EVERY:
                    with contextlib.suppress(OSError):
                        path.unlink()
        self._inputs = {k: v for k, v in self._inputs.items() if k[0] in view}
        self._filed = self._upload_files()

    # -- files ----------------------------------------------------------------------------------------

    async def download(self, request: web.Request) -> web.StreamResponse:
        """A file offered in a scheduler reply, by its token (Range honoured: the client resumes with it)."""
        name, token = request.match_info["name"], request.match_info["token"]
        if not NAME_RE.match(name) or not self.tokens.check(token, "download", name, length=24):
            raise web.HTTPNotFound(text="no such file")
        data = self.spool.get(name)
        if data is not None:
            return _ranged(request, data)
        path = self.downloads / name
        if not path.is_file():
            raise web.HTTPNotFound(text="no such file (its job may have ended)")
        return web.FileResponse(path, headers={"Content-Type": "application/octet-stream"})

    async def upload(self, request: web.Request) -> web.Response:
        """BOINC's file upload exchange: a size query, or a header then the file's bytes from an offset."""
        try:
            head = await _read_head(request, b"<data>\n", MAX_HEADER_BYTES, 8192)
        except TimeoutError:
            return _upload_reply(-1, f"the upload's header stalled for {IDLE_SECONDS:g} s", 408)
        if b"<data>\n" not in head:
            query = re.search(rb"<get_file_size>([^<]{1,200})</get_file_size>", head)
            if query is None:
                return _upload_reply(-1, "not a BOINC upload request", 400)
            name = query.group(1).decode(errors="replace").strip()
            if self._output_of(name) is None:
                return _upload_reply(-1, "no such upload", 404)
            part = self.uploads / f"{name}.part"
            done = self.uploads / name
            size = self.spool.size(name)
            if size is None and name in self._filed:
                size = done.stat().st_size if done.exists() else part.stat().st_size if part.exists() else 0
            return _upload_reply(0, size=size or 0)
        at = head.index(b"<data>\n")
        header, rest = head[:at].decode(errors="replace"), head[at + len(b"<data>\n"):]
        fields = {k: ((found or "").strip()[:1000] if (found := first_block(header, k)) is not None else "")
                  for k in ("name", "xml_signature", "max_nbytes", "nbytes", "md5_cksum", "offset")}
        name = fields["name"]
        try:
            max_nbytes, nbytes, offset = (int(float(fields[k])) for k in ("max_nbytes", "nbytes", "offset"))
        except (ValueError, OverflowError):
            return _upload_reply(-1, "the upload header's sizes are not numbers", 400)
        iid = self._output_of(name)
        if iid is None:
            return _upload_reply(-1, f"no upload was asked for a file named {name[:80]!r}", 403)
        if not self.tokens.check(fields["xml_signature"], "upload", name, max_nbytes):
            return _upload_reply(-1, "bad upload token", 403)
        if nbytes < 0:
            return _upload_reply(-1, f"nbytes is {_count(nbytes)}: a file's size is 0 or more", 400)
        if nbytes > max_nbytes:
            return _upload_reply(-1, f"a file of {_count(nbytes)} bytes is over its limit of {_count(max_nbytes)}",
                                 413)
        if self.server.service.dispatcher.view.instance(iid) is None:
            # reported, cancelled or never sent: a token has no expiry, so whether its result is still out decides
            return _upload_reply(-1, "this result is no longer out: its file is not needed")
        if name in self.spool:
            return _upload_reply(0)  # sent again after a lost answer
        part, done, have = self.uploads / f"{name}.part", self.uploads / name, 0
        if name in self._filed:  # the disk is looked at only for uploads known to be there
            if done.exists():
                return _upload_reply(0)
            have = part.stat().st_size if part.exists() else 0
        if offset < 0:
            return _upload_reply(-1, f"offset {_count(offset)} is negative: an upload resumes at 0 or more, up to the "
                                 f"{have:,} bytes received", 400)
        if offset > have:
            return _upload_reply(-1, f"offset {_count(offset)} is past the {have:,} bytes received", 400)
        if name in self._receiving:  # two writers of one file would mix their bytes
            return _upload_reply(1, "another upload of this file is under way; try again later")
        self._receiving.add(name)
        try:
            if have == 0 and nbytes <= SPOOLED_UPLOAD_BYTES:
                return await self._receive_whole(request, name, part, rest, nbytes, fields["md5_cksum"])
            return await self._receive(request, part, done, rest, offset, nbytes, fields["md5_cksum"])
        except FileNotFoundError:
            # its result was reported while the bytes came (its files removed): nothing is left to complete
            return _upload_reply(-1, "this result was reported while its file came: the file is not needed")
        finally:
            self._receiving.discard(name)

    async def _receive_whole(self, request: web.Request, name: str, part: Path, rest: bytes, nbytes: int,
                             md5: str) -> web.Response:
        """A small upload from its start, never read beyond `nbytes`, kept in the spool once whole and its MD5
        checked (a cut one goes to a file, from which the client resumes)."""
        chunks: list[bytes] = []
        received = await _read_upload(request, rest, 0, nbytes, chunks.append)
        if received > nbytes:
            return _upload_reply(-1, "more bytes than the header's nbytes", 413)
        data = b"".join(chunks)
        if received < nbytes:
            self._filed.add(name)
            part.write_bytes(data)
            return _upload_reply(1, f"upload cut at {received:,} of {nbytes:,} bytes; resume")
        if md5 and hashlib.md5(data).hexdigest() != md5.lower():
            return _upload_reply(-1, "the file's MD5 does not match the header's", 400)
        try:
            self.spool.put(name, data)
        except OSError as e:
            log.warning("volunteer pool %s cannot keep upload %s (%s); the client sends it again", self.spec.name,
                        name, e.strerror)
            return _upload_reply(1, "the server cannot keep the file now; try again later")
        return _upload_reply(0)

    async def _receive(self, request: web.Request, part: Path, done: Path, rest: bytes, offset: int, nbytes: int,
                       md5: str) -> web.Response:
        """Write the upload's bytes from `offset`, never beyond `nbytes`; check the MD5 once it is whole."""
        self._filed.add(done.name)
        with open(part, "r+b" if part.exists() else "wb") as f:
            f.truncate(offset)
            f.seek(offset)
            received = await _read_upload(request, rest, offset, nbytes, f.write)
            if received > nbytes:
                f.truncate(offset)
                return _upload_reply(-1, "more bytes than the header's nbytes", 413)
        if received < nbytes:
            return _upload_reply(1, f"upload cut at {received:,} of {nbytes:,} bytes; resume")
        digest = hashlib.md5(part.read_bytes()).hexdigest()
        if md5 and digest != md5.lower():
            part.unlink()
            return _upload_reply(-1, "the file's MD5 does not match the header's", 400)
        os.replace(part, done)
        return _upload_reply(0)

    def _output_of(self, name: str) -> int | None:
        """The instance whose output file `name` is (None: not the output of a result this server made)."""
        return instance_of(self.tokens, name[:-len(OUTPUT_SUFFIX)]) if name.endswith(OUTPUT_SUFFIX) else None


class _TooLarge(Exception):
    """A body went over its limit while it was read."""


async def _read_some(request: web.Request, n: int) -> bytes:
    """Up to `n` bytes of the body as they come (b"": its end); TimeoutError when none come for IDLE_SECONDS."""
    return await asyncio.wait_for(request.content.read(n), IDLE_SECONDS)


async def _read_head(request: web.Request, marker: bytes, limit: int, piece: int | None = None) -> bytes:
    """The start of a body, read as it comes until it holds `marker`, reaches `limit` bytes or ends; each read
    takes up to `piece` bytes (None: what the limit leaves). TimeoutError as `_read_some`."""
    head = b""
    while marker not in head and len(head) < limit:
        chunk = await _read_some(request, piece if piece is not None else limit - len(head))
        if not chunk:
            break
        head += chunk
    return head


async def _read_rest(request: web.Request, limit: int) -> bytes:
    """What is left of a request's body, up to `limit` bytes (_TooLarge past it, read no further)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await _read_some(request, 1 << 16):
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _count(n: int) -> str:
    """A number from an upload header as a reply says it: 1,234 or, when too long to read, 1e+300 (a header's
    1e300 is a 301-digit integer once read)."""
    return f"{n:,}" if abs(n) < 10**15 else f"{float(n):g}"


async def _read_upload(request: web.Request, first: bytes, received: int, nbytes: int,
                       sink: Callable[[bytes], object]) -> int:
    """Hand an upload's bytes to `sink`, `first` (read with the header) then the body, until the request
    ends; return the count reached from `received`. Over `nbytes`, reading stops at once and the chunk that
    went over never reaches `sink`: a client cannot make the server take more than the file's limit."""
    chunk = first
    while True:
        received += len(chunk)
        if received > nbytes:
            return received
        sink(chunk)
        try:
            chunk = await _read_some(request, 1 << 16)
        except TimeoutError:  # stalled: what came is kept (the client resumes from it), the file name freed
            return received
        if not chunk:
            return received


def accounts_path(access_path: Path | None, state_dir: Path) -> Path:
    """Where the volunteer accounts live: beside the server's access file, where `gridbot volunteers` writes
    them by default (or in its state folder when it has none: `--no-auth`)."""
    return (access_path.parent if access_path is not None else state_dir) / ACCOUNTS_NAME


def serve_volunteers(server: Server, pools: Sequence[PoolSpec], state_dir: Path, listen: str,
                     access_path: Path | None, tls: ssl.SSLContext | None = None) -> list[VolunteerPool]:
    """Make the BOINC side of each volunteer pool and start it with `server`'s application (stopped with it),
    over HTTPS with the server's certificate when it has one (`tls`). The code-signing key and the token
    secret are made in `state_dir/volunteer` on the first start."""
    folder = state_dir / "volunteer"
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    signer, tokens = load_or_make_signer(folder), Tokens.load_or_make(folder)
    book = AccountBook(accounts_path(access_path, state_dir))
    hosts = Hosts(folder / HOSTS_NAME)
    out = [VolunteerPool(server, spec, folder / spec.name, book, hosts, signer, tokens, listen, tls) for spec in pools]

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        for pool in out:
            await pool.start()
        yield
        for pool in out:
            await pool.stop()

    server.app.cleanup_ctx.append(lifecycle)
    return out
