"""Issue 19: a host's measured speed (a BOINC client's benchmark, `p_fpops`) is `Host.Speed` in the policies, and
`gridbot hosts` shows it."""

from __future__ import annotations

from gridbot.model.records import HostInfo
from gridbot.protocol import HostInfoRow
from tests.unit.core_harness import CoreSim


def test_a_policy_can_require_and_rank_by_the_hosts_measured_speed():
    sim = CoreSim()
    sim.bag("fast-only", 4, {"JobRequirements": "Host.Speed >= 4"})
    slow = HostInfo("slow", "slow", "Linux", 2, 0, 2, "volunteers", speed=2.5)
    fast = HostInfo("fast", "fast", "Linux", 2, 0, 2, "volunteers", speed=6.0)
    unknown = HostInfo("worker", "worker", "Linux", 2, 0, 2, "local")
    assert sim.ask(slow, 2, 1.0) == [] and sim.ask(unknown, 2, 1.0) == [], "0 where unknown, 2.5 too slow"
    assert len(sim.ask(fast, 2, 1.0)) == 2
    assert sim.d.view.host_attrs("fast", 1.0)["Speed"] == 6.0


def test_gridbot_hosts_shows_a_speed_column_only_where_one_is_known():
    from rich.console import Console

    from gridbot.cli.render import hosts_table

    row = HostInfoRow("boinc-3", "pc", "volunteers", 4, 0.0, 0.0, 5, 0, speed=3.25, valid=4, invalid=1,
                      invalid_rate=0.2)
    console = Console(width=200)
    with console.capture() as cap:
        console.print(hosts_table([row]))
    out = cap.get()
    assert "GFLOPS" in out and "3.25" in out and "1 of 5 (20%)" in out, out
    plain = HostInfoRow("abc", "w", "local", 2, 0.0, 0.0, 1, 0)
    with console.capture() as cap:
        console.print(hosts_table([plain]))
    assert "GFLOPS" not in cap.get() and "INVALID" not in cap.get()
