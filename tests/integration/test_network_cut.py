"""A PostgreSQL database cut off by the network, without a reset: a real link (a veth pair into a network
namespace of the test's own) between the store and the database, taken down under it.

Before, a statement on the cut connection waited until TCP gave up, about 15 minutes, and a server's event loop
with it; and once the network came back, the old backend (which never heard of the cut) kept the claim on the
database, so every write waited for PostgreSQL's own keepalives, two hours by default.
"""

from __future__ import annotations

import contextlib
import os
import random
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from gridbot.model.spec import parse_spec
from gridbot.store.base import StoreUnavailable
from gridbot.store.sql import LIVENESS, WRITER_USER_TIMEOUT, open_store
from tests.integration.harness import admin_url, free_port

RELAY = Path(__file__).with_name("relay.py")
SPEC = parse_spec('command = "true"\n[parameters]\ni = { from = 1, to = 3 }\n', "t", "cut")


class Link:
    """client (this namespace) -> B:5432 (a relay in a namespace of its own) -> A:PORT (a relay here, which keeps
    its connections to the database open whatever becomes of their clients) -> the database; `cut` takes the veth
    between A and B down, `mend` brings it back."""

    def __init__(self) -> None:
        token = f"{os.getpid() % 4096:03x}{random.randrange(4096):03x}"
        self.ns = f"gbcut-{token}"
        self.here, self.there = f"gbc{token}a", f"gbc{token}b"
        net, last = f"10.{random.randrange(64, 128)}.{random.randrange(256)}", 4 * random.randrange(64)
        self.a, self.b = f"{net}.{last + 1}", f"{net}.{last + 2}"  # a /30 of their own
        self.relays: list[subprocess.Popen[str]] = []

    def up(self, db_host: str, db_port: int) -> str:
        ip = ["ip"]
        for args in (["netns", "add", self.ns], ["link", "add", self.here, "type", "veth", "peer", "name", self.there],
                     ["link", "set", self.there, "netns", self.ns],
                     ["addr", "add", f"{self.a}/30", "dev", self.here], ["link", "set", self.here, "up"],
                     ["-n", self.ns, "addr", "add", f"{self.b}/30", "dev", self.there],
                     ["-n", self.ns, "link", "set", self.there, "up"], ["-n", self.ns, "link", "set", "lo", "up"]):
            subprocess.run(ip + args, check=True, capture_output=True, text=True)
        port = free_port()
        self._relay([], self.a, port, db_host, db_port, "--keep-upstream")
        self._relay(["ip", "netns", "exec", self.ns], self.b, 5432, self.a, port)
        return self.b

    def _relay(self, prefix: list[str], host: str, port: int, to_host: str, to_port: int, *flags: str) -> None:
        p = subprocess.Popen([*prefix, sys.executable, str(RELAY), host, str(port), to_host, str(to_port), *flags],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.relays.append(p)
        assert p.stdout is not None
        ready, _, _ = select.select([p.stdout], [], [], 15)
        assert ready and p.stdout.readline().strip() == "ready", "the relay did not start"

    def cut(self) -> None:
        subprocess.run(["ip", "link", "set", self.here, "down"], check=True)

    def mend(self) -> None:
        subprocess.run(["ip", "link", "set", self.here, "up"], check=True)

    def down(self) -> None:
        for p in self.relays:
            p.kill()
            p.wait()
            for f in (p.stdin, p.stdout):
                if f is not None:
                    f.close()
        subprocess.run(["ip", "link", "del", self.here], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)


@pytest.fixture
def link() -> Iterator[Link]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("cutting a link needs root and iproute2 (network namespaces)")
    link = Link()
    try:
        yield link
    finally:
        link.down()


@pytest.mark.postgres
def test_a_store_gives_up_on_a_database_cut_off_by_the_network_and_takes_its_claim_back_once_it_returns(
        link: Link, pg_url: str) -> None:
    """The URL's own timeouts are the user's (short here, to keep the test short); LIVENESS is the default."""
    rest, database = pg_url.rsplit("/", 1)
    db_host, db_port = rest.rsplit("@", 1)[-1].rsplit(":", 1)
    via = link.up(db_host, int(db_port))
    url = (f"{rest.rsplit('@', 1)[0]}@{via}:5432/{database}?tcp_user_timeout=2000&keepalives_idle=1"
           "&keepalives_interval=1&keepalives_count=2&connect_timeout=2")
    store = open_store(url)
    try:
        store.migrate()
        store.claim()
        row = store.create_bag(SPEC, None, {}, 1.0)
        old = store.conn.info.backend_pid
        assert store.conn.info.get_parameters()["tcp_user_timeout"] == "2000", "the URL's own value wins"

        link.cut()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            store.bag(row.bag_id)
        with pytest.raises(StoreUnavailable):
            store.create_bag(parse_spec('command = "true"\n', "t", "cut2"), None, {}, 1.0)
        assert time.monotonic() - started < 20, "each gives up after its timeout, not TCP's 15 minutes"

        link.mend()
        # the old writing backend never heard of the cut: it still holds the claim, and is terminated
        with psycopg.connect(admin_url(pg_url), autocommit=True) as admin:
            alive = [r[0] for r in admin.execute("SELECT pid FROM pg_stat_activity WHERE pid = %s", (old,))]
        assert alive == [old], "the old backend is still there, holding the claim, as after a real cut"
        deadline = time.monotonic() + 30
        while True:
            try:
                store.create_bag(parse_spec('command = "true"\n', "t", "after"), None, {}, 1.0)
                break
            except StoreUnavailable as e:
                assert time.monotonic() < deadline, e
                time.sleep(0.2)
        assert store.conn.info.backend_pid != old
        with psycopg.connect(admin_url(pg_url), autocommit=True) as admin:
            assert admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (old,)).fetchone()[0] == 0
        assert store.bag(row.bag_id) is not None and [b.name for b in store.bags()] == ["cut", "after"]
    finally:
        with contextlib.suppress(Exception):
            store.close()


@pytest.mark.postgres
def test_a_store_connects_with_the_liveness_options_its_url_does_not_set(pg_url: str) -> None:
    store = open_store(pg_url)
    given = open_store(f"{pg_url}?tcp_user_timeout=5000&keepalives=0")
    try:
        params = store.reader.info.get_parameters()
        for name, value in LIVENESS.items():
            assert params[name] == str(value), name
        assert store.conn.info.get_parameters()["tcp_user_timeout"] == str(WRITER_USER_TIMEOUT)
        assert given.conn.info.get_parameters()["tcp_user_timeout"] == "5000"
        assert given.conn.info.get_parameters()["keepalives"] == "0"
        assert given.reader.info.get_parameters()["keepalives_idle"] == str(LIVENESS["keepalives_idle"])
    finally:
        store.close()
        given.close()
