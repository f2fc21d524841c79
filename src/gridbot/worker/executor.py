"""Running one instance: its own directory, staged inputs, a shell command, and a report of how it went.

The command runs under `/bin/sh -c` in a new session (so a timeout or an interruption kills its whole
process tree), with stdout and stderr written to files in its directory. The child is reaped with
`wait4` so the report carries the CPU time of the command itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from gridbot.model.records import Assignment, InstanceReport, Outcome

TAIL_BYTES = 64 * 1024
STDOUT, STDERR = ".gridbot-stdout", ".gridbot-stderr"
FetchInput = Callable[[int, str], Awaitable[Path]]
_TICKS = os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(pgid: int) -> float:
    """CPU seconds used by a job's process group so far, its reaped children included (from /proc)."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += sum(int(x) for x in fields[11:15])
    return total / _TICKS


def _tail(path: Path, limit: int = TAIL_BYTES) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def describe_exit(code: int, stderr: str) -> str:
    """A reason a person understands, from an exit status (negative: killed by that signal)."""
    last = _last_line(stderr)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}" + (f": {last}" if last else "")
    if code == 127:
        return f"command not found (exit code 127): {last}" if last else "command not found (exit code 127)"
    if code == 126:
        return f"command not executable (exit code 126): {last}" if last else "command not executable (exit code 126)"
    return f"exit code {code}: {last}" if last else f"exit code {code}"


async def _wait(proc: subprocess.Popen[bytes]) -> tuple[int, float]:
    """Reap `proc` without blocking the loop; return its exit code and CPU seconds."""
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        fd = -1
    if fd >= 0:
        done: asyncio.Future[None] = loop.create_future()

        def exited() -> None:
            if not done.done():
                done.set_result(None)

        loop.add_reader(fd, exited)
        try:
            await done
        finally:
            loop.remove_reader(fd)
            os.close(fd)
        _, status, usage = os.wait4(proc.pid, 0)
    else:
        _, status, usage = await loop.run_in_executor(None, os.wait4, proc.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code
    return code, usage.ru_utime + usage.ru_stime


def _kill(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


async def run_instance(a: Assignment, jobdir: Path, fetch: FetchInput, max_result_bytes: int,
                       stop: asyncio.Event, keep: bool = False,
                       started: Callable[[int], None] | None = None,
                       stop_reason: Callable[[], str] | None = None) -> InstanceReport:
    """Run `a` in `jobdir`; return its report. `stop` set mid-run gives the instance back (INTERRUPTED).

    The directory is removed afterwards unless `keep` (the report already holds the output tails).
    """
    try:
        return await _run(a, jobdir, fetch, max_result_bytes, stop, started, stop_reason)
    finally:
        if not keep:
            shutil.rmtree(jobdir, ignore_errors=True)


async def _run(a: Assignment, jobdir: Path, fetch: FetchInput, max_result_bytes: int,
               stop: asyncio.Event, started_cb: Callable[[int], None] | None,
               stop_reason: Callable[[], str] | None) -> InstanceReport:
    started = time.monotonic()

    def report(outcome: Outcome, reason: str = "", code: int | None = None, cpu: float = 0.0,
               outputs: dict[str, bytes] | None = None) -> InstanceReport:
        return InstanceReport(a.instance_id, outcome, code, time.monotonic() - started, cpu, reason,
                              _tail(jobdir / STDOUT), _tail(jobdir / STDERR), outputs or {})

    try:
        jobdir.mkdir(parents=True, exist_ok=True)
        for name in a.inputs:
            shutil.copyfile(await fetch(a.bag_id, name), jobdir / name)
    except Exception as e:  # staging is part of the job: its failure is reported, never a crash
        return report(Outcome.FAILURE, f"could not stage inputs: {e}")
    env = dict(os.environ)
    env.update(a.env)
    env.update(GRIDBOT_JOB_INDEX=str(a.index), GRIDBOT_JOB_ID=str(a.job_id), GRIDBOT_INSTANCE=str(a.instance_id),
               GRIDBOT_BAG=a.bag_name)
    try:
        with open(jobdir / STDOUT, "wb") as out, open(jobdir / STDERR, "wb") as err:
            proc = subprocess.Popen(["/bin/sh", "-c", a.command], cwd=jobdir, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=err, start_new_session=True)
    except OSError as e:
        return report(Outcome.FAILURE, f"could not start the command: {e}")
    if started_cb is not None:
        started_cb(proc.pid)
    waiter = asyncio.ensure_future(_wait(proc))
    stopper = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({waiter, stopper}, timeout=a.timeout, return_when=asyncio.FIRST_COMPLETED)
        if waiter not in done:
            _kill(proc, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(waiter), 5)
            except TimeoutError:
                _kill(proc, signal.SIGKILL)
            code, cpu = await waiter
            if stopper in done:
                reason = stop_reason() if stop_reason is not None else ""
                if reason:  # the worker stops because of this job: it counts against the job
                    return report(Outcome.FAILURE, reason, code, cpu)
                return report(Outcome.INTERRUPTED, "the worker stopped", code, cpu)
            return report(Outcome.FAILURE, f"timed out after {a.timeout:g} s (the bag's timeout)", code, cpu)
        code, cpu = waiter.result()
    except asyncio.CancelledError:
        _kill(proc, signal.SIGKILL)
        raise
    finally:
        stopper.cancel()
    if code != 0:
        return report(Outcome.FAILURE, describe_exit(code, _tail(jobdir / STDERR, 4096)), code, cpu)
    outputs, problem = _collect(jobdir, a.outputs, max_result_bytes)
    if problem:
        return report(Outcome.FAILURE, problem, code, cpu)
    result = report(Outcome.SUCCESS, "", code, cpu, outputs)
    if result.result_bytes > max_result_bytes:
        return InstanceReport(a.instance_id, Outcome.FAILURE, code, result.wall_s, cpu,
                              f"result of {result.result_bytes:,} bytes is over the server's limit of "
                              f"{max_result_bytes:,} bytes", result.stdout_tail[-4096:], result.stderr_tail[-4096:])
    return result


def _collect(jobdir: Path, names: list[str], limit: int) -> tuple[dict[str, bytes], str]:
    """Read the declared outputs; a missing or oversized one is the job's failure."""
    outputs: dict[str, bytes] = {}
    total = 0
    for name in names:
        path = jobdir / name
        if not path.is_file():
            return {}, f"expected output '{name}' was not produced"
        total += path.stat().st_size
        if total > limit:
            return {}, (f"outputs total over {total:,} bytes, over the server's limit of {limit:,} bytes "
                        "(server option --max-result-size)")
        outputs[name] = path.read_bytes()
    return outputs, ""
