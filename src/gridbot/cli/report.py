"""`gridbot report BAG --out report.html`: one self-contained HTML file with the console's plots and tables.

Everything is inline (CSS, SVG drawn here, no script): the file opens offline, in a mail reader or beside
a paper, and fetches nothing. It reads the same aggregates the console does (`/v1/console/bags/{bag}`),
so a million-job bag makes a report of a few tens of kilobytes.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from gridbot.cli.outfile import refuse_not_regular, write_user_file
from gridbot.client import Client
from gridbot.errors import GridbotError
from gridbot.protocol import CostInfo, JobInfo
from gridbot.server.console import BagSeries, HostPage

COLORS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777")
W, H, ML, MR, MT, MB = 640, 260, 56, 12, 12, 34


class ReportData(msgspec.Struct, frozen=True):
    """What a report shows, as read from the server at `made_at`."""

    series: BagSeries
    failed: list[JobInfo]
    cost: CostInfo | None
    hosts: HostPage
    policies: dict[str, str]
    server: str
    made_at: float


def fetch(client: Client, bag: str) -> ReportData:
    """Read a bag's report from the server: its aggregates, first failed jobs, cost, busiest hosts, policies."""
    name = _q(bag)
    series = client._request("GET", f"/v1/console/bags/{name}?wait=1", None, BagSeries)
    failed = client.jobs(bag, "failed", limit=50) if series.bag.info.counts.failed else []
    hosts = client._request("GET", "/v1/console/hosts?sort=done&desc=1&size=20", None, HostPage)
    cost = client.cost(bag) if series.bag.info.spent or series.bag.info.budget is not None else None
    return ReportData(series, failed, cost, hosts, client.policy(bag), client.url, time.time())


def write_report(client: Client, bag: str, out: Path) -> Path:
    """Write the report of `bag` to `out` (made atomically: a reader never sees half a file, and concurrent
    reports never share a temporary file); a GridbotError naming `out` and what is wrong with it if it names
    no file, names something that is not a regular file (which the report would replace), or cannot be
    written there."""

    if not out.name or out.name in (".", ".."):
        raise GridbotError(f"--out {str(out)!r} names no file; give the HTML file to write, such as report.html")
    refuse_not_regular(out, "--out", "the report", "report.html")
    write_user_file(out, render(fetch(client, bag)).encode("utf-8"), "--out", "the report", "report.html")
    return out


def render(data: ReportData) -> str:
    """The report as one HTML document with inline CSS and SVG, and no URL to fetch."""
    s = data.series
    info, c = s.bag.info, s.bag.info.counts
    end = info.finished_at or s.now
    points = [(t, float(v)) for t, v in zip(s.times, s.incomplete, strict=True) if t <= s.now]
    points.append((end, float(info.total - c.done - c.failed)))
    markers = [(info.tail_plan.tail_start, "tail")] if info.tail_plan is not None else []
    pools = sorted(s.done)
    per_pool = [(p or "(unknown host)", [(s.times[k + 1], float(v)) for k, v in enumerate(s.done[p])]) for p in pools]
    held = [k for k, v in enumerate(s.runtime) if v]  # the bins that hold results, and an empty one each side
    first, last = (max(0, held[0] - 1), min(len(s.runtime) - 1, held[-1] + 1)) if held else (0, -1)
    bins = [(_bin_label(s.runtime_edges, k), s.runtime[k]) for k in range(first, last + 1)]
    counts = [("total", info.total), ("done", c.done), ("failed", c.failed), ("running", c.running),
              ("queued", c.queued), ("cancelled", c.cancelled), ("instances", c.instances), ("replicas", c.replicas),
              ("wasted", c.wasted)]
    parts = [
        f"<h1>Bag {_e(info.name)} <span class='state {_e(info.state)}'>{_e(info.state)}</span></h1>",
        f"<p class='sub'>{_e(info.description)}</p>" if info.description else "",
        f"<p class='sub'>Report made {_when(data.made_at)} from {_e(data.server)}; submitted {_when(info.created_at)}"
        f"{f', ended {_when(info.finished_at)}' if info.finished_at else ''}; ran {_dur(end - info.created_at)}; "
        f"revision {info.revision}.</p>",
        "<dl class='counts'>" + "".join(f"<div><dt>{k}</dt><dd>{v:,}</dd></div>" for k, v in counts)
        + f"<div><dt>waste</dt><dd>{s.bag.waste:.1%}</dd></div>"
        + f"<div><dt>rate</dt><dd>{s.bag.rate:.2f}/s</dd></div></dl>",
        _list("Diagnostics", info.diagnostics),
        "<div class='cards'>",
        _card("Incomplete jobs over time", line_svg([("incomplete", points)], "jobs", markers)),
        _card("Results returned per pool over time", line_svg(per_pool, f"results per {_dur(s.width)}")),
        _card("Run-time distribution of results", bar_svg(bins, "results")),
        _card("Tail and strategy", _strategy(data)),
        "</div>",
        _table("Failed jobs (first 50)", ["job", "attempts", "reason", "command"],
               [[j.index, j.attempts, j.reason or "", j.command] for j in data.failed]) if data.failed else "",
        _cost(data.cost),
        _table("Policies in force", ["policy", "expression"], [[k, v] for k, v in sorted(data.policies.items())]),
        _table(f"Busiest hosts of the server, all bags counted ({data.hosts.total:,} known, "
               f"{data.hosts.black_holes:,} black holes)",
               ["host", "name", "pool", "done", "failed", "error rate", "black hole", "turnaround"],
               [[h.host_id, h.name, h.pool, f"{h.done:,}", f"{h.failed:,}", f"{h.error_rate:.1%}",
                 "yes" if h.black_hole else "", _dur(h.turnaround) if h.turnaround is not None else ""]
                for h in data.hosts.rows]),
    ]
    return (f"<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>gridbot report: {_e(info.name)}</title><style>{CSS}</style></head>\n<body><main>\n"
            + "\n".join(p for p in parts if p) + "\n</main></body></html>\n")


def line_svg(series: Sequence[tuple[str, Sequence[tuple[float, float]]]], y_label: str,
             markers: Sequence[tuple[float, str]] = ()) -> str:
    """Lines over time as an inline SVG (x: server-clock seconds, shown as times of day)."""
    pts = [p for _, ps in series for p in ps]
    if not pts:
        return _svg("<text x='320' y='130' text-anchor='middle' class='empty'>no data</text>")
    x0, x1 = min(p[0] for p in pts), max(max(p[0] for p in pts), min(p[0] for p in pts) + 1)
    y1 = max(max(p[1] for p in pts), 1.0) * 1.05
    fmt = "%H:%M:%S" if x1 - x0 < 600 else "%H:%M"
    axes, sx, sy = _axes(x0, x1, y1, lambda v: time.strftime(fmt, time.localtime(v)), y_label)
    out = [axes]
    for x, label in markers:
        if x0 <= x <= x1:
            out.append(f"<line x1='{sx(x):.1f}' x2='{sx(x):.1f}' y1='{MT}' y2='{H - MB}' class='marker'/>"
                       f"<text x='{sx(x) + 4:.1f}' y='{MT + 10}' class='marker'>{_e(label)}</text>")
    for i, (name, ps) in enumerate(series):
        if ps:
            d = "".join(f"{'L' if k else 'M'}{sx(x):.1f},{sy(y):.1f}" for k, (x, y) in enumerate(ps))
            out.append(f"<path d='{d}' fill='none' stroke='{COLORS[i % len(COLORS)]}' stroke-width='2'>"
                       f"<title>{_e(name)}</title></path>")
    if len(series) > 1:
        for i, (name, _) in enumerate(series):
            x, y = ML + 8 + (i % 4) * 140, MT + 10 + (i // 4) * 14
            out.append(f"<rect x='{x}' y='{y - 8}' width='10' height='10' fill='{COLORS[i % len(COLORS)]}'/>"
                       f"<text x='{x + 14}' y='{y + 1}'>{_e(name[:18])}</text>")
    return _svg("".join(out))


def bar_svg(bins: Sequence[tuple[str, int]], y_label: str) -> str:
    """A histogram as an inline SVG."""
    if not bins:
        return _svg("<text x='320' y='130' text-anchor='middle' class='empty'>no data</text>")
    y1 = max(max(v for _, v in bins), 1) * 1.05
    axes, _, sy = _axes(0, 1, y1, lambda v: "", y_label)
    bw = (W - ML - MR) / len(bins)
    out = [axes]
    for i, (label, v) in enumerate(bins):
        x = ML + i * bw
        out.append(f"<rect x='{x + 1:.1f}' y='{sy(v):.1f}' width='{max(1.0, bw - 2):.1f}' "
                   f"height='{H - MB - sy(v):.1f}' fill='{COLORS[0]}'><title>{_e(label)}: {v:,}</title></rect>")
        if len(bins) <= 16 or i % math.ceil(len(bins) / 12) == 0:
            out.append(f"<text x='{x + bw / 2:.1f}' y='{H - MB + 16}' text-anchor='middle'>{_e(label)}</text>")
    return _svg("".join(out))


def _axes(x0: float, x1: float, y1: float, xfmt: Callable[[float], str],
          y_label: str) -> tuple[str, Callable[[float], float], Callable[[float], float]]:
    """Grid, ticks and labels; the scales from data to SVG coordinates."""
    def sx(v: float) -> float:
        """Data x to SVG x."""
        return ML + (v - x0) / ((x1 - x0) or 1) * (W - ML - MR)

    def sy(v: float) -> float:
        """Data y to SVG y."""
        return H - MB - v / (y1 or 1) * (H - MT - MB)

    out = []
    for v in _ticks(0, y1, 5):
        out.append(f"<line x1='{ML}' x2='{W - MR}' y1='{sy(v):.1f}' y2='{sy(v):.1f}' class='grid'/>"
                   f"<text x='{ML - 6}' y='{sy(v) + 4:.1f}' text-anchor='end'>{_num(v)}</text>")
    for v in _ticks(x0, x1, 6) if x1 > 1 else []:  # a label at an edge is anchored inside the plot
        anchor = "end" if sx(v) > W - MR - 30 else "start" if sx(v) < ML + 20 else "middle"
        out.append(f"<text x='{sx(v):.1f}' y='{H - MB + 16}' text-anchor='{anchor}'>{_e(xfmt(v))}</text>")
    mid = MT + (H - MT - MB) / 2
    out.append(f"<line x1='{ML}' x2='{W - MR}' y1='{H - MB}' y2='{H - MB}' class='axis'/>"
               f"<line x1='{ML}' x2='{ML}' y1='{MT}' y2='{H - MB}' class='axis'/>"
               f"<text x='12' y='{mid}' text-anchor='middle' transform='rotate(-90 12 {mid})'>{_e(y_label)}</text>")
    return "".join(out), sx, sy


def _ticks(lo: float, hi: float, n: int) -> list[float]:
    """Round tick values from `lo` to `hi`, about `n` of them."""
    raw = (hi - lo) / n or 1.0
    mag = 10 ** math.floor(math.log10(raw))
    step = next((m * mag for m in (1, 2, 5, 10) if m * mag >= raw), raw)
    first = math.ceil(lo / step) * step
    return [first + k * step for k in range(int((hi - first) / step) + 1)]


def _strategy(data: ReportData) -> str:
    """The tail strategy (ExPERT's frontier with its chosen point) and the DBC plan, where the bag has them."""
    info = data.series.bag.info
    out = []
    t = info.tail_plan
    if t is not None:
        out.append(f"<p>Tail strategy <b>{_e(t.strategy)}</b> ({_e(t.utility)}), tail from {_when(t.tail_start)}: "
                   f"{t.done:,} of {t.tasks:,} tail tasks done; makespan {_dur(t.predicted_makespan)} predicted"
                   f"{f', {_dur(t.actual_makespan)} actual' if t.actual_makespan is not None else ''}.</p>")
        if t.frontier:
            out.append(_table_html(["strategy", "tail makespan", "cost / task"],
                                   [[("→ " if name == t.strategy else "") + name, _dur(m), f"{cost:.4f}"]
                                    for name, m, cost in t.frontier]))
    else:
        out.append("<p class='sub'>No tail was detected.</p>")
    q = info.qos
    if q is not None:
        out.append(f"<p>Placement <b>{_e(q.strategy)}</b>: spent {q.spent:,.2f}, committed {q.committed:,.2f}, "
                   f"projected {q.projected_cost:,.2f}"
                   f"{f' of a budget of {q.budget:,.2f}' if q.budget is not None else ''}"
                   f"; projected finish {_when(q.projected_finish) if q.projected_finish else 'unknown'}"
                   f"{f', deadline {_when(q.deadline_at)}' if q.deadline_at else ''}.</p>")
    elif info.budget is not None or info.spent:
        out.append(f"<p>Spent {info.spent:,.2f}{f' of {info.budget:,.2f}' if info.budget is not None else ''}.</p>")
    return "".join(out)


def _cost(cost: CostInfo | None) -> str:
    """What the bag spent per pool, as `gridbot cost` shows it."""
    if cost is None:
        return ""
    rows = [[b.pool, f"{b.instances:,}", _dur(b.seconds), f"{b.cpu:,.2f}", f"{b.pilots:,.2f}", f"{b.total:,.2f}"]
            for b in cost.pools]
    budget = f" of a budget of {cost.budget:,.2f}" if cost.budget is not None else ""
    return _table(f"Cost: {cost.spent:,.2f}{budget}",
                  ["pool", "instances", "run time", "CPU charge", "pilots", "total"], rows)


def _bin_label(edges: Sequence[float], k: int) -> str:
    """The label of run-time bin `k`: below its upper edge, or above the last."""
    if k >= len(edges):
        return f">{_secs(edges[-1])}"
    return f"<{_secs(edges[k])}"


def _secs(v: float) -> str:
    """Seconds for a run-time label: two digits below a second, else as a duration."""
    return f"{v:.2g}s" if v < 1 else _dur(v)


def _card(title: str, body: str) -> str:
    """A titled box of the plots' grid."""
    return f"<section class='card'><h2>{_e(title)}</h2>{body}</section>"


def _list(title: str, items: Sequence[str]) -> str:
    """A titled list (nothing when empty)."""
    return f"<h2>{_e(title)}</h2><ul class='diag'>" + "".join(f"<li>{_e(i)}</li>" for i in items) + "</ul>" \
        if items else ""


def _table(title: str, head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A titled table."""
    return f"<h2>{_e(title)}</h2>" + _table_html(head, rows)


def _table_html(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A table with every cell escaped, in a box that scrolls sideways on a phone."""
    return ("<div class='scroll'><table><thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head)
            + "</tr></thead><tbody>"
            + "".join("<tr>" + "".join(f"<td>{_e(str(v))}</td>" for v in r) + "</tr>" for r in rows)
            + "</tbody></table></div>")


def _svg(body: str) -> str:
    """An inline SVG of the charts' size that scales to its box."""
    return (f"<svg viewBox='0 0 {W} {H}' role='img' "
            f"preserveAspectRatio='xMidYMid meet'>{body}</svg>")


def _num(v: float) -> str:
    """A tick label: 1.2k, 3.4M, 0.25."""
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.1f}M"
    if a >= 1e3:
        return f"{v / 1e3:.1f}k"
    return f"{v:.2g}" if 0 < a < 1 else f"{v:g}"


def _dur(s: float | None) -> str:
    """A duration as people read it: 4.2s, 3m05s, 2h10m, 1d3h."""
    if s is None or not math.isfinite(s):
        return "–"
    if s < 10:
        return f"{max(0.0, s):.1f}s"
    n = round(s)
    if n < 3600:
        return f"{n // 60}m{n % 60:02d}s" if n >= 60 else f"{n}s"
    return f"{n // 3600}h{n % 3600 // 60:02d}m" if n < 86400 else f"{n // 86400}d{n % 86400 // 3600}h"


def _when(t: float | None) -> str:
    """A time of the server's clock as a local date and time."""
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t)) if t else ""


def _e(text: str) -> str:
    """Text escaped for HTML (what users wrote: names, commands, policies)."""
    return html.escape(text, quote=True)


def _q(ref: str) -> str:
    """A bag's name or id quoted for a URL path."""
    from urllib.parse import quote

    return quote(ref, safe="")


CSS = """
body{margin:0;font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#111827;background:#f9fafb}
main{max-width:1400px;margin:0 auto;padding:12px 16px 40px}h1{font-size:20px}h2{font-size:14px;color:#374151}
.sub{color:#6b7280;font-size:12px}.state.completed{color:#16a34a}.state.failed{color:#dc2626}
.state.active{color:#b45309}.state.cancelled{color:#6b7280}
dl.counts{display:flex;flex-wrap:wrap;gap:4px 18px}dl.counts dt{color:#6b7280;font-size:11px;text-transform:uppercase}
dl.counts dd{margin:0;font-size:16px;font-weight:600}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,520px),1fr));gap:12px;margin:12px 0}
.card{background:#fff;border:1px solid #e5e7eb;border-radius:6px;padding:10px 12px;min-width:0}
svg{width:100%;height:auto;display:block}svg text{font-size:11px;fill:#4b5563}svg .grid{stroke:#f0f0f0}
svg .axis{stroke:#9ca3af}svg .marker{stroke:#9333ea;fill:#9333ea;stroke-dasharray:4 3}svg .empty{font-size:14px}
.scroll{overflow-x:auto}table{border-collapse:collapse;width:100%;background:#fff;font-size:13px}
th,td{padding:5px 8px;border-bottom:1px solid #e5e7eb;text-align:left;vertical-align:top}th{background:#f3f4f6}
ul.diag{background:#fffbeb;color:#92400e;padding:6px 6px 6px 24px}
"""
"""The report's style, inline (the file fetches nothing)."""
