"""Issue 12: faults a user meets, each reproduced as it was reported, on real processes."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from gridbot.core.changes import Changes
from gridbot.errors import ServerUnavailable
from gridbot.model.pools import PoolSpec
from gridbot.model.records import HostInfo
from gridbot.model.spec import parse_spec
from gridbot.pools.base import PILOT_PATIENCE, PilotRequest
from gridbot.protocol import ExchangeRequest
from gridbot.server.service import Service
from gridbot.store.sql import SQLiteStore
from tests.integration.harness import GRIDBOT, gridbot, gridbot_json


def _workers_of(tmp: Path) -> list[int]:
    """`gridbot worker` processes started in the folder `tmp` (as `gridbot run` starts them)."""
    out = subprocess.run(["pgrep", "-f", "gridbot worker"], capture_output=True, text=True).stdout
    pids = []
    for pid in map(int, out.split()):
        try:
            if Path(f"/proc/{pid}/cwd").resolve() == tmp.resolve():
                pids.append(pid)
        except OSError:
            continue
    return pids


def _wait_done(db: Path, at_least: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if db.exists():
            with sqlite3.connect(db) as conn:
                try:
                    done = conn.execute("SELECT COALESCE(SUM(done), 0) FROM bags").fetchone()[0] or 0
                except sqlite3.OperationalError:
                    continue  # the file exists before its tables do: `gridbot run` is still migrating it
                if done >= at_least:
                    return
    raise AssertionError("the bag did not get going")


def test_sigterm_and_sighup_to_gridbot_run_stop_its_workers(tmp_path):
    for sig in (signal.SIGTERM, signal.SIGHUP):
        folder = tmp_path / sig.name
        folder.mkdir()
        (folder / "slow.toml").write_text('command = "sleep 0.3"\n[parameters]\ni = { from = 1, to = 200 }\n')
        proc = subprocess.Popen([*GRIDBOT, "run", "slow.toml", "--workers", "2"], cwd=folder,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_done(folder / ".gridbot/gridbot.db", 3)
        assert len(_workers_of(folder)) == 2
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + sig, out + err
        assert "run the same command again to resume" in err
        deadline = time.monotonic() + 10
        while _workers_of(folder) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _workers_of(folder), f"{sig.name} left workers running"


def test_a_run_serves_its_own_bag_not_an_interrupted_one_in_the_same_store(tmp_path):
    (tmp_path / "a.toml").write_text(f'command = "sleep 0.2; echo a{{i}} >> {tmp_path}/ran.log"\n'
                                     '[parameters]\ni = { from = 1, to = 100 }\n')
    (tmp_path / "b.toml").write_text(f'command = "echo b{{i}} >> {tmp_path}/ran.log"\n'
                                     '[parameters]\ni = { from = 1, to = 5 }\n')
    first = subprocess.Popen([*GRIDBOT, "run", "a.toml", "--workers", "2"], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_done(tmp_path / ".gridbot/gridbot.db", 3)
    first.send_signal(signal.SIGINT)
    first.communicate(timeout=60)
    before = (tmp_path / "ran.log").read_text().split()
    proc = gridbot("run", "b.toml", "--workers", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "also holds unfinished bags (a)" in proc.stderr
    after = (tmp_path / "ran.log").read_text().split()[len(before):]
    assert sorted(after) == sorted(f"b{i}" for i in range(1, 6)), "only b's jobs ran"


def test_uniform_jobs_on_one_machine_make_no_speculative_copies(tmp_path):
    (tmp_path / "u.toml").write_text('command = "sleep 0.5"\n[parameters]\ni = { from = 1, to = 30 }\n')
    proc = gridbot("run", "u.toml", "--workers", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with sqlite3.connect(tmp_path / ".gridbot/gridbot.db") as conn:
        assert conn.execute("SELECT replicas, instances, done FROM bags").fetchone() == (0, 30, 30)


def test_a_bag_no_host_can_run_says_why_in_status(cluster, tmp_path):
    cluster.start_server()
    (tmp_path / "g.toml").write_text('name = "g"\ncommand = "true"\n[policy]\n'
                                     'JobRequirements = "Host.NumCpus > 4096"\n')
    gridbot_json("submit", str(tmp_path / "g.toml"))
    cluster.start_worker("--slots", "1")
    deadline = time.monotonic() + 30
    messages: list[str] = []
    while time.monotonic() < deadline and not any("matches" in m for m in messages):
        time.sleep(0.5)
        messages = gridbot_json("status")[0]["diagnostics"]
    assert any("none of the 1 connected hosts matches" in m and "`Host.NumCpus > 4096`" in m for m in messages)
    assert "Host.NumCpus > 4096" in gridbot("status").stdout


def test_pilots_wait_for_the_server_as_long_as_their_walltime_allows():
    with_walltime = PoolSpec("s", "slurm", max_running=1, walltime=3600, options={"partition": "debug"})
    args = PilotRequest("http://x:1").worker_args(with_walltime)
    assert args[args.index("--give-up-after") + 1] == "0" and "--lifetime" in args
    local = PoolSpec("l", "local", max_running=1, walltime=0)
    args = PilotRequest("http://x:1").worker_args(local)
    assert float(args[args.index("--give-up-after") + 1]) == PILOT_PATIENCE


def test_an_exchange_the_store_refuses_fails_alone_after_the_first_failed_batch(tmp_path, monkeypatch):
    """A value that decodes but cannot be stored took its whole group-committed batch down, again and
    again; after one failed batch, exchanges are committed one by one, so only the bad one fails."""
    store = SQLiteStore(tmp_path / "s.db")
    store.migrate()
    service = Service(store)
    spec = parse_spec('command = "true"\n[parameters]\ni = { from = 1, to = 20 }\n', "s", "s")
    service.submit(spec, None, {}, 0.0)
    real_apply = store.apply

    def apply(changes: Changes) -> None:
        if any(h.info.name == "poison" for h in changes.hosts.values()):
            raise RuntimeError("value out of range")
        real_apply(changes)

    monkeypatch.setattr(store, "apply", apply)
    failed: list[str] = []

    def stage(name: str) -> None:
        _, changes = service.decide(ExchangeRequest(HostInfo(name, name), 1, []), 1.0)
        service.stage(changes, lambda e, n=name: failed.append(n) if e is not None else None)

    for name in ("a", "poison", "b"):
        stage(name)
    with contextlib.suppress(ServerUnavailable):
        service.flush()
    assert sorted(failed) == ["a", "b", "poison"], "the first batch fails whole"
    assert service.solo_until > time.monotonic()
    ok = []
    for name in ("c", "poison", "d"):
        _, changes = service.decide(ExchangeRequest(HostInfo(name, name), 1, []), 2.0)
        try:
            service.commit(changes)
            ok.append(name)
        except ServerUnavailable:
            pass
    assert ok == ["c", "d"], "in solo mode the bad exchange fails alone"
    assert sorted(h.info.host_id for h in store.hosts()) == ["c", "d"], "a and b went down with the first batch"


def test_a_store_that_is_down_leaves_the_dispatcher_as_it_was_and_answers_503_until_it_is_back(tmp_path,
                                                                                             monkeypatch):
    """The dispatcher used to be rebuilt from whatever the store gave while it was down: an empty one that
    forgot running work. Now the service stays `stale` (503) and reloads once the store answers."""
    from gridbot.store.base import StoreUnavailable

    store = SQLiteStore(tmp_path / "s.db")
    store.migrate()
    service = Service(store)
    service.submit(parse_spec('command = "true"\n[parameters]\ni = [1, 2]\n', "s", "s"), None, {}, 0.0)
    _, changes = service.decide(ExchangeRequest(HostInfo("a", "a"), 1, []), 1.0)
    service.commit(changes)
    real_apply, real_snapshot = store.apply, store.snapshot

    def down(*args: object) -> None:
        raise StoreUnavailable("the database is unavailable (test)")

    monkeypatch.setattr(store, "apply", down)
    monkeypatch.setattr(store, "snapshot", down)
    before = service.dispatcher
    _, changes = service.decide(ExchangeRequest(HostInfo("b", "b"), 1, []), 2.0)
    with contextlib.suppress(ServerUnavailable):
        service.commit(changes)
    assert service.stale and service.dispatcher is before, "no dispatcher made from an empty snapshot"
    with pytest.raises(ServerUnavailable, match="the store is unavailable"):
        service.decide(ExchangeRequest(HostInfo("b", "b"), 1, []), 3.0)
    monkeypatch.setattr(store, "apply", real_apply)
    monkeypatch.setattr(store, "snapshot", real_snapshot)
    service._next_reload = 0.0  # as a request RELOAD_EVERY seconds later
    resp, changes = service.decide(ExchangeRequest(HostInfo("b", "b"), 1, []), 4.0)
    service.commit(changes)
    assert not service.stale and len(resp.assignments) == 1, "reloaded from the store, b gets the other job"
    assert service.dispatcher.view.bag(1).running == 2, "a's instance was not forgotten"
