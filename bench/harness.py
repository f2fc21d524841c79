"""What the benchmarks share: starting a real gridbot server and workers as processes, reading their
memory, making throwaway databases, and printing tables of min/median/max with ratios.

Nothing here is timed by a test; the scripts beside it print figures (issue 6).
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

NO_AUTH = os.environ.get("GRIDBOT_BENCH_NO_AUTH") == "1"
"""Start servers with --no-auth, to measure what authentication costs (issue 11): run the suite both ways."""
PG_ADMIN = os.environ.get("GRIDBOT_BENCH_PG", os.environ.get("GRIDBOT_TEST_PG",
                                                              "postgresql://postgres@127.0.0.1:5432/postgres"))
DB_DIR: Path | None = None
"""Where the benchmarks make their SQLite databases and work directories (None: the system's temporary
directory); the suite's --db-dir sets it. On tmpfs an fsync costs nothing, so no figure is durable."""


def workdir() -> tempfile.TemporaryDirectory[str]:
    """A throwaway directory for one run's database and processes, under DB_DIR."""
    if DB_DIR is not None:
        DB_DIR.mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(prefix="gridbot-bench-", dir=DB_DIR)


def filesystem(path: Path) -> tuple[str, str, str]:
    """(type, device, mount point) of the file system `path` is on, from /proc/mounts (the longest mount
    point that holds it); ("?", "?", "?") where there is no /proc/mounts."""
    path = path.resolve()
    best, depth = ("?", "?", "?"), -1
    try:
        with open("/proc/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                device, mount, kind = fields[0], Path(fields[1].replace("\\040", " ")), fields[2]
                if (path == mount or mount in path.parents) and len(mount.parts) >= depth:
                    best, depth = (kind, device, str(mount)), len(mount.parts)
    except OSError:
        pass
    return best


MEMORY_FILESYSTEMS = ("tmpfs", "ramfs")


def storage() -> str:
    """Where the SQLite databases go and on what file system, with a warning on one kept in memory."""
    with workdir() as t:
        kind, device, mount = filesystem(Path(t))
        where = str(Path(t).parent)
    line = f"database directory: {where} ({kind} on {device}, mounted at {mount})"
    if kind in MEMORY_FILESYSTEMS:
        line += (f"\nWARNING: {kind} keeps the databases in memory: an fsync costs nothing there, so SQLite's "
                 "figures are not those of a durable store; pass --db-dir on a disk-backed file system")
    return line


def pg_settings(url: str = PG_ADMIN) -> str:
    """PostgreSQL's version and the settings that decide what a commit costs (fsync, synchronous_commit,
    wal_sync_method, full_page_writes), and the file system of its data directory when it is local."""
    import psycopg

    names = ("server_version", "fsync", "synchronous_commit", "wal_sync_method", "full_page_writes")
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        values = {n: str(conn.execute(f"SHOW {n}").fetchone()[0]) for n in names}  # type: ignore[index]
        try:
            data = str(conn.execute("SHOW data_directory").fetchone()[0])  # type: ignore[index]
        except psycopg.Error:
            data = ""
    line = (f"PostgreSQL {values['server_version']}: fsync={values['fsync']}, "
            f"synchronous_commit={values['synchronous_commit']}, wal_sync_method={values['wal_sync_method']}, "
            f"full_page_writes={values['full_page_writes']}")
    if data and Path(data).exists():
        kind, device, _ = filesystem(Path(data))
        line += f", data directory {data} ({kind} on {device})"
        if kind in MEMORY_FILESYSTEMS:
            line += f"\nWARNING: PostgreSQL's data directory is on {kind}: its commits are not durable"
    if values["fsync"] != "on" or values["synchronous_commit"] not in ("on", "remote_write", "remote_apply"):
        line += "\nWARNING: PostgreSQL does not make each commit durable (fsync or synchronous_commit is off)"
    return line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int, peak: bool = False) -> float:
    """Resident memory of a process now (or its peak, VmHWM), in MiB."""
    key = "VmHWM:" if peak else "VmRSS:"
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Server:
    """A `gridbot server` process on a free port."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextmanager
def server(db: str, workdir: Path, *args: str) -> Iterator[Server]:
    """Start `gridbot server` on `db` and wait until it answers; stop it afterwards."""
    port = free_port()
    log = workdir / f"server-{port}.log"
    access = workdir / f"access-{port}.json"
    keys = [] if NO_AUTH else ["--access-file", str(access)]
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gridbot", "--log-level", "warning", "server", "--db", db,
                                 "--port", str(port), "--state-dir", str(workdir / "state"), *keys,
                                 *(["--no-auth"] if NO_AUTH else []), *args],
                                stdout=out, stderr=subprocess.STDOUT)
    srv = Server(proc, f"http://127.0.0.1:{port}", log)
    saved = os.environ.get("GRIDBOT_ACCESS")
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                headers = {}
                if not NO_AUTH:
                    token = json.loads(access.read_text())["admin"]
                    headers["Authorization"] = f"Bearer {token}"
                    os.environ["GRIDBOT_ACCESS"] = str(access)  # the clients and workers of this benchmark
                with urllib.request.urlopen(urllib.request.Request(f"{srv.url}/v1/health", headers=headers),
                                            timeout=1):
                    break
            except (OSError, ValueError, KeyError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the server did not start:\n{log.read_text()[-2000:]}") from None
                time.sleep(0.05)
        yield srv
    finally:
        srv.stop()
        if saved is None:
            os.environ.pop("GRIDBOT_ACCESS", None)
        else:
            os.environ["GRIDBOT_ACCESS"] = saved


@contextmanager
def workers(url: str, count: int, workdir: Path, *args: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start `count` `gridbot worker` processes; SIGTERM whatever is left afterwards."""
    procs = []
    for n in range(count):
        wd = workdir / f"w{n}"
        wd.mkdir(parents=True, exist_ok=True)
        with (wd / "log").open("wb") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "gridbot", "--log-level", "warning", "worker", "--server", url,
                 "--name", f"bench{n}", "--workdir", str(wd), "--idle-timeout", "3", "--allow-root", *args],
                stdout=out, stderr=subprocess.STDOUT))
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


@contextmanager
def many_hosts(url: str, workdir: Path, hosts: int, slots: int,
               prefetch: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`hosts` noop workers of `slots` slots in one process (bench/many_hosts.py); stopped afterwards."""
    wd = workdir / "hosts"
    wd.mkdir(parents=True, exist_ok=True)
    with (wd / "log").open("wb") as out:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("many_hosts.py")), "--server", url,
                                 "--workdir", str(wd), "--hosts", str(hosts), "--slots", str(slots), "--prefetch",
                                 str(prefetch), "--idle-timeout", "30"], stdout=out, stderr=subprocess.STDOUT)
    try:
        yield [proc]
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def pg_database(name: str) -> Iterator[str]:
    """A fresh PostgreSQL database for one run (dropped afterwards); yields its URL."""
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def instance_times(db: str) -> list[tuple[float, float]]:
    """(sent_at, ended_at) of every instance that ended done, from the store itself, by end time."""
    query = "SELECT sent_at, ended_at FROM instances WHERE state = 'done' ORDER BY ended_at"
    if db.startswith("sqlite:///"):
        path = db.removeprefix("sqlite:///").split("?", 1)[0]
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return [(float(a), float(b)) for a, b in conn.execute(query)]
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(db) as pconn:
        return [(float(a), float(b)) for a, b in pconn.execute(query)]


def first_sent(db: str) -> float:
    """When the store's first instance was sent (time.time() of the server)."""
    query = "SELECT MIN(sent_at) FROM instances"
    if db.startswith("sqlite:///"):
        path = db.removeprefix("sqlite:///").split("?", 1)[0]
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return float(conn.execute(query).fetchone()[0])
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(db) as pconn:
        return float(pconn.execute(query).fetchone()[0])  # type: ignore[index]


def rate(times: Sequence[tuple[float, float]], first: int | None = None) -> float:
    """Jobs per second from the first instance sent to the `first`-th result (all by default)."""
    if not times:
        return 0.0
    n = len(times) if first is None else min(first, len(times))
    start = min(t[0] for t in times[:n])
    return n / max(1e-9, times[n - 1][1] - start)


@dataclass
class Row:
    """One line of a results table: a system and its figures over repetitions."""

    name: str
    values: list[float] = field(default_factory=list)
    unit: str = "jobs/s"
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")


def fmt(v: float) -> str:
    if v != v:  # nan
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.2f}" if abs(v) < 10 else f"{v:,.1f}"


def table(title: str, rows: Sequence[Row], versus: str | None = None, higher_is_better: bool = True) -> str:
    """A Markdown table of min/median/max per row, with each row's median over `versus`'s median."""
    ref = next((r for r in rows if r.name == versus), None)
    lines = [f"### {title}", "", "| system | unit | min | median | max | runs | vs " + (versus or "-") + " | note |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.values:
            ratio = (r.median / ref.median if higher_is_better else ref.median / r.median) if ref and ref.values \
                else float("nan")
            lines.append(f"| {r.name} | {r.unit} | {fmt(min(r.values))} | {fmt(r.median)} | {fmt(max(r.values))} | "
                         f"{len(r.values)} | {'-' if ratio != ratio else f'{ratio:.2f}x'} | {r.note} |")
        else:
            lines.append(f"| {r.name} | {r.unit} | - | - | - | 0 | - | {r.note} |")
    return "\n".join(lines) + "\n\n"


def machine() -> str:
    """The machine and software the figures come from."""
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{platform.node()}: {os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, {platform.system()} "
            f"{platform.release()}, CPython {platform.python_version()} ({os.path.realpath(sys.executable)}), "
            f"SQLite {sqlite3.sqlite_version}")
