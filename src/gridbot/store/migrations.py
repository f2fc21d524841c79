"""Versioned schema migrations, written once for both SQL dialects.

`{id}` is an auto-assigned 64-bit primary key, `{blob}` binary data and `{real}` a double. Append new
versions at the end; never edit one that has shipped.
"""

from __future__ import annotations

MIGRATIONS: list[tuple[int, str]] = [
    (
        1,
        """
CREATE TABLE bags (
    id {id},
    name TEXT NOT NULL UNIQUE,
    spec {blob} NOT NULL,
    spec_hash TEXT NOT NULL,
    state TEXT NOT NULL,
    total BIGINT NOT NULL,
    queued BIGINT NOT NULL DEFAULT 0,
    running BIGINT NOT NULL DEFAULT 0,
    done BIGINT NOT NULL DEFAULT 0,
    failed BIGINT NOT NULL DEFAULT 0,
    cancelled BIGINT NOT NULL DEFAULT 0,
    instances BIGINT NOT NULL DEFAULT 0,
    wasted BIGINT NOT NULL DEFAULT 0,
    overdue BIGINT NOT NULL DEFAULT 0,
    reruns BIGINT NOT NULL DEFAULT 0,
    created_at {real} NOT NULL,
    finished_at {real}
);
CREATE TABLE bag_inputs (
    bag_id BIGINT NOT NULL REFERENCES bags(id),
    name TEXT NOT NULL,
    data {blob} NOT NULL,
    PRIMARY KEY (bag_id, name)
);
CREATE TABLE jobs (
    id {id},
    bag_id BIGINT NOT NULL REFERENCES bags(id),
    idx BIGINT NOT NULL,
    line TEXT,
    state TEXT NOT NULL DEFAULT 'queued',
    failures INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    reason TEXT,
    result_instance BIGINT
);
CREATE INDEX jobs_by_bag_state ON jobs (bag_id, state, id);
CREATE TABLE instances (
    id BIGINT PRIMARY KEY,
    job_id BIGINT NOT NULL REFERENCES jobs(id),
    bag_id BIGINT NOT NULL REFERENCES bags(id),
    host_id TEXT NOT NULL,
    state TEXT NOT NULL,
    sent_at {real} NOT NULL,
    instance_deadline {real} NOT NULL,
    ended_at {real},
    reason TEXT,
    exit_code INTEGER,
    wall_s {real},
    cpu_s {real},
    stdout_tail TEXT,
    stderr_tail TEXT
);
CREATE INDEX instances_by_job ON instances (job_id);
CREATE INDEX instances_live ON instances (bag_id) WHERE state IN ('running', 'overdue');
CREATE TABLE outputs (
    instance_id BIGINT NOT NULL REFERENCES instances(id),
    name TEXT NOT NULL,
    data {blob} NOT NULL,
    PRIMARY KEY (instance_id, name)
);
CREATE TABLE hosts (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    platform TEXT NOT NULL,
    ncpus INTEGER NOT NULL,
    memory_mb BIGINT NOT NULL,
    slots INTEGER NOT NULL,
    pool TEXT NOT NULL,
    first_seen {real} NOT NULL,
    last_seen {real} NOT NULL,
    done BIGINT NOT NULL DEFAULT 0,
    failed BIGINT NOT NULL DEFAULT 0
);
""",
    ),
    (
        2,
        """
ALTER TABLE hosts ADD COLUMN stats {blob};
ALTER TABLE bags ADD COLUMN replicas BIGINT NOT NULL DEFAULT 0;
""",
    ),
    (
        3,
        """
DROP INDEX jobs_by_bag_state;
CREATE INDEX jobs_by_bag ON jobs (bag_id, id);
CREATE INDEX jobs_queued ON jobs (bag_id, id) WHERE state = 'queued';
CREATE INDEX jobs_failed ON jobs (bag_id, id) WHERE state = 'failed';
""",
    ),
    (
        4,
        """
ALTER TABLE bags ADD COLUMN owner TEXT NOT NULL DEFAULT '';
""",
    ),
    (
        5,
        """
ALTER TABLE bags ADD COLUMN revision INTEGER NOT NULL DEFAULT 1;
ALTER TABLE bags ADD COLUMN downloaded_at {real};
ALTER TABLE jobs ADD COLUMN revision INTEGER NOT NULL DEFAULT 1;
CREATE TABLE bag_revisions (
    bag_id BIGINT NOT NULL REFERENCES bags(id),
    revision INTEGER NOT NULL,
    spec {blob} NOT NULL,
    spec_hash TEXT NOT NULL,
    replaced_at {real} NOT NULL,
    PRIMARY KEY (bag_id, revision)
);
""",
    ),
    (
        6,
        """
CREATE TABLE pilots (
    id {id},
    pool TEXT NOT NULL,
    native_id TEXT NOT NULL,
    state TEXT NOT NULL,
    submitted_at {real} NOT NULL,
    started_at {real},
    ended_at {real}
);
CREATE INDEX pilots_by_native_id ON pilots (pool, native_id);
""",
    ),
    (
        7,
        """
CREATE TABLE events (
    event_id {id},
    at {real} NOT NULL,
    kind TEXT NOT NULL,
    source TEXT NOT NULL DEFAULT '',
    refs BIGINT NOT NULL
);
CREATE INDEX events_released ON events (event_id) WHERE refs <= 0;
CREATE TABLE decisions (
    id {id},
    event_id BIGINT NOT NULL,
    bag_id BIGINT NOT NULL,
    job_id BIGINT NOT NULL,
    strategy TEXT NOT NULL,
    action TEXT NOT NULL,
    why TEXT NOT NULL
);
CREATE INDEX decisions_by_job ON decisions (bag_id, job_id);
ALTER TABLE instances ADD COLUMN replica INTEGER NOT NULL DEFAULT 0;
ALTER TABLE instances ADD COLUMN sent_event BIGINT;
ALTER TABLE instances ADD COLUMN end_event BIGINT;
ALTER TABLE instances ADD COLUMN overdue_event BIGINT;
""",
    ),
    (
        8,
        """
ALTER TABLE instances ADD COLUMN vote {blob};
CREATE INDEX instances_votes ON instances (job_id) WHERE vote IS NOT NULL;
ALTER TABLE hosts ADD COLUMN account TEXT NOT NULL DEFAULT '';
""",
    ),
    (
        9,
        """
CREATE TABLE id_floors (
    name TEXT PRIMARY KEY,
    floor BIGINT NOT NULL
);
INSERT INTO id_floors (name, floor) VALUES ('bags', 0);
INSERT INTO id_floors (name, floor) VALUES ('jobs', 0);
INSERT INTO id_floors (name, floor) VALUES ('instances', 0);
""",
    ),
    (
        10,
        """
CREATE TABLE enrollments (
    nonce TEXT PRIMARY KEY,
    used INTEGER NOT NULL,
    expires {real} NOT NULL
);
""",
    ),
]
"""Version 3: a job's state was in an index, so each of its moves (queued, running, done) rewrote an index
entry; now only entering or leaving 'queued' (the feeder's query) or 'failed' (the listing people ask
for most) does, and running -> done touches no index (issue 6). Version 4: the submitter who owns each
bag (issue 11); bags stored before it belong to no one, which only an admin key sees. Version 5 (issue 12):
a bag's revision (`gridbot run --retry-failed` with a changed spec) and each job's, the specs of earlier
revisions, and when the results were last downloaded (`gridbot delete` refuses a bag whose results never
were); adding a column with a constant default rewrites no row in either database. Version 6 (issue 13): the
overlay's pilots, so that a restarted server takes up those still queued or running (a pool may reuse a
native id, a local pid above all: only one row of an id is ever live). Version 7 (issue 13):
the events that caused changes, the strategies' decisions about jobs, and on each instance the events
that sent it, found it overdue and ended it, and whether it was a replica, for `gridbot jobs BAG JOB
--story`. Each of these columns is written once, in the batch of its event, so an event's `refs` (the rows
that cite it) is known when it is written, and deleting a bag takes its rows' share off: the events left
with none are pruned. Indexes of the instances by their event columns would have told the same, at the
price of two index entries per instance (about a tenth more time per batch on SQLite). Version 8 (issue 19):
the results of quorum jobs waiting for their quorum, as the digest the quorum compares, so that a restart
keeps the votes already in; only those rows are in the index, and a job retried or revised forgets them; and
each host's account (a volunteer's), so that a restored vote is still its account's. Version 9: the highest
bag, job and instance ids that deleted bags had, so that no id is given twice: SQLite gives a new row the
highest id + 1, and a restarted server numbers instances from the highest stored, both of which fell back to
a deleted bag's ids (a worker's input cache, keyed by bag id, then fed a new bag the deleted one's inputs).
Version 10: the hosts each enrollment token (an EC2 pilot's one-use credential) has registered, so that a
restarted server does not take a spent token for a fresh one; a row is of no use past its token's expiry."""

LATEST = MIGRATIONS[-1][0]
