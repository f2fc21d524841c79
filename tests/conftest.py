"""Shared fixtures: the stores every conformance test runs on, and a server+worker harness."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gridbot.store.base import Store
from gridbot.store.memory import MemoryStore
from gridbot.store.sql import PostgresStore, SQLiteStore, open_store

PG_URL = os.environ.get("GRIDBOT_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers keep their identity under XDG_STATE_HOME: one per test session, never the user's."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.getbasetemp() / "state"))


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    import psycopg

    try:
        psycopg.connect(PG_URL, connect_timeout=5).close()
    except psycopg.Error as e:  # a missing server is a failure, not a skip: `make test` provides one
        pytest.fail(f"PostgreSQL at {PG_URL} is not reachable ({e}); run the suite with `make test`")
    return PG_URL


@pytest.fixture
def pg_url(pg_admin_url: str) -> Iterator[str]:
    """A fresh, empty database for one test, dropped afterwards."""
    import psycopg

    name = f"gridbot_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = pg_admin_url.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each conformance test runs on all three stores."""
    s: Store
    if request.param == "memory":
        s = MemoryStore()
    elif request.param == "sqlite":
        s = SQLiteStore(tmp_path / "gridbot.db")
    else:
        s = PostgresStore(request.getfixturevalue("pg_url"))
    s.migrate()
    yield s
    s.close()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/gridbot.db".replace("sqlite:////", "sqlite:////")


def reopen(url: str) -> Store:
    return open_store(url)


@pytest.fixture
def cluster(tmp_path: Path):
    """A real `gridbot server` on SQLite; workers are started by the test."""
    from tests.integration.harness import Cluster

    c = Cluster(tmp_path)
    yield c
    c.stop()


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory):
    """A real one-node Slurm of 8 CPUs with partitions `fast` and `big` (4 CPUs each) and `small` (2), from
    Debian's packages (`make test` installs them)."""
    import shutil
    import subprocess
    import tempfile

    if shutil.which("slurmctld") is None:
        pytest.fail("Slurm is not installed: run the suite with `make test`, which installs it")
    script = Path(__file__).resolve().parents[1] / "scripts" / "slurm.sh"
    # not under pytest's base directory: that one is private to root, and slurmctld reads as the slurm user
    state = Path(tempfile.mkdtemp(prefix="gridbot-slurm-"))
    try:
        subprocess.run([str(script), "start", str(state)], check=True, timeout=120)
        os.environ["SLURM_CONF"] = str(state / "slurm.conf")
        yield SlurmCluster(script, state)
    finally:
        subprocess.run([str(script), "stop", str(state)], timeout=120)
        os.environ.pop("SLURM_CONF", None)
        shutil.rmtree(state, ignore_errors=True)


class SlurmCluster:
    def __init__(self, script: Path, state: Path) -> None:
        self.script, self.state = script, state

    def controller(self, action: str) -> None:
        import subprocess

        subprocess.run([str(self.script), f"ctld-{action}", str(self.state)], check=True, timeout=60)
