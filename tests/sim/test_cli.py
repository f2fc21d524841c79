"""`gridbot simulate` as a user types it: tables, metrics.json, plots a person can open, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCENARIO = """
[simulation]
seed = 5

[pools.cluster]
kind = "cluster"
size = 20

[pools.volunteers]
kind = "community"
size = 30
turnaround_ratio = { dist = "uniform", low = 0.2, high = 1 }

[bags.sweep]
jobs = 300
runtime = { dist = "uniform", low = "1m", high = "3m" }
"""


def gridbot(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gridbot", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_simulate_prints_tables_and_writes_metrics_and_plots(tmp_path):
    (tmp_path / "s.toml").write_text(SCENARIO)
    p = gridbot("simulate", "s.toml", "--out", "out", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "sweep" in p.stdout and "completed" in p.stdout and "volunteers" in p.stdout
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["bags"][0]["done"] == 300 and metrics["seed"] == 5
    assert len(metrics["times"]) == len(metrics["incomplete"]["sweep"]) == len(metrics["throughput"]["cluster"])
    for name in ("incomplete.png", "throughput.png"):
        data = (tmp_path / "out" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_seed_option_and_json_output(tmp_path):
    (tmp_path / "s.toml").write_text(SCENARIO)
    a = json.loads(gridbot("simulate", "s.toml", "--json", "--seed", "9", cwd=tmp_path).stdout)
    b = json.loads(gridbot("simulate", "s.toml", "--json", "--seed", "9", cwd=tmp_path).stdout)
    assert a == b and a["seed"] == 9


def test_the_seed_option_takes_the_range_a_scenarios_seed_takes(tmp_path):
    (tmp_path / "s.toml").write_text(SCENARIO)
    too_big = "9" * 23  # taken before, where the scenario's seed stops at 2**53
    (tmp_path / "big.toml").write_text(SCENARIO.replace("seed = 5", f"seed = {too_big}"))
    written = gridbot("simulate", "big.toml", cwd=tmp_path)
    assert written.returncode == 2 and f"must be a whole number of at most 9,007,199,254,740,992, not {too_big}" in \
        written.stderr
    for seed, words in ((too_big, f"must be a whole number of at most 9,007,199,254,740,992, not {too_big}"),
                        ("-1", "must be a whole number of at least 0, not -1")):
        p = gridbot("simulate", "s.toml", "--seed", seed, cwd=tmp_path)
        assert p.returncode == 2 and f"Invalid value for '--seed': {words}" in p.stderr, p.stderr
    top = gridbot("simulate", "s.toml", "--json", "--seed", str(2**53), "--scale", "0.1", cwd=tmp_path)
    assert top.returncode == 0 and json.loads(top.stdout)["seed"] == 2**53, top.stderr


def test_scale_runs_a_smaller_copy_of_the_scenario(tmp_path):
    (tmp_path / "s.toml").write_text(SCENARIO)
    p = gridbot("simulate", "s.toml", "--json", "--scale", "0.1", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    metrics = json.loads(p.stdout)
    assert metrics["bags"][0]["jobs"] == 30 and metrics["bags"][0]["done"] == 30
    assert {q["name"]: q["pilots_peak"] for q in metrics["pools"]}["cluster"] <= 2
    bad = gridbot("simulate", "s.toml", "--scale", "0", cwd=tmp_path)
    assert bad.returncode == 2 and "--scale" in bad.stderr


def test_a_bad_scenario_is_refused_with_its_problems_and_exit_code_2(tmp_path):
    (tmp_path / "bad.toml").write_text(SCENARIO.replace("size = 20", "size = 20\nspeed = { dist = \"unifrom\" }"))
    p = gridbot("simulate", "bad.toml", "--out", "out", cwd=tmp_path)
    assert p.returncode == 2
    assert "bad.toml:8" in p.stderr and "unknown distribution 'unifrom'; did you mean 'uniform'?" in p.stderr
    assert not (tmp_path / "out").exists()
    (tmp_path / "afile").write_text("")
    (tmp_path / "good.toml").write_text(SCENARIO)
    unwritable = gridbot("simulate", "good.toml", "--out", "afile/out", cwd=tmp_path)
    assert unwritable.returncode == 2 and "cannot write the results to afile/out" in unwritable.stderr
    assert "Traceback" not in unwritable.stderr
    missing = gridbot("simulate", "nope.toml", cwd=tmp_path)
    assert missing.returncode == 2 and "cannot read scenario nope.toml" in missing.stderr
    # the second walkthrough of 2026-11-29: an empty [bags] simulated its pools to the horizon and exit 0; with no
    # unreliable pool, `gridbot plan` invented one, with a size and a price
    pools = '[pools.c]\nkind = "cluster"\nsize = 4\n'
    (tmp_path / "empty.toml").write_text(pools + "[bags]\n")
    (tmp_path / "reliable.toml").write_text(pools + '[bags.b]\njobs = 5\nruntime = "1m"\n')
    for args, words in ((("simulate", "empty.toml"), "has no bag to run"), (("plan", "--scenario", "empty.toml"),
                        "has no bag to run"), (("plan", "--scenario", "reliable.toml"), "has no unreliable pool")):
        proc = gridbot(*args, cwd=tmp_path)
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_warnings_of_a_scenario_are_printed_before_the_run(tmp_path, capsys):
    """Issue 14: a log replayed with the default deadlines fails its jobs longer than 3 days: say so."""
    from gridbot.cli.simulate import run_simulation

    (tmp_path / "long.swf").write_text("1 0 0 360000 1 -1 -1 1 -1 -1 1 7 1 1 1 1 -1 -1\n")
    # volunteers keep asking for work, so a job re-queued at its deadline is sent again
    (tmp_path / "s.toml").write_text('[pools.p]\nkind = "community"\nsize = 5\n[swf_bags.log]\nswf = "long.swf"\n')
    results = run_simulation(tmp_path / "s.toml", None, None, quiet=False, as_json=True, plots=False)
    err = capsys.readouterr().err
    assert f"warning: {tmp_path / 's.toml'}:4: swf_bags 'log': 1 of the 1 jobs replayed run longer" in err
    assert results.bags[0].failed == 1, "the warning is right: the job fails for good"


def test_the_warning_holds_on_a_cluster_too(tmp_path, capsys):
    """Found by a review: on a cluster the warned-of job completed after 111 h, because the host still running
    the overdue instance counted as idle and no pilot took the re-queued job. Now the copies run and the job
    fails for good, as the warning says."""
    from gridbot.cli.simulate import run_simulation

    (tmp_path / "long.swf").write_text("1 0 0 400000 1 -1 -1 1 -1 -1 1 7 1 1 1 1 -1 -1\n")
    (tmp_path / "s.toml").write_text('[pools.c]\nkind = "cluster"\nsize = 4\n[swf_bags.log]\nswf = "long.swf"\n')
    results = run_simulation(tmp_path / "s.toml", None, None, quiet=False, as_json=True, plots=False)
    assert "these jobs fail for good before one ends" in capsys.readouterr().err
    assert results.bags[0].failed == 1 and results.bags[0].finished < 4 * 86400
    assert results.pools[0].lost == 3


def test_the_bags_diagnostics_are_printed_after_the_tables(tmp_path):
    (tmp_path / "s.toml").write_text('[pools.c]\nkind = "cluster"\nsize = 2\n[bags.b]\njobs = 3\nruntime = "1m"\n'
                                     '[bags.b.policy]\nDeadline = "Host.Slots > 100 ? 60 : -5"\n')
    p = gridbot("simulate", "s.toml", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "bag 'b': Deadline evaluated to not a positive number of seconds: -5 3 time(s)" in p.stderr
    assert "the bag's instance_deadline (86400 s) counted instead" in p.stderr
    metrics = json.loads(gridbot("simulate", "s.toml", "--json", cwd=tmp_path).stdout)
    assert metrics["bags"][0]["diagnostics"] == [line.removeprefix("bag 'b': ")
                                                 for line in p.stderr.splitlines() if line.startswith("bag 'b'")]
