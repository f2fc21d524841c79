"""GridBot's experiments, at a tenth of their size: the outcomes come in the order the paper found (or,
where gridbot differs by design, in the order experiments/README.md explains)."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def experiments():
    spec = importlib.util.spec_from_file_location("gridbot_experiments", ROOT / "experiments" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_policy_driven_execution_beats_the_naive_one_by_an_order_of_magnitude(experiments, tmp_path):
    runs = experiments.run("naive_vs_policy", scale=0.1, out=tmp_path)
    naive = runs["naive (3-day deadline, no policies)"][0].bags[0]
    policy = runs["policy-driven"][0].bags[0]
    assert naive.state == policy.state == "completed"
    assert policy.makespan * 10 < naive.makespan  # paper: 8 h vs 280 h
    assert naive.tail_makespan > naive.makespan / 2, "the naive run is all tail: deadlines of three days"
    table = (tmp_path / "naive_vs_policy.md").read_text()
    assert "280 h" in table
    assert "![incomplete jobs over time](naive_vs_policy.png)" in table
    assert (tmp_path / "naive_vs_policy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "the figure beside it"


def test_replication_orders_as_in_the_paper_once_gridbot_replicates_as_gridbot_did(experiments, tmp_path):
    """Issue 14: with gridbot's own replicas (after the queued jobs, cancelled at the first result) and host
    timeout, replication changes little; with GridBot's (from the tail threshold on, before the unsent
    jobs, left to run) and lost jobs found only at their deadline, the paper's orderings come back."""
    mine, paper = "[gridbot]", "[GridBot as in the paper]"
    runs = experiments.run("replication", scale=0.1, seeds=2, out=tmp_path,
                           only=lambda name: name.endswith((mine, paper)))
    assert all(r.bags[0].state == "completed" for rs in runs.values() for r in rs)

    def mean(arm, setting, what):
        return sum(getattr(r.bags[0], what) for r in runs[f"{arm} {setting}"]) / 2

    pp, rr, pr, dp, dr = experiments.REPLICATION_ARMS
    for replicated in (pp, pr):
        for plain in (dp, dr):
            assert mean(replicated, mine, "tail_makespan") < mean(plain, mine, "tail_makespan")
    assert mean(pp, mine, "replicas_pct") > mean(rr, mine, "replicas_pct")
    assert all(mean(arm, mine, "discarded_pct") == 0 for arm in experiments.REPLICATION_ARMS)

    makespan = {arm: mean(arm, paper, "makespan") for arm in experiments.REPLICATION_ARMS}
    assert max(makespan[pp], makespan[rr], makespan[pr]) < min(makespan[dp], makespan[dr]), makespan
    assert makespan[pr] > max(makespan[pp], makespan[rr]), makespan  # paper: 4.2 h against 4.1 and 3.2
    for permissive in (pp, pr):  # paper: 58 and 73% replicas, 30 and 57% waste, against 11 and 7
        assert mean(permissive, paper, "replicas_pct") > 2 * mean(rr, paper, "replicas_pct")
        assert mean(permissive, paper, "discarded_pct") > 2 * mean(rr, paper, "discarded_pct")
    # what disabling replication costs comes from finding lost jobs by their deadline only
    cost_here = mean(dp, mine, "makespan") - mean(pp, mine, "makespan")
    assert makespan[dp] - makespan[pp] > 2 * cost_here
    assert "Restrictive / Restrictive | 3.2 h" in (tmp_path / "replication.md").read_text()


def test_the_replication_ablation_runs_the_replicated_arms_with_machines_alike_and_unlike(experiments, tmp_path):
    """Issue 14: the ablation that asks whether R/R only ties P/P because every simulated machine is alike
    runs the three replicated arms with GridBot's server on the base pools and on pools whose machines
    differ as Los Alamos' nodes did; restrictive replication sends fewer replicas than permissive in both."""
    runs = experiments.run("replication_unlike", scale=0.1, seeds=1, out=tmp_path)
    alike, unlike = "GridBot as in the paper", f"GridBot as in the paper, {experiments.UNLIKE}"
    assert len(runs) == 6 and all(r.bags[0].state == "completed" for rs in runs.values() for r in rs)
    for setting in (alike, unlike):
        pp, rr = (runs[f"{arm} [{setting}]"][0].bags[0] for arm in ("Permissive / Permissive",
                                                                      "Restrictive / Restrictive"))
        assert rr.replicas_pct < pp.replicas_pct, setting
    table = (tmp_path / "replication_unlike.md").read_text()
    assert unlike in table and "Disabled" not in table, "only the arms that ran"


def test_the_setup_ablations_change_the_pools_as_they_say_and_run(experiments, tmp_path):
    """Issue 14: the ablations that ask which setup the paper's R/R win needs. Records kept: constant pools on
    a machine per pilot, machines unlike; bigger pools: 2.5 times the pilots, machines and queue; bundles: a
    second job behind the running one. Each edit changes the scenario as it says, and each run shows it: no
    pool above the middle of its range with records kept, more pilots than the base ever had with bigger
    pools, and with bundles restrictive replication firing more (a job waiting behind another on its host
    looks slow), as in the full-size table (6% against 18%)."""
    path = ROOT / "experiments" / "replication" / "base.toml"
    base = experiments.parse_scenario(path.read_text(), str(path))
    kept = experiments._records_kept(base)
    for before, after in zip(base.pools, kept.pools, strict=True):
        low, high, _ = before.fluctuate
        assert after.fluctuate is None and [s.size for s in after.size] == [(low + high) // 2]
        assert after.hosts == after.spec.max_running == (low + high) // 2 < before.hosts
        assert after.failure_spread == experiments.LANL_SPREAD
    bigger = experiments._bigger_pools(base)
    for before, after in zip(base.pools, bigger.pools, strict=True):
        assert after.fluctuate[:2] == (round(before.fluctuate[0] * 2.5), round(before.fluctuate[1] * 2.5))
        assert (after.hosts, after.spec.max_queued) == (round(before.hosts * 2.5), round(before.spec.max_queued * 2.5))
    bundled = experiments._bundles(base)
    assert {p.prefetch for p in bundled.pools} == {1} and bundled.bags == base.bags

    runs = experiments.run("replication_setup", scale=0.1, seeds=1, out=tmp_path,
                           only=lambda name: "Permissive / Restrictive" not in name)
    assert len(runs) == 8 and all(r.bags[0].state == "completed" for rs in runs.values() for r in rs)
    small = experiments.scaled(base, 0.1)
    middle = {p.name: (p.fluctuate[0] + p.fluctuate[1]) // 2 for p in small.pools}
    top = sum(p.fluctuate[1] for p in small.pools)

    def run_of(arm: str, setting: str = ""):
        return runs[f"{arm} [GridBot as in the paper{', ' + setting if setting else ''}]"][0]

    for arm in ("Permissive / Permissive", "Restrictive / Restrictive"):
        assert all(p.pilots_peak <= middle[p.name] for p in run_of(arm, experiments.RECORDS).pools)
        assert any(p.pilots_peak > middle[p.name] for p in run_of(arm).pools), "the base's pools fluctuate"
        assert sum(p.pilots_peak for p in run_of(arm, experiments.BIGGER_POOLS).pools) > top
    rr = "Restrictive / Restrictive"
    assert run_of(rr, experiments.BUNDLES).bags[0].replicas_pct > 1.5 * run_of(rr).bags[0].replicas_pct
    assert experiments.BIGGER_POOLS in (tmp_path / "replication_setup.md").read_text()


def test_with_the_tail_from_four_buffers_restrictive_replication_beats_permissive(experiments, tmp_path):
    """Issue 14: the section 7 table's headline, R/R faster than P/P with a fifth of P/P's replicas, once the
    tail and replication begin at 4 buffers' worth of unsent jobs rather than one (experiments/README.md):
    permissive replication then floods the last originals with replicas sent before them."""
    setting = experiments.tail_setting(4)
    runs = experiments.run("replication_tail", scale=0.1, seeds=1, out=tmp_path,
                           only=lambda name: name.endswith(f"[{setting}]"))
    pp, rr = (runs[f"{arm} [{setting}]"][0].bags[0] for arm in ("Permissive / Permissive",
                                                                  "Restrictive / Restrictive"))
    assert pp.state == rr.state == "completed"
    assert rr.makespan < pp.makespan
    assert pp.replicas_pct > 5 * rr.replicas_pct and pp.discarded_pct > 5 * rr.discarded_pct


def test_permissive_restrictive_keeps_up_with_permissive_once_replicas_wait_behind_the_unsent_jobs(experiments,
                                                                                                tmp_path):
    """Issue 14: with the tail from 2 buffers, Permissive/Restrictive was the slowest replicated arm by far, the
    paper's 4.2 h beside P/P's 4.1; sending replicas after the jobs unsent when they were made (Algorithm 2's
    "create new replica and enqueue", gridbot's own order) brings it near P/P, at the cost of the replicas the
    paper counted (experiments/README.md, `replication_order`)."""
    tail, pr, pp = experiments.tail_setting(2), "Permissive / Restrictive", "Permissive / Permissive"
    wanted = {f"{pr} [{tail}]", f"{pr} [{experiments.enqueued(tail)}]", f"{pp} [{experiments.enqueued(tail)}]"}
    runs = experiments.run("replication_order", scale=0.1, seeds=1, out=tmp_path, only=lambda name: name in wanted)
    first, queued, pp_queued = (runs[name][0].bags[0] for name in (
        f"{pr} [{tail}]", f"{pr} [{experiments.enqueued(tail)}]", f"{pp} [{experiments.enqueued(tail)}]"))
    assert first.state == queued.state == pp_queued.state == "completed"
    assert queued.makespan < 0.6 * first.makespan
    assert queued.makespan < 1.2 * pp_queued.makespan
    assert first.replicas_pct > 4 * queued.replicas_pct


def test_with_volunteers_replicas_and_waste_order_as_in_figure_9(experiments, tmp_path):
    """Figure 9: four bags at once on the grids and the community grid, the volunteers' hosts BOINC clients
    (`sim.boinc`): replicas R1 188% > R2 129% > R3 49% > R4 35%, waste 105 > 75 > 25 > 21%; the permissive arms
    far above the restrictive ones."""
    runs = experiments.run("replication_community", scale=0.1, seeds=1, out=tmp_path,
                           only=lambda name: name == experiments.FIGURE_9)
    [result] = runs[experiments.FIGURE_9]
    bags = [result.bag(name) for name in ("R1", "R2", "R3", "R4")]
    assert all(b.state == "completed" for b in bags), [b.state for b in bags]
    for more, fewer in itertools.pairwise(bags):
        assert more.replicas_pct > fewer.replicas_pct and more.discarded_pct > fewer.discarded_pct, bags
    for permissive in bags[:2]:
        for restrictive in bags[2:]:
            assert permissive.replicas_pct > 2 * restrictive.replicas_pct, bags
    assert all(b.jobs_per_pool.get("superlink", 0) > 0 for b in bags), "volunteers ran some of each bag's jobs"
    assert "188 / 105" in (tmp_path / "replication_community.md").read_text()


def test_fifty_ranked_bags_run_in_rank_order(experiments, tmp_path):
    runs = experiments.run("ranks", scale=0.1, out=tmp_path)
    r = runs["ranked"][0]
    assert len(r.bags) == 50 and all(b.state == "completed" for b in r.bags)
    pairs = 50 * 49 // 2
    # at a tenth of the size a bag has 120 jobs: 100 left is its start, 0 left its end
    assert experiments.rank_inversions(r, "100") == 0
    assert experiments.rank_inversions(r, "0") < pairs * 0.05


def test_small_bags_suffer_from_large_bundles_and_from_a_cluster_kept_for_the_tail(experiments, tmp_path):
    """Figure 8: B1 has Rank 1 and B5 Rank 5 ("priorities from 1 (B1) to 5 (B5)"); each bag is compared with
    the bag of the same Rank in a control run where every bag has B3's policy (issue 14: with the tail
    threshold of a buffer's share, every bag was in its tail from the start and B5 ran all its jobs on
    the cluster)."""
    base = (experiments.SMALL_BAGS_FIGURE, experiments.SMALL_BAGS_CONTROL)
    runs = experiments.run("small_bags", scale=0.1, seeds=2, out=tmp_path, only=lambda name: name in base)
    for figure, control in zip(runs[experiments.SMALL_BAGS_FIGURE], runs[experiments.SMALL_BAGS_CONTROL],
                               strict=True):
        # B4 (hosts with a good record only) is best in the paper but no better here than the control's bag of
        # its Rank, with the machines alike or not (experiments/README.md): not asserted
        b1, _, b3, _, b5 = figure.bags
        assert all(b.state == "completed" for b in (*figure.bags, *control.bags))
        assert b1.tail_makespan > 2 * b3.tail_makespan  # Concurrency 10: preempted bundles lengthen the tail
        assert b1.makespan > control.bags[0].makespan
        assert b5.makespan > control.bags[4].makespan  # the cluster alone serves B5's tail: overloaded
        assert b5.jobs_per_pool.get("technion", 0) < b5.jobs / 2, "B5 ran on the grids until its tail"


def test_with_a_record_on_every_machine_b4_has_the_shortest_turnaround_as_in_figure_8(experiments, tmp_path):
    """Figure 8(a): B4 (hosts with a good record only) finishes first. At full size it does so only once the
    machines differ, pilots die young and each machine hosts pilot after pilot (as many machines as pilots),
    so a host has a record when the small bags need it (experiments/README.md). At this tenth of the size
    B4 is often first without the last of these too, so what is asserted is the figure's order where the
    README says it holds, not why, nor a gain over the control's bag of B4's Rank."""
    setting = next(s for s in experiments.SMALL_BAGS_SETTINGS if experiments.RECORDS_KEPT in s)
    runs = experiments.run("small_bags", scale=0.1, seeds=2, out=tmp_path,
                           only=lambda name: name == experiments.SMALL_BAGS_FIGURE + setting)
    for figure in runs[experiments.SMALL_BAGS_FIGURE + setting]:
        assert all(b.state == "completed" for b in figure.bags)
        b4 = figure.bags[3]
        assert all(b4.makespan < b.makespan for b in figure.bags if b is not b4), [b.makespan for b in figure.bags]


def test_gridbot_beats_a_plain_batch_system_on_short_jobs(experiments, tmp_path):
    """Section 7, GridBot versus Condor (53 +- 10 against 170 +- 41 minutes): each batch job pays the
    queue wait, a pilot pays it once."""
    runs = experiments.run("batch", scale=0.1, out=tmp_path)
    for wait in experiments.BATCH_WAITS:
        gridbot = [r.bags[0].makespan for r in runs[f"GridBot, queue wait {wait}"]]
        batch = [r.bags[0].makespan for r in runs[f"plain batch system, queue wait {wait}"]]
        assert len(gridbot) == len(batch) == 5 and None not in gridbot + batch
        assert sum(batch) > 1.5 * sum(gridbot), wait
    assert "170 +- 41 min" in (tmp_path / "batch.md").read_text()


def test_shorter_jobs_raise_the_dispatch_rate_and_the_dispatcher_keeps_up(experiments, tmp_path):
    """Section 7, Number of job requests: the same bag split in five asks the server more often (the
    paper: 20 -> 93 jobs/s), and the dispatcher spends a small share of one core on it."""
    runs = experiments.run("scalability", scale=0.1, out=tmp_path)
    whole, split = (rs[0] for rs in runs.values())
    assert whole.bags[0].state == split.bags[0].state == "completed"
    assert split.load.mean(split.load.jobs) > 2 * whole.load.mean(whole.load.jobs)
    assert split.load.peak(split.load.jobs, 600) > whole.load.peak(whole.load.jobs, 600)
    for r in (whole, split):
        busy = r.load.us_per_request() * 1e-6 * r.load.peak(r.load.requests, 600)
        assert busy < 0.5, f"the dispatcher alone would be busy {busy:.0%} of a core at the peak"
