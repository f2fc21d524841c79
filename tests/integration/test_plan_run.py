"""`gridbot run sweep.pln` (issue 16): a Nimrod/G plan file runs for real as the bag its TOML would make."""

import json

from tests.integration.harness import gridbot

PLAN = """\
# a Nimrod/G plan file, in the paper's syntax (Figure 9)
parameter x integer range from 1 to 3 step 1;
parameter word label "A word" text select anyof "a b" "c";
task main
    copy prog.sh node:prog
    node:execute ./prog $x "${word}" > out.txt
    copy node:out.txt ./out.$jobname
endtask
"""


def test_a_plan_file_runs_end_to_end(tmp_path):
    (tmp_path / "sweep.pln").write_text(PLAN)
    (tmp_path / "prog.sh").write_text('#!/bin/sh\necho "x=$1 word=$2"\n')  # staged without its mode: made +x
    proc = gridbot("run", "sweep.pln", "--workers", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(line) for line in (tmp_path / "results/sweep/jobs.jsonl").read_text().splitlines()]
    assert sorted(r["index"] for r in rows) == list(range(6)) and {r["state"] for r in rows} == {"done"}
    assert (tmp_path / "results/sweep/0/out.txt").read_text() == "x=1 word=a b\n"
    assert (tmp_path / "results/sweep/5/out.txt").read_text() == "x=3 word=c\n"


def test_a_bad_plan_file_exits_2_with_its_line(tmp_path):
    (tmp_path / "sweep.pln").write_text(PLAN.replace("${word}", "${wrod}"))
    proc = gridbot("run", "sweep.pln", cwd=tmp_path)
    assert proc.returncode == 2
    assert "sweep.pln:6: $wrod names no parameter" in proc.stderr and "did you mean 'word'?" in proc.stderr
    assert not (tmp_path / ".gridbot").exists()
