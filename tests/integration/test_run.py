"""`gridbot run` as a user types it: real workers, real commands, a SQLite store, results on disk."""

import json
import signal
import sqlite3
import subprocess
import sys
import time

from tests.integration.harness import GRIDBOT, gridbot

SWEEP = """\
name = "sweep"
command = "printf '%s %s\\\\n' {x} $(cat factor.txt) > out.txt; echo done {x}"
inputs = ["factor.txt"]
outputs = ["out.txt"]
[parameters]
x = { from = 1, to = 40 }
"""


def test_run_a_sweep_collects_every_result(tmp_path):
    (tmp_path / "sweep.toml").write_text(SWEEP)
    (tmp_path / "factor.txt").write_text("7\n")
    proc = gridbot("run", "sweep.toml", "--workers", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "bag sweep: completed" in proc.stdout
    rows = [json.loads(line) for line in (tmp_path / "results/sweep/jobs.jsonl").read_text().splitlines()]
    assert sorted(r["index"] for r in rows) == list(range(40)) and {r["state"] for r in rows} == {"done"}
    assert (tmp_path / "results/sweep/05/out.txt").read_text() == "6 7\n"
    assert (tmp_path / "results/sweep/05/stdout").read_text() == "done 6\n"
    assert rows[5]["params"] == {"x": "6"} and rows[5]["exit_code"] == 0 and rows[5]["cpu_s"] >= 0


def test_run_again_on_the_same_store_does_not_run_jobs_twice(tmp_path):
    (tmp_path / "sweep.toml").write_text(SWEEP)
    (tmp_path / "factor.txt").write_text("7\n")
    assert gridbot("run", "sweep.toml", "--workers", "2", cwd=tmp_path).returncode == 0
    again = gridbot("run", "sweep.toml", cwd=tmp_path)
    assert again.returncode == 0 and "had already ended" in again.stdout
    (tmp_path / "factor.txt").write_text("8\n")
    changed = gridbot("run", "sweep.toml", cwd=tmp_path)
    assert changed.returncode == 2 and "different spec or inputs" in changed.stderr


def test_each_line_and_failures_with_reasons(tmp_path):
    (tmp_path / "cmds.txt").write_text("echo fine\nno-such-command-xyz\nexit 3\n")
    proc = gridbot("run", "--each-line", "cmds.txt", "--workers", "2", cwd=tmp_path)
    assert proc.returncode == 1
    assert "command not found (exit code 127)" in proc.stdout and "no-such-command-xyz" in proc.stdout
    assert "failed 3 times; last: exit code 3" in proc.stdout
    rows = {json.loads(x)["index"]: json.loads(x) for x in (tmp_path / "results/cmds/jobs.jsonl").open()}
    assert rows[0]["state"] == "done" and rows[1]["state"] == "failed" and rows[1]["attempts"] == 3


def test_bad_spec_exits_2_and_stores_nothing(tmp_path):
    (tmp_path / "bad.toml").write_text('command = "run {alpah}"\n[parameters]\nalpha = [1, 2]\n')
    proc = gridbot("run", "bad.toml", cwd=tmp_path)
    assert proc.returncode == 2
    assert "bad.toml:1: placeholder {alpah} in 'command' names no parameter" in proc.stderr
    assert "did you mean 'alpha'?" in proc.stderr
    assert not (tmp_path / ".gridbot").exists()
    missing = gridbot("run", "nope.toml", cwd=tmp_path)
    assert missing.returncode == 2 and "cannot read spec nope.toml" in missing.stderr


def test_a_results_folder_that_is_taken_is_refused_before_the_bag_is_stored(tmp_path):
    """Found by the walkthrough review of 2026-11-29: the run stored the bag, then refused the folder, and left
    the bag active in the store."""
    (tmp_path / "sweep.toml").write_text(SWEEP.replace("to = 40", "to = 3"))
    (tmp_path / "factor.txt").write_text("7\n")
    folder = tmp_path / "results" / "sweep"
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("mine")
    proc = gridbot("run", "sweep.toml", cwd=tmp_path)
    assert proc.returncode == 2 and "results/sweep is not empty" in proc.stderr and "--force" in proc.stderr
    stores = list((tmp_path / ".gridbot").rglob("*.db"))
    for db in stores:
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM bags").fetchone() == (0,), "nothing stored"
    (folder / ".gridbot-results.json").write_text('{"bag": "sweep", "bag_id": 1, "created_at": 1.0}')
    (folder / "notes.txt").unlink()
    proc = gridbot("run", "sweep.toml", cwd=tmp_path)
    assert proc.returncode == 2 and "holds the results of an earlier bag of that name, from another store or " \
        "deleted since ('sweep', id 1" in " ".join(proc.stderr.split())
    (folder / ".gridbot-results.json").unlink()
    proc = gridbot("run", "sweep.toml", cwd=tmp_path)
    assert proc.returncode == 0 and "bag sweep: completed" in proc.stdout, proc.stdout + proc.stderr


def test_sweep_over_max_jobs_is_refused(tmp_path):
    (tmp_path / "big.toml").write_text('command = "true"\n[parameters]\na = { from = 1, to = 5000 }\n')
    proc = gridbot("run", "big.toml", "--max-jobs", "1000", cwd=tmp_path)
    assert proc.returncode == 2 and "over the limit of 1,000" in proc.stderr


def test_missing_input_file_names_the_spec_folder(tmp_path):
    (tmp_path / "s.toml").write_text('command = "true"\ninputs = ["data.bin"]\n')
    proc = gridbot("run", "s.toml", cwd=tmp_path)
    assert proc.returncode == 2 and "input file 'data.bin' cannot be read" in proc.stderr


def test_result_over_the_size_limit_fails_the_job_with_a_reason(tmp_path):
    (tmp_path / "s.toml").write_text('command = "head -c 5000 /dev/zero > big"\noutputs = ["big"]\n'
                                     'max_failures = 1\n')
    proc = gridbot("run", "s.toml", "--max-result-size", "4K", "--workers", "1", cwd=tmp_path)
    assert proc.returncode == 1
    assert "over the server's limit of 4,096 bytes" in proc.stdout


def test_missing_output_and_timeout_are_failures(tmp_path):
    (tmp_path / "s.toml").write_text('command = "sleep {t}"\noutputs = ["never"]\ntimeout = 1\nmax_failures = 1\n'
                                     '[parameters]\nt = [0, 30]\n')
    proc = gridbot("run", "s.toml", "--workers", "2", cwd=tmp_path)
    assert proc.returncode == 1
    assert "expected output 'never' was not produced" in proc.stdout
    assert "timed out after 1 s" in proc.stdout


def test_ctrl_c_stops_cleanly_and_the_next_run_resumes(tmp_path):
    (tmp_path / "slow.toml").write_text(f'command = "sleep 0.2; echo {{i}} >> {tmp_path}/ran.log"\n'
                                        '[parameters]\ni = { from = 1, to = 60 }\n')
    proc = subprocess.Popen([*GRIDBOT, "run", "slow.toml", "--workers", "2"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    db = tmp_path / ".gridbot/gridbot.db"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.3)
        if db.exists():
            try:
                with sqlite3.connect(db) as conn:
                    done = conn.execute("SELECT COALESCE(SUM(done), 0) FROM bags").fetchone()[0]
            except sqlite3.OperationalError:  # the file is made a moment before its tables
                continue
            if done >= 5:
                break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert "run the same command again to resume" in err
    with sqlite3.connect(db) as conn:
        state, done, running = conn.execute("SELECT state, done, running FROM bags").fetchone()
        interrupted = conn.execute("SELECT COUNT(*) FROM instances WHERE state = 'interrupted'").fetchone()[0]
    assert state == "active" and 5 <= done < 60 and running == 0
    resumed = gridbot("run", "slow.toml", "--workers", "2", cwd=tmp_path)
    assert resumed.returncode == 0 and f"resuming bag 'slow': {done} done" in resumed.stdout
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT done, failed FROM bags").fetchone() == (60, 0)
        assert conn.execute("SELECT MAX(failures) FROM jobs").fetchone()[0] == 0
    ran = (tmp_path / "ran.log").read_text().split()
    assert sorted(set(ran), key=int) == [str(i) for i in range(1, 61)]
    assert len(ran) - 60 <= interrupted  # only jobs cut off by Ctrl-C ran a second time


def test_python_module_entry_point_shows_help():
    proc = subprocess.run([sys.executable, "-m", "gridbot", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "gridbot runs bags of tasks" in proc.stdout


def test_a_second_run_on_the_same_store_is_refused_while_the_first_runs(tmp_path):
    (tmp_path / "slow.toml").write_text('command = "sleep 2"\n[parameters]\ni = [1, 2]\n')
    first = subprocess.Popen([*GRIDBOT, "run", "slow.toml", "--workers", "2"], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (tmp_path / ".gridbot/gridbot.db.lock").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    second = gridbot("run", "slow.toml", cwd=tmp_path)
    assert second.returncode == 2 and "another gridbot server (or `gridbot run`) is using" in second.stderr
    assert first.wait(60) == 0
