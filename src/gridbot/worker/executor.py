"""Running one instance: its own directory, staged inputs, a shell command, and a report of how it went.

The command runs under `/bin/sh -c` (or directly, when the shell would only split it into words) in a
new session (so a timeout or an interruption kills its whole process tree), with stdout and stderr
written to files in its directory. The child is reaped with `wait4` so the report carries the CPU time
of the command itself; its process group is killed first, whatever ended the job, so nothing the job
started in it outlives it (what left the group is gridbot.worker.reaper's).

With `--run-as`, the job's directory belongs to the job's user while the worker is root: every file the
worker opens in it is opened without following symbolic links, so a link left there cannot point the
worker at another file.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path

from gridbot.model.records import Assignment, InstanceReport, Limits, Outcome
from gridbot.model.spec import output_name_problem
from gridbot.worker.isolation import RUN_VAR, RunAs, apply_limits

TAIL_BYTES = 64 * 1024
STDOUT, STDERR = ".gridbot-stdout", ".gridbot-stderr"
FetchInput = Callable[[int, str], Awaitable[Path]]
_TICKS = os.sysconf("SC_CLK_TCK")
_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)
"""Python ignores these, and posix_spawn keeps what is ignored: a job gets them back at their defaults, as
subprocess does (else `yes | head -1` says "Broken pipe", and a file over max_file_size is no signal)."""
SPAWN_LOCK = threading.Lock()
"""Held around a job's spawn and its registration with the reaper, by the event loop and by the slot threads
(gridbot.worker.threads): the spawn may change the process's working directory (the loop's always, a slot
thread's where it has no directory of its own), and the reaper's sweep (run by
whichever thread ends a job) kills every child of the worker's main thread that is not a registered job's
first process, so it must not see a job of the loop's between the two. (A slot thread's jobs are that thread's
children, which the sweep does not list; their orphans come to the main thread, and it does.)"""
KILL_GRACE = 5.0
"""Seconds between the SIGTERM that takes a job back and the SIGKILL that follows it."""
MAX_POLL_MS = 3_600_000
"""Longest sleep of a slot thread in one `poll` (its timeout must fit in a C int: a bag's timeout may not)."""


def session_cpu_seconds(sid: int) -> float:
    """CPU seconds used so far by the processes of a job's session (its first process leads one), their
    reaped children included (from /proc). The session, not the process group: `timeout`, `make -j` and job
    control shells put their children in groups of their own, whose work is still the job's."""
    return sessions_cpu_seconds({sid}).get(sid, 0.0)


def sessions_cpu_seconds(sids: Collection[int]) -> dict[int, float]:
    """`session_cpu_seconds` of several jobs, from one pass over /proc."""
    ticks: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        sid = int(fields[3])
        if sid in sids:
            ticks[sid] = ticks.get(sid, 0) + sum(int(x) for x in fields[11:15])
    return {sid: t / _TICKS for sid, t in ticks.items()}


def _tail(path: Path | str, st: os.stat_result | None, limit: int = TAIL_BYTES) -> str:
    """The last `limit` bytes of a job's output file, decoded ("" if it is not a regular file), whose `lstat`
    the caller took (`st`; None: there was none).

    Most jobs of a sweep write nothing: the `lstat` then answers alone, where the open, `fstat` and close
    cost three calls (2-3 µs a job of the slot thread's 116, issue 14). The open does not follow a link
    and does not wait on a fifo that took the file's place since."""
    if st is None or not st.st_size or not stat.S_ISREG(st.st_mode):
        return ""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        st = os.fstat(fd)
        size = st.st_size
        if not size or not stat.S_ISREG(st.st_mode):  # replaced since the lstat
            return ""
        return os.pread(fd, min(size, limit), max(0, size - limit)).decode("utf-8", errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _lstat(path: str | Path) -> os.stat_result | None:
    """The file at `path` (not followed if a link), or None if there is none (or it cannot be looked at)."""
    try:
        return os.lstat(path)
    except OSError:
        return None


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


def limit_reason(code: int, limits: Limits | None) -> str:
    """The reason for an exit status that says the job broke one of its bag's rlimits ("" if none)."""
    if limits is None:
        return ""
    if limits.cpu_time is not None and code in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return f"killed by SIGXCPU: a process used up the bag's cpu_time limit of {limits.cpu_time:g} s of CPU"
    if limits.max_file_size is not None and code in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ):
        return f"killed by SIGXFSZ: a file reached the bag's max_file_size limit of {limits.max_file_size:,} bytes"
    return ""


def _killpg(pid: int, sig: int) -> None:
    """Signal a job's process group, gone or not (a `try`, not `contextlib.suppress`: twice a job)."""
    try:  # noqa: SIM105 - suppress() builds a context manager a call, 1-2 µs of a slot thread's job (issue 14)
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


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


_OUTPUT_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
"""How the child opens its output files: never through a link, never waiting on a fifo (posix_spawn holds the GIL
and SPAWN_LOCK until the child has opened them: a fifo without a reader would stop the whole worker). Either
fails the spawn, and `clean_dir` removes what was there. O_NONBLOCK does nothing to a regular file."""
_EMPTY_FLAGS = _OUTPUT_FLAGS & ~os.O_TRUNC
"""The same for output files `clean_dir` found empty: truncating an empty file still costs the child a journalled
change of its inode, 16 µs of an `sh -c true` job's 576 here (issue 14)."""


LIBC = ctypes.CDLL(None, use_errno=True)
"""The C library, for the system calls the standard library has no binding for (prctl, unshare)."""


_fs = threading.local()
"""A slot thread's own working directory: `own` (it has one, unshare(CLONE_FS)) and `at` (the (st_dev,
st_ino) of the directory it is in); `emptied`, the slot directory (its path, st_dev and st_ino) whose output files
the thread's last `clean_dir` left empty, after a job that left no process behind, until its next spawn there;
and `ran`, that directory and its output files (`Seen`) while such a job is settled."""


def _cwd_here(jobdir: Path, st: os.stat_result) -> bool:
    """Whether the calling thread's own working directory is `jobdir` (whose stat is `st`), moving it there if
    need be: its jobs then start there with no change of the worker's around each spawn.

    The thread asks for a directory of its own with unshare(CLONE_FS) (Linux; through ctypes, the standard
    library of Python 3.11 has no binding) once; never the main thread, whose directory is the process's for
    everything else (/proc/self/cwd, a test's runner). False where the system refuses (a seccomp profile may):
    the spawn then changes the worker's directory around itself, under SPAWN_LOCK. A directory removed,
    renamed or replaced since has another identity, and the thread moves to the one now at `jobdir`; the
    identity kept is that of where it landed, which it holds (its number cannot be reused meanwhile).
    """
    if getattr(_fs, "at", None) == (st.st_dev, st.st_ino):
        return True
    own: bool | None = getattr(_fs, "own", None)
    if own is None:
        own = _fs.own = threading.current_thread() is not threading.main_thread() and _unshare_fs()
    if not own:
        return False
    try:
        os.chdir(jobdir)
        here = os.stat(".")
    except OSError:
        _fs.at = None
        return False
    at = _fs.at = (here.st_dev, here.st_ino)
    return at == (st.st_dev, st.st_ino)


def _unshare_fs() -> bool:
    """Give the calling thread its own working directory, umask and root (unshare(CLONE_FS)); False if refused."""
    try:
        return bool(LIBC.unshare(0x200) == 0)  # CLONE_FS
    except AttributeError:  # not Linux
        return False


_FOUND: dict[tuple[str, str], tuple[str, float]] = {}
"""(program, PATH) -> where `_find` found it, and when (time.monotonic)."""
FOUND_FOR = 1.0
"""Seconds a program found on a PATH is executed from there without a new search."""


def _find(name: str, path: str) -> str | None:
    """Where `name` is on `path`, as execvp would find it, remembered for FOUND_FOR seconds (under SPAWN_LOCK).

    execvp tries every directory of the PATH in the child, in turn, until one holds the program: on a PATH of
    nine directories before /usr/bin, finding `sh` cost the child 10-15 µs, 1.5% of an `sh -c true` job
    (issue 14). A program installed earlier on the PATH is used within FOUND_FOR seconds (a shell's hash
    table never sees it), and one that is gone is searched for again at once (`_spawn`). Nothing is kept
    for a PATH with a relative (or empty) entry: there, each job's directory may hold another program.
    """
    now = time.monotonic()
    hit = _FOUND.get((name, path))
    if hit is not None and now - hit[1] < FOUND_FOR:
        return hit[0]
    found = shutil.which(name, path=path)
    if found is not None and all(d.startswith("/") for d in path.split(os.pathsep)):
        if len(_FOUND) >= 1024:  # bags with many programs: a bound, not an eviction policy
            _FOUND.clear()
        _FOUND[name, path] = (found, now)
    return found


_ACTIONS: dict[tuple[str, str, bool], list[tuple[int, int, str, int, int]]] = {}
"""A slot's output files -> the spawn's file actions (read, never changed, by posix_spawn)."""


def _spawn(command: str, jobdir: Path | None, out: str, err: str, env: dict[str, str], trunc: bool = True) -> int:
    """Start the command in `jobdir` (None: in the calling thread's own working directory, `_cwd_here`), in a
    session of its own, output to the job's files (opened as `_OUTPUT_FLAGS` says; unless `trunc`, as
    `_EMPTY_FLAGS`: the caller knows them empty or absent).

    A plain command (`plain_argv`) is executed directly, found on the job's PATH as the shell would
    (`_find`): that saves starting a shell, a seventh of the cost of a short job (issue 6). Anything else,
    and a plain command that cannot be executed (not found, not permitted, a script without `#!`), goes to
    `/bin/sh -c`, which runs it or fails it with the shell's own message and exit code.

    `posix_spawn` costs a third of `subprocess.Popen` here (issue 6), but it cannot change directory in
    the child: a slot thread with a directory of its own starts its jobs there (`_cwd_here`); otherwise the
    worker changes its own for the call, under SPAWN_LOCK (the caller's): the event loop and the slot threads
    spawn, and the loop goes on while a thread is in here, so every path any thread of the worker uses is
    absolute. Descriptors the worker opened are close-on-exec (PEP 446).
    """
    actions = _ACTIONS.get((out, err, trunc))
    if actions is None:
        flags = _OUTPUT_FLAGS if trunc else _EMPTY_FLAGS
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, out, flags, 0o644),
            (os.POSIX_SPAWN_OPEN, 2, err, flags, 0o644),
        ]
        if len(_ACTIONS) >= 256:  # kept directories (`--keep-dirs`): a bound, not an eviction policy
            _ACTIONS.clear()
        _ACTIONS[out, err, trunc] = actions
    home = None
    if jobdir is not None:
        with contextlib.suppress(FileNotFoundError):  # the directory it was in is gone: nothing to go back to
            home = os.getcwd()
        os.chdir(jobdir)
    try:
        argv = plain_argv(command)
        if argv is not None:
            key = (argv[0], env.get("PATH", os.defpath))
            found = argv[0] if "/" in argv[0] else _find(*key)
            if found is not None:
                try:
                    return os.posix_spawn(found, argv, env, file_actions=actions, setsid=True,
                                          setsigdef=_DEFAULT_SIGNALS)
                except OSError:
                    _FOUND.pop(key, None)  # gone or changed since it was found: the shell has its say
        return os.posix_spawn("/bin/sh", ["/bin/sh", "-c", command], env, file_actions=actions, setsid=True,
                              setsigdef=_DEFAULT_SIGNALS)
    finally:
        if home is not None:
            os.chdir(home)


def _spawn_as(command: str, jobdir: Path, out: str, err: str, env: dict[str, str],
              user: RunAs) -> subprocess.Popen[bytes]:
    """Start the command as `user` (`--run-as`), under `/bin/sh -c`, in a session of its own.

    subprocess changes the directory, groups and user in the child without running Python code there,
    where posix_spawn cannot change users; it is slower, which matters little beside the switch.
    """
    fds = [_create(out, user), _create(err, user)]
    try:
        return subprocess.Popen(["/bin/sh", "-c", command], cwd=jobdir, env=env, stdin=subprocess.DEVNULL,
                                stdout=fds[0], stderr=fds[1], user=user.uid, group=user.gid,
                                extra_groups=list(user.groups), start_new_session=True)
    finally:
        for fd in fds:
            os.close(fd)


def _create(path: str, user: RunAs) -> int:
    """A new file for the job's output, owned by its user; whatever the job left at `path` is replaced."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    os.fchown(fd, user.uid, user.gid)
    return fd


def _stage(src: Path, dest: Path, user: RunAs | None) -> None:
    """Copy an input into the job's directory, as a new file (never written through a link left there)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(dest, flags, 0o644)
    except FileExistsError:
        os.unlink(dest)
        fd = os.open(dest, flags, 0o644)
    try:
        if user is not None:
            os.fchown(fd, user.uid, user.gid)
        with open(src, "rb") as f:
            size, offset = os.fstat(f.fileno()).st_size, 0
            while offset < size and (sent := os.sendfile(fd, f.fileno(), offset, size - offset)):
                offset += sent
    finally:
        os.close(fd)


def slot_dir(jobdir: Path) -> os.stat_result:
    """The slot's directory, made if it is missing; its stat (one system call when it is there).

    The path is the worker's own, but a job can leave a file or a link there (`rm -rf ../0; ln -s / ../0`),
    and a slot's path is the same after a restart: such a thing is removed and the directory made again,
    so that one job's mess fails no later job of the slot."""
    try:
        st = os.lstat(jobdir)
        if stat.S_ISDIR(st.st_mode):
            return st
        os.unlink(jobdir)  # a link too, to a directory or to itself: jobs run, and `clean_dir` empties, here only
    except FileNotFoundError:
        pass
    os.makedirs(jobdir, exist_ok=True)
    return os.lstat(jobdir)


Seen = tuple[os.stat_result | None, os.stat_result | None]
"""The `lstat` of a job's two output files (None: not there), taken once it had ended with nothing of it left."""


def clean_dir(jobdir: Path, seen: Seen | None = None) -> bool:
    """Empty a reused job directory for the next instance; True if its output files are left empty or absent
    (the next spawn need not truncate them, `_EMPTY_FLAGS`), False if it cannot tell.

    The output files stay (the next spawn truncates them) if they are regular files the worker can read and
    write, linked once (`_reusable`): what else a job left at their place goes, a symbolic link, fifo or
    directory (the next spawn would refuse it: `_OUTPUT_FLAGS`), a file it made unwritable (`chmod 000`: every
    later spawn of the slot would fail) or one it linked elsewhere (later jobs' output would be read there).

    With `seen`, a directory that holds nothing but the output files is settled by its listing alone: the files
    are as the `lstat` found them (a look at each again cost 2 of the slot thread's system calls a job, and
    more of its time, issue 14)."""
    if seen is not None:
        try:
            names = os.listdir(jobdir)
        except OSError:
            return False
        empty = True
        for name in names:
            st = seen[0] if name == STDOUT else seen[1] if name == STDERR else None
            if st is None or not _reusable(st):
                break
            empty = empty and not st.st_size
        else:
            return empty
    empty = True
    try:
        with os.scandir(jobdir) as entries:
            for entry in entries:
                if entry.name in (STDOUT, STDERR):
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        empty = False
                        continue
                    if _reusable(st):
                        empty = empty and not st.st_size
                        continue
                    empty = _remove(entry) and empty
                else:
                    _remove(entry)
    except OSError:
        return False
    return empty


def _reusable(st: os.stat_result) -> bool:
    """Whether an output file found so may stay for the slot's next job (`clean_dir`)."""
    return stat.S_ISREG(st.st_mode) and st.st_mode & 0o600 == 0o600 and st.st_nlink == 1


def _remove(entry: os.DirEntry[str]) -> bool:
    """Remove what a job left in its directory; False if some of it is still there."""
    if entry.is_dir(follow_symlinks=False):
        shutil.rmtree(entry.path, ignore_errors=True)
        return not os.path.lexists(entry.path)
    try:
        os.unlink(entry.path)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


class KillSwitch:
    """Set by the worker to take an instance back (a cancel, or the worker stopping), or with a `reason`
    to end it as the job's failure (it broke a limit the worker watches)."""

    __slots__ = ("_callbacks", "_set", "reason")

    def __init__(self) -> None:
        self._set = False
        self.reason = ""
        self._callbacks: list[Callable[[], None]] = []

    def set(self, reason: str = "") -> None:
        if not self._set:
            self.reason = reason  # first: a slot thread that sees the switch set reads the reason at once
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
                       base_env: dict[str, str] | None = None, user: RunAs | None = None) -> InstanceReport:
    """Run `a` in `jobdir` (as `user`, if given); return its report. `stop` set mid-run gives the
    instance back (INTERRUPTED), or fails it with the switch's reason.

    Unless `keep`, the directory is a slot's, reused by the next instance: it is emptied afterwards
    (the report already holds the output tails).
    """
    try:
        return await _run(a, jobdir, fetch, max_result_bytes, stop, started, stop_reason, base_env, user)
    finally:
        if not keep:
            clean_dir(jobdir)


async def _run(a: Assignment, jobdir: Path, fetch: FetchInput, max_result_bytes: int,
               stop: KillSwitch, started_cb: Callable[[int], None] | None,
               stop_reason: Callable[[], str] | None, base_env: dict[str, str] | None,
               user: RunAs | None) -> InstanceReport:
    started = time.monotonic()

    out, err = f"{jobdir}/{STDOUT}", f"{jobdir}/{STDERR}"

    try:
        slot_dir(jobdir)
    except OSError as e:
        return _unstarted(a, started, f"could not make the job's directory: {e}")
    try:
        if user is not None:
            os.chown(jobdir, user.uid, user.gid, follow_symlinks=False)
        for name in a.inputs:
            _stage(await fetch(a.bag_id, name), jobdir / name, user)
    except Exception as e:  # staging is part of the job: its failure is reported, never a crash
        return _unstarted(a, started, f"could not stage inputs: {e}")
    env = job_env(a, base_env)
    proc = None
    with SPAWN_LOCK:
        try:
            if user is None:
                pid = _spawn(a.command, jobdir, out, err, env)
            else:
                proc = _spawn_as(a.command, jobdir, out, err, env, user)
                pid = proc.pid
        except OSError as e:
            return _unstarted(a, started, f"could not start the command: {e}")
        if a.limits is not None:
            apply_limits(pid, a.limits)
        if started_cb is not None:
            started_cb(pid)
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()
    why: list[str] = []
    timers: list[asyncio.TimerHandle] = []

    def end(cause: str) -> None:
        """Take the instance back: SIGTERM to its process group, SIGKILL five seconds later (at once for
        a broken limit)."""
        if why or exited.done():
            return
        why.append(cause)
        if stop.reason:
            _killpg(pid, signal.SIGKILL)
            return
        _killpg(pid, signal.SIGTERM)
        timers.append(loop.call_later(KILL_GRACE, _killpg, pid, signal.SIGKILL))

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
    _killpg(pid, signal.SIGKILL)  # before the reaping: the group's id cannot be reused while its leader is unreaped
    _, status, usage = os.wait4(pid, 0)
    code, cpu = os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime
    if proc is not None:
        proc.returncode = code  # reaped here: subprocess must not wait for the pid again
    return _verdict(a, jobdir, why, stop, stop_reason, code, cpu, max_result_bytes, started, user is None)


def _unstarted(a: Assignment, started: float, reason: str, outcome: Outcome = Outcome.FAILURE) -> InstanceReport:
    """The report of an instance that ended before its spawn, without output tails: until a spawn truncates
    them, the slot's files hold the previous job's output, maybe another bag's."""
    return InstanceReport(a.instance_id, outcome, None, time.monotonic() - started, 0.0, reason)


def job_env(a: Assignment, base_env: dict[str, str] | None) -> dict[str, str]:
    """The environment of `a`'s command: the worker's job environment, the bag's [env], then gridbot's own
    variables (which the bag's cannot override)."""
    base = base_env if base_env is not None else os.environ
    env = {**base, **a.env} if a.env else dict(base)
    if RUN_VAR in base:  # a bag's [env] (stored before specs were refused it) cannot hide the job from the reaper
        env[RUN_VAR] = base[RUN_VAR]
    env["GRIDBOT_JOB_INDEX"] = str(a.index)
    env["GRIDBOT_JOB_ID"] = str(a.job_id)
    env["GRIDBOT_INSTANCE"] = str(a.instance_id)
    env["GRIDBOT_BAG"] = a.bag_name
    env["GRIDBOT_CPUS"] = str(a.cpus)
    if a.cpus > 1 and "OMP_NUM_THREADS" not in a.env:
        env["OMP_NUM_THREADS"] = str(a.cpus)  # the slots it holds, not every core of the machine
    return env


def _verdict(a: Assignment, jobdir: Path, why: list[str], stop: KillSwitch, stop_reason: Callable[[], str] | None,
             code: int | None, cpu: float, max_result_bytes: int, started: float, follow: bool,
             seen: Seen | None = None) -> InstanceReport:
    """The report of an instance whose command has ended (`code` None: it never started, taken back first):
    what ended it (`why`: "stop" or "timeout", or nothing), its exit status, then its declared outputs. `seen`:
    the output files as the caller found them (`Seen`)."""
    out, err = f"{jobdir}/{STDOUT}", f"{jobdir}/{STDERR}"
    st_out, st_err = seen if seen is not None else (_lstat(out), _lstat(err))
    if code == 0 and not why and not a.outputs:  # most jobs of a sweep: the report at once
        stdout, stderr = _tail(out, st_out), _tail(err, st_err)
        if len(stdout) + len(stderr) <= max_result_bytes:
            return InstanceReport(a.instance_id, Outcome.SUCCESS, code, time.monotonic() - started, cpu, "", stdout,
                                  stderr, {})

    def report(outcome: Outcome, reason: str = "", outputs: dict[str, bytes] | None = None) -> InstanceReport:
        return InstanceReport(a.instance_id, outcome, code, time.monotonic() - started, cpu, reason,
                              _tail(out, st_out), _tail(err, st_err), outputs or {})

    cause = why[0] if why else ""
    if cause == "stop":
        reason = _stop_cause(stop, stop_reason)
        if reason:  # the worker stops because of this job: it counts against the job
            return report(Outcome.FAILURE, reason)
        return report(Outcome.INTERRUPTED, "the worker stopped")
    if cause == "timeout":
        return report(Outcome.FAILURE, f"timed out after {a.timeout:g} s (the bag's timeout)")
    if code != 0:
        assert code is not None
        return report(Outcome.FAILURE, limit_reason(code, a.limits) or describe_exit(code, _tail(err, st_err, 4096)))
    outputs, problem = _collect(jobdir, a.outputs, max_result_bytes, follow=follow) if a.outputs else ({}, "")
    if problem:
        return report(Outcome.FAILURE, problem)
    result = report(Outcome.SUCCESS, "", outputs)
    if result.result_bytes > max_result_bytes:
        return InstanceReport(a.instance_id, Outcome.FAILURE, code, result.wall_s, cpu,
                              f"result of {result.result_bytes:,} bytes is over the server's limit of "
                              f"{max_result_bytes:,} bytes", result.stdout_tail[-4096:], result.stderr_tail[-4096:])
    return result


def _stop_cause(stop: KillSwitch, stop_reason: Callable[[], str] | None) -> str:
    """Why a job taken back counts as its failure: its switch's reason, or the worker's for stopping because
    of it ("": it is only given back)."""
    return stop.reason or (stop_reason() if stop_reason is not None else "")


def run_blocking(a: Assignment, jobdir: Path, max_result_bytes: int, stop: KillSwitch, wake: int,
                 started_cb: Callable[[int], None], stop_reason: Callable[[], str] | None,
                 base_env: dict[str, str] | None, keep: bool = True,
                 reaped_cb: Callable[[], bool] = lambda: False) -> InstanceReport:
    """Run `a` in `jobdir` on the calling thread (a slot thread of gridbot.worker.threads) and return its
    report, as `run_instance` would on the event loop: same environment, spawn, timeout, kill switch, outputs
    and report, without inputs or a user to switch to (those instances stay on the loop).

    A job without a timeout is waited for in `waitid`, and its switch takes it back itself (`_Waiting`). For
    one with a timeout the thread sleeps in `poll` on the job's pidfd and on `wake`, an eventfd that a callback
    of `stop` writes (a write meant for an earlier job only wakes it once: what counts is `stop.is_set()`),
    and takes it back itself when the switch is set or the timeout comes (`_wait_blocking`). `started_cb(pid)`
    is called under SPAWN_LOCK with the job spawned: it registers the job with the reaper; `reaped_cb()` at once
    after the job's first process is reaped, before its outputs are read: True if the job left processes behind
    (the reaper's sweep killed some), which may still write to its output files, or if the worker cannot tell
    (it is not its jobs' subreaper). A slot thread starts its jobs in a
    working directory of its own (`_cwd_here`).
    """
    started = time.monotonic()
    try:
        return _run_blocking(a, jobdir, max_result_bytes, stop, wake, started_cb, stop_reason, base_env, started,
                             reaped_cb)
    finally:
        ran, _fs.ran = getattr(_fs, "ran", None), None
        if not keep and clean_dir(jobdir, ran[1] if ran is not None else None):
            _fs.emptied = ran[0] if ran is not None else None


def _run_blocking(a: Assignment, jobdir: Path, max_result_bytes: int, stop: KillSwitch, wake: int,
                  started_cb: Callable[[int], None], stop_reason: Callable[[], str] | None,
                  base_env: dict[str, str] | None, started: float,
                  reaped_cb: Callable[[], object]) -> InstanceReport:
    out, err = f"{jobdir}/{STDOUT}", f"{jobdir}/{STDERR}"
    emptied, _fs.emptied, _fs.ran = getattr(_fs, "emptied", None), None, None
    try:
        st = slot_dir(jobdir)
    except OSError as e:
        return _unstarted(a, started, f"could not make the job's directory: {e}")
    here = _cwd_here(jobdir, st)
    env = job_env(a, base_env)
    this = (jobdir, st.st_dev, st.st_ino)
    trunc = emptied != this
    with SPAWN_LOCK:
        if stop.is_set():  # taken back before it started: it never does
            reason = _stop_cause(stop, stop_reason)
            return _unstarted(a, started, reason or "the worker stopped",
                              Outcome.FAILURE if reason else Outcome.INTERRUPTED)
        try:
            pid = _spawn(a.command, None if here else jobdir, out, err, env, trunc)
        except OSError as e:
            return _unstarted(a, started, f"could not start the command: {e}")
        try:
            if a.limits is not None:
                apply_limits(pid, a.limits)
            started_cb(pid)
        except BaseException:
            _killpg(pid, signal.SIGKILL)
            os.wait4(pid, 0)
            raise
    fd = -1
    waiting = None
    seen: Seen | None = None
    try:
        if a.timeout is None:  # most bags: nothing to wake for but the job's end, or its switch (`_Waiting`)
            waiting = _Waiting(pid, stop)
            stop.on_set(waiting.stop)
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            why, waiting = waiting.ended(), None
        else:
            with contextlib.suppress(OSError):
                fd = os.pidfd_open(pid)
            why = _wait_blocking(pid, fd, wake, stop, a.timeout)
    finally:  # whatever happened (an error of ours too), the job does not outlive its slot
        if waiting is not None:
            waiting.ended()
        if fd >= 0:
            os.close(fd)
        _killpg(pid, signal.SIGKILL)  # before the reaping: the group's id cannot be reused while its leader lives
        _, status, usage = os.wait4(pid, 0)
        if not reaped_cb():  # nothing of the job is left to change its files once they are looked at
            seen = _lstat(out), _lstat(err)
            _fs.ran = this, seen
    code, cpu = os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime
    return _verdict(a, jobdir, why, stop, stop_reason, code, cpu, max_result_bytes, started, True, seen)


class _Waiting:
    """A slot thread's job without a timeout, which the thread sleeps on in `waitid` (one system call, where
    a pidfd and `poll` with the thread's eventfd take three, and more of the thread's time: about 10 µs a job,
    issue 14). Its kill switch then takes it back itself, from whichever thread sets it, as `_wait_blocking`
    would: SIGTERM to the job's process group, SIGKILL KILL_GRACE seconds later (from a timer thread; at once
    if none can be started), or SIGKILL at once when the switch has a reason. The lock keeps every signal
    before the reaping, which frees the group's id for reuse: the thread calls `ended` first."""

    __slots__ = ("lock", "pid", "stopped", "timer", "why")

    def __init__(self, pid: int, stop: KillSwitch) -> None:
        self.lock = threading.Lock()
        self.pid = pid
        self.stopped = stop
        self.why: list[str] = []
        self.timer: threading.Timer | None = None

    def stop(self) -> None:
        """The switch was set (any thread; more than once is once)."""
        with self.lock:
            if not self.pid or self.why:
                return
            if os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                return  # it has ended on its own: its end is its own, not the switch's
            self.why.append("stop")
            if self.stopped.reason:
                _killpg(self.pid, signal.SIGKILL)
                return
            _killpg(self.pid, signal.SIGTERM)
            timer = threading.Timer(KILL_GRACE, self._kill)
            timer.daemon = True
            try:
                timer.start()
            except RuntimeError:  # no thread to be had (a small `ulimit -u`): no grace, rather than no end
                _killpg(self.pid, signal.SIGKILL)
                return
            self.timer = timer

    def _kill(self) -> None:
        with self.lock:
            if self.pid:
                _killpg(self.pid, signal.SIGKILL)

    def ended(self) -> list[str]:
        """The job has exited and is about to be reaped: no signal from here on. Returns what ended it."""
        with self.lock:
            self.pid = 0
            if self.timer is not None:
                self.timer.cancel()
            return self.why


def _wait_blocking(pid: int, pidfd: int, wake: int, stop: KillSwitch, timeout: float | None) -> list[str]:
    """Sleep until the job `pid` has exited (leaving it to be reaped), taking it back on the way as `end`
    does in `_run`: SIGTERM to its group when `stop` is set or the timeout is reached, SIGKILL KILL_GRACE
    seconds later (at once when the switch has a reason). Returns what ended it, as `_run`'s `why`."""
    why: list[str] = []
    now = time.monotonic()
    deadline = now + timeout if timeout is not None else None
    kill_at: float | None = None
    poller = select.poll()
    if pidfd >= 0:
        poller.register(pidfd, select.POLLIN)
    poller.register(wake, select.POLLIN)
    while True:
        if not why:
            cause = "stop" if stop.is_set() else "timeout" if deadline is not None and now >= deadline else ""
            if cause:
                why.append(cause)
                if stop.reason:
                    _killpg(pid, signal.SIGKILL)
                else:
                    _killpg(pid, signal.SIGTERM)
                    kill_at = now + KILL_GRACE
        if kill_at is not None and now >= kill_at:
            _killpg(pid, signal.SIGKILL)
            kill_at = None
        ends = [t for t in ((None if why else deadline), kill_at) if t is not None]
        if pidfd < 0:  # no pidfd (an old kernel): look every 50 ms
            ends.append(now + 0.05)
        wait_ms = -1 if not ends else min(MAX_POLL_MS, max(0, int((min(ends) - now) * 1000) + 1))
        for fd, _ in poller.poll(wait_ms):
            if fd == pidfd:
                return why
            with contextlib.suppress(BlockingIOError):  # a switch was set (maybe an earlier job's): look again
                os.eventfd_read(wake)
        if pidfd < 0 and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
            return why
        now = time.monotonic()


def _wait_any(pid: int) -> None:
    """Block until `pid` has exited, leaving it to be reaped (for kernels without pidfd)."""
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


def _collect(jobdir: Path, names: list[str], limit: int, follow: bool = True) -> tuple[dict[str, bytes], str]:
    """Read the declared outputs; a missing or oversized one is the job's failure. Unless `follow`, an
    output reached through a symbolic link counts as missing (`--run-as`: see the module's docstring)."""
    outputs: dict[str, bytes] = {}
    total = 0
    for name in names:
        if problem := output_name_problem(name):  # a name filled from parameters that leads out of the folder
            return {}, f"expected output '{name[:200]}' is not a name inside the job's folder: {problem}"
        try:
            fd = _open_inside(jobdir, name, follow)
        except OSError:
            return {}, f"expected output '{name}' was not produced"
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return {}, f"expected output '{name}' was not produced (it is not a regular file)"
            total += st.st_size
            if total > limit:
                return {}, (f"outputs total over {total:,} bytes, over the server's limit of {limit:,} bytes "
                            "(server option --max-result-size)")
            with open(fd, "rb", closefd=False) as f:
                outputs[name] = f.read()
        finally:
            os.close(fd)
    return outputs, ""


def _open_inside(jobdir: Path, name: str, follow: bool) -> int:
    """Open `jobdir/name` to read; unless `follow`, no part of `name` may be a symbolic link."""
    if follow:
        return os.open(jobdir / name, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    nofollow = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
    *folders, last = name.split("/")
    fd = os.open(jobdir, nofollow | os.O_DIRECTORY)
    try:
        for folder in folders:
            sub = os.open(folder, nofollow | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
        return os.open(last, nofollow | os.O_NONBLOCK, dir_fd=fd)
    finally:
        os.close(fd)
