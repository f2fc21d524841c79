"""Issue 15, offline characterization on a real server: `gridbot plan BAG --from-bag PREVIOUS` characterizes the
pools from a bag that is over (its instances as the server stored them), and `--history FILE` from a history file;
the running bag's own tasks left and instances out are the tail that is estimated."""

from __future__ import annotations

import json
import time

import msgspec
import pytest

from gridbot import history
from gridbot.cli.main import cli
from gridbot.model.spec import parse_spec
from tests.integration.harness import gridbot
from tests.integration.test_expert_plan import grid_cluster

pytestmark = pytest.mark.skipif(
    not any(p.name == "from_bag" for p in cli.commands["plan"].params),  # type: ignore[attr-defined]
    reason="`gridbot plan --from-bag/--history` needs the cli/main.py and server diffs of issue 15's report")

POOLS = """\
[pools.grid]
kind = "static"            # its hosts are the workers the test starts
reliability = "unreliable"
price_per_cpu_hour = 0.0

[pools.cloud]
kind = "local"
reliability = "reliable"
max_running = 2
price_per_cpu_hour = 3.6
charging_period = 1
idle_timeout = 5
min_cpu = 0
allow_root = true          # the tests run as root
"""
GRID = 'Bag.Tail || Pool.Reliability != "reliable"'


def bag(name: str, jobs: int, command: str = "sleep 1") -> object:
    text = f"command = '{command}'\ninstance_deadline = 60\n[parameters]\ni = {{ from = 0, to = {jobs - 1} }}\n"
    return msgspec.structs.replace(parse_spec(text, name, name), policy={"GridPolicy": GRID})


def test_plan_a_running_bag_from_a_previous_bag_and_from_a_history_file(tmp_path):
    cluster = grid_cluster(tmp_path, POOLS)
    try:
        with cluster.client() as c:
            c.submit(bag("before", 24))
            assert c.wait("before", poll=0.2, timeout=120).state == "completed"
            stored = c.bag_history("before")
            c.submit(bag("now", 200, "sleep 2"))
            deadline = time.monotonic() + 60
            while c.bag("now").counts.done < 12 and time.monotonic() < deadline:  # (online: 10 results or more)
                time.sleep(0.2)
            (tmp_path / "before.csv").write_text(history.dump_csv(
                history.HistoryRow(s, e, ok, pool) for s, e, ok, pool in stored.instances))
            (tmp_path / "bad.csv").write_text("sent_at,ended_at,success,pool\n1,0.5,1,grid\n")
            from_bag = gridbot("plan", "now", "--from-bag", "before", "--json", "--server", cluster.url, timeout=120)
            from_file = gridbot("plan", "now", "--history", str(tmp_path / "before.csv"), "--json", "--server",
                                cluster.url, timeout=120)
            bad = gridbot("plan", "now", "--history", str(tmp_path / "bad.csv"), "--server", cluster.url)
            online = gridbot("plan", "now", "--json", "--server", cluster.url, timeout=120)
            c.cancel("now")
    finally:
        cluster.stop()
    # the previous bag, over: every instance stored, each with its pool; all returned (nothing was lost)
    assert stored.state == "completed" and stored.instance_deadline == 60 and stored.reliable_pools == ["cloud"]
    assert len(stored.instances) >= 24 and all(ok and end is not None for _, end, ok, _ in stored.instances)
    assert {pool for *_, pool in stored.instances} == {"grid"}
    for done in (from_bag, from_file, online):
        assert done.returncode == 0, done.stderr
    by_bag, by_file, own = (json.loads(p.stdout) for p in (from_bag, from_file, online))
    assert by_bag["characterization"].startswith("offline from bag before: 24 results of 24"), by_bag
    assert by_file["characterization"].startswith("offline from history before.csv: 24 results of 24"), by_file
    assert own["characterization"].startswith("online")
    # the same previous run: the same characterization (sleep 1: T_ur about a second, gamma 1), and the tail
    # estimated is the running bag's (its tasks left, the whole bag as it has more than #ur)
    assert by_bag["gamma"] == by_file["gamma"] == 1.0 and by_bag["tur"] == pytest.approx(by_file["tur"])
    assert 0.9 < by_bag["tur"] < 3.0 and own["tur"] > by_bag["tur"]  # the running bag's tasks sleep 2 s
    assert by_bag["whole_bag"] and by_bag["tasks"] > 100 and by_bag["frontier"]
    assert bad.returncode != 0 and "bad.csv, line 2: ended_at 0.5 is before sent_at 1" in bad.stderr, bad.stderr
