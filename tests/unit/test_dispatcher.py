"""The dispatcher on a fake clock: assignment, results, deadlines, lost hosts, failures, cancel, restore.

Each test drives the pure core with a memory store standing in for durability, exactly as the server
does: every Changes batch is applied before the next event.
"""

import msgspec

from gridbot.core.config import DispatchConfig
from gridbot.core.dispatcher import Dispatcher
from gridbot.model.records import HostInfo, InstanceReport, Outcome
from gridbot.model.states import BagState, InstanceState, JobState
from gridbot.schedulers.overlay import HostSlots, PoolCapacity, bag_demands, host_slots, plan
from gridbot.schedulers.registry import factory
from tests.unit.core_harness import CoreSim

A, B = HostInfo("a", "host-a", slots=8), HostInfo("b", "host-b", slots=8)


class Harness(CoreSim):
    """One bag of `n` jobs; `ask` returns the whole answer (assignments, cancels, backoff)."""

    def __init__(self, n=4, max_failures=3, deadline=100, buffer_size=1000, **cfg):
        cfg.setdefault("retry_same_host_after", 0.0)
        super().__init__(buffer_size=buffer_size, **cfg)
        self.bag = self.submit("bag", n, max_failures, deadline)

    def submit(self, name, n, max_failures=3, deadline=100):
        return CoreSim.bag(self, name, n, None, deadline, max_failures)

    def ask(self, host, want, now, reports=()):
        return self.exchange(host, want, now, reports)

    def counts(self, bag=None):
        return self.store.bag(bag or self.bag).counts

    def state(self, bag=None):
        return self.store.bag(bag or self.bag).state


def ok(iid, **kw):
    return InstanceReport(iid, Outcome.SUCCESS, 0, **kw)


def fail(iid, reason="exit code 1"):
    return InstanceReport(iid, Outcome.FAILURE, 1, reason=reason)


def test_jobs_run_once_and_the_bag_completes():
    h = Harness(n=4)
    got = h.ask(A, 3, 1).assignments
    assert [a.command for a in got] == ["job 0", "job 1", "job 2"]
    assert all(a.instance_deadline == 101 for a in got)
    rest = h.ask(A, 3, 2, [ok(a.instance_id) for a in got]).assignments
    assert [a.index for a in rest] == [3]
    answer = h.ask(A, 3, 3, [ok(rest[0].instance_id)])
    assert answer.assignments == [] and answer.backoff == h.d.config.backoff_empty
    c = h.counts()
    assert (c.done, c.instances, c.reruns, c.wasted) == (4, 4, 0, 0)
    assert h.state() is BagState.COMPLETED


def test_deadline_expiry_requeues_and_a_late_result_is_still_accepted():
    h = Harness(n=1, deadline=100)
    first = h.ask(A, 1, 0).assignments[0]
    h.tick(50)
    assert h.counts().running == 1
    h.tick(101)
    assert h.counts().queued == 1 and h.counts().overdue == 1
    assert h.store.instances_of(first.job_id)[0].state is InstanceState.OVERDUE
    h.ask(A, 0, 102, [ok(first.instance_id)])  # the late result arrives before anyone picked the job again
    assert h.state() is BagState.COMPLETED
    assert h.store.jobs(h.bag)[0].result_instance == first.instance_id


def test_a_host_still_running_an_overdue_instance_counts_its_slot_busy_for_the_overlay():
    # the overlay sizes its pilots from the hosts' idle slots: a straggler's slot is not idle, or the job
    # re-queued because of it would wait for a pilot that is never submitted
    one = HostInfo("s", "host-s", slots=1)
    h = Harness(n=1, deadline=100)
    first = h.ask(one, 1, 0).assignments[0]
    h.tick(101)
    assert h.counts().queued == 1
    h.ask(one, 0, 102)  # still running it, past its deadline
    assert host_slots(h.d.view, 103)[one.pool] == HostSlots(1, 0, (0,))
    h.ask(one, 0, 104, [ok(first.instance_id)])  # it ended: the slot is free again
    assert host_slots(h.d.view, 105)[one.pool] == HostSlots(0, 1, (1,))


def test_a_bags_concurrency_counts_the_instances_the_server_has_on_the_host_not_the_overdue_ones():
    # what a host may be sent is as it was: the overdue instance it still runs is no longer the bag's there
    one = HostInfo("s", "host-s", slots=1)
    h = Harness(n=3, deadline=100)
    h.ask(one, 1, 0)
    h.tick(101)
    assert len(h.ask(one, 2, 102).assignments) == 2, "the default Concurrency, two per slot"


def test_a_bags_policy_diagnostics_outlive_it():
    # a Deadline negative on every host falls back to the bag's instance_deadline: `gridbot status` of the
    # finished bag, and the simulator's report of it, must still say so
    h = CoreSim()
    bag = h.bag("neg", 1, {"Deadline": "Host.Slots > 100 ? 3600 : -5"}, deadline=100)
    [a] = h.ask(A, 1, 0)
    assert a.instance_deadline == 100
    h.ask(A, 0, 1, [ok(a.instance_id)])
    assert h.store.bag(bag).state is BagState.COMPLETED
    [note] = h.d.diagnostics(bag, 2)
    assert note.startswith("Deadline evaluated to not a positive number of seconds: -5 1 time(s) (last on host host-a)")
    assert "the bag's instance_deadline (100 s) counted instead" in note
    plain = h.bag("plain", 1)
    [b] = h.ask(A, 1, 3)
    h.ask(A, 0, 4, [ok(b.instance_id)])
    assert h.d.diagnostics(plain, 5) == []


def _timed(h: CoreSim, name: str, timeout: float, policy: dict[str, str] | None = None) -> int:
    """A bag of two jobs with `timeout` and an instance_deadline of 100 s."""
    from gridbot.core.changes import BagSnapshot
    from gridbot.model.spec import parse_spec

    spec = parse_spec(f'command = "job {{i}}"\ntimeout = {timeout}\ninstance_deadline = 100\n'
                      '[parameters]\ni = { from = 0, to = 1 }\n', "t", name)
    row = h.store.create_bag(msgspec.structs.replace(spec, policy=policy or {}), None, {}, 0.0)
    h.d.add_bag(BagSnapshot(row.bag_id, row.spec, row.counts, row.created_at))
    return row.bag_id


def test_a_timeout_longer_than_the_instance_deadline_is_said_in_the_bags_diagnostics():
    """Found by the bad-input hunt: `timeout = "2d"` with the default instance_deadline of a day was accepted
    without a word, and the server counts every such instance lost at its deadline, and sends its job again,
    before the worker's timeout could end it. Still accepted (a spec may mean it), but said, even of the ended
    bag; nothing of a timeout no longer than the deadline."""
    h = CoreSim()
    bag = _timed(h, "long", 200)
    [note] = h.d.diagnostics(bag, 0)
    assert note.startswith("its timeout (200 s) is longer than its instance_deadline (100 s): the server counts an "
                           "instance lost at its deadline and sends its job again before the worker's timeout"), note
    assert "raise instance_deadline (or the Deadline policy) to at least the timeout, or lower the timeout" in note
    for a in h.ask(A, 2, 1):
        h.ask(A, 0, 2, [ok(a.instance_id)])
    assert h.store.bag(bag).state is BagState.COMPLETED and h.d.diagnostics(bag, 3) == [note]
    constant = _timed(h, "constant", 80, {"Deadline": "50"})
    assert "than its Deadline policy (50 s)" in h.d.diagnostics(constant, 4)[0]
    for fine in (_timed(h, "same", 100), _timed(h, "short", 50), _timed(h, "longer", 80, {"Deadline": "90"})):
        assert h.d.diagnostics(fine, 4) == []


def test_a_deadline_policy_shorter_than_the_timeout_on_some_hosts_is_said_once_instances_go():
    h = CoreSim()
    bag = _timed(h, "expr", 80, {"Deadline": "Host.Slots > 100 ? 3600 : 50"})
    assert h.d.diagnostics(bag, 0) == [], "an expression: nothing known before an instance goes"
    h.ask(A, 2, 1)
    [note] = h.d.diagnostics(bag, 2)
    assert note.startswith("its timeout (80 s) is longer than the deadline 2 of its instances were sent with (the "
                           "last: 50 s, on host host-a): the server counts an instance lost"), note
    h.d.set_policy(bag, msgspec.structs.replace(h.store.bag(bag).spec, policy={"Deadline": "3600"}), 3)
    assert h.d.diagnostics(bag, 4) == [], "a new Deadline policy: counted again"


def test_late_result_after_replacement_wins_and_the_replacement_is_cancelled():
    h = Harness(n=1, deadline=100)
    first = h.ask(A, 1, 0).assignments[0]
    h.tick(101)
    second = h.ask(B, 1, 102).assignments[0]
    assert second.job_id == first.job_id and second.instance_id != first.instance_id
    h.ask(A, 0, 103, [ok(first.instance_id)])
    assert h.state() is BagState.COMPLETED
    answer = h.ask(B, 1, 104)
    assert answer.cancel == [second.instance_id]
    states = [i.state for i in h.store.instances_of(first.job_id)]
    assert states == [InstanceState.DONE, InstanceState.CANCELLED]


def test_second_good_result_is_recorded_as_waste():
    h = Harness(n=1, deadline=100)
    h.ask(A, 1, 0)
    h.tick(101)
    second = h.ask(B, 1, 102).assignments[0]
    h.ask(B, 0, 103, [ok(second.instance_id)])
    h.submit("other", 1)  # keep the dispatcher busy so the first instance's bag is still known
    assert h.state() is BagState.COMPLETED
    c = h.counts()
    assert (c.done, c.reruns, c.instances) == (1, 1, 2)


def test_waste_while_the_bag_is_still_active():
    h = Harness(n=2, deadline=100)
    a0, _ = h.ask(A, 2, 0).assignments
    h.tick(101)
    b0, _ = h.ask(B, 2, 102).assignments
    h.ask(B, 0, 103, [ok(b0.instance_id)])
    h.ask(A, 0, 104, [ok(a0.instance_id)])  # a0 is overdue and its job already done: waste
    assert h.counts().wasted == 1 and h.counts().done == 1
    assert [i.state for i in h.store.instances_of(a0.job_id)] == [InstanceState.WASTED, InstanceState.DONE]


def test_a_job_failing_k_times_fails_for_good_with_its_last_reason():
    h = Harness(n=1, max_failures=3)
    reason = ""
    for t in range(3):
        a = h.ask(A, 1, t).assignments[0]
        reason = f"exit code {t + 1}: boom"
        h.ask(A, 0, t + 0.5, [fail(a.instance_id, reason)])
    job = h.store.jobs(h.bag)[0]
    assert job.state is JobState.FAILED and job.failures == 3 and job.attempts == 3
    assert job.reason == "failed 3 times; last: exit code 3: boom"
    assert h.state() is BagState.FAILED


def test_interruption_gives_the_job_back_without_counting_a_failure():
    h = Harness(n=1, max_failures=1)
    a = h.ask(A, 1, 0).assignments[0]
    h.ask(A, 0, 1, [InstanceReport(a.instance_id, Outcome.INTERRUPTED, reason="the worker stopped")])
    job = h.store.jobs(h.bag)[0]
    assert job.state is JobState.QUEUED and job.failures == 0
    b = h.ask(B, 1, 2).assignments[0]
    assert b.job_id == a.job_id


def test_instances_the_host_no_longer_has_are_lost():
    h = Harness(n=2)
    got = h.ask(A, 2, 0).assignments
    h.ask(A, 0, 0.5)  # the host lists them as held: they reached it
    h.held["a"] = set()  # the worker restarted: it runs nothing
    answer = h.ask(A, 1, 1)
    assert h.counts().reruns == 1 and h.counts().failed == 0
    assert h.store.instances_of(got[0].job_id)[0].reason.startswith("lost by host host-a")
    assert answer.assignments[0].job_id == got[0].job_id


def test_instances_whose_answer_never_reached_the_host_are_given_back_without_blame():
    """Issue 12: a server killed after committing an answer, or an answer lost on the network, left the
    host charged with a failure for instances it never received."""
    h = Harness(n=2)
    run = msgspec.structs.replace(A, session="run-1")
    got = h.ask(run, 2, 0).assignments
    h.held["a"] = set()  # the answer carrying them never arrived
    answer = h.ask(run, 2, 1)
    first = h.store.instances_of(got[0].job_id)[0]
    assert first.state is InstanceState.INTERRUPTED and "never reached its host" in first.reason
    assert h.d.view.host("a").stats.failed == 0 and h.counts().failed == 0
    assert sorted(a.job_id for a in answer.assignments) == sorted(a.job_id for a in got)


def test_silent_host_loses_its_instances():
    h = Harness(n=1, host_timeout=60)
    a = h.ask(A, 1, 0).assignments[0]
    h.tick(30)
    assert h.counts().running == 1
    h.tick(61)
    assert h.counts().queued == 1
    assert "silent for 61 s" in h.store.instances_of(a.job_id)[0].reason


def test_result_over_the_size_limit_fails_the_instance():
    h = Harness(n=1, max_result_bytes=10)
    a = h.ask(A, 1, 0).assignments[0]
    h.ask(A, 0, 1, [ok(a.instance_id, outputs={"big": b"x" * 11})])
    inst = h.store.instances_of(a.job_id)[0]
    assert inst.state is InstanceState.FAILED and "over the server's limit of 10 bytes" in inst.reason


def test_duplicate_and_foreign_reports_are_ignored():
    h = Harness(n=2)
    a0, _ = h.ask(A, 2, 0).assignments
    h.ask(B, 0, 1, [ok(a0.instance_id)])  # B does not run a0
    assert h.counts().done == 0
    h.ask(A, 0, 2, [ok(a0.instance_id)])
    h.ask(A, 0, 3, [ok(a0.instance_id)])  # retried after a lost answer
    c = h.counts()
    assert (c.done, c.wasted, c.running) == (1, 0, 1)


def test_cancel_bag_cancels_queued_and_running_jobs():
    h = Harness(n=5, buffer_size=2)
    running = h.ask(A, 1, 0).assignments[0]
    h.store.apply(h.d.cancel_bag(h.bag, 1))
    c = h.counts()
    assert h.state() is BagState.CANCELLED and (c.cancelled, c.queued, c.running) == (5, 0, 0)
    assert {j.state for j in h.store.jobs(h.bag)} == {JobState.CANCELLED}
    assert h.ask(A, 1, 2).cancel == [running.instance_id]


def test_each_of_n_bags_gets_its_share_of_the_buffer():
    h = Harness(n=1000, buffer_size=100)
    other = h.submit("other", 1000)
    h.feed()
    assert {b: h.d.view.bag(b).window for b in (h.bag, other)} == {h.bag: 50, other: 50}


def test_the_window_refills_from_the_store_until_every_job_ran():
    h = Harness(n=250, buffer_size=40)
    seen = []
    t = 0.0
    pending = []
    while h.state() is BagState.ACTIVE:
        t += 1
        got = h.ask(A, 7, t, [ok(i) for i in pending]).assignments
        pending = [a.instance_id for a in got]
        seen += [a.index for a in got]
    assert sorted(seen) == list(range(250))


def test_restore_resumes_where_the_store_left_off():
    h = Harness(n=6, deadline=100)
    got = h.ask(A, 3, 0).assignments
    h.ask(A, 0, 1, [ok(got[0].instance_id)])
    h.tick(101)  # the two others become overdue
    d2 = Dispatcher(DispatchConfig(check_invariants=True), factory())
    d2.restore(h.store.snapshot())
    h.d = d2
    h.held["a"] = set()
    new = h.ask(B, 10, 102).assignments
    assert sorted(a.index for a in new) == [1, 2, 3, 4, 5]
    assert min(a.instance_id for a in new) > max(a.instance_id for a in got)
    h.ask(A, 0, 103, [ok(got[1].instance_id)])  # a late result of an overdue instance, after the restart
    h.ask(B, 0, 104, [ok(a.instance_id) for a in new])
    c = h.counts()
    assert h.state() is BagState.COMPLETED and (c.done, c.wasted, c.reruns) == (6, 0, 2)
    assert h.store.jobs(h.bag)[1].result_instance == got[1].instance_id  # the late result won


def test_a_requeued_job_avoids_the_host_it_failed_on_for_a_while():
    h = Harness(n=2, retry_same_host_after=60)
    h.ask(B, 0, 0)
    a = h.ask(A, 1, 0).assignments[0]
    nxt = h.ask(A, 1, 1, [fail(a.instance_id)]).assignments
    assert [x.index for x in nxt] == [1], "A gets the other job, not the one it just failed"
    assert [x.job_id for x in h.ask(B, 1, 2).assignments] == [a.job_id], "B gets the failed one"
    h2 = Harness(n=1, retry_same_host_after=60)
    a = h2.ask(A, 1, 0).assignments[0]
    h2.ask(B, 0, 0)  # B is alive and has not failed the job
    assert h2.ask(A, 1, 1, [fail(a.instance_id)]).assignments == []
    b = h2.ask(B, 1, 2).assignments[0]
    again = h2.ask(B, 1, 3, [fail(b.instance_id)]).assignments
    assert [x.job_id for x in again] == [a.job_id], "every live host has failed it: retried at once"


def test_an_idle_host_is_told_to_wait_longer_each_time_up_to_the_cap():
    h = CoreSim()
    h.bag("b", 1)
    busy, idle = HostInfo("busy", "busy"), HostInfo("idle", "idle")
    assert len(h.ask(busy, 1, 0.0)) == 1  # the only job is out: bags are active, nothing is queued
    waits = [h.exchange(idle, 1, 1.0 + i).backoff for i in range(5)]
    cfg = h.d.config
    assert waits == [cfg.backoff_idle, 2 * cfg.backoff_idle, cfg.backoff_max, cfg.backoff_max, cfg.backoff_max]


def test_the_servers_own_absence_is_not_blamed_on_hosts():
    """Issue 12: a pause of the server (SIGSTOP, a blocked loop) longer than the host timeout, or a restart
    after it, must not charge hosts with silence nor instances with their deadline."""
    sim = CoreSim(host_timeout=60)
    sim.bag("b", 2, deadline=100)
    h = HostInfo("h1", "h1", "Linux", 2, 0, 2, "local")
    assert len(sim.ask(h, 2, 0.0)) == 2
    sim.d.shift(500.0)  # the server was stopped from t=10 to t=510
    sim.tick(510.0)
    assert sim.d.view.bag(1).running == 2 and sim.d.view.host("h1").stats.failed == 0
    sim.tick(570.0)  # 60 s after the pause ended, with no word from the host: now it is silent
    assert sim.d.view.bag(1).running == 0


def test_a_restarted_server_gives_every_host_the_host_timeout_to_come_back():
    sim = CoreSim(host_timeout=60)
    sim.bag("b", 1, deadline=100)
    h = HostInfo("h1", "h1", "Linux", 1, 0, 1, "local")
    assert len(sim.ask(h, 1, 0.0)) == 1
    restarted = Dispatcher(DispatchConfig(check_invariants=True, host_timeout=60), factory())
    restarted.restore(sim.store.snapshot())
    restarted.grace(1_000.0)  # down from t=0 to t=1000: past the host timeout and the instance deadline
    sim.store.apply(restarted.tick(1_001.0))
    assert restarted.view.bag(1).running == 1, "nobody is blamed for the server's downtime"
    sim.store.apply(restarted.tick(1_061.0))
    assert restarted.view.bag(1).running == 0, "a host silent for the timeout after the restart is lost"


def test_a_restarted_worker_that_did_not_list_its_instances_lost_them():
    """The other side of the rule above: a new worker run (another session) lost what the old one held."""
    h = Harness(n=2)
    got = h.ask(msgspec.structs.replace(A, session="run-1"), 2, 0).assignments
    h.held["a"] = set()
    h.ask(msgspec.structs.replace(A, session="run-2"), 0, 1)
    assert h.store.instances_of(got[0].job_id)[0].state is InstanceState.OVERDUE


def test_a_host_every_bag_with_work_refuses_is_told_so_and_no_other():
    """`WorkAnswer.refused` is GridBot's cue for a pilot to leave (section 5): only when every bag with work
    waiting refuses the host and no bag with jobs running would take it, never when the work is merely out, or
    waits for another reason."""
    h = CoreSim(retry_same_host_after=60)
    small, big = HostInfo("small", "small", memory_mb=1_000), HostInfo("big", "big", memory_mb=64_000)
    h.bag("wide", 2, {"JobRequirements": "Host.Memory > 32000"})
    answer = h.exchange(small, 1, 0.0)
    assert answer.assignments == [] and answer.refused, "the only bag with work refuses it"
    h.bag("any", 1)
    answer = h.exchange(small, 1, 1.0)
    assert len(answer.assignments) == 1 and not answer.refused, "a second bag takes it"
    answer = h.exchange(HostInfo("small2", "small2", memory_mb=1_000), 1, 1.5)
    assert answer.assignments == [] and not answer.refused, "the second bag's job runs: a retry of it could go here"
    assert not h.exchange(small, 0, 2.0).refused, "it asked for nothing: nothing was refused"
    first = h.ask(big, 1, 3.0)[0]
    h.ask(big, 0, 4.0, [InstanceReport(first.instance_id, Outcome.FAILURE, 1, 1.0, 1.0, "exit code 1")])
    assert [a.index for a in h.ask(big, 1, 5.0)] == [1]
    h.finish_all(big, 6.0)
    answer = h.exchange(big, 1, 7.0)
    assert answer.assignments == [] and not answer.refused, "its bag accepts it: the job it failed waits a while"
    h.finish_all(small, 8.0)
    assert [a.index for a in h.ask(HostInfo("other", "other", memory_mb=64_000), 1, 9.0)] == [0]
    answer = h.exchange(small, 1, 10.0)
    assert answer.assignments == [] and not answer.refused, "nothing waits: idle, not refused"


def test_a_pool_whose_pilots_a_bag_keeps_refusing_gets_its_pilots_one_at_a_time_and_later_each_time():
    """After `refused_pilots` of a pool's pilots in a row left refused by a bag, the overlay's demand gives the bag
    none of the pool's pilots until `refused_backoff` is over, then one, the wait doubled after each one refused;
    the pool's other pilots (already on their way) count but do not lengthen it; a host of the pool the bag
    takes, or a change of its policies, ends it. Without it a pool on which no machine suits the bag starts
    pilot after pilot, each leaving at once."""
    h = CoreSim(refused_pilots=3, refused_backoff=60)
    h.d.pool_ads = {"grid": {"Name": "grid", "Kind": "grid"}, "cloud": {"Name": "cloud", "Kind": "ec2"}}
    bag = h.bag("big", 5, {"JobRequirements": "Host.Memory > 32000"})

    def pilot(n: int, memory: int = 1_000, session: str = "") -> HostInfo:
        return HostInfo(f"m{n}", f"m{n}", memory_mb=memory, pool="grid", session=session or f"run-{n}")

    def demand(now: float) -> set[tuple[frozenset[str], int]]:
        return {(d.pools, d.slots) for d in bag_demands(h.d.view, ["grid", "cloud"], now)}

    assert demand(0.0) == {(frozenset({"grid", "cloud"}), 5)}
    for n, now in ((0, 1.0), (0, 2.0), (0, 3.0), (1, 4.0)):  # a worker asking again in the same run counts once
        assert h.exchange(pilot(n), 1, now).refused
    assert h.d.view.held_back(bag, 5.0) == {}
    assert h.exchange(pilot(0, session="run-0b"), 1, 10.0).refused, "a new pilot on a machine seen before counts"
    assert h.d.view.held_back(bag, 10.0) == {"grid": True}
    assert demand(10.0) == {(frozenset({"cloud"}), 5)}, "no pilot of the held pool: the others take the demand"
    assert h.exchange(pilot(2), 1, 30.0).refused  # a pilot already on its way
    assert h.d.view.held_back(bag, 69.9) == {"grid": True}, "a pilot on its way does not lengthen the wait"
    assert demand(70.0) == {(frozenset({"cloud"}), 5), (frozenset({"grid"}), 1)}, "one pilot, once it is due"
    assert h.exchange(pilot(3), 1, 100.0).refused
    assert h.d.view.held_back(bag, 219.9) == {"grid": True} and h.d.view.held_back(bag, 220.0) == {"grid": False}, \
        "the wait doubled"
    [sent] = h.ask(pilot(4, memory=64_000), 1, 230.0)
    assert sent.bag_id == bag and h.d.view.held_back(bag, 230.0) == {}, "a host of the pool that the bag takes"
    assert demand(230.0) == {(frozenset({"grid", "cloud"}), 4)}

    for n in range(5, 8):
        assert h.exchange(pilot(n), 1, 240.0 + n).refused
    assert h.d.view.held_back(bag, 250.0) == {"grid": True}
    view = h.d.view.bag(bag)
    assert view is not None
    h.d.set_policy(bag, msgspec.structs.replace(view.spec, policy={"JobRequirements": "Host.Memory > 500"}), 251.0)
    assert h.d.view.held_back(bag, 251.0) == {}, "new policies: the pool's pilots are sent again at once"


def test_a_pool_held_back_for_one_bag_is_not_for_another_and_its_status_says_why():
    """The hold is the bag's: a second bag with work that takes the pool's hosts gets its pilots (and, taking the
    hosts, no pilot is refused any more); the held bag's diagnostics name the pool and what refused it."""
    h = CoreSim(refused_pilots=2, refused_backoff=60)
    h.d.pool_ads = {"grid": {"Name": "grid", "Kind": "grid"}}
    big = h.bag("big", 3, {"JobRequirements": "Host.Memory > 32000 && Host.NumCpus > 0"})
    for n in range(2):
        assert h.exchange(HostInfo(f"m{n}", f"m{n}", memory_mb=1_000, pool="grid", session="s"), 1, float(n)).refused
    assert h.d.view.held_back(big, 20.0) == {"grid": True}
    said = " ".join(h.d.diagnostics(big, 20.0))
    assert "pool grid" in said and "2 of its pilots in a row" in said and "Host.Memory > 32000" in said, said
    small = h.bag("small", 3)
    assert {(d.bag_id, d.pools) for d in bag_demands(h.d.view, ["grid"], 21.0)} == {(small, frozenset({"grid"}))}
    answer = h.exchange(HostInfo("m9", "m9", memory_mb=1_000, pool="grid", session="s"), 1, 22.0)
    assert len(answer.assignments) == 1 and not answer.refused
    assert h.d.view.held_back(big, 22.0) == {"grid": True}, "the small bag's host says nothing of the big bag's"


def test_a_bag_with_only_replicas_waiting_holds_back_the_pool_its_hosts_refuse_and_its_queued_pilots_go():
    """In a bag's tail nothing is queued but replicas wait, and the overlay still asks pilots for them: those a
    bag refuses count as well. Held back, the pool's queued pilots that nobody else wants are cancelled."""
    h = CoreSim(refused_pilots=2, refused_backoff=60)
    h.d.pool_ads = {"grid": {"Name": "grid", "Kind": "grid"}}
    bag = h.bag("tail", 1, {"ReplicationRequirements": "true", "Concurrency": "1",
                            "JobRequirements": "Host.Memory > 32000"})
    assert h.ask(HostInfo("big", "big", memory_mb=64_000, pool="grid", session="s"), 1, 0.0)
    h.tick(1.0)
    view = h.d.view.bag(bag)
    assert view is not None and view.queued == 0 and view.waiting_replicas == 1
    for n in range(2):
        assert h.exchange(HostInfo(f"m{n}", f"m{n}", memory_mb=1_000, pool="grid", session="s"), 1, 2.0 + n).refused
    assert h.d.view.held_back(bag, 10.0) == {"grid": True}
    demands = bag_demands(h.d.view, ["grid"], 10.0)
    assert demands == []
    grid = PoolCapacity("grid", spare_slots=3, queued_pilots=3, new_pilots=7, pilot_slots=1)
    assert plan(demands, [grid]).cancel == {"grid": 3}, "the held pool's queued pilots are cancelled"
    assert plan(bag_demands(h.d.view, ["grid"], 70.0), [grid]).cancel == {"grid": 2}, \
        "when one is due, a queued pilot is kept for it and none is submitted"


def test_a_pool_whose_hosts_come_by_themselves_is_never_held_back():
    """Volunteers (and a static pool's hosts) are not started by the overlay: refusing them holds nothing back."""
    h = CoreSim(refused_pilots=1, refused_backoff=60)
    h.d.pool_ads = {"boinc": {"Name": "boinc", "Kind": "volunteer"},
                    "sim": {"Name": "sim", "Kind": "community"}}
    bag = h.bag("big", 2, {"JobRequirements": "Host.Memory > 32000"})
    for n, pool in enumerate(("boinc", "sim")):
        assert h.exchange(HostInfo(f"v{n}", f"v{n}", memory_mb=1_000, pool=pool, session="s"), 1, float(n)).refused
    assert h.d.view.held_back(bag, 5.0) == {}


def test_a_success_without_a_declared_output_fails_its_job():
    """The server fails a success that lacks a declared output: it took the host's word before (review of
    2026-12-07). The output named by the job's own parameters counts, and the job runs again."""
    import msgspec as _msgspec

    from gridbot.core.changes import BagSnapshot
    from gridbot.model.spec import parse_spec

    h = CoreSim(retry_same_host_after=0.0)
    spec = parse_spec('command = "job {i}"\ninstance_deadline = 100\nmax_failures = 3\noutputs = ["o_{i}.txt"]\n'
                      '[parameters]\ni = [0, 1]\n', "t", "outs")
    row = h.store.create_bag(_msgspec.structs.replace(spec), None, {}, 0.0)
    h.d.add_bag(BagSnapshot(row.bag_id, row.spec, row.counts, row.created_at))
    first, second = h.ask(A, 2, 0)
    h.ask(A, 0, 1, [ok(first.instance_id), ok(second.instance_id, outputs={"o_1.txt": b"1"})])
    jobs = h.store.jobs(row.bag_id)
    assert [j.state for j in jobs] == [JobState.QUEUED, JobState.DONE], jobs
    assert "without the declared output 'o_0.txt'" in h.store.instances_of(first.job_id)[0].reason
    again = h.ask(B, 1, 2)[0]
    assert again.job_id == first.job_id
    h.ask(B, 0, 3, [ok(again.instance_id, outputs={"o_0.txt": b"0"})])
    states = [i.state for i in h.store.instances_of(first.job_id)]
    assert states == [InstanceState.FAILED, InstanceState.DONE], states
    assert h.store.bag(row.bag_id).state is BagState.COMPLETED
