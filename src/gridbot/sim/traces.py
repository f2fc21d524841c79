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
from collections import defaultdict
from datetime import datetime
from functools import cache
from importlib import resources
from itertools import pairwise
from pathlib import Path

TASK_RUNTIMES = "task_runtimes.csv.gz"
FTA_FITS = "fta_fitted_interval_distributions_from_opendc.csv"
LANL = "LA-UR-05-7318-failure-data-1996-2005.csv.xz"
SWF_LOGS = {"NASA-iPSC": "NASA-iPSC-1993-3.1-cln.swf.gz"}
"""SWF logs shipped with gridbot, by short name."""
FTA_FAMILIES = ("Exp", "Wbl", "LogN", "Gam")


class TraceError(ValueError):
    """A trace that cannot be read or has no such entry; the message says what exists."""


def _open_text(name_or_path: str) -> io.TextIOBase:
    packaged = resources.files("gridbot.sim") / "traces" / name_or_path
    data: bytes
    if packaged.is_file():
        data = packaged.read_bytes()
    else:
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise TraceError(f"no trace file {name_or_path!r} (neither shipped with gridbot nor a file here)")
        data = path.read_bytes()
    if name_or_path.endswith(".gz"):
        data = gzip.decompress(data)
    elif name_or_path.endswith(".xz"):
        data = lzma.decompress(data)
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


@cache
def swf_runtimes(name_or_path: str) -> tuple[float, ...]:
    """Run times (field 4, seconds) of the jobs of a Standard Workload Format log that ran (> 0 s)."""
    text = _open_text(SWF_LOGS.get(name_or_path, name_or_path))
    out = []
    for line in text:
        if not line.strip() or line.lstrip().startswith(";"):
            continue
        fields = line.split()
        if len(fields) < 4:
            raise TraceError(f"{name_or_path}: line {line.strip()[:60]!r} is not an SWF record (18 fields)")
        run = float(fields[3])
        if run > 0:
            out.append(run)
    if not out:
        raise TraceError(f"{name_or_path}: no job with a positive run time")
    return tuple(out)


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


@cache
def swf_records(name_or_path: str) -> tuple[tuple[int, float, float, int], ...]:
    """(job number, submit time, run time, processors) of each SWF job that ran, in file order."""
    out = []
    for line in _open_text(SWF_LOGS.get(name_or_path, name_or_path)):
        if not line.strip() or line.lstrip().startswith(";"):
            continue
        f = line.split()
        if len(f) < 8:
            raise TraceError(f"{name_or_path}: line {line.strip()[:60]!r} is not an SWF record (18 fields)")
        procs = int(f[4]) if int(f[4]) > 0 else int(f[7])
        if float(f[3]) > 0 and procs > 0:
            out.append((int(f[0]), float(f[1]), float(f[3]), procs))
    if not out:
        raise TraceError(f"{name_or_path}: no job with a positive run time and processor count")
    return tuple(out)


def size_steps(path: Path) -> list[tuple[float, int]]:
    """A pool's size over time from a CSV file of `time,size` rows (time in seconds; a header is skipped)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise TraceError(f"cannot read size trace {path}: {e.strerror or e}") from None
    steps = []
    for n, row in enumerate(csv.reader(io.StringIO(text)), 1):
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
