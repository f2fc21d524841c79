"""Quorum validation (issue 19, as BOINC projects validate volunteers' results): `quorum = 2` runs each job on
hosts of distinct accounts and accepts a result only when that many agree; trusted pools and hosts with a long
record of valid results count alone (adaptive replication); invalid results count against their hosts."""

from __future__ import annotations

import pytest

from gridbot.core.changes import BagSnapshot
from gridbot.model.pools import PoolSpec
from gridbot.model.records import HostInfo, InstanceReport, Outcome
from gridbot.model.spec import SpecError, parse_spec

from .core_harness import CoreSim


def add(sim: CoreSim, n: int = 1, extra: str = "quorum = 2") -> int:
    spec = parse_spec(f'command = "job {{i}}"\n{extra}\n[parameters]\ni = {{ from = 0, to = {n - 1} }}\n', "t", "q")
    row = sim.store.create_bag(spec, None, {}, 0.0)
    sim.d.add_bag(BagSnapshot(row.bag_id, row.spec, row.counts, row.created_at))
    return row.bag_id


def host(name: str, account: str = "", pool: str = "volunteers") -> HostInfo:
    return HostInfo(f"{name:0<20}"[:20], name, "Linux-x86_64", 1, 1024, 1, pool, account=account)


def ok(iid: int, out: str = "42\n") -> InstanceReport:
    return InstanceReport(iid, Outcome.SUCCESS, 0, 1.0, 1.0, "", out)


def job_state(sim: CoreSim, bag: int) -> str:
    (row,) = sim.store.jobs(bag, None, 10, 0)
    return row.state.value


def story(sim: CoreSim) -> list[tuple[str, str]]:
    return [(d.action, d.why) for d in sim.store.story(1).decisions]


def test_two_agreeing_results_of_two_accounts_make_the_result_and_both_hosts_valid():
    sim = CoreSim()
    bag = add(sim)
    a, b = host("a", "alice"), host("b", "bob")
    (first,) = sim.ask(a, 1, 1.0)
    assert sim.ask(a, 1, 1.1) == [], "never a second copy to the same host"
    (second,) = sim.ask(b, 1, 1.2)
    assert second.job_id == first.job_id
    sim.exchange(a, 0, 2.0, [ok(first.instance_id)])
    assert job_state(sim, bag) == "running", "one result of two: it waits"
    sim.exchange(b, 0, 3.0, [ok(second.instance_id)])
    assert job_state(sim, bag) == "done"
    (row,) = sim.store.jobs(bag, None, 10, 0)
    assert row.result_instance == first.instance_id
    for h in (a, b):
        attrs = sim.d.view.host_attrs(h.host_id, 3.0)
        assert attrs["InvalidRate"] == 0.0 and attrs["ValidStreak"] == 1
    assert [a for a, _ in story(sim)] == ["valid", "valid"]


def test_a_disagreeing_result_gets_a_third_copy_and_is_counted_invalid_never_returned():
    sim = CoreSim()
    bag = add(sim)
    a, b, c = host("a", "alice"), host("b", "bob"), host("c", "carol")
    (i1,) = sim.ask(a, 1, 1.0)
    (i2,) = sim.ask(b, 1, 1.0)
    sim.exchange(a, 0, 2.0, [ok(i1.instance_id, "42\n")])
    sim.exchange(b, 0, 2.0, [ok(i2.instance_id, "41\n")])  # a corrupt result
    assert job_state(sim, bag) == "queued", "no quorum and nothing out: queued for another copy"
    assert sim.ask(a, 1, 3.0) == [] and sim.ask(b, 1, 3.0) == [], "the accounts that voted get no other copy"
    (i3,) = sim.ask(c, 1, 3.0)
    sim.exchange(c, 0, 4.0, [ok(i3.instance_id, "42\n")])
    (row,) = sim.store.jobs(bag, None, 10, 0)
    assert row.state.value == "done" and row.result_instance == i1.instance_id
    assert sim.d.view.host_attrs(b.host_id, 4.0)["InvalidRate"] == 1.0
    assert sim.d.view.host_attrs(c.host_id, 4.0)["InvalidRate"] == 0.0
    actions = dict(story(sim))
    assert actions["invalid"] == f"instance {i2.instance_id} on b: differs from the 2 that agree"


def test_two_hosts_of_one_account_never_vote_twice():
    sim = CoreSim()
    add(sim)
    a1, a2, b = host("a1", "alice"), host("a2", "alice"), host("b", "bob")
    (first,) = sim.ask(a1, 1, 1.0)
    assert sim.ask(a2, 1, 1.1) == [], "the copy never goes to another host of the same account"
    (second,) = sim.ask(b, 1, 1.2)
    assert second.job_id == first.job_id


def test_a_trusted_pool_counts_as_a_quorum_alone():
    sim = CoreSim()
    sim.d.pool_ads = {"cluster": PoolSpec("cluster", "local", trusted=True).ad(),
                      "volunteers": PoolSpec("volunteers", "static").ad()}
    bag = add(sim)
    own = host("own", pool="cluster")
    (i,) = sim.ask(own, 1, 1.0)
    assert sim.ask(host("v", "vic"), 1, 1.1) == [], "no copy queued for a trusted host's instance"
    sim.exchange(own, 0, 2.0, [ok(i.instance_id)])
    assert job_state(sim, bag) == "done"


def test_a_long_record_of_valid_results_gets_single_instances_but_spot_checks():
    sim = CoreSim()
    add(sim, 200, "quorum = 2\nspot_check = 0.25")
    a, b = host("a", "alice"), host("b", "bob")
    # build a's record: ten jobs validated with b
    for t in range(10):
        (x,) = sim.ask(a, 1, 10.0 * t)
        (y,) = sim.ask(b, 1, 10.0 * t + 1)
        assert x.job_id == y.job_id
        sim.exchange(a, 0, 10.0 * t + 2, [ok(x.instance_id)])
        sim.exchange(b, 0, 10.0 * t + 3, [ok(y.instance_id)])
    assert sim.d.view.host_attrs(a.host_id, 200.0)["ValidStreak"] == 10
    single = checked = 0
    for t in range(40):
        (x,) = sim.ask(a, 1, 200.0 + 10 * t)
        view = sim.d.view.bag(1)
        assert view is not None
        if view.waiting_replicas:
            checked += 1
            (copy,) = sim.ask(b, 1, 201.0 + 10 * t)
            assert copy.job_id == x.job_id
            sim.exchange(b, 0, 202.0 + 10 * t, [ok(copy.instance_id)])
        else:
            single += 1
        sim.exchange(a, 0, 203.0 + 10 * t, [ok(x.instance_id)])
    assert 3 <= checked <= 18 and single == 40 - checked, (single, checked)  # about a quarter spot-checked
    (row,) = [r for r in sim.store.jobs(1, None, 100, 0) if r.job_id == x.job_id]
    assert row.state.value == "done" and row.result_instance == x.instance_id


def test_max_instances_fails_a_job_that_never_reaches_its_quorum():
    sim = CoreSim()
    bag = add(sim, 1, "quorum = 2\nmax_instances = 3")
    hosts = [host(n, n) for n in ("a", "b", "c", "d")]
    outs = ["1\n", "2\n", "3\n"]
    for h, out in zip(hosts, outs, strict=False):
        got = sim.ask(h, 1, 1.0)
        assert got, h.name
        sim.exchange(h, 0, 2.0, [ok(got[0].instance_id, out)])
    assert sim.ask(hosts[3], 1, 3.0) == []
    (row,) = sim.store.jobs(bag, None, 10, 0)
    assert row.state.value == "failed" and "no quorum of 2 after 3 instances" in (row.reason or "")


def test_a_failed_copy_is_replaced():
    sim = CoreSim()
    bag = add(sim)
    a, b, c = host("a", "alice"), host("b", "bob"), host("c", "carol")
    (i1,) = sim.ask(a, 1, 1.0)
    (i2,) = sim.ask(b, 1, 1.0)
    sim.exchange(b, 0, 2.0, [InstanceReport(i2.instance_id, Outcome.FAILURE, 1, 1.0, 1.0, "exit code 1")])
    (i3,) = sim.ask(c, 1, 3.0)
    assert i3.job_id == i1.job_id
    sim.exchange(a, 0, 4.0, [ok(i1.instance_id)])
    sim.exchange(c, 0, 5.0, [ok(i3.instance_id)])
    assert job_state(sim, bag) == "done"


@pytest.mark.parametrize(("text", "message"), [
    ("quorum = 0", "'quorum' must be a whole number of agreeing results from 1 to 16, not 0; e.g. quorum = 2"),
    ("quorum = 2\nmax_instances = 1", "'max_instances' = 1 is less than the quorum (2)"),
    ("spot_check = 1.5", "'spot_check' must be a fraction from 0 to 1, not 1.5"),
])
def test_bad_quorum_settings_name_the_fix(text, message):
    with pytest.raises(SpecError) as e:
        parse_spec(f'command = "x"\n{text}', "t", "b")
    assert message in str(e.value)
