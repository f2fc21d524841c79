"""Real processes for integration tests: a `gridbot server` and `gridbot worker`s on free local ports."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from gridbot.client import Client

GRIDBOT = [sys.executable, "-m", "gridbot"]


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gridbot(*args: str, cwd: Path | None = None, timeout: float = 120, env: dict | None = None,
            check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the gridbot command as a user would and capture what it prints."""
    proc = subprocess.run([*GRIDBOT, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError(f"gridbot {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def gridbot_json(*args: str, **kw) -> object:
    return json.loads(gridbot(*args, "--json", check=True, **kw).stdout)


class Proc:
    """A background gridbot process with its log in a file."""

    def __init__(self, args: list[str], log: Path, cwd: Path) -> None:
        self.args, self.log_path, self.cwd = args, log, cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen([*GRIDBOT, *self.args], cwd=self.cwd, stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, sig)

    def wait(self, timeout: float = 30) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class Cluster:
    """One server and any number of workers, all stopped at the end of the test."""

    def __init__(self, tmp: Path, db: str | None = None, server_args: tuple[str, ...] = ()) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = db or f"sqlite:///{tmp}/server.db"
        self.server_args = server_args
        self.cancel_pilots = True
        """Start the server with --cancel-pilots-on-exit, so that no test leaves pilots running behind it."""
        self.access = tmp / "gridbot-access.json"
        """The access file the server makes on its first start; the test's CLI calls and workers use it
        (through GRIDBOT_ACCESS, set while the cluster runs)."""
        self._saved_access = os.environ.get("GRIDBOT_ACCESS")
        self.server: Proc | None = None
        self.workers: list[Proc] = []

    def start_server(self) -> Proc:
        self.server = Proc(["--log-level", "info", "server", "--db", self.db, "--port", str(self.port),
                            "--access-file", str(self.access), *self.server_args,
                            *(["--cancel-pilots-on-exit"] if self.cancel_pilots else [])], self.tmp / "server.log",
                           self.tmp).start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    os.environ["GRIDBOT_ACCESS"] = str(self.access)
                    return self.server
            except OSError:
                if self.server.proc and self.server.proc.poll() is not None:
                    raise AssertionError(f"server exited:\n{self.server.log}") from None
                time.sleep(0.1)
        raise AssertionError(f"server did not listen:\n{self.server.log}")

    def start_worker(self, *args: str, name: str | None = None) -> Proc:
        n = len(self.workers)
        w = Proc(["--log-level", "debug", "worker", "--server", self.url, "--workdir", str(self.tmp / f"w{n}"),
                  "--name", name or f"w{n}", "--allow-root", *args], self.tmp / f"worker-{n}.log",
                 self.tmp).start()
        self.workers.append(w)
        return w

    def register(self, pool: str = "local") -> tuple[str, str]:
        """Register a host with `pool`'s worker key, as a worker does: (host id, host credential)."""
        import urllib.request

        import msgspec

        from gridbot.protocol import RegisterRequest, Registration
        from gridbot.security.access import read_access

        key = read_access(self.access).workers[pool]
        req = urllib.request.Request(f"{self.url}/v1/register", msgspec.msgpack.encode(RegisterRequest("test")),
                                     {"Authorization": f"Bearer {key}", "Content-Type": "application/msgpack"})
        with urllib.request.urlopen(req, timeout=10) as r:
            reg = msgspec.msgpack.decode(r.read(), type=Registration)
        return reg.host_id, reg.credential

    def client(self, admin: bool = False) -> Client:
        return Client(self.url, access=self.access, admin=admin)

    def wait_bag(self, bag: str, timeout: float = 120) -> object:
        with self.client() as c:
            return c.wait(bag, poll=0.2, timeout=timeout)

    def stop(self) -> None:
        for w in self.workers:
            w.stop()
        if self.server is not None:
            self.server.stop()
        if self._saved_access is None:
            os.environ.pop("GRIDBOT_ACCESS", None)
        else:
            os.environ["GRIDBOT_ACCESS"] = self._saved_access


def admin_url(pg_url: str) -> str:
    """The maintenance database of the PostgreSQL server `pg_url` is on."""
    return pg_url.rsplit("/", 1)[0] + "/postgres"


def server_backends(pg_url: str) -> list[int]:
    """The backends of gridbot servers' connections (their application_name) to the database of `pg_url`."""
    import psycopg

    with psycopg.connect(admin_url(pg_url), autocommit=True) as admin:
        return [r[0] for r in admin.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s AND "
                                            "application_name LIKE 'gridbot server %%'",
                                            (pg_url.rsplit("/", 1)[1],))]


def terminate_backends(pg_url: str, pids: list[int]) -> None:
    """Terminate PostgreSQL backends and wait until they have exited (their locks released)."""
    import psycopg

    with psycopg.connect(admin_url(pg_url), autocommit=True) as admin:
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 30
        while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchone()[0]:
            assert time.monotonic() < deadline, "the terminated backends did not exit"
            time.sleep(0.02)
