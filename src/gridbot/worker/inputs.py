"""The worker's cache of input files, kept by content so one bag's job cannot change another bag's inputs.

A downloaded input is stored once per content as `<cache>/sha256/<hex>`, read-only (0444, in folders
only the worker may write). Jobs never get that path: each gets its own copy, staged by the executor.
A job that runs as the worker's user (`--allow-root`, or a worker that is not root) could still write
it, so before every use the file's identity (inode, size, change time, mode) is compared with what was
recorded when it was stored: any write or chmod changes the change time. A changed file is hashed
again, and if its content is not what was downloaded it is thrown away and downloaded anew.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

Key = tuple[int, str]
"""(bag id, input name)."""
_CHUNK = 1 << 20


@dataclass
class _Entry:
    path: Path
    digest: str
    identity: tuple[int, int, int, int]


class InputCache:
    """Inputs by content under `root`, and what each (bag, name) was when it was downloaded."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "sha256"
        self.entries: dict[Key, _Entry] = {}

    def store(self, key: Key, data: bytes) -> Path:
        """Keep `data` as the input `key`; return its path in the cache."""
        digest = hashlib.sha256(data).hexdigest()
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        path = self.dir / digest
        tmp = self.dir / f".{digest}.{os.getpid()}.part"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
        try:
            with os.fdopen(fd, "wb", closefd=False) as f:
                f.write(data)
            os.fchmod(fd, 0o444)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        self.entries[key] = _Entry(path, digest, _identity(os.stat(path, follow_symlinks=False)))
        return path

    def intact(self, key: Key) -> bool:
        """Whether the cached file of `key` still holds what was downloaded (False: download it again)."""
        entry = self.entries.get(key)
        if entry is None:
            return False
        try:
            st = os.stat(entry.path, follow_symlinks=False)
        except OSError:
            return self._forget(key)
        if _identity(st) == entry.identity:
            return True
        if not stat.S_ISREG(st.st_mode) or _sha256(entry.path) != entry.digest:
            return self._forget(key)
        if stat.S_IMODE(st.st_mode) != 0o444:
            os.chmod(entry.path, 0o444)
            st = os.stat(entry.path, follow_symlinks=False)
        entry.identity = _identity(st)
        return True

    def _forget(self, key: Key) -> bool:
        """Drop a cached file that is gone or changed, so the next use downloads it again."""
        entry = self.entries.pop(key)
        with contextlib.suppress(OSError):
            entry.path.unlink()
        return False


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """What changes when a file is written, replaced or chmodded (the change time cannot be set back)."""
    return st.st_ino, st.st_size, st.st_ctime_ns, st.st_mode


def _sha256(path: Path) -> str:
    """The hex SHA-256 of a file, read a megabyte at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()
