"""GridBot's experiments, at a tenth of their size: the outcomes come in the order the paper found (or,
where gridbot differs by design, in the order experiments/README.md explains)."""

from __future__ import annotations

import importlib.util
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
    assert "280 h" in (tmp_path / "naive_vs_policy.md").read_text()


def test_permissive_replication_shortens_the_tail(experiments, tmp_path):
    runs = experiments.run("replication", scale=0.1, seeds=2, out=tmp_path)
    tail = {name: sum(r.bags[0].tail_makespan for r in rs) / len(rs) for name, rs in runs.items()}
    replicas = {name: sum(r.bags[0].replicas_pct for r in rs) / len(rs) for name, rs in runs.items()}
    assert all(r.bags[0].state == "completed" for rs in runs.values() for r in rs)
    for replicated in ("Permissive / Permissive", "Permissive / Restrictive"):
        for plain in ("Disabled / Permissive", "Disabled / Restrictive"):
            assert tail[replicated] < tail[plain], tail
    assert replicas["Permissive / Permissive"] > replicas["Restrictive / Restrictive"]
    assert replicas["Disabled / Permissive"] == replicas["Disabled / Restrictive"] == 0


def test_fifty_ranked_bags_run_in_rank_order(experiments, tmp_path):
    runs = experiments.run("ranks", scale=0.1, out=tmp_path)
    r = runs["ranked"][0]
    assert len(r.bags) == 50 and all(b.state == "completed" for b in r.bags)
    pairs = 50 * 49 // 2
    # at a tenth of the size a bag has 120 jobs: 100 left is its start, 0 left its end
    assert experiments.rank_inversions(r, "100") == 0
    assert experiments.rank_inversions(r, "0") < pairs * 0.05


def test_small_bags_suffer_from_large_bundles_and_from_a_cluster_kept_for_the_tail(experiments, tmp_path):
    runs = experiments.run("small_bags", scale=0.1, out=tmp_path)
    b1, b2, b3, b4, b5 = runs["Figure 8(b)"][0].bags
    assert all(b.state == "completed" for b in (b1, b2, b3, b4, b5))
    assert b1.tail_makespan > 2 * b3.tail_makespan  # Concurrency 10: preempted bundles lengthen the tail
    assert b5.makespan == max(b.makespan for b in (b1, b2, b3, b4, b5))  # the cluster alone in the tail
