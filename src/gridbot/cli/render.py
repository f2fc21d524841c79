"""How the command line shows things: tables, progress, summaries, sizes and durations."""

from __future__ import annotations

import math
import os
import re
import sys
import time
from collections.abc import Sequence

import click
import msgspec
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from gridbot.model.pools import KINDS
from gridbot.model.states import BagState, JobState
from gridbot.protocol import BagInfo, CostInfo, HostInfoRow, JobInfo, JobLog, PoolInfo, QueueInfo

MIN_WIDTH = 50
"""The narrowest the output is drawn, whatever COLUMNS says (click's help has the same floor): at 3 columns
rich drew a table as blank lines, and below 1 it printed nothing at all, error messages included."""


def _columns() -> int | None:
    """The width COLUMNS asks for, at least MIN_WIDTH; None when it is unset or no positive whole number
    (`abc`, `-5`, `0`), which is ignored as Python's shutil ignores it."""
    text = os.environ.get("COLUMNS", "")
    if not (text.isascii() and text.isdigit() and len(text) <= 9) or int(text) == 0:
        return None
    return max(int(text), MIN_WIDTH)


def width_for(stream: object) -> int | None:
    """The width to give a rich Console writing to `stream`, every command's (None: let it measure the terminal):
    the terminal's, or a wide one when piped, for a listing must never be cut to 80 columns. COLUMNS sets it, when
    it is a width (`_columns`); one that is not is ignored everywhere, though rich reads it itself."""
    columns = _columns()
    isatty = getattr(stream, "isatty", None)
    if isatty is None or not isatty():
        return columns or 250
    if columns is not None or "COLUMNS" not in os.environ:
        return columns  # None: rich measures the terminal, as it is resized too
    try:  # rich would take `0` from COLUMNS itself
        return max(os.get_terminal_size(stream.fileno()).columns, MIN_WIDTH)  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return 80


console = Console(highlight=False, width=width_for(sys.stdout))
err_console = Console(stderr=True, highlight=False, width=width_for(sys.stderr))


def parse_size(text: str) -> int:
    """Bytes from `1024`, `64K`, `16M` or `2G` (powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.IGNORECASE)
    if not m:
        raise click.BadParameter(f"{text!r} is not a size; write e.g. 512K, 16M or 1G")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def parse_indices(text: str) -> list[int]:
    """Job indices from `3,7-9` (ranges inclusive); click.BadParameter names what cannot be read."""
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d{1,12})\s*(?:-\s*(\d{1,12})\s*)?", part)
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise click.BadParameter(f"{part.strip()!r} is not a job index or a range of them; write e.g. 3,7-9",
                                     param_hint="--jobs")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        if last - first >= 10_000_000:
            raise click.BadParameter(f"{part.strip()!r} names more jobs than a bag has", param_hint="--jobs")
        out.extend(range(first, last + 1))
    return out


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
    cancelled = any(b.counts.cancelled for b in bags)  # the column only where it says something
    columns = ("ID", "NAME", "STATE", "TOTAL", "QUEUED", "RUNNING", "DONE", "FAILED",
               *(("CANCELLED",) if cancelled else ()), "INSTANCES", "REPLICAS", "WASTED", "AGE")
    t = _table(*columns, right=tuple(c for c in columns if c not in ("NAME", "STATE")))
    for b in bags:
        c = b.counts
        name = b.name if b.revision <= 1 else f"{b.name} (revision {b.revision})"
        t.add_row(str(b.bag_id), name, b.state, f"{b.total:,}", f"{c.queued:,}", f"{c.running:,}", f"{c.done:,}",
                  f"{c.failed:,}", *((f"{c.cancelled:,}",) if cancelled else ()), f"{c.instances:,}",
                  f"{c.replicas:,}", f"{c.wasted:,}", ago(b.created_at))
    return t


def tail_plan(bag: BagInfo) -> str | None:
    """One paragraph on the bag's tail plan (ExPERT's): the strategy in force, what it predicted for the tail,
    and what was measured."""
    p = bag.tail_plan
    if p is None:
        return None
    times = f"{p.plans} times" if p.plans > 1 else "once"
    text = (f"bag {bag.name}: tail strategy {p.strategy}, best for {p.utility} of {len(p.frontier)} on the "
            f"frontier (planned {times}; {p.characterization}). Predicted tail {span(p.predicted_makespan)} "
            f"± {span(p.makespan_error)}, cost {p.predicted_cost:.4g} ± {p.cost_error:.2g} per task")
    if p.makespan_range is not None and p.cost_range is not None:
        (m_lo, m_hi), (c_lo, c_hi) = p.makespan_range, p.cost_range
        text += (f" ({share(p.range_share)} of simulated tails: {span(m_lo)} to {span(m_hi)}, cost {c_lo:.4g} to "
                 f"{c_hi:.4g} per task)")
    if p.actual_makespan is not None:
        return text + (f"; measured tail {span(p.actual_makespan)}, cost {p.actual_cost or 0.0:.4g} per task "
                       f"({p.done} of {p.tasks} tail tasks done)")
    return text + (f"; so far {p.done} of {p.tasks} tail tasks done in {span(p.elapsed)}, cost "
                   f"{p.actual_cost or 0.0:.4g} per task")


def money(bag: BagInfo, now: float | None = None) -> str | None:
    """One line on the bag's budget and deadline: spent against the budget, projected cost and completion
    against the deadline (None: it has neither and spent nothing)."""
    if bag.budget is None and bag.deadline_at is None and bag.spent <= 0:
        return None
    now = time.time() if now is None else now
    parts = [f"spent {bag.spent:,.2f}" + (f" of {bag.budget:,.2f}" if bag.budget is not None else "")]
    q = bag.qos
    if q is not None:
        parts.append(f"committed {q.committed:,.2f}, projected {q.projected_cost:,.2f}")
    if bag.deadline_at is not None:
        left = bag.deadline_at - now
        parts.append(f"deadline {'in ' + duration(left) if left > 0 else duration(-left) + ' ago'}")
    if q is not None and q.projected_finish is not None and bag.state == BagState.ACTIVE.value:
        left = q.projected_finish - now
        # a plan's projection ages until the next plan: one already passed says when it was made, not "in 0 s"
        parts.append(f"projected completion in {duration(left)}" if left > 0 else
                     f"projected completion {duration(-left)} ago, by the plan of {duration(now - q.planned_at)} ago")
    if q is not None and q.unplanned:
        parts.append(f"{q.unplanned:,} jobs fit neither")
    where = f" ({q.strategy}: {', '.join(f'{p} {n:,}' for p, n in sorted(q.planned.items()))} planned)" if (
        q is not None and q.planned) else ""
    return f"bag {bag.name}: " + "; ".join(parts) + where


def level(bag: BagInfo) -> str | None:
    """One paragraph on where the execution hierarchy holds the bag and how it got there."""
    lv = bag.level
    if lv is None:
        return None
    work = "unknown" if lv.complexity is None else f"{lv.complexity:,.0f} CPU-s ({lv.source})"
    text = (f"bag {bag.name}: level {lv.level}, queue {lv.queue}, position {lv.position}; remaining work {work}; "
            f"{duration(lv.queued_for)} in the queue, running {duration(lv.running_for)}")
    if lv.ended:
        text += f"; ended: {lv.ended}"
    for at, src, dst, why in lv.migrations:
        text += f"\n  {ago(at)} ago: {src} -> {dst or 'end'}: {why}"
    return text


def levels_table(queues: Sequence[QueueInfo]) -> Table:
    """The hierarchy's queues, top level first (`gridbot levels`)."""
    t = _table("LEVEL", "QUEUE", "POOLS", "TQ", "TE", "N", "P", "WORK", "C_Q", "C_E", "RUNNING", "BAGS",
               right=("LEVEL", "TQ", "TE", "N", "P", "WORK", "C_Q", "C_E", "RUNNING"))
    for q in queues:
        t.add_row(str(q.level), q.name, ", ".join(q.pools), duration(q.queue_time_limit), duration(q.exec_time_limit),
                  str(q.max_cpus), f"{q.performance:g}", f"{q.work:,.0f}", f"{q.queue_limit:,.0f}",
                  f"{q.exec_limit:,.0f}", f"{q.running:,}", ", ".join(q.bags[:5]) + (" ..." if len(q.bags) > 5 else ""))
    return t


def cost_table(info: CostInfo) -> Table:
    """A bag's spend per pool (`gridbot cost`)."""
    t = _table("POOL", "INSTANCES", "HOURS", "CPU", "PILOTS", "TOTAL", "SEC/JOB", "COST/JOB",
               right=("INSTANCES", "HOURS", "CPU", "PILOTS", "TOTAL", "SEC/JOB", "COST/JOB"))
    q = info.qos
    names = sorted({p.pool for p in info.pools} | (set(q.seconds_per_job) if q is not None else set()))
    bills = {p.pool: p for p in info.pools}
    for name in names:
        b = bills.get(name)
        rate = q.seconds_per_job.get(name) if q is not None else None
        cost = q.cost_per_job.get(name) if q is not None else None
        t.add_row(name or "(unknown host)", f"{b.instances:,}" if b else "0", f"{b.seconds / 3600:,.2f}" if b else "0",
                  f"{b.cpu:,.2f}" if b else "0", f"{b.pilots:,.2f}" if b else "0", f"{b.total:,.2f}" if b else "0",
                  f"{rate:,.0f}" if rate is not None else "", f"{cost:,.4g}" if cost is not None else "")
    return t


def share(fraction: float) -> str:
    """A share of draws, rounded down so that it never claims more than was drawn ("99.8%")."""
    return f"{math.floor(fraction * 1000) / 10:g}%"


def span(seconds: float) -> str:
    """A duration, or "never" for an infinite one."""
    return duration(seconds) if seconds < float("inf") else "never"


def jobs_table(jobs: Sequence[JobInfo]) -> Table:
    t = _table("INDEX", "STATE", "ATTEMPTS", "COMMAND", "REASON", fold=True)
    for j in jobs:
        t.add_row(str(j.index), j.state, str(j.attempts), escape(cut(j.command)), escape(cut(j.reason or "")))
    return t


def cut(text: str, width: int = 300) -> str:
    """`text` for a line of a listing: at most `width` characters, with how much was left out (a command may
    be 100 KB long, and the summary of a bag that failed printed all of it; issue 12)."""
    return text if len(text) <= width else f"{text[:width]}... ({len(text) - width:,} more characters)"


def pools_table(pools: Sequence[PoolInfo]) -> Table:
    t = _table("POOL", "KIND", "QUEUED", "RUNNING", "ENDED", "LIMITS", "HOSTS", "JOBS DONE", "JOBS/S")
    for p in pools:
        queued = f"{p.pilots_queued} ({p.pilots_stale} stale)" if p.pilots_stale else str(p.pilots_queued)
        t.add_row(p.name, p.kind, queued, str(p.pilots_running), str(p.pilots_ended), _limits(p),
                  str(p.hosts), f"{p.jobs_done:,}", f"{p.throughput:.2f}")
    return t


def _limits(p: PoolInfo) -> str:
    """The pool's limits on its pilots, those that apply to its kind: a local pool queues none, a static or
    volunteer pool's hosts come by themselves."""
    kind = KINDS.get(p.kind)
    if kind is not None and not kind.pilots:
        return "-"
    return f"{p.max_running} run" if kind is not None and not kind.queue else \
        f"{p.max_running} run / {p.max_queued} queue"


def hosts_table(hosts: Sequence[HostInfoRow]) -> Table:
    judged = any(h.valid or h.invalid for h in hosts)
    speeds = any(h.speed for h in hosts)
    t = _table("HOST", "NAME", "POOL", "CPUS", *(["GFLOPS"] if speeds else []), "DONE", "FAILED", "ERROR RATE",
               *(["INVALID"] if judged else []), "BLACK HOLE", "REFUSED", "LAST SEEN")
    for h in hosts:
        invalid = [f"{h.invalid:,} of {h.valid + h.invalid:,} ({h.invalid_rate:.0%})" if h.valid + h.invalid else ""]
        t.add_row(h.host_id, h.name, h.pool, str(h.ncpus), *([f"{h.speed:.2f}" if h.speed else ""] if speeds else []),
                  f"{h.done:,}", f"{h.failed:,}", f"{h.error_rate:.1%}", *(invalid if judged else []),
                  "yes" if h.black_hole else "", f"{h.refused:,}" if h.refused else "", ago(h.last_seen) + " ago")
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
            console.print(f"  job {j.index}: {escape(cut(j.reason or ''))}  [dim]({escape(cut(j.command))})[/]",
                          soft_wrap=True)


def job_log(log: JobLog) -> None:
    """`gridbot logs`: the job, each instance on one line with its host and reason, then the kept result's
    output tails (the last 64 KiB of each, as the server keeps them)."""
    j = log.job
    revision = f", revision {j.revision}" if j.revision > 1 else ""
    console.print(f"[bold]job {j.index} of bag {log.bag}[/]: {j.state}, {j.attempts} attempt(s), {j.failures} "
                  f"failure(s) counted{revision}", soft_wrap=True)
    console.print(f"command: {j.command}", markup=False, soft_wrap=True)
    if log.params:
        console.print("parameters: " + ", ".join(f"{k}={v}" for k, v in log.params.items()), markup=False,
                      soft_wrap=True)
    if j.reason and j.state != JobState.DONE:
        console.print(f"reason: {j.reason}", markup=False, soft_wrap=True)
    if not log.instances:
        console.print("no instance of it has been sent yet")
    for i in log.instances:
        how = [f"exit code {i.exit_code}" if i.exit_code is not None else "",
               duration(i.wall_s) if i.wall_s is not None else "", i.reason or ""]
        kept = " (kept in the results)" if i.kept else ""
        console.print(f"instance {i.instance_id} on host {i.host_id}: {i.state}{kept}"
                      + "".join(f"; {h}" for h in how if h), markup=False, soft_wrap=True)
    kept_one = next((i for i in log.instances if i.kept), None)
    if kept_one is None:
        return
    for name, tail in (("stdout", kept_one.stdout_tail), ("stderr", kept_one.stderr_tail)):
        console.print(f"[bold]--- {name} of instance {kept_one.instance_id}[/]" + (" (empty)" if not tail else ""))
        if tail:
            shown = terminal_safe(tail) if sys.stdout.isatty() else tail  # a file or a pipe gets it as it was
            sys.stdout.write(shown if shown.endswith("\n") else shown + "\n")
            sys.stdout.flush()


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """`text` with its control characters but newlines and tabs shown as `\\xNN`: a job's output (a volunteer's
    host's, say) could otherwise move the cursor, retitle the window or hide lines of the terminal it is shown in."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
