"""Running one instance: its own directory, staged inputs, a shell command, and a report of how it went.

The command runs under `/bin/sh -c` (or directly, when the shell would only split it into words) in a
new session (so a timeout or an interruption kills its whole process tree), with stdout and stderr
written to files in its directory. The child is reaped with `wait4` so the report carries the CPU time
of the command itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
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


def _tail(path: Path | str, limit: int = TAIL_BYTES) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        size = os.fstat(fd).st_size
        if not size:  # most jobs of a sweep write nothing: one system call less than reading
            return ""
        return os.pread(fd, min(size, limit), max(0, size - limit)).decode("utf-8", errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


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


def _killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


_SHELL_WORDS = frozenset((
    "!", ".", ":", "[", "[[", "{", "}", "alias", "bg", "break", "case", "cd", "command", "continue", "declare", "do",
    "done", "elif", "else", "esac", "eval", "exec", "exit", "export", "fc", "fg", "fi", "for", "function", "getopts",
    "hash", "if", "in", "jobs", "let", "local", "login", "logout", "read", "readonly", "return", "select", "set",
    "shift", "source", "test", "then", "time", "times", "trap", "type", "typeset", "ulimit", "umask", "unalias",
    "unset", "until", "wait", "while"))
"""Reserved words and builtins that have no program of the same behaviour (GNU make's list, widened)."""
_PLAIN = re.compile(r"[\w./=:,+@%-]+(?: [\w./=:,+@%-]+)*", re.ASCII)


def plain_argv(command: str) -> list[str] | None:
    """The words of a command in which the shell would do nothing but split at spaces (no quoting,
    expansion, redirection, operator, assignment or builtin), so it can be executed without a shell, as
    GNU make does; None when it needs `/bin/sh -c`."""
    if not _PLAIN.fullmatch(command):
        return None
    words = command.split(" ")
    if words[0] in _SHELL_WORDS or "=" in words[0]:
        return None
    return words


def _spawn(command: str, jobdir: Path, out: str, err: str, env: dict[str, str]) -> int:
    """Start the command in `jobdir`, in a session of its own, output to the job's files.

    A plain command (`plain_argv`) is executed directly, found on the job's PATH as the shell would:
    that saves starting a shell, a seventh of the cost of a short job (issue 6). Anything else, and a
    plain command that cannot be executed (not found, not permitted, a script without `#!`), goes to
    `/bin/sh -c`, which runs it or fails it with the shell's own message and exit code.

    `posix_spawn` costs a third of `subprocess.Popen` here (issue 6), but it cannot change directory in
    the child, so the worker changes its own for the call: this runs on the event loop's thread, and
    every path the worker uses is absolute. Descriptors the worker opened are close-on-exec (PEP 446).
    """
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
        (os.POSIX_SPAWN_OPEN, 2, err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
    ]
    home = os.getcwd()
    os.chdir(jobdir)
    try:
        argv = plain_argv(command)
        if argv is not None:
            with contextlib.suppress(OSError):
                path = env.get("PATH")
                if "/" in argv[0] or path == os.environ.get("PATH"):  # the C library searches the same PATH
                    return os.posix_spawnp(argv[0], argv, env, file_actions=actions, setsid=True)
                found = shutil.which(argv[0], path=path if path is not None else os.defpath)
                if found is not None:
                    return os.posix_spawn(found, argv, env, file_actions=actions, setsid=True)
        return os.posix_spawn("/bin/sh", ["/bin/sh", "-c", command], env, file_actions=actions, setsid=True)
    finally:
        os.chdir(home)


def clean_dir(jobdir: Path) -> None:
    """Empty a reused job directory for the next instance (the output files are truncated on reuse)."""
    with contextlib.suppress(OSError), os.scandir(jobdir) as entries:
        for entry in entries:
            if entry.name in (STDOUT, STDERR):
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


class KillSwitch:
    """Set by the worker to take an instance back (a cancel, or the worker stopping)."""

    __slots__ = ("_callbacks", "_set")

    def __init__(self) -> None:
        self._set = False
        self._callbacks: list[Callable[[], None]] = []

    def set(self) -> None:
        if not self._set:
            self._set = True
            for cb in self._callbacks:
                cb()

    def is_set(self) -> bool:
        return self._set

    def on_set(self, cb: Callable[[], None]) -> None:
        self._callbacks.append(cb)
        if self._set:
            cb()


async def run_instance(a: Assignment, jobdir: Path, fetch: FetchInput, max_result_bytes: int,
                       stop: KillSwitch, keep: bool = True,
                       started: Callable[[int], None] | None = None,
                       stop_reason: Callable[[], str] | None = None,
                       base_env: dict[str, str] | None = None) -> InstanceReport:
    """Run `a` in `jobdir`; return its report. `stop` set mid-run gives the instance back (INTERRUPTED).

    Unless `keep`, the directory is a slot's, reused by the next instance: it is emptied afterwards
    (the report already holds the output tails).
    """
    try:
        return await _run(a, jobdir, fetch, max_result_bytes, stop, started, stop_reason, base_env)
    finally:
        if not keep:
            clean_dir(jobdir)


async def _run(a: Assignment, jobdir: Path, fetch: FetchInput, max_result_bytes: int,
               stop: KillSwitch, started_cb: Callable[[int], None] | None,
               stop_reason: Callable[[], str] | None, base_env: dict[str, str] | None) -> InstanceReport:
    started = time.monotonic()

    out, err = f"{jobdir}/{STDOUT}", f"{jobdir}/{STDERR}"

    def report(outcome: Outcome, reason: str = "", code: int | None = None, cpu: float = 0.0,
               outputs: dict[str, bytes] | None = None) -> InstanceReport:
        return InstanceReport(a.instance_id, outcome, code, time.monotonic() - started, cpu, reason,
                              _tail(out), _tail(err), outputs or {})

    try:
        if not os.path.isdir(jobdir):
            os.makedirs(jobdir, exist_ok=True)
        for name in a.inputs:
            shutil.copyfile(await fetch(a.bag_id, name), jobdir / name)
    except Exception as e:  # staging is part of the job: its failure is reported, never a crash
        return report(Outcome.FAILURE, f"could not stage inputs: {e}")
    env = dict(base_env if base_env is not None else os.environ)
    env.update(a.env)
    env.update(GRIDBOT_JOB_INDEX=str(a.index), GRIDBOT_JOB_ID=str(a.job_id), GRIDBOT_INSTANCE=str(a.instance_id),
               GRIDBOT_BAG=a.bag_name)
    try:
        pid = _spawn(a.command, jobdir, out, err, env)
    except OSError as e:
        return report(Outcome.FAILURE, f"could not start the command: {e}")
    if started_cb is not None:
        started_cb(pid)
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()
    why: list[str] = []
    timers: list[asyncio.TimerHandle] = []

    def end(cause: str) -> None:
        """Take the instance back: SIGTERM to its process group, SIGKILL five seconds later."""
        if why or exited.done():
            return
        why.append(cause)
        _killpg(pid, signal.SIGTERM)
        timers.append(loop.call_later(5, _killpg, pid, signal.SIGKILL))

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = -1
    def gone(*_: object) -> None:
        if not exited.done():
            exited.set_result(None)

    try:
        if fd >= 0:
            loop.add_reader(fd, gone)
        else:
            loop.run_in_executor(None, _wait_any, pid).add_done_callback(gone)
        stop.on_set(lambda: end("stop"))
        if a.timeout is not None:
            timers.append(loop.call_later(a.timeout, end, "timeout"))
        try:
            await exited
        except asyncio.CancelledError:
            _killpg(pid, signal.SIGKILL)
            raise
    finally:
        for t in timers:
            t.cancel()
        if fd >= 0:
            loop.remove_reader(fd)
            os.close(fd)
    _, status, usage = os.wait4(pid, 0)
    code, cpu = os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime
    if why == ["stop"]:
        reason = stop_reason() if stop_reason is not None else ""
        if reason:  # the worker stops because of this job: it counts against the job
            return report(Outcome.FAILURE, reason, code, cpu)
        return report(Outcome.INTERRUPTED, "the worker stopped", code, cpu)
    if why == ["timeout"]:
        return report(Outcome.FAILURE, f"timed out after {a.timeout:g} s (the bag's timeout)", code, cpu)
    if code != 0:
        return report(Outcome.FAILURE, describe_exit(code, _tail(err, 4096)), code, cpu)
    outputs, problem = _collect(jobdir, a.outputs, max_result_bytes)
    if problem:
        return report(Outcome.FAILURE, problem, code, cpu)
    result = report(Outcome.SUCCESS, "", code, cpu, outputs)
    if result.result_bytes > max_result_bytes:
        return InstanceReport(a.instance_id, Outcome.FAILURE, code, result.wall_s, cpu,
                              f"result of {result.result_bytes:,} bytes is over the server's limit of "
                              f"{max_result_bytes:,} bytes", result.stdout_tail[-4096:], result.stderr_tail[-4096:])
    return result


def _wait_any(pid: int) -> None:
    """Block until `pid` has exited, leaving it to be reaped (for kernels without pidfd)."""
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


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
