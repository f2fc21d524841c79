"""Issue 12: a bag can be managed over its whole life. Real `gridbot server`, workers and commands.

Results are written whole and never over another bag's; failed jobs are retried (and a bag revised);
bags are deleted; a job's logs are read without downloading the bag; long listings say they were cut.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from gridbot.client import ApiError, Client
from tests.integration.harness import Cluster, gridbot, gridbot_json

FLAKY = 'name = "{name}"\ncommand = "test -f {flag} || echo broken {{i}} >&2; test -f {flag} || exit 3; ' \
        'echo ok {{i}} > o"\n' \
        'outputs = ["o"]\nmax_failures = {max_failures}\n[parameters]\ni = {{ from = 0, to = {last} }}\n'


def flaky(tmp_path: Path, name: str = "fl", last: int = 5, max_failures: int = 1) -> tuple[Path, Path]:
    """A spec whose jobs fail until the flag file exists; returns (spec, flag)."""
    flag = tmp_path / f"{name}.flag"
    spec = tmp_path / f"{name}.toml"
    spec.write_text(FLAKY.format(name=name, flag=flag, last=last, max_failures=max_failures))
    return spec, flag


def quick(tmp_path: Path, name: str, n: int = 6, command: str = "echo {i} > o") -> Path:
    spec = tmp_path / f"{name}.toml"
    spec.write_text(f'name = "{name}"\ncommand = "{command}"\noutputs = ["o"]\n'
                    f'[parameters]\ni = {{ from = 0, to = {n - 1} }}\n')
    return spec


def no_traceback(proc) -> None:
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr


# -- results on disk ---------------------------------------------------------------------------------------


def test_a_file_in_the_way_of_a_job_folder_is_an_error_and_jobs_jsonl_survives(cluster, tmp_path):
    cluster.start_server()
    cluster.start_worker("--slots", "2")
    with cluster.client() as c:
        c.submit_file(quick(tmp_path, "q"))
        assert c.wait("q", poll=0.2, timeout=60).state == "completed"
    out = tmp_path / "out"
    gridbot("results", "q", str(out), check=True)
    before = (out / "jobs.jsonl").read_bytes()
    (out / "3" / "o").unlink()
    (out / "3").rmdir()
    (out / "3").write_text("in the way")
    proc = gridbot("results", "q", str(out))
    assert proc.returncode == 2, proc.stderr
    no_traceback(proc)
    assert "a file is in the way" in proc.stderr and str(out / "3") in proc.stderr
    assert (out / "jobs.jsonl").read_bytes() == before, "the earlier index is left whole"
    assert not [p for p in out.rglob(".*.tmp")], "no temporary file is left behind"


def test_results_into_proc_or_a_file_are_clear_errors(cluster, tmp_path):
    cluster.start_server()
    with cluster.client() as c:
        c.submit_file(quick(tmp_path, "q"))
    for target in ("/proc/x", "/proc/self/x/y"):
        proc = gridbot("results", "q", target)
        assert proc.returncode == 2, proc.stderr
        no_traceback(proc)
        assert f"cannot write the results to {target}" in proc.stderr
    (tmp_path / "afile").write_text("x")
    proc = gridbot("results", "q", str(tmp_path / "afile"))
    assert proc.returncode == 2 and "is a file" in proc.stderr
    no_traceback(proc)


def test_a_folder_with_another_bags_results_is_refused_unless_forced(cluster, tmp_path):
    cluster.start_server()
    cluster.start_worker("--slots", "2")
    with cluster.client() as c:
        c.submit_file(quick(tmp_path, "a", 4))
        c.submit_file(quick(tmp_path, "b", 3, "echo b{i} > o"))
        c.wait("a", poll=0.2, timeout=60)
        c.wait("b", poll=0.2, timeout=60)
    out = tmp_path / "out"
    gridbot("results", "a", str(out), check=True)
    index = (out / "jobs.jsonl").read_bytes()
    again = gridbot("results", "a", str(out))  # the same bag again: its own folder
    assert again.returncode == 0 and (out / "jobs.jsonl").read_bytes() == index
    proc = gridbot("results", "b", str(out))
    assert proc.returncode == 2
    no_traceback(proc)
    assert "holds the results of another bag ('a'" in proc.stderr and "--force" in proc.stderr
    assert (out / "jobs.jsonl").read_bytes() == index and (out / "0" / "o").read_text() == "0\n"
    (out / "notes.txt").write_text("mine")
    (out / "3" / "plot.png").write_text("mine too")
    forced = gridbot("results", "b", str(out), "--force")
    assert forced.returncode == 0, forced.stderr
    rows = [json.loads(x) for x in (out / "jobs.jsonl").read_text().splitlines()]
    assert [r["command"] for r in rows] == ["echo b0 > o", "echo b1 > o", "echo b2 > o"]
    assert json.loads((out / ".gridbot-results.json").read_text())["bag"] == "b"
    # audit: bag a's results were left beside b's (its job 3's folder and output): now they go, the user's stay
    assert sorted(p.name for p in out.iterdir()) == [".gridbot-results.json", "0", "1", "2", "3", "jobs.jsonl",
                                                     "notes.txt"]
    assert [p.name for p in (out / "3").iterdir()] == ["plot.png"] and (out / "0" / "o").read_text() == "b0\n"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my own file")
    proc = gridbot("results", "a", str(mine))
    assert proc.returncode == 2 and "is not empty" in proc.stderr and "--force" in proc.stderr
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


# -- retry and revisions -----------------------------------------------------------------------------------


def test_retry_failed_jobs_reopens_the_bag_and_counts_failures_afresh(cluster, tmp_path):
    cluster.start_server()
    cluster.start_worker("--slots", "3")
    spec, flag = flaky(tmp_path, max_failures=2)
    with cluster.client() as c:
        c.submit_file(spec)
        first = c.wait("fl", poll=0.2, timeout=60)
        assert (first.state, first.counts.failed) == ("failed", 6)
        out = tmp_path / "out"
        c.download_results("fl", out)
        assert "broken 2" in (out / "2" / "stderr").read_text()

        bad = gridbot("retry", "fl", "--jobs", "1,9")
        assert bad.returncode == 2 and "there is no job 9" in bad.stderr
        no_traceback(bad)
        answer = gridbot_json("retry", "fl", "--jobs", "1")  # still broken: fails twice more, then for good
        assert answer["requeued"] == 1 and answer["bag"]["state"] == "active"
        again = c.wait("fl", poll=0.2, timeout=60)
        assert again.state == "failed" and again.counts.failed == 6
        job1 = next(j for j in c.jobs("fl") if j.index == 1)
        assert (job1.state, job1.attempts) == ("failed", 4), "max_failures applied afresh after the retry"

        flag.write_text("fixed")
        proc = gridbot("retry", "fl")
        assert proc.returncode == 0 and "6 failed job(s) queued again; it is active" in proc.stdout
        final = c.wait("fl", poll=0.2, timeout=60)
        assert (final.state, final.counts.done, final.counts.failed, final.finished_at is not None) == \
            ("completed", 6, 0, True)
        done_twice = gridbot("retry", "fl", "--jobs", "0")
        assert done_twice.returncode == 2 and "job(s) 0 (done)" in done_twice.stderr
        nothing = gridbot("retry", "fl")
        assert nothing.returncode == 0 and "no failed jobs: nothing to retry" in nothing.stdout
    gridbot("results", "fl", str(out), check=True)
    assert (out / "2" / "o").read_text() == "ok 2\n"
    assert not (out / "2" / "stderr").exists(), "the failed run's stderr is not left beside the new result"
    assert {json.loads(x)["state"] for x in (out / "jobs.jsonl").read_text().splitlines()} == {"done"}


def test_retry_of_a_cancelled_bag_is_refused_with_a_reason(cluster, tmp_path):
    cluster.start_server()
    with cluster.client() as c:
        c.submit_file(quick(tmp_path, "q"))
        c.cancel("q")
    proc = gridbot("retry", "q")
    assert proc.returncode == 2 and "was cancelled" in proc.stderr and "gridbot delete q" in proc.stderr
    no_traceback(proc)
    # found by the walkthrough review of 2026-11-29: a cancelled bag's counts did not add up to its total
    lines = gridbot("status").stdout.splitlines()
    columns = next(x for x in lines if "CANCELLED" in x).split()
    row = next(x for x in lines if x.split()[1:2] == ["q"]).split()
    assert row[columns.index("CANCELLED")] == row[columns.index("TOTAL")] != "0", lines


REVISED = """\
name = "rev"
command = "test {x} -le $(cat limit.txt) && echo {x} $(cat limit.txt) > out.txt"
inputs = ["limit.txt"]
outputs = ["out.txt"]
max_failures = 1
[parameters]
x = { from = 1, to = 8 }
"""


def test_run_retry_failed_makes_a_revision_that_keeps_good_results(tmp_path):
    (tmp_path / "rev.toml").write_text(REVISED)
    (tmp_path / "limit.txt").write_text("5\n")
    first = gridbot("run", "rev.toml", "--workers", "2", cwd=tmp_path)
    assert first.returncode == 1, first.stdout + first.stderr
    before = {r["index"]: r for r in map(json.loads, (tmp_path / "results/rev/jobs.jsonl").read_text().splitlines())}
    (tmp_path / "limit.txt").write_text("10\n")
    refused = gridbot("run", "rev.toml", cwd=tmp_path)
    assert refused.returncode == 2 and "--retry-failed" in refused.stderr
    second = gridbot("run", "rev.toml", "--retry-failed", "--workers", "2", cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "revision 2: 3 failed job(s) queued again" in second.stdout
    rows = {r["index"]: r for r in map(json.loads, (tmp_path / "results/rev/jobs.jsonl").read_text().splitlines())}
    assert {r["state"] for r in rows.values()} == {"done"}
    assert [rows[i]["revision"] for i in range(8)] == [1] * 5 + [2] * 3
    assert (tmp_path / "results/rev/4/out.txt").read_text() == "5 5\n", "good results are kept, not rerun"
    assert (tmp_path / "results/rev/7/out.txt").read_text() == "8 10\n", "reruns got the new input"
    # not run again (on a loaded machine an answer may time out and its instance be sent again: count from
    # what the first run left)
    assert rows[4]["attempts"] == before[4]["attempts"]
    resumed = gridbot("run", "rev.toml", cwd=tmp_path)  # the revision is the bag's spec now
    assert resumed.returncode == 0 and "had already ended" in resumed.stdout

    (tmp_path / "rev.toml").write_text(REVISED.replace("to = 8", "to = 9"))
    proc = gridbot("run", "rev.toml", "--retry-failed", cwd=tmp_path)
    assert proc.returncode == 2 and "a revision keeps the bag's jobs" in proc.stderr
    no_traceback(proc)


def test_a_revision_shows_each_job_with_the_command_it_ran_and_brings_its_inputs(cluster, tmp_path):
    cluster.start_server()
    cluster.start_worker("--slots", "2")  # it stays up: it must fetch the new revision's input, not its copy
    spec = tmp_path / "cmd.toml"
    head = ('name = "cmd"\ninputs = ["v.txt"]\noutputs = ["o"]\nmax_failures = 1\n'
            '[parameters]\ni = { from = 0, to = 3 }\n')
    spec.write_text('command = "test $(({i} % 2)) = 0 || exit 3; cat v.txt > o"\n' + head)
    (tmp_path / "v.txt").write_text("one\n")
    with cluster.client() as c:
        c.submit_file(spec)
        assert c.wait("cmd", poll=0.2, timeout=60).counts.failed == 2
        spec.write_text('command = "echo new {i} $(cat v.txt) > o"\n' + head)
        (tmp_path / "v.txt").write_text("two\n")
        # the command line (the second walkthrough of 2026-11-29: only the API could revise a server's bag)
        proc = gridbot("retry", "cmd", "--spec", str(spec))
        assert proc.returncode == 0 and "bag cmd: revision 2; 2 failed job(s) queued again" in proc.stdout, \
            proc.stdout + proc.stderr
        final = c.wait("cmd", poll=0.2, timeout=60)
        assert (final.state, final.revision, final.counts.done) == ("completed", 2, 4)
        assert [(j.revision, j.command) for j in c.jobs("cmd")] == [
            (1, "test $((0 % 2)) = 0 || exit 3; cat v.txt > o"), (2, "echo new 1 $(cat v.txt) > o"),
            (1, "test $((2 % 2)) = 0 || exit 3; cat v.txt > o"), (2, "echo new 3 $(cat v.txt) > o")]
        assert [r.outputs["o"] for r in c.results("cmd")] == [b"one\n", b"new 1 two\n", b"one\n", b"new 3 two\n"]
    assert "cmd (revision 2)" in gridbot("status").stdout


def test_retry_each_line_revises_a_servers_bag_and_keeps_its_budget(cluster, tmp_path):
    cluster.start_server()
    cluster.start_worker("--slots", "2")
    (tmp_path / "cmds.txt").write_text("true\nexit 3\n")
    gridbot("submit", "--each-line", str(tmp_path / "cmds.txt"), "--name", "el", "--max-failures", "1",
            "--budget", "5", check=True)
    assert cluster.wait_bag("el", timeout=60).counts.failed == 1
    (tmp_path / "fixed.txt").write_text("true\ntrue\n")
    both = gridbot("retry", "el", "--each-line", str(tmp_path / "fixed.txt"), "--jobs", "1")
    assert both.returncode == 2 and "not both" in both.stderr
    bag_id = str(cluster.wait_bag("el", timeout=5).bag_id)  # by id too (a review: its id became the spec's name)
    proc = gridbot("retry", bag_id, "--each-line", str(tmp_path / "fixed.txt"))
    assert proc.returncode == 0 and "revision 2; 1 failed job(s) queued again" in proc.stdout, proc.stderr
    final = cluster.wait_bag("el", timeout=60)
    assert (final.state, final.revision, final.budget) == ("completed", 2, 5.0), final
    with cluster.client() as c:
        kept = c.spec("el")
    assert (kept.max_failures, kept.budget, kept.strategy.placement) == (1, 5.0, "cost-time"), "every setting kept"
    wrong = gridbot("retry", "el", "--spec", str(tmp_path / "fixed.txt"))
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr, wrong.stderr
    same = gridbot("retry", "el", "--each-line", str(tmp_path / "fixed.txt"))
    assert same.returncode == 0 and "the same spec as its own, so no revision" in same.stdout, same.stdout


def test_each_line_bags_take_max_failures_and_timeout(tmp_path):
    (tmp_path / "cmds.txt").write_text("echo fine\nsleep 20\n")
    start = time.monotonic()
    proc = gridbot("run", "--each-line", "cmds.txt", "--max-failures", "1", "--timeout", "1s", "--workers", "2",
                   cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert time.monotonic() - start < 18
    rows = {r["index"]: r for r in map(json.loads, (tmp_path / "results/cmds/jobs.jsonl").read_text().splitlines())}
    assert rows[1]["state"] == "failed" and "failed 1 time; last: timed out after 1 s" in rows[1]["reason"]
    (tmp_path / "s.toml").write_text('command = "true"\n')
    bad = gridbot("run", "s.toml", "--max-failures", "2", cwd=tmp_path)
    assert bad.returncode == 2 and "--max-failures goes with --each-line" in bad.stderr
    worse = gridbot("run", "--each-line", "cmds.txt", "--timeout", "soon", cwd=tmp_path)
    assert worse.returncode == 2 and "--timeout" in worse.stderr
    no_traceback(worse)


# -- delete ------------------------------------------------------------------------------------------------


def _rows(db: Path, bag_id: int) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        return {t: conn.execute(f"SELECT COUNT(*) FROM {t} WHERE {col} = ?", (bag_id,)).fetchone()[0]
                for t, col in (("bags", "id"), ("jobs", "bag_id"), ("instances", "bag_id"),
                               ("bag_inputs", "bag_id"), ("bag_revisions", "bag_id"))}


def test_delete_refuses_results_never_downloaded_and_keeps_them_on_request(cluster, tmp_path):
    cluster.start_server()
    cluster.start_worker("--slots", "2")
    (tmp_path / "data.txt").write_text("x")
    spec = quick(tmp_path, "q")
    spec.write_text(spec.read_text().replace('outputs', 'inputs = ["data.txt"]\noutputs'))
    with cluster.client() as c:
        bag_id = c.submit_file(spec).bag_id
        c.wait("q", poll=0.2, timeout=60)
    proc = gridbot("delete", "q")
    assert proc.returncode == 2 and "were never downloaded" in proc.stderr
    assert "--keep-results" in proc.stderr and "--force" in proc.stderr
    kept = tmp_path / "kept"
    done = gridbot("delete", "q", "--keep-results", str(kept))
    assert done.returncode == 0, done.stderr
    assert "deleted bag" in done.stdout and (kept / "5" / "o").read_text() == "5\n"
    assert _rows(tmp_path / "server.db", bag_id) == dict.fromkeys(
        ("bags", "jobs", "instances", "bag_inputs", "bag_revisions"), 0)
    with sqlite3.connect(tmp_path / "server.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM outputs").fetchone()[0] == 0
    assert gridbot_json("status") == []
    with cluster.client() as c:
        assert c.submit_file(spec).name == "q", "the name is free again"
        assert c.wait("q", poll=0.2, timeout=60).state == "completed"
    gridbot("results", "q", str(tmp_path / "again"), check=True)
    assert gridbot("delete", "q").returncode == 0, "downloaded results: nothing to lose"


def test_delete_an_active_bag_cancels_it_and_its_workers_kill_its_jobs(tmp_path):
    cluster = Cluster(tmp_path, server_args=("--heartbeat", "1"))
    try:
        cluster.start_server()
        cluster.start_worker("--slots", "2")
        (tmp_path / "slow.toml").write_text('name = "slow"\ncommand = "sleep 31{i}"\n[parameters]\ni = [1, 2, 3]\n')
        with cluster.client() as c:
            c.submit_file(tmp_path / "slow.toml")
            deadline = time.monotonic() + 20
            while c.bag("slow").counts.running < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
        gone = gridbot_json("delete", "slow")  # nothing ended, so no result to lose
        assert gone["deleted"]["state"] == "active"
        deadline = time.monotonic() + 15
        while "sleep 31" in _processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "sleep 31" not in _processes()
        with cluster.client() as c, pytest.raises(ApiError, match="no bag 'slow'"):
            c.bag("slow")
    finally:
        cluster.stop()


def _processes() -> str:
    import subprocess

    return subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


# -- logs and listings -------------------------------------------------------------------------------------


def test_logs_show_each_instance_and_the_kept_output(cluster, tmp_path):
    cluster.start_server()
    cluster.start_worker("--slots", "2")
    spec, _ = flaky(tmp_path, last=2, max_failures=2)
    with cluster.client() as c:
        c.submit_file(spec)
        c.wait("fl", poll=0.2, timeout=60)
    proc = gridbot("logs", "fl", "1")
    assert proc.returncode == 0, proc.stderr
    assert "job 1 of bag fl: failed, 2 attempt(s)" in proc.stdout
    lines = [x for x in proc.stdout.splitlines() if x.startswith("instance ")]
    assert len(lines) == 2 and all("failed" in x and "; exit code 3" in x for x in lines)
    assert "(kept in the results)" in lines[1] and "--- stderr of instance" in proc.stdout
    assert proc.stdout.endswith("broken 1\n")
    story = gridbot_json("logs", "fl", "1")
    assert [i["kept"] for i in story["instances"]] == [False, True]
    assert story["instances"][1]["stderr_tail"] == "broken 1\n" and story["params"] == {"i": "1"}
    missing = gridbot("logs", "fl", "7")
    assert missing.returncode == 2 and "there is no job 7" in missing.stderr
    bob = tmp_path / "bob.json"
    gridbot("access", "add-submitter", "bob", "--out", str(bob), "--access-file", str(cluster.access), check=True)
    with Client(cluster.url, access=bob) as b:
        for call in (lambda: b.logs("fl", 1), lambda: b.retry("fl"), lambda: b.delete("fl", force=True)):
            with pytest.raises(ApiError, match="no bag 'fl'") as e:
                call()
            assert e.value.status == 404
    with cluster.client() as c:
        assert c.bag("fl").state == "failed", "another submitter changed nothing"


def test_jobs_says_when_it_cut_the_list_and_pages_past_the_server_limit(cluster, tmp_path):
    cluster.start_server()
    (tmp_path / "big.toml").write_text('name = "big"\ncommand = "true"\n[parameters]\ni = { from = 0, to = 10049 }\n')
    with cluster.client() as c:
        c.submit_file(tmp_path / "big.toml")
    cut = gridbot("jobs", "big", "--limit", "5")
    assert cut.returncode == 0 and "showing the first 5 of 10,050 jobs; --all" in cut.stderr
    assert len(gridbot_json("jobs", "big", "--limit", "10020")) == 10020
    every = gridbot("jobs", "big", "--all", "--json")
    assert len(json.loads(every.stdout)) == 10050 and "showing" not in every.stderr
    queued = gridbot("jobs", "big", "--state", "queued", "--limit", "3")
    assert "showing the first 3 of 10,050 queued jobs" in queued.stderr
