"""What keeps a job to itself on its host: a clean environment, the user it runs as, and its rlimits.

A job sees a few variables of the worker's environment (`ENV_ALLOWED`, and those named with
`--pass-env`), never the rest: a worker's key, credentials or tokens stay the worker's. Every job also
carries `GRIDBOT_RUN`, a random token of the worker process, and `GRIDBOT_INSTANCE`: the marks by which
the worker (gridbot.worker.reaper) and its watchdog find a job's processes, even those that left its
session. A worker started as root runs its jobs as `--run-as USER`, and refuses to run them as root
unless told `--allow-root`.
"""

from __future__ import annotations

import math
import os
import pwd
import resource
import secrets
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gridbot.errors import UsageError
from gridbot.model.records import Limits

ENV_ALLOWED = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "USER", "LOGNAME", "TZ", "SHELL")
"""Variables of the worker's environment a job gets: where programs are, whose home, language and time
zone, the temporary folder. Everything else (keys, proxies, cloud credentials) needs `--pass-env NAME`."""
RUN_VAR = "GRIDBOT_RUN"
CPU_GRACE = 5
"""Seconds of CPU a process gets past the SIGXCPU of its `cpu_time` limit (to save its work) before SIGKILL."""


@dataclass(frozen=True)
class RunAs:
    """The user jobs run as (`--run-as`), resolved once when the worker starts."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


def new_token() -> str:
    """A random mark for the jobs of one worker process (`GRIDBOT_RUN`)."""
    return secrets.token_hex(8)


def resolve_user(run_as: str | None, allow_root: bool, euid: int | None = None) -> RunAs | None:
    """The user to run jobs as (None: the worker's own), or UsageError when the worker must not start:
    as root with neither `--run-as` nor `--allow-root`, with `--run-as` naming root without `--allow-root`,
    or with `--run-as` another user while not root (only root can switch users)."""
    euid = os.geteuid() if euid is None else euid
    if run_as is None:
        if euid == 0 and not allow_root:
            raise UsageError("the worker runs as root, so its jobs would too: give --run-as USER to run them as "
                             "that user, or --allow-root to run them as root anyway")
        return None
    try:
        pw = pwd.getpwuid(int(run_as)) if run_as.isdigit() else pwd.getpwnam(run_as)
    except KeyError:
        raise UsageError(f"--run-as {run_as}: no such user on this host") from None
    if pw.pw_uid == 0 and not allow_root:
        raise UsageError(f"--run-as {run_as} runs jobs as root: add --allow-root if that is really meant")
    if pw.pw_uid == euid:
        return None
    if euid != 0:
        raise UsageError(f"--run-as {run_as} needs the worker to start as root (it runs as uid {euid})")
    groups = tuple(g for g in os.getgrouplist(pw.pw_name, pw.pw_gid) if g != pw.pw_gid)
    return RunAs(pw.pw_name, pw.pw_uid, pw.pw_gid, groups, pw.pw_dir)


def job_environment(pass_env: Sequence[str], token: str, user: RunAs | None,
                    environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every job of this worker starts from (its `[env]` and `GRIDBOT_*` go on top).

    Made once per worker: the executor copies it for each job.
    """
    source = os.environ if environ is None else environ
    env = {name: source[name] for name in (*ENV_ALLOWED, *pass_env) if name in source}
    if user is not None:
        env.update(HOME=user.home, USER=user.name, LOGNAME=user.name)
        if "PATH" in env:
            env["PATH"] = searchable_path(env["PATH"], user)
    env[RUN_VAR] = token
    return env


SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
"""A job's PATH when none of the worker's entries can be searched by the user it runs as."""


def searchable_path(path: str, user: RunAs) -> str:
    """`path` without the folders `user` cannot search (root's own, such as /root/.local/bin): there a missing
    command would fail as "Permission denied" instead of "not found", and a command found further along the
    PATH would be the wrong one for no visible reason. File modes only (no ACLs)."""
    kept = [d for d in path.split(":") if d and _searchable(d, user)]
    return ":".join(kept) or SAFE_PATH


def _searchable(folder: str, user: RunAs) -> bool:
    """Whether `user` may search `folder` and every folder above it, by their modes."""
    groups = {user.gid, *user.groups}
    here = Path(folder)
    if not here.is_absolute():
        return False
    for part in (here, *here.parents):
        try:
            st = part.stat()
        except OSError:
            return False
        if st.st_uid == user.uid:
            bit = stat.S_IXUSR
        elif st.st_gid in groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return False
    return True


def apply_limits(pid: int, limits: Limits) -> None:
    """Set a job's rlimits on its first process, just after it started.

    posix_spawn cannot set limits in the child, so for the microseconds between the exec and this call
    the process runs with the worker's own: what it forks in that window keeps them. The memory limit is
    not an rlimit (RLIMIT_AS counts reserved address space and breaks runtimes that reserve much, like
    the JVM or Go); gridbot.worker.reaper polls it.
    """
    try:
        if limits.cpu_time is not None:
            seconds = math.ceil(limits.cpu_time)
            resource.prlimit(pid, resource.RLIMIT_CPU, _capped(resource.RLIMIT_CPU, seconds, seconds + CPU_GRACE))
        if limits.max_file_size is not None:
            size = limits.max_file_size
            resource.prlimit(pid, resource.RLIMIT_FSIZE, _capped(resource.RLIMIT_FSIZE, size, size))
        if limits.max_processes is not None:
            n = limits.max_processes
            resource.prlimit(pid, resource.RLIMIT_NPROC, _capped(resource.RLIMIT_NPROC, n, n))
    except ProcessLookupError:
        pass  # already gone: a job quicker than its limits


def _capped(which: int, soft: int, hard: int) -> tuple[int, int]:
    """(soft, hard) no higher than the worker's own hard limit, which only root could raise."""
    ceiling = resource.getrlimit(which)[1]
    if ceiling == resource.RLIM_INFINITY:
        ceiling = 1 << 62
    return min(soft, ceiling), min(hard, ceiling)
