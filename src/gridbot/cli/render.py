"""How the command line shows things: tables, progress, summaries, sizes and durations."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Sequence

import click
import msgspec
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from gridbot.protocol import BagInfo, HostInfoRow, JobInfo, PoolInfo


def _width(stream: object) -> int | None:
    """The terminal's width, or a wide one when piped: a listing must never be cut to 80 columns."""
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        return None
    return int(os.environ.get("COLUMNS", "0") or 0) or 250


console = Console(highlight=False, width=_width(sys.stdout))
err_console = Console(stderr=True, highlight=False, width=_width(sys.stderr))


def parse_size(text: str) -> int:
    """Bytes from `1024`, `64K`, `16M` or `2G` (powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.IGNORECASE)
    if not m:
        raise click.BadParameter(f"{text!r} is not a size; write e.g. 512K, 16M or 1G")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def print_json(value: object) -> None:
    sys.stdout.write(msgspec.json.encode(value).decode() + "\n")


def ago(t: float | None) -> str:
    if t is None:
        return "-"
    return duration(time.time() - t)


def duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _table(*columns: str, right: tuple[str, ...] = (), fold: bool = False) -> Table:
    """An empty listing with these columns (the ones in `right` right-aligned)."""
    t = Table(box=None, header_style="bold")
    for col in columns:
        t.add_column(col, justify="right" if col in right else "left", overflow="fold" if fold else "ellipsis")
    return t


def bags_table(bags: Sequence[BagInfo]) -> Table:
    """One line per bag with counts by state, like condor_q."""
    columns = ("ID", "NAME", "STATE", "TOTAL", "QUEUED", "RUNNING", "DONE", "FAILED", "INSTANCES", "REPLICAS",
               "WASTED", "AGE")
    t = _table(*columns, right=tuple(c for c in columns if c not in ("NAME", "STATE")))
    for b in bags:
        c = b.counts
        t.add_row(str(b.bag_id), b.name, b.state, f"{b.total:,}", f"{c.queued:,}", f"{c.running:,}", f"{c.done:,}",
                  f"{c.failed:,}", f"{c.instances:,}", f"{c.replicas:,}", f"{c.wasted:,}", ago(b.created_at))
    return t


def jobs_table(jobs: Sequence[JobInfo]) -> Table:
    t = _table("INDEX", "STATE", "ATTEMPTS", "COMMAND", "REASON", fold=True)
    for j in jobs:
        t.add_row(str(j.index), j.state, str(j.attempts), j.command, j.reason or "")
    return t


def pools_table(pools: Sequence[PoolInfo]) -> Table:
    t = _table("POOL", "KIND", "QUEUED", "RUNNING", "ENDED", "LIMITS", "HOSTS", "JOBS DONE", "JOBS/S")
    for p in pools:
        t.add_row(p.name, p.kind, str(p.pilots_queued), str(p.pilots_running), str(p.pilots_ended),
                  f"{p.max_running} run / {p.max_queued} queue", str(p.hosts), f"{p.jobs_done:,}",
                  f"{p.throughput:.2f}")
    return t


def hosts_table(hosts: Sequence[HostInfoRow]) -> Table:
    t = _table("HOST", "NAME", "POOL", "CPUS", "DONE", "FAILED", "ERROR RATE", "BLACK HOLE", "LAST SEEN")
    for h in hosts:
        t.add_row(h.host_id, h.name, h.pool, str(h.ncpus), f"{h.done:,}", f"{h.failed:,}", f"{h.error_rate:.1%}",
                  "yes" if h.black_hole else "", ago(h.last_seen) + " ago")
    return t


class BagProgress:
    """A live progress bar with counts and ETA on a terminal; a line every 10 s elsewhere (logs, CI)."""

    def __init__(self, name: str, total: int) -> None:
        self.live = console.is_terminal
        self.last_line = 0.0
        self.name = name
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[counts]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=console, transient=False, disable=not self.live)
        self.task = self.progress.add_task(name, total=total, counts="")

    def __enter__(self) -> BagProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def update(self, info: BagInfo) -> None:
        c = info.counts
        ended = c.done + c.failed + c.cancelled
        counts = f"done {c.done:,}  failed {c.failed:,}  running {c.running:,}  queued {c.queued:,}"
        self.progress.update(self.task, completed=ended, total=info.total, counts=counts)
        now = time.monotonic()
        if not self.live and now - self.last_line >= 10:
            self.last_line = now
            console.print(f"{self.name}: {ended:,}/{info.total:,} ended  {counts}")


def summary(info: BagInfo, results_dir: str | None, failed: Sequence[JobInfo]) -> None:
    """The table printed when a bag ends, then the failed jobs with their reasons.

    Times are the bag's own, from submission to its end (a resumed bag's makespan includes the pause).
    """
    c = info.counts
    elapsed = (info.finished_at or time.time()) - info.created_at
    t = Table(title=f"bag {info.name}: {info.state}", box=None, show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column(justify="right")
    rows = [
        ("jobs", f"{info.total:,}"), ("done", f"{c.done:,}"), ("failed", f"{c.failed:,}"),
        ("cancelled", f"{c.cancelled:,}"), ("instances sent", f"{c.instances:,}"),
        ("jobs sent more than once", f"{c.reruns:,}"), ("overdue instances", f"{c.overdue:,}"),
        ("replicas (speculative)", f"{c.replicas:,} ({pct(c.replicas, info.total)} of jobs)"),
        ("results discarded (waste)", f"{c.wasted:,} ({pct(c.wasted, info.total)} of jobs)"),
        ("makespan", duration(elapsed)),
        ("throughput", f"{(c.done + c.failed) / elapsed:,.1f} jobs/s" if elapsed > 0 else "-"),
    ]
    if results_dir:
        rows.append(("results", results_dir))
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    if failed:
        console.print(f"[bold red]{c.failed:,} job(s) failed[/]; first {len(failed)}:")
        for j in failed:
            console.print(f"  job {j.index}: {j.reason}  [dim]({j.command})[/]", soft_wrap=True)
