"""Every benchmark script of `bench/` runs, at a size of seconds, and prints its figures: they are measured
apart (`make bench`), never timed here, but a script that no longer runs against today's code is a defect the
suite must find (bench/decode_cost.py had stopped at its own assertion once the protocol gained fields). The
peers' virtualenv is not needed: gridbot's own rows only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPTS = [
    ("suite.py --only 1 2 3 4 --runs 1 --jobs 200 --peers gridbot-loop --capacity-jobs 2000 --many-hosts-jobs 1000 "
     "--capacity-peers --no-pg --scale-jobs 10000 --scale-runs 1 --scale-small 1000 --scale-window 1000 "
     "--scale-deep 1000 --lines-jobs 1000 --bags 3 --peer-noop-jobs 100 --out {tmp}/bench.md",
     ["### 1. End to end", "### 2. Dispatch capacity", "### 3. Queue scale", "### 4. Many bags",
      "| gridbot | jobs/s |", "| gridbot, every job on the worker's event loop (--no-slot-threads) | jobs/s |"]),
    ("cpu_per_job.py --jobs 200 --runs 1", ["ms of its own CPU per job", "machine"]),
    ("slot_steps.py --jobs 50 --runs 1", ["run_blocking, the whole path"]),
    ("decision.py --bags 3 --jobs 300 --requests 100 --hosts 10", ["exchange  p50", "decision  p50"]),
    ("expert_estimator.py --runs 1 --reps 1", ["simulations/s"]),
    ("decode_cost.py --runs 2 --reports 100", ["constrained vs plain"]),
    ("auth_cost.py --runs 1 --jobs 100 --capacity-jobs 1000", ["cost of authentication, end to end"]),
    ("console_cost.py --jobs 200 --runs 1 --pollers 1 --every 0.5", ["with / without"]),
    ("console_scale.py --jobs 1000 --hosts 10 --dir {tmp}/scale", ["/v1/console/pools"]),
    ("volunteer_rpc.py --jobs 100 --clients 2 --ncpus 2", ["scheduler RPCs/s"]),
    ("throughput.py --jobs 100 --runs 1 --workers 2", ["jobs/s"]),
    ("simulate.py --jobs 300", ["events/s"]),
]


@pytest.mark.parametrize(("command", "says"), SCRIPTS, ids=[c.split()[0] for c, _ in SCRIPTS])
def test_the_benchmark_script_runs_and_prints_its_figures(tmp_path: Path, command: str, says: list[str]) -> None:
    script, *args = [word.format(tmp=tmp_path) for word in command.split()]
    peers = (ROOT / ".venv-peers").exists()
    p = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=tmp_path, capture_output=True,
                       text=True, timeout=280)  # (under pytest's own 300 s, so the script is stopped, not orphaned)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "Traceback" not in out, out[-3000:]
    assert (ROOT / ".venv-peers").exists() == peers, "gridbot's own rows install no peers' virtualenv"
    for words in says:
        assert words in out, (words, out[-3000:])
