"""ExPERT offline (issue 15): history files, the characterization of a run that is over, a pinned strategy on the
pools there are, the user's T_r, and the estimator's first-come-first-served reliable queue."""

from __future__ import annotations

import numpy as np
import pytest

from gridbot import history
from gridbot.model.states import InstanceState
from gridbot.schedulers.expert.characterize import Characterization, InstanceRecord, from_history
from gridbot.schedulers.expert.estimate import Setup, estimate
from gridbot.schedulers.expert.planner import Settings, fit, offline, with_tr
from gridbot.schedulers.expert.strategy import NTDMr, Prices

CSV = """\
sent_at,ended_at,success,pool
# a comment
100,2166.5,1,grid
101,,0,grid
102,1500,0,grid

103,3000,true,cloud
"""


def test_a_history_file_is_csv_or_json_lines_and_its_rows_say_where_and_how_each_instance_ended():
    rows = history.parse(CSV, "h.csv")
    assert rows == [history.HistoryRow(100.0, 2166.5, True, "grid"), history.HistoryRow(101.0, None, False, "grid"),
                    history.HistoryRow(102.0, 1500.0, False, "grid"), history.HistoryRow(103.0, 3000.0, True, "cloud")]
    jsonl = "\n".join(['{"sent_at": 100, "ended_at": 2166.5, "success": true, "pool": "grid"}',
                       '{"sent_at": 101, "ended_at": null, "success": 0, "pool": "grid", "reliable": false}'])
    assert history.parse(jsonl)[0] == rows[0] and history.parse(jsonl)[1].reliable is False
    assert history.parse(history.dump_csv(rows)) == rows  # written as read
    records = history.records(rows, {"cloud"})
    assert [r.reliable for r in records] == [False, False, False, True]
    assert records[1] == InstanceRecord(101.0, None, False, False)
    # the `reliable` column wins over the pools given
    marked = history.parse("sent_at,ended_at,success,pool,reliable\n0,10,1,grid,1\n0,10,1,cloud,\n")
    assert [r.reliable for r in history.records(marked, {"cloud"})] == [True, True]


@pytest.mark.parametrize(("text", "says"), [
    ("", "the history is empty"),
    ("sent_at,success,pool\n1,1,grid\n", "line 1: the header lacks ended_at"),
    ("sent_at,ended_at,success,pool\n1,2,1\n", "line 2: 3 fields where the header has 4"),
    ("sent_at,ended_at,success,pool\nx,2,1,grid\n", "line 2: sent_at must be a number of seconds, not 'x'"),
    ("sent_at,ended_at,success,pool\n5,2,1,grid\n", "line 2: ended_at 2 is before sent_at 5"),
    ("sent_at,ended_at,success,pool\n1,,1,grid\n", "line 2: a good result (success 1) needs the time it came back"),
    ("sent_at,ended_at,success,pool\n1,2,maybe,grid\n", "line 2: success must be 1/0 or true/false"),
    ("sent_at,ended_at,success,pool\n1,2,1, \n", "line 2: pool is empty"),
    ("sent_at,ended_at,success,pool\n1,inf,1,grid\n", "line 2: ended_at must be a finite number"),
    ('{"sent_at": 1}\n{"sent_at": 2, "ended_at": 3, "success": 1, "pool": "grid"}\n',
     "line 1: ended_at, success, pool missing"),
    ('{"sent_at": 1, "ended_at": 3, "success": 1, "pool": "grid"}\nnot json\n', "line 2: not JSON"),
    ("sent_at,ended_at,success,pool\n", "the history holds no instance"),
    ("sent_at,ended_at,success,pool\n1,2,1," + "g" * 140_000 + "\n",  # the CLI review: _csv.Error, a traceback
     "line 2: not a CSV line (field larger than field limit (131072))"),
])
def test_a_bad_history_file_is_refused_naming_the_line_and_the_fix(text, says):
    with pytest.raises(history.HistoryError) as refused:
        history.parse(text, "h")
    assert str(refused.value).startswith("h") and says in str(refused.value), str(refused.value)


def test_stored_instance_states_become_rows_and_those_whose_outcome_is_unknown_are_left_out():
    S = InstanceState
    stored = [(0.0, 10.0, S.DONE, "g"), (1.0, 12.0, S.WASTED, "g"), (2.0, 5.0, S.FAILED, "g"),
              (3.0, 50.0, S.OVERDUE, "g"), (4.0, None, S.RUNNING, "c"), (5.0, 6.0, S.CANCELLED, "g"),
              (6.0, 7.0, S.INTERRUPTED, "g")]
    assert history.rows_from_states(stored) == [
        history.HistoryRow(0.0, 10.0, True, "g"), history.HistoryRow(1.0, 12.0, True, "g"),
        history.HistoryRow(2.0, 5.0, False, "g"), history.HistoryRow(3.0, None, False, "g"),
        history.HistoryRow(4.0, None, False, "c")]


def lossy_run(sent_every: float = 10.0, count: int = 200, lost_every: int = 5) -> list[InstanceRecord]:
    """Instances sent every 10 s, each back after 100 s, but every fifth lost (gamma 0.8)."""
    return [InstanceRecord(i * sent_every, None if i % lost_every == 0 else i * sent_every + 100.0,
                           i % lost_every != 0) for i in range(count)]


def test_a_run_that_is_over_gives_gamma_from_the_instances_whose_outcome_is_known():
    records = lossy_run()  # the last sent at 1990, the last result at 2090
    char = from_history(records, deadline=490.0)
    # known: sent before 2090 - 490 = 1600 (160 instances, 128 results): gamma 0.8 exactly; the later ones are
    # left out, though 32 of their 40 results came: their 8 losses are not known yet
    assert char.gamma_future == pytest.approx(0.8)
    assert char.turnarounds.size == 128 and char.tur == pytest.approx(100.0)
    assert char.tr == pytest.approx(100.0)  # no reliable result: T_ur
    # counting every instance, the unknown ones as failures, would make gamma lower; as successes, higher
    assert from_history(records, deadline=490.0, end=5000.0).gamma_future == pytest.approx(0.8)
    with_reliable = [*records, InstanceRecord(0.0, 30.0, True, reliable=True)]
    assert from_history(with_reliable, deadline=490.0).tr == pytest.approx(30.0)
    assert from_history(records, deadline=490.0, reliable_runtime=42.0).tr == pytest.approx(42.0)


def test_a_run_too_short_for_any_known_outcome_is_characterized_as_online_at_its_end():
    records = lossy_run(count=20)  # all sent within the last deadline: the paper's partial-knowledge epoch
    char = from_history(records, deadline=5000.0)
    assert 0.0 < char.gamma_future <= 1.0 and char.gamma_sent.size == 0 and char.tur == pytest.approx(100.0)


def test_offline_planning_reads_the_users_reliable_runtime_and_counts_the_known_instances():
    settings = Settings(reliable_runtime=1600.0)
    char, source, known = offline(lossy_run(), 490.0, settings, "bag before")
    assert char.tr == 1600.0 and known == 160
    assert source == "offline from bag before: 160 results of 200 unreliable instances, gamma 0.80"
    base = Characterization(np.array([1.0, 3.0]), np.array([2.0]), 0.9)
    assert with_tr(base, Settings()).tr == 2.0 and with_tr(base, settings).tr == 1600.0


def test_a_pinned_strategy_gets_the_reliable_machines_the_pools_have():
    pin = NTDMr(2, 10.0, 20.0, 0.5)
    assert fit(pin, 50, 5).reliable_machines(50) == 5  # Mr x #ur = 25 machines asked, 5 there
    assert fit(pin, 50, 100) == pin
    assert fit(NTDMr(2, 10.0, 20.0, 0.001), 50, 5).reliable_machines(50) == 1  # rounds to none: one
    assert fit(pin, 50, 0).mr == 0.0


@pytest.mark.parametrize("ages", [(0.0, 3000.0), (3000.0, 0.0)])
def test_the_reliable_queue_is_first_come_first_served_whatever_the_tasks_order(ages):
    """N = 0, T = 0 at the tail's start: both tasks are due for the one reliable machine at once; the one whose
    instance has been out longest (its timer ran out first) gets it first, whichever task it is."""
    char = Characterization(np.array([4000.0]), np.array([1500.0]), 1.0)
    setup = Setup(2, 2, Prices(0.0, 3600.0, 1.0), ages=ages, step=10.0)
    est = estimate(char, [NTDMr(0, 0.0, 8000.0, 0.5)], setup, repetitions=1)
    # the older task's unreliable instance returns at 1000 (its reliable one, sent at 0, runs on to 1500 and is
    # paid); the younger task's reliable instance goes at 1500 and ends at 3000, before its unreliable one (4000)
    assert est.makespan[0] == pytest.approx(3000.0)
    assert est.cost[0] == pytest.approx(1500.0)  # two reliable runs of 1,500 s at 1 a second, per task
