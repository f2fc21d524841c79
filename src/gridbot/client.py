"""`gridbot.Client`: the Python API of a gridbot server, for scripts and workflow tools.

    client = gridbot.Client("http://127.0.0.1:8470", access="gridbot-access.json")
    bag = client.submit_file("sweep.toml")
    client.wait(bag.name)
    client.download_results(bag.name, "results/")

Every call is one HTTP request (results are paged); errors the server reports arrive as ApiError
with the server's message, and an unreachable server as ServerUnavailable. The key comes from the
access file the server wrote (`access=`, or GRIDBOT_ACCESS, or ./gridbot-access.json); with a
fingerprint in it, the connection accepts only the server's own certificate.
"""

from __future__ import annotations

import codecs
import http.client
import json
import os
import stat
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from gridbot.errors import GridbotError, ServerUnavailable
from gridbot.model.plan_file import PLAN_SUFFIX, parse_plan
from gridbot.model.spec import (
    DEFAULT_MAX_JOBS,
    BagSpec,
    Problem,
    SpecError,
    StrategyChoice,
    each_line_spec,
    key_lines,
    name_issue,
    parse_lines,
    parse_spec,
)
from gridbot.model.states import BAG_TERMINAL
from gridbot.policy.policies import PolicyError, validate_policies
from gridbot.protocol import (
    DEFAULT_PORT,
    MSGPACK,
    BagHistory,
    BagInfo,
    CostInfo,
    Deleted,
    HostInfoRow,
    InstanceInfo,
    JobInfo,
    JobLog,
    JobStory,
    PlanInput,
    PolicyChange,
    PoolInfo,
    QosChange,
    QueueInfo,
    ResultInfo,
    RetryAnswer,
    RetryRequest,
    SubmitRequest,
    lean,
)
from gridbot.results import ResultsFolder
from gridbot.schedulers import registry
from gridbot.schedulers.base import StrategyError
from gridbot.security.access import Access, find_access
from gridbot.security.keys import AccessError
from gridbot.security.tls import PinnedHTTPSConnection, client_context

T = TypeVar("T")
TERMINAL_BAG_STATES: frozenset[str] = BAG_TERMINAL
"""States in which a bag has ended (the model's `BAG_TERMINAL`; `BagInfo.state` is one of `BagState`)."""
WAIT_HOLD = 25.0
"""Seconds `Client.wait` asks the server to hold each request (the server's cap, MAX_WAIT, is 30)."""
OLD_POLL = 1.0
"""Seconds between two looks at a running bag on a server without the `wait` route (an older version)."""
DEFAULT_SERVER = f"http://127.0.0.1:{DEFAULT_PORT}"


class ApiError(GridbotError):
    """The server refused a request; `status` is the HTTP status and the message is the server's."""

    def __init__(self, status: int, message: str, kind: str = "error") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


SPEC_FILE_LIMIT = 64 << 20
"""The largest spec or each-line file read (a spec of a million-line sweep is a few MiB)."""
INPUTS_LIMIT = 256 << 20
"""The largest total of a bag's input files read: the server's limit (`ServiceConfig.max_input_bytes`)."""


def read_regular(path: Path, limit: int, what: str) -> bytes:
    """A regular file's bytes, refusing anything else before reading it: a FIFO (which would wait for a
    writer forever), a device (/dev/zero never ends), a directory, or a file over `limit` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise GridbotError(f"cannot read {what} {path} ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise GridbotError(f"{what} {path} is not a regular file (a device, pipe or folder): give a file")
        if st.st_size > limit:
            raise GridbotError(f"{what} {path} is {st.st_size:,} bytes, over the {limit:,} read here: split it, "
                               "or pass big data some other way than through the server")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit + 1)
    finally:
        os.close(fd)


def _lines(text: str) -> str:
    """Line ends as `Path.read_text` makes them (a lone CR, an old Mac's, is a line end too)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _text(data: bytes, path: Path, what: str) -> str:
    """The text of a file read as `what`, with `_lines`' line ends and without the UTF-8 byte order mark
    some editors put first (Notepad's): left in, it went into the first job's command, or the TOML reader
    refused the spec's first line. A file that is not UTF-8 is a GridbotError naming its first bad line."""
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        return _lines(data.decode())
    except UnicodeDecodeError as e:
        line = _lines(data[:e.start].decode()).count("\n") + 1
        raise GridbotError(f"{what} {path} is not UTF-8 text (byte 0x{data[e.start]:02x} on line {line}): save it "
                           "as UTF-8") from None


def load_spec_file(path: str | Path, name: str | None = None,
                   max_jobs: int = DEFAULT_MAX_JOBS) -> tuple[BagSpec, dict[str, bytes]]:
    """Read and validate a spec file and its input files (relative to the spec's folder). A file ending in
    `.pln` is a Nimrod/G plan file, translated into the same bag (docs/spec.md, "Nimrod plan files")."""
    path = Path(path)
    text = _text(read_regular(path, SPEC_FILE_LIMIT, "spec"), path, "spec")
    if path.suffix.lower() == PLAN_SUFFIX:
        spec = parse_plan(text, str(path), path.stem, max_jobs)
    else:
        spec = parse_spec(text, str(path), path.stem, max_jobs)
    if name:
        spec = _named(msgspec.structs.replace(spec, name=name), str(path))
    problems, lines = [], key_lines(text)
    for policy, written in spec.policy.items():  # one at a time, so that every wrong one is named at once
        try:
            validate_policies({policy: written}, spec.instance_deadline, bag_name=spec.name)
        except PolicyError as e:
            line = lines.get(("policy", e.policy)) or lines.get(("policy",))
            problems.append(Problem(f"policy {e.policy} = {e.text!r}: {e.problem}", line, e.hint))
    try:
        registry.check_bag(spec)
    except StrategyError as e:
        # GridBot's placement, named or not, is the hierarchy's on a server with queues: its options are for
        # that server to judge (one without queues refuses them, naming the fix)
        hierarchy = registry.default_placement(spec, True)
        if hierarchy is spec or not _passes(hierarchy):
            problems.append(Problem(str(e), lines.get(("strategy",)), "see docs/architecture.md for the strategies"))
    if problems:
        raise SpecError(str(path), problems)
    inputs = {}
    left = INPUTS_LIMIT
    for p in spec.inputs:
        f = path.parent / p
        if not f.exists():
            raise GridbotError(f"{path}: input file '{p}' cannot be read (no such file): inputs are relative to "
                               f"the spec's folder, {path.parent}")
        data = read_regular(f, left, f"{path}: input file")
        left -= len(data)
        inputs[p.rstrip("/").rsplit("/", 1)[-1]] = data
    return spec, inputs


def _passes(spec: BagSpec) -> bool:
    try:
        registry.check_bag(spec)
    except StrategyError:
        return False
    return True


def with_policies(spec: BagSpec, assignments: Sequence[str]) -> BagSpec:
    """The spec with `NAME=EXPRESSION` policies from the command line added (they win over the spec's)."""
    written = dict(spec.policy)
    for item in assignments:
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise GridbotError(f"--policy {item!r} is not NAME=EXPRESSION; e.g. --policy 'Rank=Host.NumCpus'")
        written[name.strip()] = text.strip()
    try:
        validate_policies(written, spec.instance_deadline, bag_name=spec.name)
    except PolicyError as e:
        raise GridbotError(f"--policy: {e}") from None
    return msgspec.structs.replace(spec, policy=written)


def load_lines_file(path: str | Path, name: str | None = None,
                    max_jobs: int = DEFAULT_MAX_JOBS) -> tuple[BagSpec, list[str]]:
    """Read a file of one shell command per line into an each-line bag."""
    path = Path(path)
    text = _text(read_regular(path, SPEC_FILE_LIMIT, "each-line file"), path, "each-line file")
    lines = parse_lines(text, str(path), max_jobs)
    return _named(each_line_spec(name or path.stem), str(path)), lines


def _named(spec: BagSpec, source: str) -> BagSpec:
    """`spec`, unless its name (from --name, or a file's stem) is one the server refuses: then a SpecError."""
    if issue := name_issue(spec.name):
        raise SpecError(source, [Problem(issue[0], None, f"{issue[1]}; choose one with --name")])
    return spec


def _server_url(url: str) -> tuple[str, str, int]:
    """The scheme, host and port of `url` (the scheme's port if it names none); a GridbotError if it is no
    http(s)://host:port. urllib checks an IPv6 host's brackets and the port only as it reads them, and says
    so with a ValueError of its own."""
    try:
        parsed = urllib.parse.urlsplit(url)
        port = parsed.port
    except ValueError as e:
        raise GridbotError(f"server URL {url!r} is not http://host:port ({e})") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise GridbotError(f"server URL {url!r} is not http://host:port")
    if port == 0:  # (it went to port 80: 0 is falsy)
        raise GridbotError(f"server URL {url!r} is not http://host:port (port 0 is no port a server listens on)")
    return parsed.scheme, parsed.hostname, port or (443 if parsed.scheme == "https" else 80)


class Client:
    """A connection to one gridbot server, as the submitter (or, with `admin=True`, the admin) of an
    access file."""

    def __init__(self, url: str | None = None, timeout: float = 60.0, access: Access | str | Path | None = None,
                 admin: bool = False) -> None:
        self.access = access if isinstance(access, Access) else find_access(access)
        url = url or self.access.server or DEFAULT_SERVER
        scheme, self._host, self._port = _server_url(url)
        if scheme == "http" and self.access.fingerprint:
            raise GridbotError(f"the access file pins a TLS certificate, but {url} is plain http: the key would "
                               "cross the network in clear; use the https:// URL the access file names")
        self.url = url.rstrip("/")
        self._https = scheme == "https"
        self._timeout = timeout
        self._conn: http.client.HTTPConnection | None = None
        self._old_server = False
        """The server has no `wait` route (an older version): `bag_once_ended` polls."""
        key = self.access.user_key(admin)
        self._headers = {"Accept": MSGPACK, **({"Authorization": f"Bearer {key}"} if key else {})}

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            fingerprint = self.access.fingerprint
            if self._https and fingerprint:
                self._conn = PinnedHTTPSConnection(self._host, self._port, fingerprint, self._timeout)
            elif self._https:
                self._conn = http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout,
                                                         context=client_context(None))
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        return self._conn

    def _request(self, method: str, path: str, body: bytes | None = None, type_: type[T] | Any = None,
                 content_type: str = MSGPACK) -> Any:
        """One call; a read the server answers with 503 (its database briefly away) is tried again after the
        server's Retry-After, a few times, before the error reaches the caller."""
        for attempt in range(UNAVAILABLE_TRIES):
            try:
                return self._once(method, path, body, type_, content_type)
            except _Retry as e:
                if method != "GET" or attempt == UNAVAILABLE_TRIES - 1:
                    raise ServerUnavailable(str(e)) from None
                time.sleep(e.after)
        raise AssertionError("unreachable")

    def _once(self, method: str, path: str, body: bytes | None, type_: type[T] | Any, content_type: str) -> Any:
        headers = dict(self._headers)
        if body is not None:
            headers["Content-Type"] = content_type
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                break
            except AccessError:
                self.close()
                raise
            except (OSError, http.client.HTTPException) as e:
                self.close()
                if attempt == 2 or (method != "GET" and not isinstance(e, http.client.RemoteDisconnected)):
                    raise ServerUnavailable(f"cannot reach the gridbot server at {self.url}: {e}; "
                                            "is `gridbot server` running there?") from e
        if resp.status >= 400:
            try:
                err = msgspec.msgpack.decode(data) if resp.getheader("Content-Type") == MSGPACK else json.loads(data)
                message, kind = err.get("error", str(err)), err.get("kind", "error")
            except Exception:
                message, kind = data[:300].decode(errors="replace"), "error"
            if resp.status == 503:
                raise _Retry(f"server error (HTTP {resp.status}): {message}", resp.getheader("Retry-After"))
            if resp.status >= 500:
                raise ServerUnavailable(f"server error (HTTP {resp.status}): {message}")
            raise ApiError(resp.status, message, kind)
        if type_ is None:
            return data
        return msgspec.msgpack.decode(data, type=type_)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- submitting -----------------------------------------------------------------------------------

    def submit(self, spec: BagSpec, lines: Sequence[str] | None = None,
               inputs: dict[str, bytes] | None = None) -> BagInfo:
        """Submit a validated spec (with its commands, for each-line bags, and its input files)."""
        body = msgspec.msgpack.encode(lean(SubmitRequest(spec, list(lines) if lines is not None else None,
                                                         inputs or {})))
        return self._request("POST", "/v1/bags", body, BagInfo)  # type: ignore[no-any-return]

    def submit_file(self, path: str | Path, name: str | None = None, max_jobs: int = DEFAULT_MAX_JOBS) -> BagInfo:
        """Validate and submit a TOML spec (or a `.pln` plan file); SpecError names the file, line and fix of
        every problem."""
        spec, inputs = load_spec_file(path, name, max_jobs)
        return self.submit(spec, None, inputs)

    def submit_lines(self, path: str | Path, name: str | None = None, max_jobs: int = DEFAULT_MAX_JOBS) -> BagInfo:
        """Submit one job per line of a file, each line a shell command."""
        spec, lines = load_lines_file(path, name, max_jobs)
        return self.submit(spec, lines)

    # -- watching -------------------------------------------------------------------------------------

    def bags(self) -> list[BagInfo]:
        return self._request("GET", "/v1/bags", None, list[BagInfo])  # type: ignore[no-any-return]

    def bag(self, ref: str | int) -> BagInfo:
        return self._request("GET", f"/v1/bags/{_q(ref)}", None, BagInfo)  # type: ignore[no-any-return]

    def bag_once_ended(self, ref: str | int, hold: float) -> BagInfo:
        """The bag once it has ended, or after `hold` seconds (at most the server's 30, and half this client's
        timeout) if it has not. A server older than the `wait` route is asked for the bag, and if it is still
        running the answer comes after `hold` or OLD_POLL seconds, whichever is less (the poll of before)."""
        hold = self._hold(hold)
        if not self._old_server:
            try:
                return self._request("GET", f"/v1/bags/{_q(ref)}/wait?timeout={hold:.3f}",  # type: ignore[no-any-return]
                                     None, BagInfo)
            except ApiError as e:
                if e.status != 404 or e.kind == "not_found":  # the route's own 404 is "no such bag"
                    raise
                self._old_server = True
        info = self.bag(ref)
        if info.state not in TERMINAL_BAG_STATES:
            time.sleep(min(hold, OLD_POLL))
        return info

    def _hold(self, hold: float) -> float:
        """Seconds a `wait` request may be held: no more than half this client's own timeout."""
        return max(0.0, min(hold, self._timeout / 2))

    def jobs(self, ref: str | int, state: str | None = None, limit: int = 1000, after: int = 0) -> list[JobInfo]:
        query = urllib.parse.urlencode({k: v for k, v in (("state", state), ("limit", limit), ("after", after))
                                        if v is not None})
        return self._request("GET", f"/v1/bags/{_q(ref)}/jobs?{query}", None,  # type: ignore[no-any-return]
                             list[JobInfo])

    def instances(self, ref: str | int, job_id: int) -> list[InstanceInfo]:
        """Every instance of one job of the bag: where it ran and how it ended."""
        return self._request("GET", f"/v1/bags/{_q(ref)}/jobs/{job_id}/instances", None,  # type: ignore[no-any-return]
                             list[InstanceInfo])

    def pools(self) -> list[PoolInfo]:
        """Each pool of the server's pools file with its pilots, hosts and throughput."""
        return self._request("GET", "/v1/pools", None, list[PoolInfo])  # type: ignore[no-any-return]

    def hosts(self) -> list[HostInfoRow]:
        return self._request("GET", "/v1/hosts", None, list[HostInfoRow])  # type: ignore[no-any-return]

    def spec(self, ref: str | int) -> BagSpec:
        """The bag's spec as stored (its latest revision)."""
        return self._request("GET", f"/v1/bags/{_q(ref)}/spec", None, BagSpec)  # type: ignore[no-any-return]

    def policy(self, ref: str | int) -> dict[str, str]:
        """The bag's policies as they apply (what was written, and the defaults)."""
        return self._request("GET", f"/v1/bags/{_q(ref)}/policy", None, dict[str, str])  # type: ignore[no-any-return]

    def set_policy(self, ref: str | int, name: str, text: str) -> BagInfo:
        """Change one policy of a bag while it runs; the next decision uses it."""
        body = msgspec.json.encode(PolicyChange(name, text))
        return self._request("POST", f"/v1/bags/{_q(ref)}/policy", body, BagInfo,  # type: ignore[no-any-return]
                             "application/json")

    def set_strategy(self, ref: str | int, choice: StrategyChoice) -> BagInfo:
        """Change a running bag's `[strategy]`; its strategies are made anew from the next decision on."""
        body = msgspec.json.encode(lean(choice))
        return self._request("POST", f"/v1/bags/{_q(ref)}/strategy", body, BagInfo,  # type: ignore[no-any-return]
                             "application/json")

    def levels(self) -> list[QueueInfo]:
        """The execution hierarchy's queues with their limits and load (empty: the server has none)."""
        return self._request("GET", "/v1/levels", None, list[QueueInfo])  # type: ignore[no-any-return]

    def set_qos(self, ref: str | int, change: QosChange) -> BagInfo:
        """Change a running bag's deadline or budget; its placement plans with them from the next decision on."""
        return self._request("POST", f"/v1/bags/{_q(ref)}/qos", msgspec.json.encode(change), BagInfo,  # type: ignore[no-any-return]
                             "application/json")

    def cost(self, ref: str | int) -> CostInfo:
        """What a bag spent, per pool, against its budget."""
        return self._request("GET", f"/v1/bags/{_q(ref)}/cost", None, CostInfo)  # type: ignore[no-any-return]

    def plan_input(self, ref: str | int) -> PlanInput:
        """A running bag's instances so far, tasks left and pools: what `gridbot plan` characterizes."""
        return self._request("GET", f"/v1/bags/{_q(ref)}/history", None, PlanInput)  # type: ignore[no-any-return]

    def bag_history(self, ref: str | int) -> BagHistory:
        """Every instance of a bag, running or ended, as the server stored it: what `gridbot plan --from-bag`
        characterizes the pools from."""
        return self._request("GET", f"/v1/bags/{_q(ref)}/instances", None, BagHistory)  # type: ignore[no-any-return]

    def cancel(self, ref: str | int) -> BagInfo:
        return self._request("POST", f"/v1/bags/{_q(ref)}/cancel", b"", BagInfo)  # type: ignore[no-any-return]

    def wait(self, ref: str | int, poll: float = 1.0, timeout: float | None = None,
             on_update: Callable[[BagInfo], None] | None = None) -> BagInfo:
        """Wait until the bag has ended; return its final state (TimeoutError after `timeout` seconds).

        The server holds the request until the bag's end is committed (`GET /v1/bags/{bag}/wait`), so this
        returns at once then, not at the next poll. With `on_update`, it is given the bag every `poll` seconds
        meanwhile, and at the end."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            hold = self._hold(poll if on_update is not None else WAIT_HOLD)
            if deadline is not None:
                hold = max(0.0, min(hold, deadline - time.monotonic()))
            asked = time.monotonic()
            info = self.bag_once_ended(ref, hold)
            if on_update is not None:
                on_update(info)
            if info.state in TERMINAL_BAG_STATES:
                return info
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"bag {ref} still {info.state} after {timeout} s")
            early = hold / 2 - (time.monotonic() - asked)
            if early > 0 and not self._old_server:  # answered long before its time (a server stopping): not at once
                time.sleep(min(early, poll))

    # -- results --------------------------------------------------------------------------------------

    def results(self, ref: str | int, page: int = 200) -> Iterator[ResultInfo]:
        """Every ended job of the bag with its kept result and outputs, by job id."""
        after = 0
        while True:
            rows: list[ResultInfo] = self._request(
                "GET", f"/v1/bags/{_q(ref)}/results?after={after}&limit={page}", None, list[ResultInfo])
            yield from rows
            if not rows:  # a page may come short of `page` when its outputs are large
                return
            after = rows[-1].job.job_id

    def download_results(self, ref: str | int, directory: str | Path, force: bool = False) -> int:
        """Write each ended job's stdout, stderr and outputs under `directory/<index>/`, and `jobs.jsonl`.

        Returns the number of jobs written. Each file is replaced whole (`gridbot.results`); a folder that
        holds another bag's results, or other files, is refused unless `force`; output names that would
        escape the directory are refused; a file-system error is a GridbotError that names it.
        """
        info = self.bag(ref)
        folder = ResultsFolder(directory, info, force)
        folder.prepare()
        return folder.write(self.results(info.bag_id))

    def all_jobs(self, ref: str | int, state: str | None = None, limit: int | None = None) -> Iterator[JobInfo]:
        """The bag's jobs (in `state`), up to `limit` (None: all), in pages of the server's largest."""
        after, left = 0, limit
        while left is None or left > 0:
            page = self.jobs(ref, state, JOBS_PAGE if left is None else min(left, JOBS_PAGE), after)
            yield from page
            if not page:
                return
            after = page[-1].job_id
            left = None if left is None else left - len(page)

    def retry(self, ref: str | int, indices: Sequence[int] | None = None) -> RetryAnswer:
        """Queue the bag's failed jobs again (those at `indices`, else all), re-opening it if it had ended."""
        body = msgspec.msgpack.encode(lean(RetryRequest(list(indices) if indices is not None else None)))
        return self._request("POST", f"/v1/bags/{_q(ref)}/retry", body, RetryAnswer)  # type: ignore[no-any-return]

    def revise(self, spec: BagSpec, lines: Sequence[str] | None = None,
               inputs: dict[str, bytes] | None = None) -> RetryAnswer:
        """Make `spec` (its lines, its inputs) the next revision of the bag of its name and queue its failed
        jobs again: done jobs keep their results, the others run the new command."""
        revision = SubmitRequest(spec, list(lines) if lines is not None else None, inputs or {})
        body = msgspec.msgpack.encode(lean(RetryRequest(None, revision)))
        return self._request("POST", f"/v1/bags/{_q(spec.name)}/retry", body,  # type: ignore[no-any-return]
                             RetryAnswer)

    def delete(self, ref: str | int, force: bool = False) -> Deleted:
        """Remove the bag from the server (cancelled first if active); refused (ApiError 409) if some of its
        results were never downloaded, unless `force`."""
        return self._request("DELETE", f"/v1/bags/{_q(ref)}{'?force=1' if force else ''}",  # type: ignore[no-any-return]
                             None, Deleted)

    def logs(self, ref: str | int, index: int) -> JobLog:
        """The job at `index` of the bag with every instance of it: hosts, reasons, output tails."""
        return self._request("GET", f"/v1/bags/{_q(ref)}/logs/{index}", None, JobLog)  # type: ignore[no-any-return]

    def story(self, ref: str | int, index: int) -> JobStory:
        """The life of the job at `index` of the bag: its instances, hosts and outcomes, the events that sent
        and ended each, and the strategies' decisions about it."""
        return self._request("GET", f"/v1/bags/{_q(ref)}/story/{index}", None, JobStory)  # type: ignore[no-any-return]


JOBS_PAGE = 10_000
"""Most jobs the server returns in one listing (`server.app.MAX_PAGE`)."""


UNAVAILABLE_TRIES = 5


class _Retry(Exception):
    """A 503 answer: the message, and how long the server asked to wait (at most 5 s is honoured)."""

    def __init__(self, message: str, after: str | None) -> None:
        super().__init__(message)
        try:
            self.after = min(5.0, max(0.1, float(after or 1)))
        except ValueError:
            self.after = 1.0


def _q(ref: str | int) -> str:
    return urllib.parse.quote(str(ref), safe="")
