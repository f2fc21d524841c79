"""The BOINC client's scheduler request, read into what the dispatcher needs, whatever else it holds.

A request is XML, 2-4 KB from the stock client, and is read with ElementTree; a body that is not
well-formed XML (a client of another version, a proxy that cut it) is read again tag by tag, so a sender
gets an answer about what is missing rather than a parse error. Documents with a DOCTYPE (where entity
declarations live) are refused outright: the client never sends one, and they are how XML bombs come. The
parser says so as it meets one, within the first piece it is fed (expat caps what entities may expand to
besides); text that merely reads like one (a task's stderr, in CDATA, holding an HTML page's
`<!DOCTYPE html>`) is text.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field

from gridbot.errors import GridbotError

MAX_TEXT = 64 * 1024
"""Characters kept of any one value (an app's stderr comes back in `<stderr_out>`)."""
Getter = Callable[[str], str | None]
"""Reads one value of a request by its path (`host_info/p_ncpus`); None when absent."""
MAX_RESULTS = 5_000
"""Results read from one request, reported or held (the client reports at most a few hundred at once)."""


class RequestError(GridbotError):
    """The body is not a scheduler request the server can answer."""


@dataclass(frozen=True)
class Reported:
    """One finished result the client reports."""

    name: str
    state: int
    """5: its outputs were uploaded (success); 3: compute error; 1: download error; 4: upload failed; 6: aborted."""
    exit_status: int
    cpu_time: float
    elapsed_time: float
    stderr_out: str


@dataclass(frozen=True)
class SchedulerRequest:
    """What the server uses of a scheduler request."""

    authenticator: str
    hostid: int = 0
    rpc_seqno: int = 0
    platform: str = ""
    alt_platforms: tuple[str, ...] = ()
    work_req_seconds: float = 0.0
    cpu_req_secs: float = 0.0
    cpu_req_instances: float = 0.0
    has_code_sign_key: bool = False
    cpid: str = ""
    domain_name: str = ""
    os_name: str = ""
    ncpus: int = 1
    fpops: float = 1e9
    memory_bytes: float = 0.0
    client_version: str = ""
    results: tuple[Reported, ...] = ()
    other_results: tuple[str, ...] = field(default_factory=tuple)


def _text(value: str | None) -> str:
    return (value or "").strip()[:MAX_TEXT]


def _number(value: str | None, default: float = 0.0, low: float = 0.0, high: float = 1e15) -> float:
    """A finite number within [low, high] from `value`, else `default` (the client's numbers, trusted no further)."""
    try:
        x = float((value or "").strip())
    except ValueError:
        return default
    return min(max(x, low), high) if math.isfinite(x) else default


def _int(value: str | None, default: int = 0, low: int = -(2**31), high: int = 2**31 - 1) -> int:
    return int(_number(value, default, low, high))


_DECLARATION = "a scheduler request may not declare a DOCTYPE or entities"
FEED_BYTES = 64 << 10
"""The parser is fed this much at a time: an exception raised in a handler surfaces when `feed` returns, so a
refused DOCTYPE stops the parse within one piece, not after expat has read (and expanded) the whole body."""


def _without_cdata(text: str) -> str:
    """`text` with its CDATA sections left out, in one pass (a regular expression took quadratic time on a body
    of unclosed `<![CDATA[`: 4.5 s for 108 KB, on the event loop)."""
    out, pos = [], 0
    while (start := text.find("<![CDATA[", pos)) >= 0:
        out.append(text[pos:start])
        end = text.find("]]>", start + 9)
        if end < 0:
            return "".join(out)
        pos = end + 3
    out.append(text[pos:])
    return "".join(out)


class _NoDoctype(ET.TreeBuilder):
    """A tree builder that refuses a document at the start of its DOCTYPE (ElementTree's parser calls
    `doctype` as it begins one; the refusal surfaces when the piece fed returns: `FEED_BYTES`)."""

    def doctype(self, name: str, pubid: str | None, system: str | None) -> None:
        raise RequestError(_DECLARATION)


def parse_request(body: bytes) -> SchedulerRequest:
    """The request in `body`, or RequestError saying what is wrong with it."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = body.decode("latin-1")
    parser = ET.XMLParser(target=_NoDoctype())
    try:
        for start in range(0, len(text), FEED_BYTES):
            parser.feed(text[start:start + FEED_BYTES])
        root = parser.close()
    except ET.ParseError:
        # read tag by tag, which declares and expands nothing; a declaration outside CDATA is refused all the same
        lowered = _without_cdata(text).lower()
        if "<!doctype" in lowered or "<!entity" in lowered:
            raise RequestError(_DECLARATION) from None
        return _parse_loose(text)
    if root.tag != "scheduler_request":
        raise RequestError(f"the body is <{root.tag[:40]}>, not a <scheduler_request>")
    return _from_tree(root)


def _from_tree(root: ET.Element) -> SchedulerRequest:
    def get(path: str) -> str | None:
        node = root.find(path)
        return node.text if node is not None else None

    results = []
    for node in root.findall("result")[:MAX_RESULTS]:
        results.append(Reported(_text(node.findtext("name")), _int(node.findtext("state")),
                                _int(node.findtext("exit_status")), _number(node.findtext("final_cpu_time")),
                                _number(node.findtext("final_elapsed_time")),
                                _text("".join(e.itertext()) if (e := node.find("stderr_out")) is not None else "")))
    others = tuple(_text(n.text) for n in root.findall("other_results/other_result/name")[:MAX_RESULTS])
    return _build(get, tuple(results), others,
                  tuple(_text(n.text) for n in root.findall("alt_platform/name")),
                  root.find("code_sign_key") is not None and bool(_text(get("code_sign_key"))))


def blocks(text: str, tag: str, limit: int = MAX_RESULTS) -> list[tuple[int, int, str]]:
    """Up to `limit` `<tag>...</tag>` blocks of `text`, each (start, end, inside), in one forward pass: linear in
    the text whatever it holds (a regex with `.*?` took seconds on a few kilobytes of unclosed tags)."""
    opening, closing = f"<{tag}>", f"</{tag}>"
    out: list[tuple[int, int, str]] = []
    pos = 0
    while len(out) < limit:
        start = text.find(opening, pos)
        if start < 0:
            break
        end = text.find(closing, start + len(opening))
        if end < 0:
            break
        out.append((start, end + len(closing), text[start + len(opening):end]))
        pos = end + len(closing)
    return out


def first_block(text: str, tag: str) -> str | None:
    """The inside of the first `<tag>...</tag>` of `text` (None: none), in linear time."""
    found = blocks(text, tag, 1)
    return found[0][2] if found else None


def _parse_loose(text: str) -> SchedulerRequest:
    """Read a body that is not well-formed XML tag by tag (the client's own parser is as tolerant)."""
    if "<scheduler_request>" not in text:
        raise RequestError("the body is not a BOINC scheduler request (no <scheduler_request>)")

    def first(tag: str, within: str = text) -> str | None:
        return first_block(within, tag)

    def plain(tag: str) -> str | None:
        value = first(tag)
        return _unescape(value) if value is not None else None

    spans = blocks(text, "result", 10 * MAX_RESULTS)
    pieces, pos = [], 0
    for start, end, _ in spans:
        pieces.append(text[pos:start])
        pos = end
    body = "".join(pieces) + text[pos:]
    results = []
    for _, _, part in spans:
        stderr = first("stderr_out", part) or ""
        results.append(Reported(_text(_unescape(first("name", part) or "")), _int(first("state", part)),
                                _int(first("exit_status", part)), _number(first("final_cpu_time", part)),
                                _number(first("final_elapsed_time", part)),
                                _text(stderr.replace("<![CDATA[", "").replace("]]>", ""))))
        if len(results) >= MAX_RESULTS:
            break
    others_block = first("other_results", body) or ""
    others = tuple(_text(_unescape(n)) for _, _, n in blocks(others_block, "name"))
    alts = tuple(_text(_unescape(name)) for _, _, alt in blocks(body, "alt_platform", 16)
                 if (name := first_block(alt, "name")) is not None)

    def get(path: str) -> str | None:
        return plain(path.rsplit("/", 1)[-1]) if "/" in path else (
            _unescape(v) if (v := first(path, body)) is not None else None)

    return _build(get, tuple(results), others, alts, bool(_text(first("code_sign_key", body))))


def _unescape(text: str) -> str:
    return (text.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&apos;", "'")
            .replace("&amp;", "&"))


def _build(g: Getter, results: tuple[Reported, ...], others: tuple[str, ...], alts: tuple[str, ...],
           has_key: bool) -> SchedulerRequest:
    """The request from its values (`g` reads one by path), each bounded: a client is trusted no further."""
    authenticator = _text(g("authenticator"))
    if not authenticator:
        raise RequestError("the request has no <authenticator>: attach with the account key `gridbot volunteers "
                           "add NAME` printed")
    version = ".".join(_text(g(f"core_client_{p}")) for p in ("major_version", "minor_version", "release"))
    return SchedulerRequest(
        authenticator=authenticator[:200], hostid=_int(g("hostid"), 0, 0), rpc_seqno=_int(g("rpc_seqno"), 0, 0),
        platform=_text(g("platform_name"))[:100], alt_platforms=tuple(a[:100] for a in alts[:10]),
        work_req_seconds=_number(g("work_req_seconds"), 0.0, 0.0, 1e9),
        cpu_req_secs=_number(g("cpu_req_secs"), 0.0, 0.0, 1e9),
        cpu_req_instances=_number(g("cpu_req_instances"), 0.0, 0.0, 1e6),
        has_code_sign_key=has_key, cpid=_text(g("host_info/host_cpid"))[:64],
        domain_name=_text(g("host_info/domain_name"))[:200], os_name=_text(g("host_info/os_name"))[:100],
        ncpus=_int(g("host_info/p_ncpus"), 1, 1, 100_000), fpops=_number(g("host_info/p_fpops"), 1e9, 1e6, 1e15),
        memory_bytes=_number(g("host_info/m_nbytes"), 0.0, 0.0, 1e18),
        client_version=version if version != ".." else "", results=results, other_results=others)
