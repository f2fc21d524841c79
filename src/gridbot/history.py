"""A bag's instances as ExPERT characterizes the pools offline from them: a history file, or a previous bag.

A history file is CSV with a header line, or JSON lines, one instance a line:

    sent_at,ended_at,success,pool
    1700000000.0,1700002066.5,1,grid
    1700000003.2,,0,grid
    1700000004.0,1700001500.0,0,grid
    1700008000.0,1700009800.0,1,cloud

    {"sent_at": 0, "ended_at": 2066.5, "success": true, "pool": "grid"}

- `sent_at`: when the instance was sent (seconds, any origin shared by the file: Unix time, or since the bag
  began);
- `ended_at`: when its result or its failure came back; empty (or null): it never came back (lost), or was still
  out when the file was written;
- `success`: 1/true if a good result came back, 0/false otherwise;
- `pool`: the pool it ran on; an optional `reliable` column (1/true, 0/false) says whether that pool is a
  reliable one, else the pools given as reliable (those of the server, or none) decide.

An instance cancelled before it ended (its job done elsewhere) is not a line: what it would have done is not
known. `gridbot plan BAG --history FILE` characterizes from such a file, `--from-bag NAME` from a previous
bag's instances as the server stored them (`rows_from_states` turns the store's instance states into rows).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import NamedTuple

from gridbot.errors import GridbotError
from gridbot.model.states import InstanceState
from gridbot.schedulers.expert.characterize import InstanceRecord

COLUMNS = ("sent_at", "ended_at", "success", "pool")
"""The columns every line has (`reliable` is optional)."""
MAX_LINES = 2_000_000
"""Most instances a history file may hold."""


class HistoryError(GridbotError, ValueError):
    """A history file that cannot be read (the message names the line and what to write)."""


class HistoryRow(NamedTuple):
    """One instance of a history."""

    sent_at: float
    ended_at: float | None
    success: bool
    pool: str
    reliable: bool | None = None
    """None: as the pool's reliability says."""


def parse(text: str, name: str = "history") -> list[HistoryRow]:
    """The rows of a history file (CSV with a header line, or JSON lines), or HistoryError naming the line."""
    body = text.lstrip("\ufeff")
    first = next((line.strip() for line in body.splitlines() if line.strip()), "")
    if not first:
        raise HistoryError(f"{name}: the history is empty; write a header line '{','.join(COLUMNS)}' and one "
                           "instance a line")
    lines = _json_lines(body, name) if first.startswith("{") else _csv_lines(body, name)
    rows = [_row(fields, f"{name}, line {number}") for number, fields in lines]
    if not rows:
        raise HistoryError(f"{name}: the history holds no instance")
    return rows


def dump_csv(rows: Iterable[HistoryRow]) -> str:
    """A history file (CSV, with the `reliable` column when any row says it)."""
    rows = list(rows)
    with_reliable = any(r.reliable is not None for r in rows)
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow([*COLUMNS, *(["reliable"] if with_reliable else [])])
    for r in rows:
        line = [repr(float(r.sent_at)), "" if r.ended_at is None else repr(float(r.ended_at)), int(r.success), r.pool]
        if with_reliable:
            line.append("" if r.reliable is None else int(r.reliable))
        w.writerow(line)
    return out.getvalue()


def records(rows: Iterable[HistoryRow], reliable_pools: Collection[str] = ()) -> list[InstanceRecord]:
    """The rows as the characterization reads them; a row's pool is reliable if its `reliable` says so, else
    if it is one of `reliable_pools`."""
    return [InstanceRecord(r.sent_at, r.ended_at, r.success,
                           r.reliable if r.reliable is not None else r.pool in reliable_pools) for r in rows]


def rows_from_states(instances: Iterable[tuple[float, float | None, InstanceState, str]]) -> list[HistoryRow]:
    """Rows from stored instances (sent_at, ended_at, state, pool): a result (done, or wasted: it came after the
    job's first) is a success, a failure is not, an overdue instance was lost (no end), a running one is still
    out; an instance cancelled or given back (interrupted) is left out, its outcome unknown."""
    out = []
    for sent_at, ended_at, state, pool in instances:
        if state in (InstanceState.DONE, InstanceState.WASTED):
            out.append(HistoryRow(sent_at, ended_at, True, pool))
        elif state is InstanceState.FAILED:
            out.append(HistoryRow(sent_at, ended_at, False, pool))
        elif state in (InstanceState.OVERDUE, InstanceState.RUNNING):
            out.append(HistoryRow(sent_at, None, False, pool))
    return out


def _csv_lines(text: str, name: str) -> list[tuple[int, dict[str, str]]]:
    header: list[str] | None = None
    out = []
    for line, row in csv_rows(text, lambda line, e: HistoryError(
            f"{name}, line {line}: not a CSV line ({e}); write '{','.join(COLUMNS)}' and one instance a line, or JSON "
            "lines")):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        if header is None:
            header = [h.strip().lower() for h in row]
            missing = [c for c in COLUMNS if c not in header]
            if missing:
                raise HistoryError(f"{name}, line {line}: the header lacks {', '.join(missing)}: write "
                                   f"'{','.join(COLUMNS)}' (and optionally ',reliable') first")
            continue
        if len(row) != len(header):
            raise HistoryError(f"{name}, line {line}: {len(row)} fields where the header has "
                               f"{len(header)} ({','.join(header)})")
        out.append((line, dict(zip(header, row, strict=True))))
        if len(out) > MAX_LINES:
            raise HistoryError(f"{name}: more than {MAX_LINES:,} instances")
    return out


def csv_rows(text: str, refuse: Callable[[int, csv.Error], Exception]) -> Iterator[tuple[int, list[str]]]:
    """The CSV rows of `text`, each with its line; a line the csv module cannot read (a field over its limit of
    131,072 characters) raises `refuse(line, error)`, where its `_csv.Error` was a traceback. Also the
    simulator's traces' (sim/traces.py)."""
    reader = csv.reader(io.StringIO(text))
    try:
        for row in reader:
            yield reader.line_num, row
    except csv.Error as e:
        raise refuse(reader.line_num, e) from None


def _json_lines(text: str, name: str) -> list[tuple[int, dict[str, object]]]:
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise HistoryError(f"{name}, line {number}: not JSON ({e.msg}); write one object a line, as "
                               '{"sent_at": 0, "ended_at": 2066.5, "success": true, "pool": "grid"}') from None
        if not isinstance(value, dict):
            raise HistoryError(f"{name}, line {number}: a line must be a JSON object with "
                               f"{', '.join(COLUMNS)}")
        out.append((number, value))
        if len(out) > MAX_LINES:
            raise HistoryError(f"{name}: more than {MAX_LINES:,} instances")
    return out


def _row(fields: dict[str, object] | dict[str, str], where: str) -> HistoryRow:
    missing = [c for c in COLUMNS if c not in fields]
    if missing:
        raise HistoryError(f"{where}: {', '.join(missing)} missing (each line gives {', '.join(COLUMNS)})")
    sent = _seconds(fields["sent_at"], "sent_at", where, required=True)
    assert sent is not None
    ended = _seconds(fields["ended_at"], "ended_at", where, required=False)
    if ended is not None and ended < sent:
        raise HistoryError(f"{where}: ended_at {ended:g} is before sent_at {sent:g}")
    success = _flag(fields["success"], "success", where)
    if success is None:
        raise HistoryError(f"{where}: success must be 1/0 or true/false")
    if success and ended is None:
        raise HistoryError(f"{where}: a good result (success 1) needs the time it came back (ended_at)")
    pool = str(fields["pool"]).strip()
    if not pool:
        raise HistoryError(f"{where}: pool is empty: name the pool the instance ran on")
    return HistoryRow(sent, ended, success, pool, _flag(fields.get("reliable", ""), "reliable", where))


def _seconds(value: object, key: str, where: str, required: bool) -> float | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise HistoryError(f"{where}: {key} is empty: give the time in seconds")
        return None
    if isinstance(value, bool):
        raise HistoryError(f"{where}: {key} must be a number of seconds, not {value!r}")
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise HistoryError(f"{where}: {key} must be a number of seconds, not {str(value)[:40]!r}") from None
    if not math.isfinite(x):
        raise HistoryError(f"{where}: {key} must be a finite number of seconds, not {x}")
    return x


def _flag(value: object, key: str, where: str) -> bool | None:
    if isinstance(value, bool):
        return value
    if value is None:
        return None
    if isinstance(value, int | float):
        if value in (0, 1):
            return bool(value)
        raise HistoryError(f"{where}: {key} must be 1/0 or true/false, not {value!r}")
    text = str(value).strip().lower()
    if not text:
        return None
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no"):
        return False
    raise HistoryError(f"{where}: {key} must be 1/0 or true/false, not {str(value)[:20]!r}")

