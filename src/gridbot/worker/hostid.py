"""A worker's stable identity: the same machine and slot name give the same host id after a restart.

Two workers on one machine must not share an id (the server would think one lost the other's
instances), so each holds an exclusive lock on its slot name; a second worker asking for a taken
name gets the next free one (`worker`, `worker-1`, `worker-2`, ...), which is again stable.
"""

from __future__ import annotations

import fcntl
import os
import socket
import uuid
from pathlib import Path
from typing import IO

_NAMESPACE = uuid.UUID("6f1b3f55-3c3c-4f53-9d0a-2a8f0d9b1f00")


def state_dir() -> Path:
    """Where workers keep their identity (XDG state directory)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gridbot"


def machine_id(directory: Path) -> str:
    """The OS's machine id, or one generated once and kept in `directory`."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text:
            return text
    own = directory / "machine-id"
    if not own.exists():
        directory.mkdir(parents=True, exist_ok=True)
        own.write_text(uuid.uuid4().hex + "\n")
    return own.read_text().strip()


class HostIdentity:
    """Holds the slot lock for as long as the worker lives."""

    def __init__(self, host_id: str, name: str, lock: IO[str], slot: str = "worker") -> None:
        self.host_id = host_id
        self.name = name
        self.slot = slot
        """The slot name locked (`worker`, `worker-1`, ...): the key of what the worker keeps per slot."""
        self._lock = lock

    def release(self) -> None:
        self._lock.close()


def acquire(slot: str = "worker", directory: Path | None = None) -> HostIdentity:
    """Lock the first free slot name starting from `slot` and return its stable identity."""
    directory = directory or state_dir()
    locks = directory / "slots"
    locks.mkdir(parents=True, exist_ok=True)
    mid = machine_id(directory)
    for n in range(4096):
        name = slot if n == 0 else f"{slot}-{n}"
        handle = open(locks / f"{name}.lock", "w")  # noqa: SIM115 - held open as the lock
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        host_id = uuid.uuid5(_NAMESPACE, f"{mid}:{name}").hex[:20]
        return HostIdentity(host_id, f"{socket.gethostname()}/{name}", handle, name)
    raise RuntimeError(f"no free worker slot name under {locks}")
