"""What a slot thread pays per job, step by step, against the bare spawn and `subprocess.run` (issue 14).

Runs `sh -c true` JOBS times on a thread of its own (as a slot thread does), once per step, each step adding
one of the worker's duties to the one before, and prints the thread's CPU per job, the CPU of the job's
processes, and the wall time. The last row is `run_blocking`, the worker's whole path without a server:
the gap between it and the bare spawn is what the worker's Python costs per job; `subprocess.run` is what
ProcessPoolExecutor's tasks pay in the chunked map; the row after it, a helper in the shell that would keep
the spawning out of the interpreter (`shell_helper`). The steps alternate over --runs rounds (the machine's
speed drifts); the table gives each row's median. A benchmark, not a test:

    .venv/bin/python bench/slot_steps.py [--jobs 3000] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # bench/ is not a package: its modules come from sys.path

from gridbot.model.records import Assignment
from gridbot.worker import executor as ex
from gridbot.worker.isolation import job_environment

HELPER = "a helper in the shell: a persistent dash per slot, a subshell per job"


def steps(jobdir: Path) -> list[tuple[str, Callable[[], object]]]:
    """The rows, each one duty more than the one before (the first and the last stand alone)."""
    env = job_environment([], "token", None)
    out, err = f"{jobdir}/{ex.STDOUT}", f"{jobdir}/{ex.STDERR}"
    files = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
             (os.POSIX_SPAWN_OPEN, 1, out, ex._OUTPUT_FLAGS, 0o644),
             (os.POSIX_SPAWN_OPEN, 2, err, ex._OUTPUT_FLAGS, 0o644)]
    a = Assignment(1, 1, 1, "bench", 1, "sh -c true", {}, [], [], 1e12)
    wake = os.eventfd(0, os.EFD_NONBLOCK)

    def bare() -> None:
        pid = os.posix_spawn("/bin/sh", ["sh", "-c", "true"], env)
        os.waitpid(pid, 0)

    def options() -> None:
        pid = os.posix_spawn("/bin/sh", ["sh", "-c", "true"], env, file_actions=files, setsid=True,
                             setsigdef=ex._DEFAULT_SIGNALS)
        os.waitpid(pid, 0)

    def spawn() -> None:
        pid = ex._spawn(a.command, None, out, err, env)
        os.waitpid(pid, 0)

    def reap() -> None:
        pid = ex._spawn(a.command, None, out, err, env)
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        ex._killpg(pid, signal.SIGKILL)
        os.wait4(pid, 0)

    def tails() -> None:
        reap()
        ex._tail(out, ex._lstat(out))
        ex._tail(err, ex._lstat(err))

    def clean() -> None:
        tails()
        ex.clean_dir(jobdir)

    def whole() -> None:
        ex.run_blocking(a, jobdir, 1 << 20, ex.KillSwitch(), wake, lambda pid: None, None, env, keep=False)

    def popen() -> None:
        subprocess.run("true", shell=True, check=True)

    return [("posix_spawn + waitpid", bare),
            ("+ output files, session, default signals", options),
            ("+ gridbot's _spawn (plain command found on PATH)", spawn),
            ("+ waitid, killpg, wait4", reap),
            ("+ output tails", tails),
            ("+ clean_dir", clean),
            ("run_blocking, the whole path", whole),
            ("subprocess.run(shell=True), the map's task", popen)]


def measure(step: Callable[[], object], jobs: int, jobdir: Path) -> tuple[float, float, float]:
    """(the thread's CPU, the children's CPU, wall) in µs per job, on a thread with its own directory."""
    result: list[tuple[float, float, float]] = []

    def body() -> None:
        ex._cwd_here(jobdir, os.stat(jobdir))
        for _ in range(min(200, jobs)):
            step()
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu, wall = time.thread_time(), time.perf_counter()
        for _ in range(jobs):
            step()
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        children = after.ru_utime - kids.ru_utime + after.ru_stime - kids.ru_stime
        result.append((1e6 * cpu / jobs, 1e6 * children / jobs, 1e6 * wall / jobs))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    return result[0]


def shell_helper(jobs: int, jobdir: Path) -> tuple[float, float, float]:
    """The same triple for a helper in the shell: a persistent `dash` per slot that reads a command a line
    and runs it in a subshell with the job's files, answering its exit status (what a worker could hand its
    spawning to, to keep it out of the interpreter). The job's processes' CPU here is the helper's own and
    its children's, from /proc."""
    script = 'while IFS= read -r c; do (eval "exec $c") >o 2>e </dev/null; echo $?; done'
    helper = subprocess.Popen(["/bin/dash", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              cwd=jobdir, bufsize=0)
    assert helper.stdin is not None and helper.stdout is not None
    tick = os.sysconf("SC_CLK_TCK")

    def spent() -> float:
        with open(f"/proc/{helper.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(v) for v in fields[11:15]) / tick

    try:
        for n in range(min(200, jobs) + jobs):
            if n == min(200, jobs):
                before, cpu, wall = spent(), time.thread_time(), time.perf_counter()
            helper.stdin.write(b"sh -c true\n")
            if helper.stdout.readline() != b"0\n":
                raise RuntimeError("the helper's job failed")
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        children = spent() - before
    finally:
        helper.stdin.close()
        helper.wait()
    return 1e6 * cpu / jobs, 1e6 * children / jobs, 1e6 * wall / jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {harness.machine()}")
    with tempfile.TemporaryDirectory(prefix="gridbot-steps-", dir=harness.DB_DIR) as t:
        jobdir = Path(t) / "job"
        jobdir.mkdir()
        rows = steps(jobdir)
        figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _ in rows}
        for _ in range(args.runs):
            for name, step in rows:
                figures[name].append(measure(step, args.jobs, jobdir))
            figures.setdefault(HELPER, []).append(shell_helper(args.jobs, jobdir))
    print(f"\n{args.jobs:,} x `sh -c true` per row and run, {args.runs} runs, medians, µs per job\n")
    print("| step | the thread's CPU | the job's processes' CPU | wall |")
    print("|---|---|---|---|")
    for name in figures:
        thread, children, wall = (statistics.median(f[i] for f in figures[name]) for i in range(3))
        print(f"| {name} | {thread:.1f} | {children:.1f} | {wall:.1f} |")


if __name__ == "__main__":
    main()
