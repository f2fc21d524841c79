"""The executor runs a plain command without a shell (as GNU make does) and everything else under
`/bin/sh -c`; a user sees the same outputs, exit codes and messages either way, and on both of the worker's
paths: a task of its event loop (`run_instance`) and a slot thread (`run_blocking`, on a thread with a working
directory of its own, as a slot thread has, and on the main thread, which changes the process's around each
spawn). Real processes."""

from __future__ import annotations

import asyncio
import os
import stat
import threading
from pathlib import Path

import pytest

from gridbot.model.records import Assignment, InstanceReport, Outcome
from gridbot.worker import executor
from gridbot.worker.executor import KillSwitch, plain_argv, run_blocking, run_instance


async def no_inputs(bag_id: int, name: str) -> Path:
    raise AssertionError("no inputs")


def run_on(path: str, a: Assignment, jobdir: Path, base_env: dict[str, str] | None = None) -> InstanceReport:
    """Run `a` on the event loop's path ("loop") or a slot thread's: "thread" on a thread of its own (which
    gets a working directory of its own), "main-thread" on this one (which changes the process's)."""
    if path == "loop":
        return asyncio.run(run_instance(a, jobdir, no_inputs, 1 << 20, KillSwitch(), base_env=base_env))
    reports: list[InstanceReport] = []

    def run() -> None:
        wake = os.eventfd(0, os.EFD_NONBLOCK)
        try:
            reports.append(run_blocking(a, jobdir, 1 << 20, KillSwitch(), wake, lambda pid: None, None, base_env))
        finally:
            os.close(wake)

    if path == "main-thread":
        run()
    else:
        thread = threading.Thread(target=run)
        thread.start()
        thread.join(60)
    return reports[0]


@pytest.fixture(params=["loop", "thread", "main-thread"])
def run(request):
    def run(tmp_path: Path, command: str, env: dict[str, str] | None = None) -> InstanceReport:
        return run_on(request.param, Assignment(1, 1, 1, "b", 0, command, env or {}, [], [], 60.0), tmp_path / "job")
    return run


@pytest.mark.parametrize(("command", "plain"), [
    ("true", ["true"]),
    ("python3 work.py 5 --out=r.txt", ["python3", "work.py", "5", "--out=r.txt"]),
    ("./prog -n 3", ["./prog", "-n", "3"]),
    ("echo $HOME", None), ("a && b", None), ("FOO=1 env", None), ("cd /tmp", None), ("x > y", None),
    ('echo "a b"', None), ("sleep 1;", None), ("exit 3", None), ("echo  two", None), ("ls *.txt", None),
    ("echo ~", None), ("true # comment", None), ("printf a\tb", None),
])
def test_only_commands_the_shell_would_just_split_skip_it(command, plain):
    assert plain_argv(command) == plain


@pytest.mark.parametrize("left", ["file", "dangling link", "link to itself", "link to a directory"])
def test_a_file_or_link_at_the_slots_path_is_replaced_by_its_directory(tmp_path, run, left):
    """On every path (the event loop's too, which only checked `isdir` and failed each later job): a job
    can leave these at its slot's path, and the path is the same after a restart. A link to a directory
    would have the next jobs run there, and the slot's cleaning empty it."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep").write_text("mine")
    make = {"file": "touch job", "dangling link": "ln -s nowhere job", "link to itself": "ln -s job job",
            "link to a directory": f"ln -s {other} job"}[left]
    r = run(tmp_path, f"cd .. && rm -rf job && {make}")
    assert r.outcome is Outcome.SUCCESS, r
    r = run(tmp_path, "pwd -P && touch made")
    assert (r.outcome, r.stdout_tail) == (Outcome.SUCCESS, f"{tmp_path / 'job'}\n"), r
    assert not (tmp_path / "job").is_symlink() and sorted(p.name for p in other.iterdir()) == ["keep"]


def test_a_job_whose_inputs_cannot_be_staged_reports_no_output_of_the_job_before_it(tmp_path):
    """Found in the last read of this session: on the event loop's path (jobs with inputs run there) a job
    that failed before its spawn reported the slot's output files as its own tails, which still held the
    previous job's output, maybe another bag's. The slot threads' path already reported none."""
    async def unreachable(bag_id: int, name: str) -> Path:
        raise OSError("the server is away")

    jobdir = tmp_path / "job"
    first = Assignment(1, 1, 1, "theirs", 0, "echo secret-of-another-bag; echo err >&2", {}, [], [], 60.0)
    r = asyncio.run(run_instance(first, jobdir, no_inputs, 1 << 20, KillSwitch(), keep=False))
    assert (r.outcome, r.stdout_tail) == (Outcome.SUCCESS, "secret-of-another-bag\n"), r
    second = Assignment(2, 2, 2, "mine", 0, "cat in.txt", {}, ["in.txt"], [], 60.0)
    r = asyncio.run(run_instance(second, jobdir, unreachable, 1 << 20, KillSwitch(), keep=False))
    assert r.outcome is Outcome.FAILURE and "could not stage inputs: the server is away" in r.reason, r
    assert (r.stdout_tail, r.stderr_tail, r.exit_code) == ("", "", None), r


def test_a_plain_command_runs_without_a_shell(tmp_path, run):
    def parent(report: InstanceReport) -> int:
        assert report.outcome is Outcome.SUCCESS, report
        return int(report.stdout_tail.rsplit(")", 1)[1].split()[1])

    assert parent(run(tmp_path, "cat /proc/self/stat")) == os.getpid(), "started by the worker itself"
    assert parent(run(tmp_path, "cat /proc/self/stat && true")) != os.getpid(), "started by /bin/sh"


def test_a_plain_command_finds_programs_on_the_jobs_own_path(tmp_path, run):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    prog = bin_dir / "hello-gridbot"
    prog.write_text("#!/bin/sh\necho hello from $0 \"$@\"\n")
    prog.chmod(prog.stat().st_mode | stat.S_IXUSR)
    r = run(tmp_path, "hello-gridbot a b", {"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert (r.outcome, r.stdout_tail) == (Outcome.SUCCESS, "hello from /tmp/x a b\n".replace("/tmp/x", str(prog)))


def test_what_cannot_be_executed_fails_as_the_shell_fails_it(tmp_path, run):
    r = run(tmp_path, "no-such-program-gridbot 1")
    assert (r.outcome, r.exit_code) == (Outcome.FAILURE, 127) and "not found" in r.stderr_tail
    script = tmp_path / "job" / "noshebang"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("echo ran by the shell; exit 4\n")
    script.chmod(0o755)
    r = run(tmp_path, "./noshebang")
    assert (r.exit_code, r.stdout_tail) == (4, "ran by the shell\n"), "a script without #! is the shell's"
    unreadable = tmp_path / "job" / "notexec"
    unreadable.write_text("echo x\n")
    r = run(tmp_path, "./notexec")
    assert r.exit_code == 126 and "Permission denied" in r.stderr_tail


def test_exit_codes_and_outputs_are_the_programs(tmp_path, run):
    r = run(tmp_path, "ls /no/such/gridbot/dir")
    assert (r.outcome, r.exit_code) == (Outcome.FAILURE, 2) and "No such file" in r.stderr_tail
    r = run(tmp_path, "exit 3")
    assert r.exit_code == 3, "a builtin: under the shell"
    r = run(tmp_path, "false")
    assert (r.outcome, r.exit_code) == (Outcome.FAILURE, 1)
    r = run(tmp_path, "echo plain words")
    assert (r.outcome, r.stdout_tail) == (Outcome.SUCCESS, "plain words\n")


def test_a_program_gone_from_where_it_was_found_is_searched_for_again_at_once(tmp_path, run, monkeypatch):
    """The spawn remembers where a program was found on the PATH (`executor._find`): one removed since runs
    from where the PATH now has it, at once; one installed earlier on the PATH is used once FOUND_FOR passes."""
    monkeypatch.setattr(executor, "FOUND_FOR", 60.0)
    first, second = tmp_path / "first", tmp_path / "second"
    for d in (first, second):
        d.mkdir()
    env = {"PATH": f"{first}:{second}:{os.environ['PATH']}"}

    def install(d: Path) -> None:
        prog = d / "which-gridbot"
        prog.write_text(f"#!/bin/sh\necho {d.name}\n")
        prog.chmod(0o755)

    install(first)
    assert run(tmp_path, "which-gridbot", env).stdout_tail == "first\n"
    (first / "which-gridbot").unlink()
    install(second)
    assert run(tmp_path, "which-gridbot", env).stdout_tail == "second\n"
    assert run(tmp_path, "which-gridbot", env).stdout_tail == "second\n"
    install(first)
    assert run(tmp_path, "which-gridbot", env).stdout_tail == "second\n", "earlier on the PATH: not yet seen"
    monkeypatch.setattr(executor, "FOUND_FOR", 0.0)
    assert run(tmp_path, "which-gridbot", env).stdout_tail == "first\n", "found again once FOUND_FOR has passed"


def test_a_program_on_a_relative_path_entry_is_looked_for_in_each_jobs_directory(tmp_path, run):
    """Found by review: a PATH with a relative (or empty) entry before the one that held the program must not
    be remembered, since another job's directory may hold the program at that entry."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "which-rel").write_text("#!/bin/sh\necho absolute\n")
    (bin_dir / "which-rel").chmod(0o755)
    env = {"PATH": f":{bin_dir}:{os.environ['PATH']}"}
    assert run(tmp_path / "a", "which-rel", env).stdout_tail == "absolute\n"
    local = tmp_path / "b" / "job" / "which-rel"
    local.parent.mkdir(parents=True)
    local.write_text("#!/bin/sh\necho local\n")
    local.chmod(0o755)
    assert run(tmp_path / "b", "which-rel", env).stdout_tail == "local\n"


@pytest.mark.parametrize("path", ["loop", "thread", "main-thread"])
def test_a_bags_env_cannot_take_the_run_mark_by_which_the_worker_watches_its_jobs(tmp_path, path):
    """Found by the review of 2026-11-27: `[env] GRIDBOT_RUN = "mine"` replaced the worker's mark, so the reaper
    no longer found the job's processes and its memory limit went unenforced. Specs now refuse GRIDBOT_* in
    [env]; a bag stored before that still cannot take the mark."""
    a = Assignment(1, 1, 1, "b", 0, 'echo "$GRIDBOT_RUN $MINE"', {"GRIDBOT_RUN": "mine", "MINE": "kept"}, [], [],
                   60.0)
    base = {"PATH": os.environ["PATH"], "GRIDBOT_RUN": "the-workers-token"}
    report = run_on(path, a, tmp_path / "job", base)
    assert report.outcome is Outcome.SUCCESS and report.stdout_tail == "the-workers-token kept\n"


def test_a_slot_threads_jobs_in_a_row_truncate_only_output_files_that_hold_something(tmp_path, monkeypatch):
    """A slot thread skips truncating output files its last cleaning found empty (a journalled change of the
    inode, 16 µs of an `sh -c true` job: issue 14); a file that held the job before's output is truncated,
    or its tail would show that job's output after this one's."""
    spawned: list[bool] = []
    spawn = executor._spawn

    def recording(*args, **kwargs):
        spawned.append(args[5] if len(args) > 5 else kwargs.get("trunc", True))
        return spawn(*args, **kwargs)

    monkeypatch.setattr(executor, "_spawn", recording)
    commands = ["true", "printf x", "echo long-output-of-the-job-before; echo e >&2", "printf y", "true", "true"]
    reports: list[InstanceReport] = []

    def slot() -> None:
        wake = os.eventfd(0, os.EFD_NONBLOCK)
        try:
            for i, command in enumerate(commands):
                a = Assignment(i, i, i, "b", i, command, {}, [], [], None)
                reports.append(run_blocking(a, tmp_path / "t0", 1 << 20, KillSwitch(), wake, lambda pid: None,
                                            None, None, keep=False))
        finally:
            os.close(wake)

    thread = threading.Thread(target=slot)
    thread.start()
    thread.join(60)
    assert [(r.outcome, r.stdout_tail, r.stderr_tail) for r in reports] == [
        (Outcome.SUCCESS, "", ""), (Outcome.SUCCESS, "x", ""),
        (Outcome.SUCCESS, "long-output-of-the-job-before\n", "e\n"), (Outcome.SUCCESS, "y", ""),
        (Outcome.SUCCESS, "", ""), (Outcome.SUCCESS, "", "")]
    assert spawned == [True, False, True, True, True, False]


def test_output_files_are_truncated_after_a_job_that_left_processes_behind_or_in_another_directory(
        tmp_path, monkeypatch):
    """The review's findings: a process a job left behind may write to its files after they were found empty
    (the worker's sweep kills it after the reaping: `reaped_cb` says so), and a slot directory replaced since
    is another directory whatever its path: either way the next spawn truncates."""
    spawned: list[bool] = []
    spawn = executor._spawn

    def recording(*args, **kwargs):
        spawned.append(args[5])
        return spawn(*args, **kwargs)

    monkeypatch.setattr(executor, "_spawn", recording)
    jobdir = tmp_path / "t0"

    def slot() -> None:
        wake = os.eventfd(0, os.EFD_NONBLOCK)
        try:
            for i, left in enumerate([False, False, True, False, False]):
                if i == 4:
                    os.rename(jobdir, tmp_path / "old")
                    jobdir.mkdir()
                    (jobdir / executor.STDOUT).write_text("not this job's")
                a = Assignment(i, i, i, "b", i, "true", {}, [], [], None)
                r = run_blocking(a, jobdir, 1 << 20, KillSwitch(), wake, lambda pid: None, None, None, keep=False,
                                 reaped_cb=lambda left=left: left)
                assert (r.outcome, r.stdout_tail) == (Outcome.SUCCESS, ""), r
        finally:
            os.close(wake)

    thread = threading.Thread(target=slot)
    thread.start()
    thread.join(60)
    assert spawned == [True, False, False, True, True]


def test_cleaning_removes_output_files_a_job_made_unreadable_and_says_whether_they_are_empty(tmp_path, run):
    """A job's `chmod 000` on its output files failed every later spawn of the slot for a worker that is not
    root (they were kept for the next spawn to truncate); they are removed now, and the next job's are new."""
    jobdir = tmp_path / "job"
    jobdir.mkdir()
    assert executor.clean_dir(jobdir) is True  # nothing there: the spawn creates them empty
    (jobdir / executor.STDOUT).write_text("")
    (jobdir / executor.STDERR).write_text("")
    (jobdir / "left.txt").write_text("x")
    assert executor.clean_dir(jobdir) is True and sorted(p.name for p in jobdir.iterdir()) == sorted(
        [executor.STDOUT, executor.STDERR])
    (jobdir / executor.STDERR).write_text("something")
    assert executor.clean_dir(jobdir) is False
    for name in (executor.STDOUT, executor.STDERR):
        (jobdir / name).chmod(0)
    assert executor.clean_dir(jobdir) is True and list(jobdir.iterdir()) == []
    assert executor.clean_dir(tmp_path / "gone") is False
    r = run(tmp_path, f"chmod 000 {executor.STDOUT} {executor.STDERR}")
    assert r.outcome is Outcome.SUCCESS, r
    executor.clean_dir(jobdir)
    r = run(tmp_path, "echo fine")
    assert (r.outcome, r.stdout_tail) == (Outcome.SUCCESS, "fine\n"), r
    assert stat.S_IMODE((jobdir / executor.STDOUT).stat().st_mode) == 0o644
    r = run(tmp_path, f"ln {executor.STDOUT} ../spy")  # a link elsewhere would show later jobs' output there
    assert r.outcome is Outcome.SUCCESS, r
    assert executor.clean_dir(jobdir) is True and not (jobdir / executor.STDOUT).exists()
    r = run(tmp_path, "echo mine")
    assert (r.outcome, r.stdout_tail, (tmp_path / "spy").read_text()) == (Outcome.SUCCESS, "mine\n", ""), r


def test_a_slot_threads_cleaning_from_what_it_saw_removes_what_jobs_leave_as_the_full_look_does(tmp_path):
    """After a job that left nothing running, the slot thread settles its directory from a listing and the
    `lstat` of the output files it took for the tails (issue 14): whatever else is there, and output files
    made unusable, still go, and each next job starts in a directory with its own output files only."""
    jobdir = tmp_path / "t0"
    commands = ["touch left.txt; mkdir sub", "true", f"chmod 000 {executor.STDOUT}", "echo after-chmod",
                f"ln {executor.STDOUT} ../spy", "echo mine", f"rm {executor.STDERR}; mkdir {executor.STDERR}",
                "echo last >&2"]
    seen: list[tuple[InstanceReport, list[str]]] = []

    def slot() -> None:
        wake = os.eventfd(0, os.EFD_NONBLOCK)
        try:
            for i, command in enumerate(commands):
                a = Assignment(i, i, i, "b", i, command, {}, [], [], None)
                r = run_blocking(a, jobdir, 1 << 20, KillSwitch(), wake, lambda pid: None, None, None, keep=False)
                seen.append((r, sorted(p.name for p in jobdir.iterdir())))
        finally:
            os.close(wake)

    thread = threading.Thread(target=slot)
    thread.start()
    thread.join(60)
    assert [(r.outcome, r.stdout_tail, r.stderr_tail) for r, _ in seen] == [
        (Outcome.SUCCESS, "", ""), (Outcome.SUCCESS, "", ""), (Outcome.SUCCESS, "", ""),
        (Outcome.SUCCESS, "after-chmod\n", ""), (Outcome.SUCCESS, "", ""), (Outcome.SUCCESS, "mine\n", ""),
        (Outcome.SUCCESS, "", ""), (Outcome.SUCCESS, "", "last\n")]
    both = sorted([executor.STDOUT, executor.STDERR])
    assert [left for _, left in seen] == [both, both, [executor.STDERR], both, [executor.STDERR], both,
                                          [executor.STDOUT], both]
    assert (tmp_path / "spy").read_text() == ""


def test_cleaning_from_what_was_seen_looks_again_at_anything_it_did_not_see(tmp_path):
    """`clean_dir` with the output files' `lstat`: a listing of nothing else answers from them; a name it has
    no `lstat` for, or an output file it saw unusable, sends it to the full look, which removes them."""
    jobdir = tmp_path / "job"
    jobdir.mkdir()
    out, err = jobdir / executor.STDOUT, jobdir / executor.STDERR
    out.write_text("")
    err.write_text("")
    assert executor.clean_dir(jobdir, (out.lstat(), err.lstat())) is True
    err.write_text("held")
    assert executor.clean_dir(jobdir, (out.lstat(), err.lstat())) is False
    err.write_text("")
    assert executor.clean_dir(jobdir, (out.lstat(), None)) is True  # err found now: looked at, kept, empty
    (jobdir / "left").write_text("x")
    assert executor.clean_dir(jobdir, (out.lstat(), err.lstat())) is True
    assert sorted(p.name for p in jobdir.iterdir()) == sorted([executor.STDOUT, executor.STDERR])
    out.chmod(0)
    assert executor.clean_dir(jobdir, (out.lstat(), err.lstat())) is True
    assert [p.name for p in jobdir.iterdir()] == [executor.STDERR]


def test_an_output_name_that_leads_out_of_the_jobs_folder_is_not_read(tmp_path):
    """The security review of 2026-11-29: an output filled from parameters (`{a}{b}{c}`) can become
    `.././etc/shadow`, which the spec's check, trying each value beside the others' first, let through; the
    worker read it (as root under --run-as), and the job's failure told whether the file existed."""
    from gridbot.worker.executor import _collect

    (tmp_path / "secret").write_text("root only")
    job = tmp_path / "job"
    job.mkdir()
    outputs, problem = _collect(job, ["../secret"], 1 << 20, follow=False)
    assert outputs == {} and "is not a name inside the job's folder" in problem
    outputs, problem = _collect(job, [".././secret"], 1 << 20)
    assert outputs == {} and "is not a name inside the job's folder" in problem
