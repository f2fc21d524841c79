"""Issue 19: a quorum compared by a validator the server's admin registered (`[validators.NAME]` in the pools
file, `compare = "NAME"` in a spec), with a real server and real workers.

The jobs print a number with noise in its last digits, so no two results are equal byte for byte; the
validator (a Python script, run by the server) says two results are equivalent when their numbers are within
1e-6. One of three workers adds 1 to every number (it gets `CORRUPT` in its jobs' environment): its results
must never be kept, and each that a quorum judged is invalid.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.integration.harness import Cluster, gridbot

CLOSE = """\
import sys
from pathlib import Path

a, b = (float((Path(d) / "stdout").read_text()) for d in sys.argv[1:3])
sys.exit(0 if abs(a - b) < 1e-6 else 1)
"""

NOISY = """\
name = "{name}"
quorum = 2
compare = "{compare}"
max_instances = {cap}
command = "python3 -c 'import os, random; print({{i}} + random.random() * 1e-9 + bool(os.getenv(\\"CORRUPT\\")))'"
[parameters]
i = {{ from = 1, to = {jobs} }}
"""


@pytest.fixture
def cluster(tmp_path: Path):
    (tmp_path / "close.py").write_text(CLOSE)
    (tmp_path / "broken.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "pools.toml").write_text(
        f'[validators.close]\ncommand = ["{sys.executable}", "{tmp_path / "close.py"}"]\ntimeout = "30s"\n'
        f'[validators.broken]\ncommand = ["{sys.executable}", "{tmp_path / "broken.py"}"]\n')
    c = Cluster(tmp_path, server_args=("--pools", str(tmp_path / "pools.toml"), "--heartbeat", "1"))
    c.start_server()
    try:
        yield c
    finally:
        c.stop()


def submit(cluster: Cluster, tmp_path: Path, name: str, compare: str, jobs: int, cap: int = 4):
    spec = tmp_path / f"{name}.toml"
    spec.write_text(NOISY.format(name=name, compare=compare, jobs=jobs, cap=cap))
    return gridbot("submit", str(spec), "--server", cluster.url)


def test_a_validator_accepts_results_that_differ_in_bytes_and_outvotes_a_corrupt_host(cluster, tmp_path):
    assert submit(cluster, tmp_path, "noisy", "close", 8).returncode == 0
    os.environ["CORRUPT"] = "1"
    try:  # first, so that it surely takes part
        cluster.start_worker("--slots", "1", "--pass-env", "CORRUPT", name="corrupt")
    finally:
        del os.environ["CORRUPT"]
    cluster.start_worker("--slots", "1", name="honest-a")
    cluster.start_worker("--slots", "1", name="honest-b")
    info = cluster.wait_bag("noisy", timeout=240)
    assert info.state == "completed" and info.counts.done == 8, info
    with cluster.client() as c:
        results = list(c.results("noisy"))
        values = sorted(float(r.stdout_tail) for r in results)
        assert [round(v) for v in values] == list(range(1, 9)), "only the honest hosts' numbers are kept"
        assert len({r.stdout_tail for r in results}) == 8
        valid = invalid = equivalent = different = 0
        for index in range(8):
            story = c.story("noisy", index)
            actions = [d.action for d in story.decisions if d.strategy == "quorum"]
            valid += actions.count("valid")
            invalid += actions.count("invalid")
            assert actions.count("valid") >= 2, (index, actions)
            # what the validator said of each result is in its instance's story
            said = [i.reason or "" for i in story.instances if i.state == "done"]
            assert all(s.startswith("a result for the quorum: ") for s in said), said
            equivalent += sum("(validator close: " in s and "equivalent to instance " in s for s in said)
            different += sum(s.count("different from instance ") for s in said if "(validator close: " in s)
        hosts = {h.name.rsplit("/", 1)[-1]: h for h in c.hosts()}
    corrupt = hosts["corrupt"]
    assert valid >= 16 and corrupt.invalid == invalid >= 1 and corrupt.valid == 0, corrupt
    assert equivalent >= 8, "each job's quorum had a result found equivalent to an earlier one"
    assert different >= corrupt.invalid, "each corrupt result was compared and found different"
    assert corrupt.invalid_rate == 1.0
    assert hosts["honest-a"].invalid == hosts["honest-b"].invalid == 0
    assert hosts["honest-a"].valid + hosts["honest-b"].valid == valid
    table = gridbot("hosts", "--server", cluster.url, check=True).stdout
    assert "INVALID" in table and f"{corrupt.invalid} of {corrupt.invalid} (100%)" in table, table


def test_a_validator_that_fails_counts_the_results_as_different(cluster, tmp_path):
    """A validator that exits 3 (neither 0 nor 1) is the validator's failure: no two results agree, the job
    fails for want of a quorum after `max_instances`, and the server's log says why."""
    assert submit(cluster, tmp_path, "judged", "broken", 1, cap=2).returncode == 0
    cluster.start_worker("--slots", "1", name="a")
    cluster.start_worker("--slots", "1", name="b")
    info = cluster.wait_bag("judged", timeout=120)
    assert info.state == "failed" and info.counts.failed == 1, info
    with cluster.client() as c:
        (job,) = c.jobs("judged")
    assert "no quorum of 2 after 2 instances" in job.reason, job.reason
    assert "validator broken exited with status 3" in cluster.server.log
    with cluster.client() as c:
        story = c.story("judged", 0)
    said = [i.reason or "" for i in story.instances]
    assert any("(validator broken: could not compare it with instance " in s
               and "(it exited with status 3; its message is in the server's log: counted as different))" in s
               for s in said), said


def test_a_spec_naming_no_validator_of_the_server_is_refused_with_the_fix(cluster, tmp_path):
    proc = submit(cluster, tmp_path, "unknown", "fuzzy", 2)
    assert proc.returncode != 0
    assert "no such validator (it has broken, close)" in proc.stderr, proc.stderr
    assert "[validators.fuzzy]" in proc.stderr
    (tmp_path / "lone.toml").write_text('command = "true"\ncompare = "close"\n')
    lone = gridbot("submit", str(tmp_path / "lone.toml"), "--server", cluster.url)
    assert lone.returncode != 0 and "add quorum = 2" in lone.stderr, lone.stderr
    with cluster.client() as c:
        assert [b.name for b in c.bags()] == []
