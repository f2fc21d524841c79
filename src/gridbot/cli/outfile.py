"""Files the command line writes where the user says (`report --out`, `plan --plot`): refused where the name
is taken by something that is not a regular file, written whole or not at all, with the mode any file the
user makes gets. A regular file already there is replaced by a rename, as an editor saves: one read-only,
or with other hard links, is replaced, not written through."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gridbot.errors import GridbotError, unwritable
from gridbot.security.keys import write_atomic

NOT_REGULAR = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"),
               (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))
"""What may be at a path that is not a regular file, as the refusal names it."""


def refuse_not_regular(path: Path, option: str, what: str, example: str) -> None:
    """Refuse (GridbotError) a `path` that exists and is not a regular file: the file is renamed over what is
    there, so it would turn a link into a file (its target untouched), a pipe or a device into a file. A
    missing `path`, or one that cannot be looked at, is left to the write to take or explain."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in NOT_REGULAR if test(mode)), "something")
    example = f"new-{example}" if path.name == example else example
    raise GridbotError(f"{option} {path} is {kind}, not a regular file, and {what} is written over nothing else; "
                       f"give {option} another name, such as {example}")


def user_file_mode() -> int:
    """The mode a new file gets here (0666 less the umask), which a report or a plot has as any file the user
    writes."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def write_user_file(path: Path, data: bytes, option: str, what: str, example: str) -> None:
    """Write `data` to `path` atomically (a reader never sees half a file, two writers never share a
    temporary file), after `refuse_not_regular`; a GridbotError naming `path` if it cannot be written."""
    refuse_not_regular(path, option, what, example)
    try:
        write_atomic(path, data, user_file_mode())
    except OSError as e:
        raise unwritable(path, e, what, f"give {option} a file in a folder you may write") from None
