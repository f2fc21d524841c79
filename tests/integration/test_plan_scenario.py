"""`gridbot plan --scenario` as a user reads it: the static strategies are placed against the frontier that the
table shows (found by the walkthrough review of 2026-11-29: with every price 0, 33 strategies tied on one
point, the table showed that point once, and each static was said to be "dominated by 33 frontier strategies",
while CN1T0, faster than the point, was "on or below the frontier")."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.integration.harness import gridbot

FREE = """\
[simulation]
seed = 7

[pools.osg]
kind = "grid"
size = 200
queue_wait = { dist = "lognormal", mu = 6.0, sigma = 1.5 }
preemption = 0.1

[pools.technion]
kind = "cluster"
size = 60

[bags.linkage]
jobs = 5000
runtime = { dist = "uniform", low = "10m", high = "15m" }
instance_deadline = "3d"
"""


def test_the_statics_are_counted_against_the_frontiers_distinct_points(tmp_path: Path) -> None:
    (tmp_path / "free.toml").write_text(FREE)
    proc = gridbot("plan", "--scenario", "free.toml", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    points = len(plan["frontier"])
    assert points >= 1
    for name, s in plan["statics"].items():
        assert 0 <= s["dominated_by"] <= points and 0 <= s["dominates"] <= points, (name, s)
        assert not (s["dominated_by"] and s["dominates"]), (name, s)
    text = gridbot("plan", "--scenario", "free.toml", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    counts = {int(n) for n in re.findall(r"of the frontier's (\d+) points", text.stdout)}
    assert counts == {points}, text.stdout
    chosen = next(f for f in plan["frontier"] if f["strategy"] == plan["chosen"]["strategy"])
    ahead = [n for n, s in plan["statics"].items() if s["tail_makespan"] is not None and
             s["tail_makespan"] <= chosen["tail_makespan"] and s["cost"] <= chosen["cost"] and
             (s["tail_makespan"], s["cost"]) != (chosen["tail_makespan"], chosen["cost"])]
    said = re.search(r"^(.*) beats? it here: a static strategy, outside ExPERT's space", text.stdout, re.M)
    assert (said.group(1).split(", ") if said else []) == ahead, text.stdout


def test_a_bound_no_strategy_keeps_is_said_with_what_is_possible_and_exit_1(tmp_path: Path) -> None:
    """The second walkthrough of 2026-11-29: `--deadline 1m` printed "no strategy meets cheapest within 60 s" and
    exited 0."""
    (tmp_path / "free.toml").write_text(FREE)
    proc = gridbot("plan", "--scenario", "free.toml", "--deadline", "1m", cwd=tmp_path)
    text = " ".join(proc.stdout.split())
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "no strategy keeps to 'cheapest within 60 s': the fastest tail estimated takes" in text
    assert "give a looser --deadline or --budget" in text
    as_json = gridbot("plan", "--scenario", "free.toml", "--deadline", "1m", "--json", cwd=tmp_path)
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["chosen"] is None


def test_a_utility_that_is_no_number_is_not_blamed_on_a_bound_nobody_gave(tmp_path: Path) -> None:
    """Audit: `--utility "1/0"` (or "Makespan / Cost" where every strategy is free) printed "no strategy keeps to
    '1/0' ... give a looser --deadline or --budget", though neither was given."""
    (tmp_path / "free.toml").write_text(FREE)
    proc = gridbot("plan", "--scenario", "free.toml", "--utility", "Makespan / Cost", cwd=tmp_path)
    text = " ".join(proc.stdout.split())
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the utility 'Makespan / Cost' is not a finite number for any strategy sampled (e.g. a division by " \
           "zero" in text and "such as 'Makespan * Cost'" in text, text
    assert "--deadline" not in text and "no strategy keeps to" not in text
    proc = gridbot("plan", "--scenario", "free.toml", "--utility", "1/0", cwd=tmp_path)
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "utility '1/0' is not a finite number at any makespan and cost tried" in said, said


def test_a_choice_whose_whole_tail_estimate_breaks_the_bound_says_so(tmp_path: Path) -> None:
    """The second walkthrough of 2026-11-29: `--deadline 40m` chose on the sampled estimate (37m34s) and printed
    the whole tail's (44m42s) without a word on the deadline it broke."""
    (tmp_path / "free.toml").write_text(FREE)
    for bound in ("30m", "45m"):
        text = gridbot("plan", "--scenario", "free.toml", "--deadline", bound, cwd=tmp_path).stdout
        plan = json.loads(gridbot("plan", "--scenario", "free.toml", "--deadline", bound, "--json",
                                  cwd=tmp_path).stdout)
        over = plan["chosen"]["tail_makespan"] > {"30m": 1800, "45m": 2700}[bound]
        assert over == ("on the whole tail its estimate is outside" in " ".join(text.split())), (bound, text)
