"""Validators: how a quorum compares two results other than byte for byte (issue 19).

A BOINC project validates volunteers' results with its own comparison (two floating-point outputs agree
within a tolerance, two orderings of the same set agree, ...). gridbot's server runs the admin's command,
declared in the pools file, never a submitter's:

    [validators.fuzzy]
    command = ["python3", "/opt/checks/close_enough.py"]   # or one string, split as a shell would
    timeout = "60s"                                         # at most this long per comparison

A bag names it with `compare = "fuzzy"` (and `quorum` >= 2). The command is run as
`COMMAND A B`, where A and B are directories, each holding one result: its declared output files under their
names and its standard output as `stdout` (no output may be called so). It exits 0 when the two results are
equivalent and 1 when they are not; anything else (another status, a signal, the timeout) is the validator's
failure, logged, and the two results count as different.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from gridbot.model.hierarchy import Fail
from gridbot.model.spec import VALIDATOR_NAME, parse_duration

DEFAULT_TIMEOUT = 60.0
MAX_TIMEOUT = 3600.0


@dataclass(frozen=True, slots=True)
class ValidatorSpec:
    """A comparison the server's admin registered: its name, the command's words and how long it may take."""

    name: str
    command: tuple[str, ...]
    timeout: float = DEFAULT_TIMEOUT


def parse_validators(table: object, fail: Fail) -> list[ValidatorSpec]:
    """The `[validators.NAME]` tables of a pools file; every problem is reported through `fail` (path, message,
    hint)."""
    example = '[validators.fuzzy]\ncommand = ["python3", "/opt/checks/close_enough.py"]'
    if not isinstance(table, dict):
        fail(("validators",), "'validators' must hold one table per validator", example)
        return []
    out = []
    for name, t in table.items():
        where = ("validators", name)
        if not VALIDATOR_NAME.fullmatch(name):
            fail(where, f"validator name {name[:70]!r} must be a letter, then up to 63 letters, digits, '-' or '_'",
                 "e.g. [validators.fuzzy]")
            continue
        if not isinstance(t, dict):
            fail(where, f"validator '{name}' must be a table", example)
            continue
        for key in t:
            if key not in ("command", "timeout"):
                fail((*where, key), f"unknown key '{key}' in validator '{name}'", "a validator has command and timeout")
        command = _command(t.get("command"), name, fail)
        timeout = _timeout(t.get("timeout", DEFAULT_TIMEOUT), name, fail)
        if command:
            out.append(ValidatorSpec(name, command, timeout))
    return out


def _command(value: object, name: str, fail: Fail) -> tuple[str, ...]:
    where = ("validators", name, "command")
    hint = 'command = ["python3", "/opt/checks/close_enough.py"]'
    if value is None:
        fail(where, f"validator '{name}' has no command", hint)
        return ()
    if isinstance(value, str):
        try:
            words = shlex.split(value)
        except ValueError as e:
            fail(where, f"validator '{name}': cannot split its command into words ({e})", hint)
            return ()
    elif isinstance(value, list) and all(isinstance(w, str) for w in value):
        words = list(value)
    else:
        fail(where, f"validator '{name}': 'command' must be a string or a list of strings", hint)
        return ()
    if not words or not words[0]:
        fail(where, f"validator '{name}' has an empty command", hint)
        return ()
    if any("\0" in w for w in words):
        fail(where, f"validator '{name}': its command holds a NUL character", hint)
        return ()
    return tuple(words)


def _timeout(value: object, name: str, fail: Fail) -> float:
    where = ("validators", name, "timeout")
    hint = 'timeout = "60s"'
    try:
        seconds: float | None = parse_duration(value)
    except ValueError:
        seconds = None
    if seconds is None or not 0 < seconds <= MAX_TIMEOUT:
        fail(where, f"validator '{name}': 'timeout' must be a duration from over 0 to {MAX_TIMEOUT:.0f}s, not "
             f"{str(value)[:40]!r}", hint)
        return DEFAULT_TIMEOUT
    return seconds
