"""SQL stores: SQLite (the embedded default, WAL) and PostgreSQL (psycopg 3), sharing every statement.

Statements are written once with `?` placeholders in `SQL` and translated for PostgreSQL. Each
`Changes` batch is one transaction; on SQLite with `synchronous=FULL` (the default) a committed batch
survives a power loss, with `synchronous=NORMAL` it survives a crash of the process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import msgspec

from gridbot.core.changes import (
    HISTORY_ROWS,
    BagCounts,
    BagSnapshot,
    Changes,
    Decision,
    EndedRow,
    Event,
    HostSnapshot,
    LiveInstance,
    QueuedJob,
    Snapshot,
    VoteRow,
)
from gridbot.core.hosts import HostStats
from gridbot.core.ledger import Usage
from gridbot.model.records import HostInfo
from gridbot.model.spec import BagSpec
from gridbot.model.states import PILOT_TERMINAL, BagState, InstanceState, JobState, PilotState
from gridbot.store.base import (
    RETIRED,
    BagExists,
    BagRow,
    ClaimLost,
    InstanceRow,
    JobRow,
    JobStoryRow,
    PilotRow,
    ResultRow,
    Store,
    StoreError,
    StoreUnavailable,
    StoryInstanceRow,
    retiring_event,
    spec_hash,
)
from gridbot.store.migrations import LATEST, MIGRATIONS

_BAG_COLS = ("id, name, spec, spec_hash, state, queued, running, done, failed, cancelled, instances, wasted, overdue, "
             "reruns, replicas, total, created_at, finished_at, owner, revision, downloaded_at")
_JOB_COLS = "id, bag_id, idx, line, state, failures, attempts, reason, result_instance, revision"
_SENT = "EXISTS (SELECT 1 FROM instances i WHERE i.job_id = j.id AND i.state = 'running')"
"""A job stored as queued whose send was not written (JobUpdate.sent): it runs."""
_JOB_SHOWN = (f"id, bag_id, idx, line, CASE WHEN state = 'queued' AND {_SENT} THEN 'running' ELSE state END, "
              f"failures, attempts + CASE WHEN state = 'queued' AND {_SENT} THEN 1 ELSE 0 END, reason, "
              "result_instance, revision")
"""Job columns as listings show them: a job whose send was not written shows as running, with the attempt."""
_INST_COLS = ("id, job_id, host_id, state, sent_at, ended_at, reason, exit_code, wall_s, cpu_s, stdout_tail, "
              "stderr_tail")
_PILOT_COLS = "pool, native_id, state, submitted_at, started_at, ended_at"
_PILOT_LIVE = ", ".join(f"'{s.value}'" for s in PilotState if s not in PILOT_TERMINAL)

SQL = {
    "bag_by_id": f"SELECT {_BAG_COLS} FROM bags WHERE id = ?",
    "bag_by_name": f"SELECT {_BAG_COLS} FROM bags WHERE name = ?",
    "bags": f"SELECT {_BAG_COLS} FROM bags ORDER BY id",
    "insert_bag": "INSERT INTO bags (name, spec, spec_hash, state, total, queued, created_at, owner) "
                  "VALUES (?, ?, ?, 'active', ?, ?, ?, ?) RETURNING id",
    "insert_bag_at": "INSERT INTO bags (id, name, spec, spec_hash, state, total, queued, created_at, owner) "
                     "VALUES (?, ?, ?, ?, 'active', ?, ?, ?, ?) RETURNING id",
    "id_floor": "SELECT floor FROM id_floors WHERE name = ?",
    "raise_floor": "UPDATE id_floors SET floor = ? WHERE name = ? AND floor < ?",
    "bag_top_ids": "SELECT (SELECT MAX(id) FROM jobs WHERE bag_id = ?), "  # by instances_by_job: bag_id has no index
                   "(SELECT MAX(id) FROM instances WHERE job_id IN (SELECT id FROM jobs WHERE bag_id = ?))",
    "set_spec": "UPDATE bags SET spec = ? WHERE id = ?",
    "keep_revision": "INSERT INTO bag_revisions (bag_id, revision, spec, spec_hash, replaced_at) "
                     "SELECT id, revision, spec, spec_hash, ? FROM bags WHERE id = ?",
    "revise_bag": "UPDATE bags SET spec = ?, spec_hash = ?, revision = revision + 1 WHERE id = ?",
    "revise_jobs": "UPDATE jobs SET revision = ? WHERE bag_id = ? AND state <> 'done'",
    "open_jobs": "SELECT id, idx FROM jobs WHERE bag_id = ? AND state <> 'done'",
    "set_line": "UPDATE jobs SET line = ? WHERE id = ?",
    "revisions": "SELECT revision, spec FROM bag_revisions WHERE bag_id = ? ORDER BY revision",
    "reopen_bag": "UPDATE bags SET finished_at = NULL, downloaded_at = NULL WHERE id = ?",
    "retire_overdue": "UPDATE instances SET state = 'cancelled', reason = ?, end_event = COALESCE(?, end_event) "
                      "WHERE job_id = ? AND state = 'overdue'",
    "mark_downloaded": "UPDATE bags SET downloaded_at = ? WHERE id = ?",
    "delete_inputs": "DELETE FROM bag_inputs WHERE bag_id = ?",
    "delete_outputs": "DELETE FROM outputs WHERE instance_id IN "
                      "(SELECT i.id FROM instances i JOIN jobs j ON j.id = i.job_id WHERE j.bag_id = ?)",
    "delete_instances": "DELETE FROM instances WHERE job_id IN (SELECT id FROM jobs WHERE bag_id = ?)",
    "delete_jobs": "DELETE FROM jobs WHERE bag_id = ?",
    "delete_revisions": "DELETE FROM bag_revisions WHERE bag_id = ?",
    "delete_decisions": "DELETE FROM decisions WHERE bag_id = ?",
    "release_events": "WITH mine AS (SELECT sent_event, end_event, overdue_event FROM instances "
                      "WHERE job_id IN (SELECT id FROM jobs WHERE bag_id = ?)), "
                      "cited AS (SELECT sent_event AS e FROM mine UNION ALL SELECT end_event FROM mine "
                      "UNION ALL SELECT overdue_event FROM mine "
                      "UNION ALL SELECT event_id FROM decisions WHERE bag_id = ?), "
                      "n AS (SELECT e, COUNT(*) AS c FROM cited WHERE e IS NOT NULL GROUP BY e) "
                      "UPDATE events SET refs = events.refs - n.c FROM n WHERE events.event_id = n.e",
    "prune_events": "DELETE FROM events WHERE refs <= 0 AND event_id < (SELECT MAX(event_id) FROM events)",
    "delete_bag": "DELETE FROM bags WHERE id = ?",
    "insert_job": "INSERT INTO jobs (bag_id, idx, line) VALUES (?, ?, ?)",
    "insert_input": "INSERT INTO bag_inputs (bag_id, name, data) VALUES (?, ?, ?)",
    "live_instances": "SELECT i.id, i.job_id, i.bag_id, i.host_id, i.state, i.sent_at, i.instance_deadline, "
                      "j.idx, j.line, CASE WHEN j.state = 'queued' AND i.state = 'running' THEN 'running' "
                      "ELSE j.state END, j.failures, "
                      "j.attempts + CASE WHEN j.state = 'queued' AND i.state = 'running' THEN 1 ELSE 0 END "
                      "FROM instances i "
                      "JOIN jobs j ON j.id = i.job_id JOIN bags b ON b.id = i.bag_id "
                      "WHERE i.state IN ('running', 'overdue') AND b.state = 'active' ORDER BY i.id",
    "votes": "SELECT i.id, i.job_id, i.bag_id, i.host_id, i.sent_at, i.ended_at, i.cpu_s, i.vote, j.idx, j.line, "
             "j.state, j.failures, j.attempts FROM instances i JOIN jobs j ON j.id = i.job_id "
             "JOIN bags b ON b.id = i.bag_id WHERE i.vote IS NOT NULL AND i.state = 'done' "
             "AND j.state IN ('queued', 'running') AND b.state = 'active' ORDER BY i.id",
    "set_vote": "UPDATE instances SET vote = ? WHERE id = ?",
    "instance_outputs": "SELECT name, data FROM outputs WHERE instance_id = ? ORDER BY name",
    "forget_votes": "UPDATE instances SET vote = NULL WHERE job_id = ? AND vote IS NOT NULL",
    "max_instance": "SELECT MAX(v) FROM (SELECT COALESCE(MAX(id), 0) AS v FROM instances UNION ALL "
                    "SELECT floor FROM id_floors WHERE name = 'instances') AS t",
    "max_event": "SELECT COALESCE(MAX(event_id), 0) FROM events",
    "usage": "SELECT bag_id, host_id, COUNT(*), SUM(wall_s), MAX(ended_at) FROM instances WHERE wall_s IS NOT NULL "
             "GROUP BY bag_id, host_id",
    "job_span": "SELECT MIN(id), MAX(id) FROM jobs WHERE bag_id = ?",
    "history": "SELECT i.bag_id, i.id, i.sent_at, i.ended_at, i.state, COALESCE(h.pool, '') FROM instances i "
               "LEFT JOIN hosts h ON h.id = i.host_id WHERE i.job_id BETWEEN ? AND ? AND i.state IN ('done', "
               "'wasted', 'failed', 'overdue') ORDER BY i.id DESC LIMIT ?",
    "hosts": "SELECT id, name, platform, ncpus, memory_mb, slots, pool, first_seen, last_seen, stats, account "
             "FROM hosts ORDER BY first_seen, id",
    "queued_jobs": "SELECT id, idx, line, failures, attempts FROM jobs "
                   "WHERE bag_id = ? AND state = 'queued' AND id > ? ORDER BY id LIMIT ?",
    "new_instance": "INSERT INTO instances (id, job_id, bag_id, host_id, state, sent_at, instance_deadline, "
                    "sent_event, replica) VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?)",
    "end_instance": "UPDATE instances SET state = ?, ended_at = ?, reason = ?, exit_code = ?, wall_s = ?, "
                    "cpu_s = ?, stdout_tail = ?, stderr_tail = ?, end_event = ? WHERE id = ?",
    "mark_instance": "UPDATE instances SET state = ?, ended_at = ?, reason = ?, end_event = COALESCE(?, end_event), "
                     "overdue_event = COALESCE(?, overdue_event) WHERE id = ?",
    "note_overdue": "UPDATE instances SET overdue_event = ? WHERE id = ?",
    "insert_event": "INSERT INTO events (event_id, at, kind, source, refs) VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT (event_id) DO NOTHING",
    "insert_decision": "INSERT INTO decisions (event_id, bag_id, job_id, strategy, action, why) "
                       "VALUES (?, ?, ?, ?, ?, ?)",
    "insert_output": "INSERT INTO outputs (instance_id, name, data) VALUES (?, ?, ?)",
    "cancel_queued": "UPDATE jobs SET state = 'cancelled' WHERE bag_id = ? AND state = 'queued'",
    "update_job": "UPDATE jobs SET state = ?, failures = ?, attempts = ?, reason = COALESCE(?, reason), "
                  "result_instance = COALESCE(?, result_instance) WHERE id = ?",
    "update_bag": "UPDATE bags SET state = ?, queued = ?, running = ?, done = ?, failed = ?, cancelled = ?, "
                  "instances = ?, wasted = ?, overdue = ?, reruns = ?, replicas = ?, "
                  "finished_at = COALESCE(?, finished_at) WHERE id = ?",
    "upsert_host": "INSERT INTO hosts (id, name, platform, ncpus, memory_mb, slots, pool, first_seen, last_seen, "
                   "done, failed, stats, account) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                   "ON CONFLICT (id) DO UPDATE SET account = excluded.account, "
                   "name = excluded.name, platform = excluded.platform, ncpus = excluded.ncpus, "
                   "memory_mb = excluded.memory_mb, slots = excluded.slots, pool = excluded.pool, "
                   "last_seen = excluded.last_seen, done = excluded.done, failed = excluded.failed, "
                   "stats = excluded.stats",
    "jobs": f"SELECT {_JOB_SHOWN} FROM jobs j WHERE bag_id = ? AND id > ? ORDER BY id LIMIT ?",
    "jobs_in_state": f"SELECT {_JOB_SHOWN} FROM jobs j WHERE bag_id = ? AND state = ? AND id > ? ORDER BY id LIMIT ?",
    "jobs_queued": f"SELECT {_JOB_SHOWN} FROM jobs j WHERE bag_id = ? AND state = 'queued' AND NOT {_SENT} "
                   "AND id > ? ORDER BY id LIMIT ?",
    "jobs_running": f"SELECT {_JOB_SHOWN} FROM jobs j WHERE bag_id = ? AND (state = 'running' OR "
                    f"(state = 'queued' AND {_SENT})) AND id > ? ORDER BY id LIMIT ?",
    "instances_of": f"SELECT {_INST_COLS} FROM instances WHERE job_id = ? ORDER BY id",
    "job_by_id": f"SELECT {_JOB_SHOWN} FROM jobs j WHERE id = ?",
    "story_instances": "SELECT i.id, i.host_id, h.name, h.pool, i.state, i.sent_at, i.instance_deadline, i.ended_at, "
                       "i.reason, i.exit_code, i.wall_s, i.cpu_s, i.replica, i.sent_event, i.end_event, "
                       "i.overdue_event FROM instances i LEFT JOIN hosts h ON h.id = i.host_id "
                       "WHERE i.job_id = ? ORDER BY i.id",
    "story_decisions": "SELECT event_id, bag_id, job_id, strategy, action, why FROM decisions "
                       "WHERE bag_id = ? AND job_id = ? ORDER BY id",
    "story_events": "SELECT event_id, at, kind, source FROM events WHERE event_id IN ("
                    "SELECT sent_event FROM instances WHERE job_id = ? UNION SELECT end_event FROM instances "
                    "WHERE job_id = ? UNION SELECT overdue_event FROM instances WHERE job_id = ? "
                    "UNION SELECT event_id FROM decisions WHERE bag_id = ? AND job_id = ?) ORDER BY event_id",
    "results": f"SELECT {', '.join('j.' + c.strip() for c in _JOB_COLS.split(','))}, "
               f"{', '.join('i.' + c.strip() for c in _INST_COLS.split(','))} FROM jobs j "
               "LEFT JOIN instances i ON i.id = COALESCE(j.result_instance, "
               "(SELECT id FROM instances WHERE job_id = j.id AND state != 'done' "
               "ORDER BY CASE WHEN state IN ('failed', 'overdue') THEN 0 ELSE 1 END, id DESC LIMIT 1)) "
               "WHERE j.bag_id = ? AND j.id > ? AND j.state IN ('done', 'failed') ORDER BY j.id LIMIT ?",
    "outputs_of": "SELECT instance_id, name, data FROM outputs WHERE instance_id = ?",
    "input_file": "SELECT data FROM bag_inputs WHERE bag_id = ? AND name = ?",
    "insert_pilot": "INSERT INTO pilots (pool, native_id, state, submitted_at, started_at, ended_at) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
    "update_pilot": "UPDATE pilots SET state = ?, started_at = ?, ended_at = ? WHERE pool = ? AND native_id = ? "
                    f"AND state IN ({_PILOT_LIVE})",
    "pilots": f"SELECT {_PILOT_COLS} FROM pilots ORDER BY id",
    "live_pilots": f"SELECT {_PILOT_COLS} FROM pilots WHERE state IN ({_PILOT_LIVE}) ORDER BY id",
    "spend_enrollment": "INSERT INTO enrollments (nonce, used, expires) VALUES (?, 1, ?) ON CONFLICT (nonce) "
                        "DO UPDATE SET used = enrollments.used + 1 WHERE enrollments.used < ?",
    "expired_enrollments": "DELETE FROM enrollments WHERE expires <= ?",
    "schema_version": "SELECT MAX(version) FROM gridbot_schema",
    "set_version": "INSERT INTO gridbot_schema (version) VALUES (?)",
}


class _Rows:
    """A batch's rows, as the statements take them (instances updated twice in one batch, e.g. overdue and
    then reported late, appear once, as their last update: it carries every column but the event that
    found it overdue, written apart in `overdue`). An event id of 0 (not known) is stored as NULL; `refs`
    counts the rows that cite each event, each once (an instance sent, found overdue or ended, a decision),
    the count each event is stored with."""

    def __init__(self, changes: Changes) -> None:
        self.new = [(n.instance_id, n.job_id, n.bag_id, n.host_id, n.sent_at, n.instance_deadline,
                     n.event_id or None, int(n.replica)) for n in changes.new_instances]
        self.ended: list[tuple[Any, ...]] = []
        self.marked: list[tuple[Any, ...]] = []
        self.overdue: list[tuple[Any, ...]] = []
        self.outputs: list[tuple[Any, ...]] = []
        self.votes = [(u.vote, u.instance_id) for u in changes.instances if u.vote is not None]
        updates = changes.instances
        if len({u.instance_id for u in updates}) != len(updates):
            last = {u.instance_id: u for u in updates}
            self.overdue = [(u.event_id, u.instance_id) for u in updates
                            if u.state is InstanceState.OVERDUE and u.event_id and last[u.instance_id] is not u]
            updates = list(last.values())
        for u in updates:
            r = u.report
            if r is None:  # an overdue instance has not ended: its event is the one that found it overdue
                found = u.state is InstanceState.OVERDUE
                self.marked.append((_NAMES[u.state], u.at, u.reason or None, None if found else u.event_id or None,
                                    u.event_id or None if found else None, u.instance_id))
                continue
            self.ended.append((_NAMES[u.state], u.at, u.reason or None, r.exit_code, r.wall_s, r.cpu_s,
                               r.stdout_tail, r.stderr_tail, u.event_id or None, u.instance_id))
            if r.outputs and u.state is InstanceState.DONE:
                self.outputs.extend((u.instance_id, k, v) for k, v in r.outputs.items())
        self.jobs = [(_NAMES[j.state], j.failures, j.attempts, j.reason or None, j.result_instance, j.job_id)
                     for j in changes.jobs.values() if not j.sent]
        self.decisions = [(d.event_id, d.bag_id, d.job_id, d.strategy, d.action, d.why) for d in changes.decisions]
        self.refs = Counter(n.event_id for n in changes.new_instances)
        self.refs.update(u.event_id for u in updates)
        self.refs.update(event_id for event_id, _ in self.overdue)
        self.refs.update(d.event_id for d in changes.decisions)
        del self.refs[0]
        self.retire_event = retiring_event(changes)

    def events(self, changes: Changes) -> list[tuple[Any, ...]]:
        """The batch's events that its rows cite, with how many do (`retire_event` counted by then)."""
        refs = self.refs
        return [(e.event_id, e.at, e.kind, e.source, refs[e.event_id]) for e in changes.events if refs[e.event_id]]


def _from_json(columns: str) -> str:
    """A row source over a JSON array of arrays bound as one parameter: `columns` name its positions."""
    names = [c.strip() for c in columns.split(",")]
    return "(SELECT " + ", ".join(f"json_extract(value, '$[{i}]') AS {n}" for i, n in enumerate(names)) + \
        " FROM json_each(?))"


SQLITE_BATCH = {
    "new_instance": "INSERT INTO instances (id, job_id, bag_id, host_id, state, sent_at, instance_deadline, "
                    "sent_event, replica) SELECT id, job, bag, host, 'running', sent, deadline, ev, rep FROM "
                    + _from_json("id, job, bag, host, sent, deadline, ev, rep"),
    "end_instance": "UPDATE instances SET state = u.s, ended_at = u.at, reason = u.r, exit_code = u.x, wall_s = u.w, "
                    "cpu_s = u.c, stdout_tail = u.o, stderr_tail = u.e, end_event = u.ev FROM "
                    + _from_json("s, at, r, x, w, c, o, e, ev, id") + " AS u WHERE instances.id = u.id",
    "mark_instance": "UPDATE instances SET state = u.s, ended_at = u.at, reason = u.r, "
                     "end_event = COALESCE(u.ev, instances.end_event), "
                     "overdue_event = COALESCE(u.ov, instances.overdue_event) FROM "
                     + _from_json("s, at, r, ev, ov, id") + " AS u WHERE instances.id = u.id",
    "note_overdue": "UPDATE instances SET overdue_event = u.ev FROM " + _from_json("ev, id")
                    + " AS u WHERE instances.id = u.id",
    "insert_event": "INSERT INTO events (event_id, at, kind, source, refs) SELECT id, at, k, s, n FROM "
                    + _from_json("id, at, k, s, n") + " WHERE true ON CONFLICT (event_id) DO NOTHING",
    "update_job": "UPDATE jobs SET state = u.s, failures = u.f, attempts = u.a, reason = COALESCE(u.r, jobs.reason), "
                  "result_instance = COALESCE(u.ri, jobs.result_instance) FROM "
                  + _from_json("s, f, a, r, ri, id") + " AS u WHERE jobs.id = u.id",
}
"""SQLite's statements for a whole batch at once: one call into SQLite per statement, which runs without
the interpreter lock, where `executemany` took the lock back for every row (issue 6)."""
_json = msgspec.json.Encoder()


def _from_json_rows(columns: str) -> str:
    """PostgreSQL's row source over a JSON array of arrays bound as one parameter, `name:type` a column."""
    pairs = [c.strip().split(":") for c in columns.split(",")]
    return ("(SELECT " + ", ".join(f"(v->>{i})::{t} AS {n}" for i, (n, t) in enumerate(pairs))
            + " FROM json_array_elements(%s::json) AS v) AS u")


PG_BATCH = {
    "new_instance": "INSERT INTO instances (id, job_id, bag_id, host_id, state, sent_at, instance_deadline, "
                    "sent_event, replica) SELECT id, job, bag, host, 'running', sent, deadline, ev, rep FROM "
                    + _from_json_rows("id:bigint, job:bigint, bag:bigint, host:text, sent:float8, deadline:float8, "
                                      "ev:bigint, rep:integer"),
    "end_instance": "UPDATE instances SET state = u.s, ended_at = u.at, reason = u.r, exit_code = u.x, wall_s = u.w, "
                    "cpu_s = u.c, stdout_tail = u.o, stderr_tail = u.e, end_event = u.ev FROM "
                    + _from_json_rows("s:text, at:float8, r:text, x:integer, w:float8, c:float8, o:text, e:text, "
                                   "ev:bigint, id:bigint") + " WHERE instances.id = u.id",
    "mark_instance": "UPDATE instances SET state = u.s, ended_at = u.at, reason = u.r, "
                     "end_event = COALESCE(u.ev, instances.end_event), "
                     "overdue_event = COALESCE(u.ov, instances.overdue_event) FROM "
                     + _from_json_rows("s:text, at:float8, r:text, ev:bigint, ov:bigint, id:bigint")
                     + " WHERE instances.id = u.id",
    "note_overdue": "UPDATE instances SET overdue_event = u.ev FROM " + _from_json_rows("ev:bigint, id:bigint")
                    + " WHERE instances.id = u.id",
    "insert_event": "INSERT INTO events (event_id, at, kind, source, refs) SELECT id, at, k, s, n FROM "
                    + _from_json_rows("id:bigint, at:float8, k:text, s:text, n:bigint")
                    + " ON CONFLICT (event_id) DO NOTHING",
    "update_job": "UPDATE jobs SET state = u.s, failures = u.f, attempts = u.a, reason = COALESCE(u.r, jobs.reason), "
                  "result_instance = COALESCE(u.ri, jobs.result_instance) FROM "
                  + _from_json_rows("s:text, f:integer, a:integer, r:text, ri:bigint, id:bigint")
                  + " WHERE jobs.id = u.id",
}
"""PostgreSQL's statements for a whole batch, its rows in one JSON parameter: the server runs one statement
where `executemany` had it execute one per row, and the rows are encoded in C (psycopg's array dumper
is Python code, and cost as much as it saved; issue 6)."""


class SqlStore(Store):
    """A store over a DB-API connection; subclasses set the dialect and the transaction boundaries."""

    placeholder = "?"
    types: ClassVar[dict[str, str]] = {}
    batch: ClassVar[dict[str, str]] = {}
    """The dialect's statements that take a whole batch's rows as one JSON parameter."""

    threaded_writes = True

    ids_go_back = False
    """Whether the database gives a new row the highest id + 1 (SQLite), which after a delete may be a deleted
    row's: bags and jobs then get ids above `id_floors` from here. PostgreSQL's sequences never go back."""

    def __init__(self, conn: Any, reader: Any = None) -> None:
        self.conn = conn
        self._mutex = threading.RLock()
        """One transaction at a time on the connection, whichever thread asks (the writer or the server's)."""
        self.reader = reader
        """A second connection for reads, or None: a read then need not wait for the batch the writer thread
        is committing (a feed or a listing waited for an fsync; issue 6). Reads see committed data only."""
        self._rmutex = threading.Lock()
        self._writing: int | None = None
        """The thread inside a write transaction: its reads go to the writing connection, to see its writes."""

    @contextlib.contextmanager
    def _read(self) -> Iterator[Any]:
        """A read transaction on the reader connection."""
        raise NotImplementedError

    def _reads_apart(self, write: bool) -> bool:
        return not write and self.reader is not None and self._writing != threading.get_ident()

    # -- dialect hooks --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _tx(self, write: bool = True) -> Iterator[Any]:
        """A transaction; `write=False` for reads, which need no write lock (and go to the reader).

        A lost connection, a locked or full database is StoreUnavailable (the caller may try again; the
        next transaction reconnects where the dialect can); any other error is the statement's own."""
        try:
            with (self._read() if self._reads_apart(write) else self._own_tx(write)) as cur:
                yield cur
        except Exception as e:
            if not self._unavailable(e):
                raise
            raise StoreUnavailable(f"the database is unavailable ({str(e).strip()[:300]})") from e

    def _unavailable(self, e: Exception) -> bool:
        """Whether the driver's error means "not now" (lost connection, locked, disk) rather than "never"."""
        return False

    def ping(self) -> None:
        with self._tx(write=False) as cur:
            cur.execute("SELECT 1")
            cur.fetchone()

    @contextlib.contextmanager
    def _own_tx(self, write: bool) -> Iterator[Any]:
        """A transaction on the writing connection."""
        raise NotImplementedError

    def _sql(self, name: str) -> str:
        return SQL[name] if self.placeholder == "?" else SQL[name].replace("?", self.placeholder)

    def _insert_jobs(self, cur: Any, bag_id: int, total: int, lines: Sequence[str] | None) -> None:
        cur.executemany(self._sql("insert_job"),
                        ((bag_id, i, lines[i] if lines is not None else None) for i in range(total)))

    def _execute_script(self, cur: Any, script: str) -> None:
        for statement in script.split(";"):
            if statement.strip():
                cur.execute(statement)

    # -- schema ---------------------------------------------------------------------------------------

    def migrate(self) -> None:
        with self._tx() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS gridbot_schema (version INTEGER NOT NULL)")
            self._lock_schema(cur)
            cur.execute(self._sql("schema_version"))
            current = cur.fetchone()[0] or 0
            if current > LATEST:
                raise StoreError(f"the database has schema version {current}, newer than this gridbot knows "
                                 f"({LATEST}): upgrade gridbot, or point --db at another database")
            for version, script in MIGRATIONS:
                if version > current:
                    self._execute_script(cur, script.format(**self.types))
                    cur.execute(self._sql("set_version"), (version,))

    def _lock_schema(self, cur: Any) -> None:
        """Keep two processes from migrating at once (SQLite's BEGIN IMMEDIATE already does)."""

    # -- bags -----------------------------------------------------------------------------------------

    def create_bag(self, spec: BagSpec, lines: Sequence[str] | None, inputs: dict[str, bytes], now: float,
                   owner: str = "") -> BagRow:
        total = len(lines) if lines is not None else spec.sweep_size
        digest = spec_hash(spec, lines, inputs)
        with self._tx() as cur:
            cur.execute(self._sql("bag_by_name"), (spec.name,))
            if cur.fetchone() is not None:
                raise BagExists(f"a bag named '{spec.name}' exists already")
            values = (spec.name, msgspec.json.encode(spec), digest, total, total, now, owner)
            above = self._id_above_deleted(cur, "bags")
            if above is not None:
                cur.execute(self._sql("insert_bag_at"), (above, *values))
            else:
                cur.execute(self._sql("insert_bag"), values)
            bag_id = cur.fetchone()[0]
            self._insert_jobs(cur, bag_id, total, lines)
            if inputs:
                cur.executemany(self._sql("insert_input"), [(bag_id, k, v) for k, v in inputs.items()])
        row = self.bag(bag_id)
        assert row is not None
        return row

    def set_spec(self, bag_id: int, spec: BagSpec) -> None:
        with self._tx() as cur:
            cur.execute(self._sql("set_spec"), (msgspec.json.encode(spec), bag_id))

    def revise(self, bag_id: int, spec: BagSpec, lines: Sequence[str] | None, inputs: dict[str, bytes],
               now: float) -> BagRow:
        with self._tx() as cur:
            cur.execute(self._sql("keep_revision"), (now, bag_id))
            cur.execute(self._sql("revise_bag"), (msgspec.json.encode(spec), spec_hash(spec, lines, inputs), bag_id))
            cur.execute(self._sql("delete_inputs"), (bag_id,))
            if inputs:
                cur.executemany(self._sql("insert_input"), [(bag_id, k, v) for k, v in inputs.items()])
            cur.execute(self._sql("bag_by_id"), (bag_id,))
            row = _bag(cur.fetchone())
            cur.execute(self._sql("revise_jobs"), (row.revision, bag_id))
            if lines is not None:
                cur.execute(self._sql("open_jobs"), (bag_id,))
                changed = [(lines[idx], job_id) for job_id, idx in cur.fetchall()]
                if changed:
                    self._write_many(cur, "set_line", changed)
        return row

    def revisions(self, bag_id: int) -> dict[int, BagSpec]:
        with self._tx(write=False) as cur:
            cur.execute(self._sql("revisions"), (bag_id,))
            return {r[0]: msgspec.json.decode(bytes(r[1]), type=BagSpec) for r in cur.fetchall()}

    def _id_above_deleted(self, cur: Any, table: str) -> int | None:
        """The id the next row of `table` (bags or jobs) must be given where the database's own choice (the
        highest id + 1, `ids_go_back`) would be one a deleted bag had (`id_floors`); None where it is new. Only
        the first row of a batch needs it: the next ones follow it. (Giving every row its id made SQLite look
        each one up: a sweep went in 8% slower.)"""
        if not self.ids_go_back:
            return None
        cur.execute(f"SELECT COALESCE(MAX(id), 0) FROM {table}")
        top = cur.fetchone()[0]
        cur.execute(self._sql("id_floor"), (table,))
        floor = cur.fetchone()
        return floor[0] + 1 if floor is not None and floor[0] > top else None

    def delete_bag(self, bag_id: int) -> None:
        with self._tx() as cur:
            cur.execute(self._sql("bag_top_ids"), (bag_id, bag_id))
            jobs_top, instances_top = cur.fetchone()
            for name, top in (("bags", bag_id), ("jobs", jobs_top), ("instances", instances_top)):
                if top is not None:
                    cur.execute(self._sql("raise_floor"), (top, name, top))
            # the bag's rows take back their citations of events (while they are there to say which)
            cur.execute(self._sql("release_events"), (bag_id, bag_id))
            cur.execute(self._sql("prune_events"))
            for name in ("delete_outputs", "delete_instances", "delete_decisions", "delete_jobs", "delete_inputs",
                         "delete_revisions", "delete_bag"):
                cur.execute(self._sql(name), (bag_id,))

    def mark_downloaded(self, bag_id: int, now: float) -> None:
        with self._tx() as cur:
            cur.execute(self._sql("mark_downloaded"), (now, bag_id))

    def bag(self, ref: str | int) -> BagRow | None:
        with self._tx(write=False) as cur:
            if isinstance(ref, int) or ref.isdigit():
                cur.execute(self._sql("bag_by_id"), (int(ref),))
            else:
                cur.execute(self._sql("bag_by_name"), (ref,))
            row = cur.fetchone()
        return _bag(row) if row else None

    def bags(self) -> list[BagRow]:
        with self._tx(write=False) as cur:
            cur.execute(self._sql("bags"))
            return [_bag(r) for r in cur.fetchall()]

    # -- the dispatcher's view ------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        with self._tx(write=False) as cur:
            cur.execute(self._sql("bags"))
            bags = [_bag(r) for r in cur.fetchall()]
            cur.execute(self._sql("live_instances"))
            live = [LiveInstance(r[0], r[1], r[2], r[3], InstanceState(r[4]), r[5], r[6], r[7], r[8], JobState(r[9]),
                                 r[10], r[11]) for r in cur.fetchall()]
            cur.execute(self._sql("votes"))
            votes = [VoteRow(int(r[0]), int(r[1]), int(r[2]), r[3], float(r[4]), float(r[5]), float(r[6] or 0.0),
                             bytes(r[7]), int(r[8]), r[9], JobState(r[10]), int(r[11]), int(r[12]))
                     for r in cur.fetchall()]
            cur.execute(self._sql("max_instance"))
            next_id = cur.fetchone()[0] + 1
            cur.execute(self._sql("max_event"))
            next_event = cur.fetchone()[0] + 1
            hosts = self._hosts(cur)
            cur.execute(self._sql("usage"))
            usage = [Usage(int(r[0]), r[1], int(r[2]), float(r[3]), float(r[4] or 0.0)) for r in cur.fetchall()]
            active = [BagSnapshot(b.bag_id, b.spec, b.counts, b.created_at, b.revision) for b in bags
                      if b.state is BagState.ACTIVE]
            history: list[EndedRow] = []
            for b in active:  # (a bag's jobs have consecutive ids: the instances' job index finds its instances)
                cur.execute(self._sql("job_span"), (b.bag_id,))
                first, last = cur.fetchone()
                if first is None:
                    continue
                cur.execute(self._sql("history"), (first, last, HISTORY_ROWS))
                history.extend(reversed([EndedRow(int(r[0]), int(r[1]), float(r[2]),
                                                  None if r[3] is None else float(r[3]), InstanceState(r[4]), r[5])
                                         for r in cur.fetchall()]))
        return Snapshot(active, live, hosts, next_id, next_event, usage, history, votes)

    def queued_jobs(self, bag_id: int, after: int, limit: int) -> list[QueuedJob]:
        with self._tx(write=False) as cur:
            cur.execute(self._sql("queued_jobs"), (bag_id, after, limit))
            return [QueuedJob(r[0], r[1], r[2], r[3], r[4]) for r in cur.fetchall()]

    def apply(self, changes: Changes) -> None:
        if not changes:
            return
        rows = _Rows(changes)
        with self._tx() as cur:
            self._write(cur, "new_instance", rows.new)
            self._write(cur, "end_instance", rows.ended)
            self._write(cur, "mark_instance", rows.marked)
            self._write(cur, "note_overdue", rows.overdue)
            if rows.outputs:
                self._write_many(cur, "insert_output", rows.outputs)
            if rows.votes:
                self._write_many(cur, "set_vote", rows.votes)
            for bag_id in changes.cancelled_bags:
                cur.execute(self._sql("cancel_queued"), (bag_id,))
            self._write(cur, "update_job", rows.jobs)
            for bag_id in changes.reopened_bags:  # before the bag's update, which may end it again
                cur.execute(self._sql("reopen_bag"), (bag_id,))
            for job_id in dict.fromkeys(changes.retired_jobs):
                cur.execute(self._sql("retire_overdue"), (RETIRED, rows.retire_event, job_id))
                if rows.retire_event is not None:
                    rows.refs[rows.retire_event] += max(0, cur.rowcount)
                cur.execute(self._sql("forget_votes"), (job_id,))
            if rows.decisions:
                self._write_many(cur, "insert_decision", rows.decisions)
            self._write(cur, "insert_event", rows.events(changes))
            self._write_rest(cur, changes)

    def _write(self, cur: Any, name: str, rows: list[tuple[Any, ...]]) -> None:
        """Run statement `name` over `rows` (tuples in the order of its placeholders): as one statement over
        all of them where the dialect has one (`batch`), else row by row."""
        if len(rows) > 1 and name in self.batch:
            cur.execute(self.batch[name], (self._json_rows(rows),))
        elif rows:
            self._write_many(cur, name, rows)

    def _write_many(self, cur: Any, name: str, rows: list[tuple[Any, ...]]) -> None:
        """Run statement `name` once per row."""
        if any("\x00" in v for r in rows for v in r if isinstance(v, str)):
            rows = _no_nul(rows)
        cur.executemany(self._sql(name), rows)

    def _json_rows(self, rows: list[tuple[Any, ...]]) -> str:
        """`rows` as one JSON parameter of the batch statements."""
        text = _json.encode(rows).decode()
        return text if "\\u0000" not in text else _json.encode(_no_nul(rows)).decode()

    def _write_rest(self, cur: Any, changes: Changes) -> None:
        """Bags and hosts: a few rows per batch."""
        if changes.bags:
            cur.executemany(self._sql("update_bag"), [
                (_NAMES[b.state], b.counts.queued, b.counts.running, b.counts.done, b.counts.failed,
                 b.counts.cancelled, b.counts.instances, b.counts.wasted, b.counts.overdue, b.counts.reruns,
                 b.counts.replicas, b.finished_at,
                 b.bag_id) for b in changes.bags.values()])
        if changes.hosts:
            self._write_many(cur, "upsert_host", [
                (h.info.host_id, h.info.name, h.info.platform, h.info.ncpus, h.info.memory_mb, h.info.slots,
                 h.info.pool, h.first_seen, h.last_seen, h.stats.done, h.stats.failed, _stats_enc.encode(h.stats),
                 h.info.account) for h in changes.hosts.values()])

    # -- listings -------------------------------------------------------------------------------------

    def jobs(self, bag_id: int, state: JobState | None = None, limit: int = 1000, after: int = 0) -> list[JobRow]:
        with self._tx(write=False) as cur:
            if state is None:
                cur.execute(self._sql("jobs"), (bag_id, after, limit))
            elif state in (JobState.QUEUED, JobState.RUNNING):
                cur.execute(self._sql(f"jobs_{state.value}"), (bag_id, after, limit))
            else:
                cur.execute(self._sql("jobs_in_state"), (bag_id, state.value, after, limit))
            return [_job(r) for r in cur.fetchall()]

    def instances_of(self, job_id: int) -> list[InstanceRow]:
        with self._tx(write=False) as cur:
            cur.execute(self._sql("instances_of"), (job_id,))
            return [_instance(r) for r in cur.fetchall()]

    def outputs_of(self, instance_id: int) -> dict[str, bytes]:
        with self._tx(write=False) as cur:
            cur.execute(self._sql("instance_outputs"), (instance_id,))
            return {r[0]: bytes(r[1]) for r in cur.fetchall()}

    def story(self, job_id: int) -> JobStoryRow | None:
        with self._tx(write=False) as cur:
            cur.execute(self._sql("job_by_id"), (job_id,))
            row = cur.fetchone()
            if row is None:
                return None
            job = _job(row)
            cur.execute(self._sql("story_instances"), (job_id,))
            instances = [StoryInstanceRow(r[0], r[1], r[2], r[3], InstanceState(r[4]), r[5], r[6], r[7], r[8], r[9],
                                          r[10], r[11], bool(r[12]), r[13], r[14], r[15]) for r in cur.fetchall()]
            cur.execute(self._sql("story_decisions"), (job.bag_id, job_id))
            decisions = [Decision(*r) for r in cur.fetchall()]
            cur.execute(self._sql("story_events"), (job_id, job_id, job_id, job.bag_id, job_id))
            events = [Event(*r) for r in cur.fetchall()]
        return JobStoryRow(job, instances, decisions, events)

    def results(self, bag_id: int, after: int = 0, limit: int = 500) -> list[ResultRow]:
        out = []
        with self._tx(write=False) as cur:
            cur.execute(self._sql("results"), (bag_id, after, limit))
            rows = cur.fetchall()
            for r in rows:
                job = _job(r[:10])
                inst = _instance(r[10:]) if r[10] is not None else None
                files: dict[str, bytes] = {}
                if inst is not None and job.state is JobState.DONE:
                    cur.execute(self._sql("outputs_of"), (inst.instance_id,))
                    files = {name: bytes(data) for _, name, data in cur.fetchall()}
                out.append(ResultRow(job, inst, files))
        return out

    def input_file(self, bag_id: int, name: str) -> bytes | None:
        with self._tx(write=False) as cur:
            cur.execute(self._sql("input_file"), (bag_id, name))
            row = cur.fetchone()
        return bytes(row[0]) if row else None

    def hosts(self) -> list[HostSnapshot]:
        with self._tx(write=False) as cur:
            return self._hosts(cur)

    def _hosts(self, cur: Any) -> list[HostSnapshot]:
        cur.execute(self._sql("hosts"))
        return [HostSnapshot(HostInfo(r[0], r[1], r[2], r[3], r[4], r[5], r[6], account=r[10] or ""), r[7], r[8],
                             _stats_dec.decode(bytes(r[9])) if r[9] is not None else HostStats())
                for r in cur.fetchall()]

    # -- the overlay's pilots -------------------------------------------------------------------------

    def save_pilots(self, new: Sequence[PilotRow], changed: Sequence[PilotRow]) -> None:
        if not new and not changed:
            return
        with self._tx() as cur:
            if new:
                self._write_many(cur, "insert_pilot", [(p.pool, p.native_id, p.state.value, p.submitted_at,
                                                        p.started_at, p.ended_at) for p in new])
            if changed:
                self._write_many(cur, "update_pilot", [(p.state.value, p.started_at, p.ended_at, p.pool,
                                                        p.native_id) for p in changed])

    def pilots(self, live: bool = False) -> list[PilotRow]:
        with self._tx(write=False) as cur:
            cur.execute(self._sql("live_pilots" if live else "pilots"))
            return [PilotRow(r[0], r[1], PilotState(r[2]), r[3], r[4], r[5]) for r in cur.fetchall()]

    def spend_enrollment(self, nonce: str, uses: int, expires: float, now: float) -> bool:
        with self._tx() as cur:
            cur.execute(self._sql("expired_enrollments"), (now,))
            cur.execute(self._sql("spend_enrollment"), (nonce, expires, uses))
            return bool(cur.rowcount == 1)


_NAMES: dict[object, str] = {s: s.value for e in (InstanceState, JobState, BagState) for s in e}
"""States as the store writes them (an enum's .value is a property call, on every row)."""
_stats_enc = msgspec.json.Encoder()
_stats_dec = msgspec.json.Decoder(HostStats)


def _bag(r: Sequence[Any]) -> BagRow:
    counts = BagCounts(r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12], r[13], r[14])
    return BagRow(r[0], r[1], msgspec.json.decode(bytes(r[2]), type=BagSpec), r[3], BagState(r[4]), counts, r[15],
                  r[16], r[17], r[18], r[19], r[20])


def _job(r: Sequence[Any]) -> JobRow:
    return JobRow(r[0], r[1], r[2], r[3], JobState(r[4]), r[5], r[6], r[7], r[8], r[9])


def _instance(r: Sequence[Any]) -> InstanceRow:
    return InstanceRow(r[0], r[1], r[2], InstanceState(r[3]), r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11])


class SQLiteStore(SqlStore):
    """The embedded default: one file, WAL journal, one writer (the server)."""

    types: ClassVar[dict[str, str]] = {"id": "INTEGER PRIMARY KEY", "blob": "BLOB", "real": "REAL"}
    batch: ClassVar[dict[str, str]] = SQLITE_BATCH
    ids_go_back = True

    def _unavailable(self, e: Exception) -> bool:
        text = str(e).lower()
        return isinstance(e, sqlite3.OperationalError) and any(
            w in text for w in ("locked", "busy", "disk", "i/o", "unable to open", "full", "readonly"))

    def __init__(self, path: str | Path, synchronous: str = "FULL") -> None:
        if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA", "OFF"):
            raise StoreError(f"synchronous={synchronous!r} is not a SQLite mode; use FULL, NORMAL, EXTRA or OFF")
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
            conn.execute("PRAGMA journal_mode=WAL")
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"cannot open the SQLite database {path}: {e}; check the path and its permissions") from e
        conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
        conn.execute("PRAGMA foreign_keys=ON")
        # WAL lets this connection read the last commit while the writer's transaction is open
        reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        reader.execute("PRAGMA query_only=ON")
        super().__init__(conn, reader)
        self.path = path
        self._depth = 0
        self._lock: Any = None

    def _insert_jobs(self, cur: Any, bag_id: int, total: int, lines: Sequence[str] | None) -> None:
        start = 0
        first = self._id_above_deleted(cur, "jobs")
        if first is not None and total:  # the first job takes it, the others follow (the highest id + 1)
            cur.execute("INSERT INTO jobs (id, bag_id, idx, line) VALUES (?, ?, 0, ?)",
                        (first, bag_id, lines[0] if lines is not None else None))
            start = 1
        if lines is not None:
            cur.executemany(self._sql("insert_job"), ((bag_id, i, lines[i]) for i in range(start, total)))
            return
        # a sweep's jobs are only their indices: SQLite counts them out itself, 2.5x faster than binding
        # ten million rows from Python (issue 6); ids ascend with the index, as the feeder reads them
        cur.execute("WITH RECURSIVE n(i) AS (SELECT ? WHERE ? < ? UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?) "
                    "INSERT INTO jobs (bag_id, idx) SELECT ?, i FROM n", (start, start, total, total, bag_id))

    def claim(self) -> None:
        lock = open(f"{self.path}.lock", "w")  # noqa: SIM115 - held open as the claim
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise StoreError(f"another gridbot server (or `gridbot run`) is using {self.path}; stop it, or point "
                             "--db at another database") from None
        self._lock = lock

    @contextlib.contextmanager
    def _own_tx(self, write: bool) -> Iterator[Any]:
        with self._mutex:
            if self._depth:
                yield self.conn.cursor()
                return
            cur = self.conn.cursor()
            cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            self._depth += 1
            self._writing = threading.get_ident()
            try:
                yield cur
            except BaseException:
                self.conn.rollback()
                raise
            else:
                self.conn.commit()
            finally:
                self._depth -= 1
                self._writing = None

    @contextlib.contextmanager
    def _read(self) -> Iterator[Any]:
        with self._rmutex:
            cur = self.reader.cursor()
            cur.execute("BEGIN")
            try:
                yield cur
            finally:
                self.reader.rollback()

    def close(self) -> None:
        with self._rmutex:
            self.reader.close()
        with self._mutex:
            self.conn.close()
        if self._lock is not None:
            self._lock.close()
            self._lock = None


LIVENESS: dict[str, int] = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
                            "tcp_user_timeout": 30_000}
"""libpq options every connection gets unless its URL (or a service file it names) sets its own. A database cut
off by the network without a reset (a partition, a failover that moved its address, a host gone) otherwise left
a statement waiting until TCP gave up, about 15 minutes of retransmissions, and the event loop's reads with it:
now a connection is given up 30 s after the database last answered (`tcp_user_timeout`, in ms, which also
bounds the keepalive probes sent after 10 s idle), and the server answers 503 and reconnects. The writing
connection waits `WRITER_USER_TIMEOUT` instead: Linux also gives a connection up when the database has not read
what was sent for that long (a zero window), which a COPY of a big bag meets behind a slow disk. Only
`connect_timeout` applies to a Unix socket."""
WRITER_USER_TIMEOUT = 120_000
_CLAIM_HOLDER = ("FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
                 "AND l.classid = 0 AND l.objid = 7715371 AND l.objsubid = 1 AND l.database = "
                 "(SELECT oid FROM pg_database WHERE datname = current_database())")
"""The backend holding a database's claim (pg_try_advisory_lock(7715371)), with `a` its pg_stat_activity row."""


class PostgresStore(SqlStore):
    """Shared deployments: PostgreSQL through psycopg 3, jobs loaded with COPY."""

    placeholder = "%s"
    types: ClassVar[dict[str, str]] = {"id": "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY", "blob": "BYTEA",
             "real": "DOUBLE PRECISION"}
    batch: ClassVar[dict[str, str]] = PG_BATCH

    def __init__(self, url: str) -> None:
        import psycopg

        self.url = url
        self._options = _options_unless_given(url)
        self._writer_options = {**self._options, "tcp_user_timeout": WRITER_USER_TIMEOUT} \
            if "tcp_user_timeout" in self._options else self._options
        self._transient = (psycopg.OperationalError, psycopg.InterfaceError)
        self.tag = f"gridbot server {uuid.uuid4().hex[:12]}"
        """The connections' application_name: whose backend holds the claim, seen in pg_stat_activity."""
        self._lost_hooks: list[Callable[[ClaimLost], None]] = []
        self._closed = False
        conn = self._connect("cannot connect to PostgreSQL at {url}: {e}; check that the server runs and the URL "
                             "names an existing database", StoreError, writer=True)
        try:
            reader = self._connect("cannot open a second connection to PostgreSQL at {url}: {e}; the server takes "
                                   "two (check max_connections)", StoreError)
        except StoreError:
            conn.close()
            raise
        super().__init__(conn, reader)
        self._claimed = False

    def _connect(self, message: str, error: type[StoreError] = StoreUnavailable, writer: bool = False) -> Any:
        """A connection; at start a failure is the user's to fix (StoreError), later one to wait out."""
        import psycopg

        options = self._writer_options if writer else self._options
        try:
            return psycopg.connect(self.url, autocommit=True, application_name=self.tag, **options)
        except psycopg.Error as e:
            raise error(message.format(url=_redact(self.url), e=str(e).strip())) from e

    def _unavailable(self, e: Exception) -> bool:
        return isinstance(e, self._transient)

    def _writer(self) -> Any:
        """The writing connection, opened again if it was lost or left unfit (its claim on the database
        taken again)."""
        if not _fit(self.conn):
            if self._closed:  # its claim was let go: no write may follow, here or on a new connection
                raise StoreUnavailable("the store is closed (the server is stopping)")
            _close_quietly(self.conn)
            conn = self._connect("lost the connection to PostgreSQL at {url} and cannot reconnect: {e}", writer=True)
            try:
                if self._claimed:  # the claim went with the old connection: take it again before any write
                    self._reclaim(conn)
            except BaseException:
                _close_quietly(conn)
                raise
            self.conn = conn
        return self.conn

    def _reclaim(self, conn: Any) -> None:
        """Take the claim on the database again on a new connection, after the old one was lost.

        The old backend lets go of the claim only once it has exited, some milliseconds after the connection
        was lost: until then this is a wait (StoreUnavailable, the next write tries again). If another
        server's connection holds it, that server took the database in the meantime and is its writer now:
        ClaimLost, and this server stops (it used to answer 503 to every write for good while it went on
        serving reads). Whose it is, is told by the holder's application_name (`tag`)."""
        with conn.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(7715371)")
            if cur.fetchone()[0]:
                return
            holder = _claim_holder(cur)
        if holder is None or holder[0] == self.tag:
            if holder is not None:
                self._end_orphan(conn)
            raise StoreUnavailable("reconnected to PostgreSQL; this server's old connection still holds its claim "
                                   "on the database until its backend has exited")
        lost = ClaimLost(f"another gridbot server ({_describe_holder(holder)}) took the database while this server's "
                         "connection to it was lost: this server is no longer its writer and stops; its workers and "
                         "clients go on with the other one (point them at it), or stop that one and start this one "
                         "again")
        for hook in self._lost_hooks:
            hook(lost)
        raise lost

    def _end_orphan(self, conn: Any) -> None:
        """Terminate this server's old writing backend, which still holds the claim.

        Its connection was dropped here, so nothing of this server uses it any more. A backend whose client was
        cut off by the network (no reset reached it) waits for a statement until its own keepalives give up,
        two hours by default: the claim, and every write, waited with it. The holder is found again in the same
        statement (a backend already exiting may be gone, and its pid reused, since the look that found it). A
        backend of another role is left to exit by itself (terminating it needs pg_signal_backend)."""
        import psycopg

        with contextlib.suppress(psycopg.Error), conn.cursor() as cur:
            cur.execute(f"SELECT pg_terminate_backend(a.pid) {_CLAIM_HOLDER} AND a.application_name = %s "
                        "AND a.pid <> pg_backend_pid()", (self.tag,))

    def on_lost(self, hook: Callable[[ClaimLost], None]) -> None:
        self._lost_hooks.append(hook)

    def hold_claim(self) -> None:
        """An idle connection whose backend was terminated learns of it only when used: one `SELECT 1` a tick
        on the writing connection finds it, and `_writer` takes the claim again on a new one. Skipped while a
        write is in progress (the write's transaction finds a lost connection itself)."""
        if not self._claimed or not self._mutex.acquire(blocking=False):
            return
        try:
            if self._closed:
                return
            conn = self._writer()
            try:
                conn.execute("SELECT 1")
            except self._transient as e:
                _drop_if_unsound(conn, e)
                self._writer()
        finally:
            self._mutex.release()

    @contextlib.contextmanager
    def _own_tx(self, write: bool) -> Iterator[Any]:
        with self._mutex:
            nested = self._writing == threading.get_ident()  # a savepoint in this thread's transaction
            conn = self.conn if nested else self._writer()
            try:
                with conn.transaction(), conn.cursor() as cur:
                    previous, self._writing = self._writing, threading.get_ident()
                    try:
                        yield cur
                    finally:
                        self._writing = previous
            except self._transient as e:
                if not nested:  # (the outermost transaction judges the connection, once it has ended)
                    _drop_if_unsound(conn, e)
                raise

    @contextlib.contextmanager
    def _read(self) -> Iterator[Any]:
        with self._rmutex:
            if not _fit(self.reader):
                _close_quietly(self.reader)
                self.reader = self._connect("lost the reading connection to PostgreSQL at {url}: {e}")
            conn = self.reader
            try:
                with conn.transaction(), conn.cursor() as cur:
                    yield cur
            except self._transient as e:
                _drop_if_unsound(conn, e)
                raise

    def _lock_schema(self, cur: Any) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(7715370)")

    def claim(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(7715371)")
            if not cur.fetchone()[0]:
                holder = _claim_holder(cur)
                who = ""
                if holder is not None:
                    since = holder[3]
                    who = (f" ({_describe_holder(holder)}"
                           f"{f', in its state since {since:%Y-%m-%d %H:%M:%S %Z}' if since is not None else ''})")
                raise StoreError(f"another gridbot server is using this PostgreSQL database{who}; stop it, or point "
                                 "--db at another database. If that server is gone (its host lost, or cut off by the "
                                 "network), its backend may wait hours for PostgreSQL's keepalives: end it with "
                                 f"SELECT pg_terminate_backend({holder[1] if holder is not None else 'PID'})")
        self._claimed = True

    def _execute_script(self, cur: Any, script: str) -> None:
        cur.execute(script)

    def _insert_jobs(self, cur: Any, bag_id: int, total: int, lines: Sequence[str] | None) -> None:
        with cur.copy("COPY jobs (bag_id, idx, line) FROM STDIN") as copy:
            for i in range(total):
                copy.write_row((bag_id, i, lines[i] if lines is not None else None))

    def close(self) -> None:
        # release the claim now: a closed connection's backend lets go of its locks only when it has
        # finished exiting, so another server opening the database right after could find it still held
        with self._mutex:
            self._claimed, self._closed = False, True  # a `hold_claim` queued behind this takes nothing back
            with contextlib.suppress(Exception):
                self.conn.rollback()
                self.conn.execute("SELECT pg_advisory_unlock_all()")
                self.conn.commit()
            self.conn.close()
        with self._rmutex:
            self.reader.close()


def _drop_if_unsound(conn: Any, e: Exception) -> None:
    """Close a PostgreSQL connection that a lost-connection error may have left unfit for the next
    transaction, so that the next one opens a new connection.

    psycopg marks a connection broken only when libpq has seen the socket close. When the server's
    "terminating connection" arrives as a result in the middle of a pipeline (`executemany`), the driver
    can fail to leave pipeline mode and keep the connection, not broken, in pipeline mode: every later
    statement then fails with "PQsendQuery not allowed in pipeline mode" and the server never recovered.
    A connection is kept only when the error was the server's answer to a statement and the connection
    is idle and out of pipeline mode again."""
    sqlstate = getattr(e, "sqlstate", None)
    if sqlstate is None or sqlstate[:2] in ("08", "57", "58") or not _fit(conn):
        _close_quietly(conn)


def _fit(conn: Any) -> bool:
    """Whether a PostgreSQL connection can start a transaction: open, not broken, idle, out of pipeline mode
    (a connection an error of another kind than `_drop_if_unsound` sees may have been left otherwise, and
    a transaction begun on one still in a transaction would be a savepoint, never committed)."""
    import psycopg

    return (not conn.closed and not conn.broken and conn.pgconn.pipeline_status == psycopg.pq.PipelineStatus.OFF
            and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)


def _close_quietly(conn: Any) -> None:
    with contextlib.suppress(Exception):
        conn.close()


def _no_nul(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """A NUL character, which a job's output tail (or a worker's report) may carry, becomes U+FFFD, the
    replacement character: PostgreSQL's text cannot hold one (the batch failed again at every retry) and
    SQLite's JSON functions cut a string at one (a tail lost what followed)."""
    return [tuple(v.replace("\x00", "\ufffd") if isinstance(v, str) else v for v in r) for r in rows]


def _claim_holder(cur: Any) -> tuple[Any, ...] | None:
    """The backend holding the database's claim: (application_name, pid, client_addr, state_change), or None."""
    cur.execute(f"SELECT a.application_name, a.pid, a.client_addr, a.state_change {_CLAIM_HOLDER}")
    row: tuple[Any, ...] | None = cur.fetchone()
    return row


def _describe_holder(holder: tuple[Any, ...]) -> str:
    """Whose the claim is, for people: its application_name (a server's `tag`), its backend and where from."""
    name, pid, addr = holder[:3]
    return f"{name or 'no application_name'}, PostgreSQL backend {pid}{f' from {addr}' if addr else ''}"


def _options_unless_given(url: str) -> dict[str, Any]:
    """The `LIVENESS` options the URL (or PGCONNECT_TIMEOUT) does not set itself: the user's own values win. A
    URL that names a service (or PGSERVICE) gets none: its file's settings would be overridden unread."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        given = set(conninfo_to_dict(url))
    except psycopg.Error:  # the connection's own error says what is wrong with the URL
        given = set()
    if "service" in given or os.environ.get("PGSERVICE"):
        return {}
    if os.environ.get("PGCONNECT_TIMEOUT"):
        given.add("connect_timeout")
    return {k: v for k, v in LIVENESS.items() if k not in given}


def _redact(url: str) -> str:
    if "@" in url and ":" in url.split("@", 1)[0].split("//", 1)[-1]:
        scheme, rest = url.split("//", 1)
        user = rest.split(":", 1)[0]
        return f"{scheme}//{user}:***@{rest.split('@', 1)[1]}"
    return url


def open_store(url: str) -> Store:
    """The store a URL names: `memory://`, `sqlite:///relative.db`, `sqlite:////abs.db` (`?synchronous=NORMAL`),
    `postgresql://user@host/db`, or a plain path to a SQLite file."""
    from gridbot.store.memory import MemoryStore

    store: Store
    if url == "memory://":
        store = MemoryStore()
    elif url.startswith(("postgresql://", "postgres://")):
        store = PostgresStore(url)
    elif url.startswith("sqlite://"):
        rest = url.removeprefix("sqlite://")
        path, _, query = rest.partition("?")
        if not path.startswith("/") or path == "/":
            raise StoreError(f"bad SQLite URL {url!r}: write sqlite:///relative/path.db or sqlite:////absolute.db")
        options = dict(kv.partition("=")[::2] for kv in query.split("&") if kv)
        unknown = set(options) - {"synchronous"}
        if unknown:
            raise StoreError(f"unknown SQLite URL option {sorted(unknown)[0]!r}; the only one is synchronous")
        store = SQLiteStore(path[1:], options.get("synchronous", "FULL"))
    elif "://" not in url:
        store = SQLiteStore(url)
    else:
        raise StoreError(f"unknown database URL {url!r}: use sqlite:///path.db, postgresql://... or memory://")
    store.migrate()
    return store
