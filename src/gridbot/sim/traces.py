"""Real traces the simulator draws from: measured task runtimes, SWF job logs, failure records, fitted
availability models. Copies of the public files ship in `gridbot/sim/traces/` with their provenance
(README.md there); a scenario may also name a file of its own by path.

Each loader reads a file once per process and returns plain numbers in seconds.
"""

from __future__ import annotations

import csv
import gzip
import io
import lzma
import math
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from importlib import resources
from itertools import pairwise
from pathlib import Path
from typing import Any, ClassVar

from gridbot.errors import GridbotError
from gridbot.history import csv_rows

TASK_RUNTIMES = "task_runtimes.csv.gz"
FTA_FITS = "fta_fitted_interval_distributions_from_opendc.csv"
LANL = "LA-UR-05-7318-failure-data-1996-2005.csv.xz"
SWF_LOGS = {"NASA-iPSC": "NASA-iPSC-1993-3.1-cln.swf.gz", "CESNET-wagap": "wagap-2013.swf.gz"}
"""SWF logs shipped with gridbot, by short name."""
FTA_FAMILIES = ("Exp", "Wbl", "LogN", "Gam")


class TraceError(GridbotError, ValueError):
    """A trace that cannot be read or has no such entry; the message says what exists (still a ValueError, as
    callers caught it)."""


_COMPRESSED: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    ".gz": ("gzip", gzip.decompress), ".xz": ("xz", lzma.decompress)}
"""How a trace file is decompressed, by its suffix."""


def _open_text(name_or_path: str) -> io.TextIOBase:
    """A shipped trace or a file, decompressed by its suffix; TraceError if missing, unreadable, cut or garbled."""
    packaged = resources.files("gridbot.sim") / "traces" / name_or_path
    data: bytes
    try:
        if packaged.is_file():
            data = packaged.read_bytes()
        else:
            path = Path(name_or_path).expanduser()
            if not path.is_file():
                raise TraceError(f"no trace file {name_or_path!r} (neither shipped with gridbot nor a file here)")
            data = path.read_bytes()
    except OSError as e:
        raise TraceError(f"cannot read trace file {name_or_path!r}: {e.strerror or e}") from None
    for suffix, (kind, decompress) in _COMPRESSED.items():
        if not name_or_path.endswith(suffix):
            continue
        try:
            data = decompress(data)
        except (EOFError, OSError, zlib.error, lzma.LZMAError) as e:  # gzip.BadGzipFile is an OSError
            raise TraceError(f"trace file {name_or_path!r} cannot be decompressed ({e}): it is cut short or is not "
                             f"{kind}-compressed as its suffix {suffix} says; copy it again, or drop the suffix "
                             "if the file is plain text") from None
    return io.StringIO(data.decode("utf-8", errors="replace"))


@cache
def _runtimes_by_program() -> dict[str, tuple[float, ...]]:
    out: dict[str, list[float]] = defaultdict(list)
    for row in csv.DictReader(_open_text(TASK_RUNTIMES)):
        try:
            out[row["program"]].append(float(row["runtime_s"]))
        except (KeyError, ValueError):
            continue
    return {k: tuple(v) for k, v in out.items()}


def task_runtimes(program: str) -> tuple[float, ...]:
    """Measured runtimes (s) of one program of the WfCommons bag-of-tasks stages (e.g. `blastall`)."""
    by_program = _runtimes_by_program()
    if program not in by_program:
        known = ", ".join(f"{k} ({len(v):,})" for k, v in sorted(by_program.items(), key=lambda kv: -len(kv[1]))[:8])
        raise TraceError(f"no measured runtimes of program {program!r}; the largest are {known}")
    return by_program[program]


@dataclass(frozen=True)
class SwfJob:
    """One record of a Standard Workload Format log; an absent field is -1, as the format writes it."""

    number: int
    submit: float
    run: float
    """Run time (field 4), seconds: cut short for a job that was killed or failed."""
    procs: int
    """Allocated processors (field 5), or the requested ones (field 8) when not recorded."""
    status: int
    """Field 11: 1 completed, 0 failed, 5 cancelled, 2-4 partial runs of a checkpointed job, -1 unknown."""
    user: int
    queue: int
    partition: int
    queue_name: str = ""
    """The queue by name, from Alea's extended SWF (a `{node ids}` field, then the queue name)."""


SWF_STATUSES = (1, -1)
"""Kept by default: completed jobs, and those of logs that record no status (NASA-iPSC). Failed (0),
cancelled (5) and partial (2-4) runs ended early: their run times are not the jobs' run times."""


@dataclass(frozen=True)
class SwfFilter:
    """Which records of an SWF log to replay: by status, user, queue (number or Alea's name) and partition;
    None keeps every value."""

    status: frozenset[int] = frozenset(SWF_STATUSES)
    user: frozenset[int] | None = None
    queue: frozenset[int | str] | None = None
    partition: frozenset[int] | None = None

    KEYS: ClassVar[tuple[str, ...]] = ("status", "user", "queue", "partition")

    @classmethod
    def from_table(cls, table: Mapping[str, object]) -> SwfFilter:
        """The filter a scenario writes (`status = [1, 0]`, `user = 24`, `queue = ["q_2h", 3]`); raise
        TraceError on a value that is not a whole number (or, for a queue, a name) or a list of them."""
        chosen: dict[str, Any] = {}
        for key in cls.KEYS:
            if key not in table:
                continue
            value = table[key]
            values: list[Any] = value if isinstance(value, list) else [value]
            names = key == "queue"
            if not values or not all((isinstance(v, int) and not isinstance(v, bool)) or (names and isinstance(v, str))
                                     for v in values):
                raise TraceError(f"{key} must be a whole number{' or a queue name' if names else ''}, or a list of "
                                 f"them, like {key} = [1, 2], not {value!r}")
            chosen[key] = frozenset(values)
        return cls(**chosen)

    def keeps(self, job: SwfJob) -> bool:
        return (job.status in self.status and (self.user is None or job.user in self.user)
                and (self.partition is None or job.partition in self.partition)
                and (self.queue is None or job.queue in self.queue or job.queue_name in self.queue))


@cache
def swf_jobs(name_or_path: str) -> tuple[SwfJob, ...]:
    """Every record of a Standard Workload Format log (a shipped one by short name, or a path), in file order."""
    out = []
    for line in _open_text(SWF_LOGS.get(name_or_path, name_or_path)):
        if not line.strip() or line.lstrip().startswith(";"):
            continue
        f = line.split()
        if len(f) < 8:
            raise TraceError(f"{name_or_path}: line {line.strip()[:60]!r} is not an SWF record (18 fields)")
        try:
            n = [int(float(x)) for x in (*f[4:18], *["-1"] * (18 - len(f)))]
            procs = n[0] if n[0] > 0 else n[3]
            alea = f[19] if len(f) > 19 and f[18].startswith("{") else ""
            job = SwfJob(int(f[0]), float(f[1]), float(f[3]), procs, n[6], n[7], n[10], n[11], alea)
        except (ValueError, OverflowError):  # int(float("inf")) overflows
            raise TraceError(f"{name_or_path}: line {line.strip()[:60]!r} holds a field that is not a number") \
                from None
        if problem := _swf_times_problem(job):
            raise TraceError(f"{name_or_path}: line {line.strip()[:60]!r} {problem}; correct or delete that line")
        out.append(job)
    return tuple(out)


MAX_SUBMIT = 1e11
"""The latest submit time of an SWF record: seconds from the log's start, or a Unix time (CESNET-wagap's are about
1.36e9), up to the year 5138; a bag's arrival, counted from the first bag taken, is warned of if past the horizon."""


def _swf_times_problem(job: SwfJob) -> str:
    """Why a record's submit or run time cannot be replayed, or "": an infinite run time crashed the check of
    overdue jobs, and an infinite, NaN or negative submit time made a bag that never arrives (one of 1e300 s,
    one that arrives in an absurdly far future)."""
    if not (math.isfinite(job.submit) and 0 <= job.submit <= MAX_SUBMIT):
        return (f"has a submit time (field 2) of {job.submit:g}: it is seconds from the log's start (or a Unix "
                f"time, as CESNET's logs have), a number from 0 to {MAX_SUBMIT:g}")
    if not math.isfinite(job.run):
        return f"has a run time (field 4) of {job.run:g}: it is a finite number of seconds (-1 when not recorded)"
    return ""


def swf_source(name: str, base: Path) -> str:
    """The SWF log a scenario names: a shipped one by short name, an absolute path, or a path from the scenario's
    folder `base` (then, as before, from the current one); TraceError naming the folders searched."""
    if name in SWF_LOGS or name in SWF_LOGS.values() or Path(name).expanduser().is_absolute():
        return name
    for folder in (base, Path()):
        if (folder / name).expanduser().is_file():
            return str(folder / name)
    folders = [f"the scenario's folder ({base.resolve()})"]
    if base.resolve() != Path.cwd():
        folders.append(f"the current folder ({Path.cwd()})")
    shipped = ", ".join(f"{short} ({file})" for short, file in SWF_LOGS.items())
    raise TraceError(f"no SWF log {name!r}: not one shipped with gridbot ({shipped}), nor a file in "
                     f"{' or '.join(folders)}; give its path from the scenario's folder, or an absolute one")


def swf_runtimes(name_or_path: str, keep: SwfFilter = SwfFilter()) -> tuple[float, ...]:
    """Run times (field 4, seconds) of the jobs of a Standard Workload Format log that ran (> 0 s) and that
    `keep` keeps (by default, not those killed or failed)."""
    out = tuple(j.run for j in swf_jobs(name_or_path) if j.run > 0 and keep.keeps(j))
    if not out:
        raise TraceError(f"{name_or_path}: no job with a positive run time{_filtered(keep)}")
    return out


def _filtered(keep: SwfFilter) -> str:
    if keep == SwfFilter():
        return f" and a status of {' or '.join(map(str, SWF_STATUSES))} (add status = [...] to keep others)"
    return " that the filter (status, user, queue, partition) keeps"


@cache
def _fta() -> dict[tuple[str, str], tuple[str, float, float, str, float, float]]:
    out = {}
    for row in csv.DictReader(_open_text(FTA_FITS)):
        out[(row["fta_trace"], row["fit_family"])] = (
            row["avail_dist"], float(row["avail_p1"]), float(row["avail_p2"] or 0),
            row["unavail_dist"], float(row["unavail_p1"]), float(row["unavail_p2"] or 0))
    return out


def fta_fit(trace: str, family: str, available: bool) -> tuple[str, float, float]:
    """(distribution, p1, p2) in hours of the fitted availability or unavailability interval of a trace."""
    fits = _fta()
    if family not in FTA_FAMILIES:
        raise TraceError(f"unknown fit family {family!r}; use one of {', '.join(FTA_FAMILIES)}")
    if (trace, family) not in fits:
        names = sorted({t for t, _ in fits})
        raise TraceError(f"no Failure Trace Archive fit for {trace!r}; there are {', '.join(names)}")
    f = fits[(trace, family)]
    return (f[0], f[1], f[2]) if available else (f[3], f[4], f[5])


@cache
def _lanl() -> dict[str, tuple[float, ...]]:
    """Downtimes and times between failures of one node (both in seconds) from the LANL records."""
    starts: dict[tuple[str, str], list[float]] = defaultdict(list)
    downtime: list[float] = []
    for row in csv.DictReader(_open_text(LANL)):
        try:
            start = datetime.strptime(row["Prob Started"], "%m/%d/%Y %H:%M").timestamp()
            down = float(row["Down Time"]) * 60
        except (KeyError, ValueError):
            continue
        starts[(row["System"], row["nodenumz"])].append(start)
        downtime.append(down)
    between: list[float] = []
    for times in starts.values():
        times.sort()
        between.extend(b - a for a, b in pairwise(times) if b > a)
    return {"downtime": tuple(downtime), "between_failures": tuple(between)}


def lanl_intervals(kind: str) -> tuple[float, ...]:
    """`downtime` (repair time) or `between_failures` (time between failures of one node), seconds."""
    data = _lanl()
    if kind not in data:
        raise TraceError(f"LANL records give 'downtime' or 'between_failures', not {kind!r}")
    return data[kind]


def swf_records(name_or_path: str, keep: SwfFilter = SwfFilter()) -> tuple[SwfJob, ...]:
    """The SWF jobs that ran (a positive run time and processor count) and that `keep` keeps, in order of
    submission (file order among equal submit times). The archive's logs are in submission order, but a log
    in job-number order, merged, or written by hand need not be: replayed in file order, a job submitted
    before the first line's made a bag arriving before time 0, and a wrong makespan, without a word."""
    kept = (j for j in swf_jobs(name_or_path) if j.run > 0 and j.procs > 0 and keep.keeps(j))
    out = tuple(sorted(kept, key=lambda j: j.submit))
    if not out:
        raise TraceError(f"{name_or_path}: no job with a positive run time and processor count{_filtered(keep)}")
    return out


def swf_bursts(jobs: Sequence[SwfJob], gap: float) -> list[list[SwfJob]]:
    """The jobs grouped into bursts: one user's jobs, each submitted at most `gap` seconds after the one
    before it (a user submitting a bag of tasks to a batch queue sends it as a burst of jobs). In order
    of their first job's submission; jobs of an unknown user (-1) are grouped as if one user's."""
    current: dict[int, list[SwfJob]] = {}
    out: list[list[SwfJob]] = []
    for job in sorted(jobs, key=lambda j: j.submit):
        burst = current.get(job.user)
        if burst is not None and job.submit - burst[-1].submit <= gap:
            burst.append(job)
        else:
            current[job.user] = burst = [job]
            out.append(burst)
    return out


@dataclass(frozen=True)
class HostSession:
    """A named host online from `start` to `end` (seconds), from a trace of named hosts (`host_sessions`)."""

    host: str
    start: float
    end: float


def _csv_rows(path: Path, what: str, columns: str) -> Iterator[tuple[int, list[str]]]:
    """The rows of a CSV file a scenario names, with their line numbers; TraceError naming the file (and the line)
    if it cannot be read, is not UTF-8 text (a UnicodeDecodeError named neither), or has a field over the csv
    module's limit of 131,072 characters (its `_csv.Error` was a traceback)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise TraceError(f"cannot read {what} {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise TraceError(f"{path} is not a UTF-8 text file ({e.reason} at byte {e.start:,}): a {what} is CSV text "
                         f"of {columns} rows; name the right file, or save it as UTF-8") from None
    yield from csv_rows(text, lambda line, e: TraceError(f"{path}:{line}: not a CSV line of {columns} ({e}); name the "
                                                          "right file, or correct that line"))


def host_sessions(path: Path) -> list[HostSession]:
    """The sessions of named hosts from a CSV file of `host,start,end` rows (seconds; a header is skipped), in
    order of start: when each volunteer was online. A host's sessions may not overlap (it is one machine)."""
    sessions: list[tuple[HostSession, int]] = []
    for n, row in _csv_rows(path, "host trace", "host,start,end"):
        if not row or row[0].strip().startswith("#"):
            continue
        try:
            host, start, end = row[0].strip(), float(row[1]), float(row[2])
        except (ValueError, IndexError):
            if n == 1:
                continue
            raise TraceError(f"{path}:{n}: expected 'host,start,end' (a name, then seconds), got "
                             f"{','.join(row)!r}") from None
        if not host or not (0 <= start < end < math.inf):
            raise TraceError(f"{path}:{n}: a session needs a host name and 0 <= start < end (seconds), got "
                             f"{','.join(row)!r}")
        sessions.append((HostSession(host, start, end), n))
    if not sessions:
        raise TraceError(f"{path} holds no 'host,start,end' rows")
    last: dict[str, tuple[HostSession, int]] = {}
    merged: list[HostSession] = []
    for s, n in sorted(sessions, key=lambda sn: (sn[0].host, sn[0].start)):
        before = last.get(s.host)
        if before is not None and s.start < before[0].end:
            raise TraceError(f"{path}:{n}: host {s.host!r} is online from {s.start:g} s, but its session of line "
                             f"{before[1]} lasts until {before[0].end:g} s: one machine has one session at a time "
                             "(merge the two rows)")
        if before is not None and s.start == before[0].end:  # online all along: one session
            s = HostSession(s.host, before[0].start, s.end)
            merged.pop()
        merged.append(s)
        last[s.host] = (s, n)
    return sorted(merged, key=lambda s: (s.start, s.host))


def online_steps(sessions: Sequence[HostSession]) -> list[tuple[float, int]]:
    """How many of the hosts are online over time, as `time,size` steps (the pool's size)."""
    changes: dict[float, int] = defaultdict(int)
    for s in sessions:
        changes[s.start] += 1
        changes[s.end] -= 1
    steps, online = [], 0
    for at in sorted(changes):
        online += changes[at]
        steps.append((at, online))
    return steps if steps[0][0] == 0 else [(0.0, 0), *steps]


def size_steps(path: Path) -> list[tuple[float, int]]:
    """A pool's size over time from a CSV file of `time,size` rows (time in seconds; a header is skipped)."""
    steps = []
    for n, row in _csv_rows(path, "size trace", "time,size"):
        if not row or row[0].strip().startswith("#"):
            continue
        try:
            steps.append((float(row[0]), int(row[1])))
        except (ValueError, IndexError):
            if n == 1:
                continue
            raise TraceError(f"{path}:{n}: expected 'time,size' (seconds, whole number), got {','.join(row)!r}")\
                from None
    if not steps:
        raise TraceError(f"{path} holds no 'time,size' rows")
    return steps
