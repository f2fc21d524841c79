"""A host's pacing (issue 13): what it asks for, when it talks, when it leaves; and how the server answers
an idle host. Pure: the time and the random draws are given."""

from __future__ import annotations

import math

import pytest

from gridbot.model.pacing import LONG_POLL_S, PREFETCH_MAX, REPORT_DELAY, PaceConfig, Pacing, server_hold


def low(a: float, b: float) -> float:
    return a


def high(a: float, b: float) -> float:
    return b


def started(now: float = 100.0, **config: float) -> Pacing:
    pacing = Pacing(PaceConfig(**config))
    pacing.begin(now)
    return pacing


def test_a_new_host_talks_at_once_and_asks_for_its_slots_and_prefetch():
    step = started(slots=4, prefetch=6).step(100.0, 0, 0, None)
    assert step == (10, 6, 100.0, False)


def test_the_prefetch_follows_the_run_time_of_the_instances_within_bounds():
    pacing = started(slots=2, prefetch=1, prefetch_seconds=1.0)
    assert pacing.prefetch() == 1, "nothing run yet: the configured prefetch"
    pacing.ran(0.1)
    assert pacing.prefetch() == 20, "two slots, 1 s of work of 0.1 s jobs"
    assert pacing.step(100.0, 0, 0, None).want == 22
    pacing.ran(0.011)
    assert pacing.avg_wall == pytest.approx(0.9 * 0.1 + 0.1 * 0.011), "a moving average"
    pacing.avg_wall = 0.0001
    assert pacing.prefetch() == PREFETCH_MAX
    pacing.avg_wall = 600.0
    assert pacing.prefetch() == 1, "long jobs: one at a time beyond the slots, never less than asked"
    assert started(slots=2, prefetch=3).prefetch() == 3, "no prefetch_seconds: the run time does not matter"


def test_an_empty_answer_makes_it_wait_the_backoff_with_jitter():
    pacing = started(slots=1)
    pacing.answered(100.0, 1, 0, 4.0, 15.0, low)
    assert pacing.step(100.0, 0, 0, None).at == 102.0
    pacing.answered(102.0, 1, 0, 4.0, 15.0, high)
    assert pacing.step(102.0, 0, 0, None).at == 108.0
    pacing.answered(108.0, 1, 1, 0.0, 15.0, high)
    assert pacing.step(108.0, 0, 0, None).at == 108.0, "work came: it asks for more at once"


def test_a_boinc_client_doubles_its_own_backoff_up_to_its_cap():
    pacing = started(slots=1, backoff_cap=20.0)
    waits = []
    for _ in range(5):
        pacing.answered(0.0, 1, 0, 3.0, 1e9, high)
        waits.append(pacing.next_talk)
    assert waits == [3.0, 6.0, 12.0, 20.0, 20.0]
    pacing.answered(0.0, 1, 1, 0.0, 1e9, high)
    pacing.answered(0.0, 1, 0, 3.0, 1e9, high)
    assert pacing.next_talk == 3.0, "work resets it"


def test_a_busy_host_asks_again_when_a_slot_is_idle_or_half_its_prefetch_is_gone():
    pacing = started(slots=2, prefetch=6)
    pacing.answered(100.0, 8, 8, 0.0, 15.0, low)
    assert pacing.step(101.0, 2, 6, None).at == 115.0, "full: only the heartbeat"
    assert pacing.step(101.0, 2, 4, None).at == 115.0, "2 of 6 prefetched gone: not yet"
    assert pacing.step(101.0, 2, 3, None) == (3, 6, 101.0, False)
    assert pacing.step(101.0, 1, 0, None).at == 101.0, "a slot is idle"
    pacing.answered(101.0, 7, 0, 4.0, 15.0, low)
    assert pacing.step(101.0, 1, 0, None).at == 103.0, "after an empty answer, not before its backoff"


def test_a_result_goes_at_once_unless_work_waits_here_then_it_waits_for_company():
    pacing = started(slots=1, prefetch=9)
    pacing.answered(100.0, 10, 10, 0.0, 15.0, low)
    assert pacing.step(110.0, 1, 8, 109.5).at == 109.5 + REPORT_DELAY
    assert pacing.step(110.0, 0, 0, 109.5).at == 110.0, "the tail: nothing waits, it reports at once"


def test_it_leaves_after_idle_timeout_holding_and_reporting_nothing():
    pacing = started(slots=1, idle_timeout=120.0)
    pacing.answered(100.0, 1, 0, 10.0, 15.0, low)
    assert not pacing.step(220.0, 0, 0, None).leave
    step = pacing.step(220.5, 0, 0, None)
    assert step.leave and step.at == math.inf
    pacing = started(slots=1, idle_timeout=120.0)
    pacing.step(200.0, 1, 0, None)
    assert not pacing.step(320.0, 0, 0, None).leave, "it held work at 200"
    pacing.step(330.0, 0, 0, 329.0)
    assert not pacing.step(450.0, 0, 0, None).leave, "it had a result to report at 330"
    pacing.answered(455.0, 1, 1, 0.0, 15.0, low)
    assert not pacing.step(575.0, 0, 0, None).leave, "it was sent work at 455 (cancelled since)"
    assert started(slots=1).step(1e9, 0, 0, None).leave is False, "idle_timeout 0: never"


@pytest.mark.parametrize(("args", "hold"), [
    ((1, 0, 0, 0, 0, 4.0), 4.0),  # an idle host asks and gets nothing: held for the backoff
    ((1, 0, 0, 0, 0, 100.0), LONG_POLL_S),
    ((1, 0, 3, 0, 0, 4.0), 0.0),  # it handed in its last results: asks again at once
    ((1, 0, 0, 0, 1, 4.0), 0.0),
    ((1, 2, 0, 0, 0, 4.0), None),  # it holds work: answered as decided
    ((1, 0, 0, 1, 0, 0.0), None),  # it got work
    ((0, 0, 0, 0, 0, 4.0), None),  # it asked for nothing
    ((1, 0, 0, 0, 0, 0.0), None),
])
def test_the_server_holds_an_idle_hosts_request(args, hold):
    assert server_hold(*args) == hold


def test_a_host_refused_by_every_bag_leaves_once_it_holds_nothing():
    """GridBot's pilot suicide (section 5): told that no bag with work waiting accepts it, a pilot leaves at
    once rather than idle until its idle timeout in a slot the overlay counts as spare."""
    pacing = started(slots=2, idle_timeout=1800.0, leave_refused=True)
    pacing.answered(100.0, 1, 0, 4.0, 15.0, low, refused=True)
    assert pacing.refused
    assert not pacing.step(101.0, 1, 0, None).leave, "it still runs a job"
    assert not pacing.step(102.0, 0, 0, 101.5).leave, "it has that job's result to report"
    step = pacing.step(103.0, 0, 0, None)
    assert step.leave and step.at == math.inf
    pacing.answered(104.0, 1, 1, 0.0, 15.0, low, refused=True)
    assert not pacing.refused, "an answer that sends work is no refusal"
    assert not pacing.step(105.0, 0, 0, None).leave
    keep = started(slots=1, leave_refused=True)
    keep.answered(100.0, 1, 0, 4.0, 15.0, low, refused=True)
    assert not keep.step(101.0, 0, 0, None).leave, "idle_timeout 0: a host that never leaves stays"
    by_hand = started(slots=1, idle_timeout=1800.0)
    by_hand.answered(100.0, 1, 0, 4.0, 15.0, low, refused=True)
    assert not by_hand.step(101.0, 0, 0, None).leave, "a worker started by hand waits for its idle timeout"
    assert by_hand.step(1901.0, 0, 0, None).leave


def test_the_server_answers_a_refused_host_at_once_so_it_can_leave():
    assert server_hold(1, 0, 0, 0, 0, 4.0) == 4.0
    assert server_hold(1, 0, 0, 0, 0, 4.0, refused=True) is None
