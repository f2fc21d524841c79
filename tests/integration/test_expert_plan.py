"""Issue 15 on a real server with real workers: `gridbot plan` on a running bag, `--apply`, and `gridbot status`
showing the strategy in force with its prediction and, once the tail has ended, what was measured."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import msgspec

from gridbot.model.spec import parse_spec
from tests.integration.harness import Cluster, gridbot

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


def until(what: str, cond: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.1)


def grid_cluster(tmp_path, pools: str = POOLS) -> Cluster:
    """A server on `pools` with four workers of one slot in its static pool `grid`."""
    (tmp_path / "pools.toml").write_text(pools)
    cluster = Cluster(tmp_path, server_args=("--pools", str(tmp_path / "pools.toml"), "--state-dir",
                                             str(tmp_path / "state")))
    cluster.start_server()
    try:
        for n in range(4):
            cluster.start_worker("--pool", "grid", "--slots", "1", "--idle-timeout", "60", name=f"g{n}")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def test_plan_a_running_bag_then_apply_expert_and_see_it_in_status(tmp_path):
    cluster = grid_cluster(tmp_path)
    try:
        text = "command = 'sleep 1'\ninstance_deadline = 60\n[parameters]\ni = { from = 0, to = 39 }\n"
        spec = msgspec.structs.replace(parse_spec(text, "e", "e"),
                                       policy={"GridPolicy": 'Bag.Tail || Pool.Reliability != "reliable"'})
        with cluster.client() as c:
            c.submit(spec)
            until("a dozen results", lambda: c.bag("e").counts.done >= 12)
            planned = gridbot("plan", "e", "--json", "--server", cluster.url, timeout=120)
            assert planned.returncode == 0, planned.stderr
            report = json.loads(planned.stdout)
            shown = gridbot("plan", "e", "--utility", "makespan", "--plot", str(tmp_path / "frontier.png"),
                            "--apply", "--server", cluster.url, timeout=120)
            assert shown.returncode == 0, shown.stderr
            assert c.wait("e", poll=0.2, timeout=120).state == "completed"
            story = c.story("e", 39)
            status = gridbot("status", "--server", cluster.url)
            info = c.bag("e")
    finally:
        cluster.stop()
    # the running bag's own instances, characterized online; the rest of the bag, then its tail, estimated
    assert report["characterization"].startswith("online"), report["characterization"]
    assert report["unreliable"] == 4 and report["reliable_capacity"] == 2
    assert report["prices"] == {"unreliable_per_hour": 0.0, "reliable_per_hour": 3.6, "charging_period": 1.0}
    assert report["whole_bag"] and report["utility"] == "makespan x cost"
    assert report["frontier"] and report["chosen"] is not None
    assert {"TRR", "TR", "AUR", "CN∞", "CN1T0", "B", "AR"} <= set(report["statics"])
    assert set(report["bests"]) >= {"fastest", "cheapest", "makespan x cost"}
    assert report["bests"]["cheapest"]["cost"] <= report["chosen"]["cost"]
    # the table, the plot and the strategy set on the bag
    assert "best for fastest:" in shown.stdout and "STATIC" in shown.stdout, shown.stdout
    assert "tail = \"expert\" with utility = 'makespan' from now on" in shown.stdout
    assert (tmp_path / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert info.tail_plan is not None and info.tail_plan.utility == "fastest"
    assert info.tail_plan.actual_makespan is not None and info.tail_plan.done == info.tail_plan.tasks
    assert f"tail strategy {info.tail_plan.strategy}" in status.stdout and "measured tail" in status.stdout
    expert = [d for d in story.decisions if d.strategy == "tail=expert"]
    assert all("ExPERT N=" in d.why for d in expert)


def test_plan_warns_that_a_bag_past_its_deadline_starts_nothing_whatever_tail_is_applied(tmp_path):
    """Found by the second walkthrough of 2026-11-29: `gridbot plan --apply` on a bag whose DBC placement had
    given up at its deadline (nothing more is started) applied an ExPERT tail without a word, as if it would
    change the bag's end."""
    cluster = grid_cluster(tmp_path)
    try:
        text = ("command = 'sleep 0.5'\ninstance_deadline = 60\nbag_deadline = 10\n"
                "[strategy]\nplacement = \"cost-time\"\nruntime = 0.5\n[parameters]\ni = { from = 0, to = 199 }\n")
        with cluster.client() as c:
            c.submit(parse_spec(text, "late", "late"))
            until("the deadline passed with jobs queued",
                  lambda: any("nothing more is started" in d for d in c.bag("late").diagnostics), timeout=60)
            done = c.bag("late").counts.done
            applied = gridbot("plan", "late", "--apply", "--server", cluster.url, timeout=120)
            c.cancel("late")
    finally:
        cluster.stop()
    assert done >= 3, "enough results to plan from"
    assert applied.returncode == 0, applied.stderr
    assert "warning: bag late: the bag's deadline passed" in applied.stderr, applied.stderr
    assert "no tail strategy starts jobs until then" in applied.stderr
    assert 'tail = "expert"' in applied.stdout, applied.stdout
