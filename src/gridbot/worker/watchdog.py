"""The worker's watchdog: when the worker dies, even by SIGKILL, it kills what is left of the worker's jobs.

The worker starts it once (gridbot.worker.reaper.start_watchdog) as `python -I -S watchdog.py TOKEN FD`:
run by path, it imports nothing of gridbot and only four modules of the standard library. It waits for
end-of-file on the pipe `FD`, whose write end only the worker holds (close-on-exec, so jobs never
inherit it): the kernel closes it when the worker exits, however it exits. It then kills every process
whose environment carries the worker's `GRIDBOT_RUN=TOKEN`, again until none is left, and exits. It
runs in a session of its own and ignores SIGINT, SIGTERM and SIGHUP, so a Ctrl-C or a signal to the
worker's process group does not take it away before the worker.
"""

from __future__ import annotations

import os
import signal
import sys
import time

ROUNDS = 50
"""Scans at most, 20 ms apart: a job forking while it is killed is caught by the next one."""


def marked(marker: bytes) -> list[int]:
    """Processes whose environment contains `marker` (those this process may read)."""
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if marker in f.read():
                    found.append(int(name))
        except OSError:
            continue
    return found


def sweep(token: str) -> int:
    """SIGKILL every process of the worker's jobs; return how many were killed."""
    marker = f"GRIDBOT_RUN={token}\0".encode()
    killed = 0
    for _ in range(ROUNDS):
        pids = marked(marker)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        time.sleep(0.02)
    return killed


def main(argv: list[str]) -> None:
    """Wait for the worker to exit, then sweep its jobs' processes."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    token, fd = argv[1], int(argv[2])
    while os.read(fd, 512):
        pass
    sweep(token)


if __name__ == "__main__":
    main(sys.argv)
