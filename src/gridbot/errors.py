"""The root of gridbot's exceptions; each subsystem derives its own base from it.

Messages say what went wrong and what to do next, since they are shown to users as they are.
"""

from __future__ import annotations

import errno
from pathlib import Path


class GridbotError(Exception):
    """Base of every error gridbot raises on purpose. `retryable` errors may succeed if tried again."""

    retryable: bool = False


class UsageError(GridbotError):
    """The user asked for something that cannot be done as asked (exit code 2 on the command line)."""


class ServerUnavailable(GridbotError):
    """The server could not be reached or answered with a temporary failure."""

    retryable = True


def unwritable(path: Path, error: OSError, what: str, fix: str) -> GridbotError:
    """The error for `what` that cannot be written to `path`: the path, why, and what to do (`fix`), instead
    of the OSError's traceback. It names `path` and its folder, never the temporary file an atomic write
    was making beside it."""
    if error.errno == errno.ENOENT:
        why = f"{path.parent} does not exist or takes no files"
    elif error.errno in (errno.EEXIST, errno.ENOTDIR):
        why = f"a file is in the way: {path.parent} is not a folder"
    elif error.errno == errno.EISDIR:
        why = f"{path} is a folder"
    elif error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        why = f"no permission to write in {path.parent} ({error.strerror})"
    elif error.errno == errno.ENOSPC:
        why = "the disk is full"
    else:
        why = error.strerror or str(error)
    return GridbotError(f"cannot write {what} {path}: {why}; {fix}")
