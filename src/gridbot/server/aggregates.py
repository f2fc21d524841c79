"""Read-only aggregates of the store for the console and `gridbot report`: completions over time.

A bag of a million jobs cannot be shipped to a browser, nor read row by row into Python on every poll:
the database groups the ended instances into time buckets (per pool) and run-time bins itself, in one
scan, and only those counts come back. The queries run on a connection of their own (read-only for
SQLite), on the console's thread, so they never wait for, or hold, the locks the dispatcher's commits and
feeds take. The SQL of these reads lives here, named, as the store's lives in `store/sql.py`.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from gridbot.model.states import InstanceState, JobState
from gridbot.store.base import Store
from gridbot.store.memory import MemoryStore
from gridbot.store.sql import PostgresStore, SQLiteStore

RUNTIME_EDGES: tuple[float, ...] = tuple(round(10 ** (k / 4), 6) for k in range(-8, 25))
"""Upper edges of the run-time bins, seconds (0.01 s to 1e6 s, four bins a decade); one more bin holds the
rest. Fixed, so the histogram is counted in the same scan as the completions."""


class Completions(msgspec.Struct):
    """Instances that returned a result, per time bucket and pool, and their run times."""

    start: float
    """The start of the first bucket (server clock, seconds)."""
    width: float
    """Seconds per bucket."""
    buckets: int
    done: dict[str, list[int]]
    """Per pool (the host's pool; "" for a host the store no longer knows): results returned in each bucket."""
    cpu: dict[str, list[float]]
    """Per pool: the run time (wall seconds on one slot; CPU seconds where no wall time was reported) of those
    results: their CPU-time equivalent, GridBot's measure of what a pool delivered."""
    failed: list[int]
    """Jobs that failed for good in each bucket (their last instance's end), for a bag; zeros for pools."""
    runtime: list[int]
    """Done instances per run-time bin (`RUNTIME_EDGES`; the last bin is above the last edge)."""


def empty(start: float, width: float, buckets: int) -> Completions:
    """Completions with nothing counted yet."""
    return Completions(start, width, buckets, {}, {}, [0] * buckets, [0] * (len(RUNTIME_EDGES) + 1))


def runtime_bin(wall_s: float) -> int:
    """The run-time bin of an instance that ran `wall_s` seconds."""
    for k, edge in enumerate(RUNTIME_EDGES):
        if wall_s < edge:
            return k
    return len(RUNTIME_EDGES)


def _count(out: Completions, rows: Iterable[tuple[Any, ...]]) -> Completions:
    """Add grouped rows (bucket, pool, run-time bin, count, cpu-seconds) into `out`."""
    for bucket, pool, wbin, n, cpu in rows:
        k = min(max(int(bucket), 0), out.buckets - 1)
        pool = pool or ""
        out.done.setdefault(pool, [0] * out.buckets)[k] += int(n)
        out.cpu.setdefault(pool, [0.0] * out.buckets)[k] += float(cpu or 0.0)
        if wbin is not None and int(wbin) >= 0:
            out.runtime[int(wbin)] += int(n)
    return out


class Aggregates(ABC):
    """Completions of one bag, or of every bag per pool, computed where the rows are."""

    threaded = True
    """Whether the queries may run on another thread than the server's (the store in memory may not)."""

    @abstractmethod
    def bag(self, bag_id: int, start: float, width: float, buckets: int) -> Completions:
        """The bag's results and jobs failed for good, per bucket of `width` seconds from `start`."""

    @abstractmethod
    def pools(self, start: float, width: float, buckets: int, owner: str | None) -> Completions:
        """Results of every bag (of `owner`'s bags only, unless None) per pool and bucket."""

    def close(self) -> None:  # noqa: B027 - nothing to release in memory
        """Release the connection."""


class MemoryAggregates(Aggregates):
    """The same counts by walking a MemoryStore's dictionaries (tests, `memory://` servers)."""

    threaded = False

    def __init__(self, store: MemoryStore) -> None:
        """Aggregates read from `store`."""
        self.store = store

    def _done(self, start: float, width: float, buckets: int, keep: Any) -> Completions:
        """Done instances of the bags `keep` accepts, ended at `start` or later, counted per bucket and pool."""
        out = empty(start, width, buckets)
        d = self.store.d
        rows = []
        for inst in d.instances.values():
            r = inst.row
            if r.state is InstanceState.DONE and r.ended_at is not None and r.ended_at >= start and keep(inst.bag_id):
                host = d.hosts.get(r.host_id)
                wall = r.wall_s
                ran = wall if wall is not None else r.cpu_s or 0.0
                rows.append((int((r.ended_at - start) // width), host.info.pool if host else "",
                             runtime_bin(wall) if wall is not None else -1, 1, ran))
        return _count(out, rows)

    def bag(self, bag_id: int, start: float, width: float, buckets: int) -> Completions:
        """See Aggregates.bag."""
        out = self._done(start, width, buckets, lambda b: b == bag_id)
        d = self.store.d
        for job_id in d.job_ids.get(bag_id, []):
            if d.jobs[job_id].state is JobState.FAILED:
                ends = [e for i in d.by_job.get(job_id, []) if (e := d.instances[i].row.ended_at) is not None]
                if ends:
                    out.failed[min(max(int((max(ends) - start) // width), 0), buckets - 1)] += 1
        return out

    def pools(self, start: float, width: float, buckets: int, owner: str | None) -> Completions:
        """See Aggregates.pools."""
        mine = {b.bag_id for b in self.store.d.bags.values() if owner is None or b.owner == owner}
        return self._done(start, width, buckets, lambda b: b in mine)


def _ladder(column: str) -> str:
    """SQL for the run-time bin of `column` (-1 when it is NULL): a CASE over the fixed edges, for a SQLite
    built without its math functions."""
    steps = " ".join(f"WHEN {column} < {edge!r} THEN {k}" for k, edge in enumerate(RUNTIME_EDGES))
    return f"CASE WHEN {column} IS NULL THEN -1 {steps} ELSE {len(RUNTIME_EDGES)} END"


def _log_bin(column: str, bin_of: str) -> str:
    """SQL for the same bin by its logarithm (a third of the ladder's time on a million rows): bin k holds
    edge[k-1] <= x < edge[k], edge[k] = 10^((k-8)/4), so k = floor(4 log10 x) + 9, which `bin_of` computes in
    the dialect (`log10` is SQLite's, `LOG` PostgreSQL's base-10 logarithm) for x between the edges."""
    last = len(RUNTIME_EDGES)
    return (f"CASE WHEN {column} IS NULL THEN -1 WHEN {column} < {RUNTIME_EDGES[0]!r} THEN 0 "
            f"WHEN {column} >= {RUNTIME_EDGES[-1]!r} THEN {last} ELSE {bin_of} END")


_DONE = ("SELECT {bucket} AS b, COALESCE(h.pool, '') AS p, {wbin} AS w, COUNT(*), "
         "SUM(COALESCE(i.wall_s, i.cpu_s, 0)) "
         "FROM instances i LEFT JOIN hosts h ON h.id = i.host_id "
         "WHERE i.state = 'done' AND i.ended_at >= ? {where} GROUP BY 1, 2, 3")
SQL: dict[str, str] = {
    "bag_done": _DONE.replace("{where}", "AND i.bag_id = ?"),
    "pool_done": _DONE.replace("{where}", ""),
    "owner_done": _DONE.replace("{where}", "AND i.bag_id IN (SELECT id FROM bags WHERE owner = ?)"),
    "bag_failed": ("SELECT {bucket_t}, COUNT(*) FROM (SELECT MAX(i.ended_at) AS t FROM jobs j "
                   "JOIN instances i ON i.job_id = j.id WHERE j.bag_id = ? AND j.state = 'failed' GROUP BY j.id) f "
                   "WHERE t IS NOT NULL GROUP BY 1"),
}
"""The console's reads. `{bucket}` is the dialect's whole number of buckets since the start (its
parameters: start, width), `{wbin}` the run-time bin; `i.ended_at >= start` keeps the bucket from being
negative for results older than the window."""


class SqlAggregates(Aggregates):
    """The counts grouped by SQLite or PostgreSQL, on a connection of their own opened on first use."""

    def __init__(self, store: SQLiteStore | PostgresStore) -> None:
        """Aggregates read from `store`."""
        self.store = store
        self._conn: Any = None
        self._lock = threading.Lock()
        sqlite = isinstance(store, SQLiteStore)
        self._mark = "?" if sqlite else "%s"
        self._floor = "CAST(({x} - ?) / ? AS INTEGER)" if sqlite else "CAST(FLOOR(({x} - ?) / ?) AS BIGINT)"
        pg_bin = "CAST(FLOOR(4 * LOG(i.wall_s)) AS BIGINT) + 9"
        self._wbin = _ladder("i.wall_s") if sqlite else _log_bin("i.wall_s", pg_bin)

    def _connect(self) -> Any:
        """A connection of the console's own: read-only for SQLite, autocommit for PostgreSQL."""
        if isinstance(self.store, SQLiteStore):
            uri = Path(self.store.path).resolve().as_uri() + "?mode=ro"  # (a path with # or ? would cut it short)
            conn = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=30)
            conn.execute("PRAGMA query_only=ON")
            with contextlib.suppress(sqlite3.Error):  # built with its math functions (3.35 on)
                conn.execute("SELECT log10(10.0)")
                self._wbin = _log_bin("i.wall_s", "CAST(4 * log10(i.wall_s) + 9 AS INTEGER)")  # >= 1: floor
            return conn
        import psycopg

        return psycopg.connect(self.store.url, autocommit=True, connect_timeout=10)

    def _sql(self, name: str) -> str:
        """The named query in this dialect, with the bucket and run-time bin expressions filled in."""
        text = SQL[name].format(bucket=self._floor.format(x="i.ended_at"), bucket_t=self._floor.format(x="t"),
                                wbin=self._wbin)
        return text.replace("?", self._mark)

    def _rows(self, name: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """One query's rows; a connection that failed is dropped, to be opened again next time."""
        with self._lock:
            try:
                if self._conn is None:
                    self._conn = self._connect()
                cur = self._conn.cursor()
                cur.execute(self._sql(name), params)
                rows = cur.fetchall()
                cur.close()
                return [tuple(r) for r in rows]
            except Exception:
                self._close()
                raise

    def bag(self, bag_id: int, start: float, width: float, buckets: int) -> Completions:
        """See Aggregates.bag."""
        out = _count(empty(start, width, buckets), self._rows("bag_done", (start, width, start, bag_id)))
        for bucket, n in self._rows("bag_failed", (start, width, bag_id)):
            out.failed[min(max(int(bucket), 0), buckets - 1)] += int(n)
        return out

    def pools(self, start: float, width: float, buckets: int, owner: str | None) -> Completions:
        """See Aggregates.pools."""
        if owner is None:
            rows = self._rows("pool_done", (start, width, start))
        else:
            rows = self._rows("owner_done", (start, width, start, owner))
        return _count(empty(start, width, buckets), rows)

    def _close(self) -> None:
        """Drop the connection (the lock is held)."""
        if self._conn is not None:
            with contextlib.suppress(Exception):  # a connection already broken has nothing left to close
                self._conn.close()
            self._conn = None

    def close(self) -> None:
        """Close the connection; the next query opens another."""
        with self._lock:
            self._close()


def aggregates_of(store: Store) -> Aggregates | None:
    """The aggregates reader for a store (None: a store of a kind this module does not know)."""
    if isinstance(store, SQLiteStore | PostgresStore):
        return SqlAggregates(store)
    if isinstance(store, MemoryStore):
        return MemoryAggregates(store)
    return None
