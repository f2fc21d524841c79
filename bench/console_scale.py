"""How fast the console's routes answer with a bag of 1,000,000 jobs and 10,000 hosts in the store (issue 20).

Makes a SQLite store with one active bag of JOBS jobs, DONE of them done (one instance each, on HOSTS hosts
in four pools), serves it with the real server, and times each page's request: the first (the aggregate is
computed) and the next ones (served from the console's cache while it is refreshed on its own thread).

    .venv/bin/python bench/console_scale.py [--jobs 1000000] [--hosts 10000] [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from gridbot.client import load_spec_file
from gridbot.server.app import EmbeddedServer
from gridbot.server.service import Service
from gridbot.store.sql import SQLiteStore


def make_store(path: Path, jobs: int, hosts: int, done: int) -> None:
    store = SQLiteStore(path, "OFF")
    store.migrate()
    now = time.time()
    start = now - 3600
    toml = path.parent / "big.toml"
    toml.write_text(f'name = "big"\ncommand = "run {{i}}"\n[parameters]\ni = {{ from = 0, to = {jobs - 1} }}\n')
    spec, _ = load_spec_file(toml, max_jobs=jobs)
    row = store.create_bag(spec, None, {}, start, "")
    rnd = random.Random(1)
    pools = ["local", "slurm", "ec2", "volunteer"]
    cur = store.conn.cursor()
    cur.execute("BEGIN")
    cur.executemany("INSERT INTO hosts (id, name, platform, ncpus, memory_mb, slots, pool, first_seen, last_seen, "
                    "done, failed) VALUES (?, ?, 'linux', 4, 8000, 4, ?, ?, ?, ?, ?)",
                    [(f"h{k:05d}", f"node{k}", pools[k % 4], start, now - rnd.random() * 900, done // hosts, k % 7)
                     for k in range(hosts)])
    first = cur.execute("SELECT MIN(id) FROM jobs WHERE bag_id = ?", (row.bag_id,)).fetchone()[0]
    rows = []
    for k in range(done):
        sent = start + k * 3600 / done
        wall = rnd.lognormvariate(3, 0.5)
        rows.append((k + 1, first + k, row.bag_id, f"h{rnd.randrange(hosts):05d}", "done", sent, sent + 600,
                     sent + wall, wall, wall * 0.9))
    cur.executemany("INSERT INTO instances (id, job_id, bag_id, host_id, state, sent_at, instance_deadline, ended_at, "
                    "wall_s, cpu_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    cur.execute("UPDATE jobs SET state = 'done', attempts = 1, result_instance = id - ? + 1 "
                "WHERE bag_id = ? AND id < ?", (first, row.bag_id, first + done))
    cur.execute("UPDATE bags SET queued = ?, done = ?, instances = ? WHERE id = ?",
                (jobs - done, done, done, row.bag_id))
    cur.execute("COMMIT")
    store.close()


def timed(url: str, key: str, runs: int) -> tuple[float, float]:
    """Milliseconds of the first request and the median of the next `runs`."""
    def once() -> float:
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
        t = time.perf_counter()
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()
        return (time.perf_counter() - t) * 1000
    first = once()
    return first, statistics.median(once() for _ in range(runs))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--hosts", type=int, default=10_000)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    if args.dir is not None:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "big.db"
        t = time.perf_counter()
        make_store(path, args.jobs, args.hosts, args.jobs * 95 // 100)
        print(f"store made in {time.perf_counter() - t:.0f} s")
        t = time.perf_counter()
        service = Service(SQLiteStore(path))
        print(f"service loaded in {time.perf_counter() - t:.1f} s")
        with EmbeddedServer(service) as srv:
            key = srv.access.admin
            print("| route | first (ms) | once computed, median (ms) |\n|---|---|---|")
            for route in ("/ui", "/v1/console/bags", "/v1/console/bags/big", "/v1/console/hosts?sort=error_rate&desc=1",
                          "/v1/console/hosts?q=node99&page=0", "/v1/console/pools", "/v1/bags/big/jobs?limit=25",
                          "/v1/bags/big/story/5"):
                first, then = timed(srv.url + route, key, 10)
                if "/console/" in route:  # the first look may answer `pending`: the counts, once computed
                    time.sleep(3)
                    then = timed(srv.url + route, key, 10)[1]
                print(f"| `{route}` | {first:.0f} | {then:.0f} |")


if __name__ == "__main__":
    main()
