"""The root of gridbot's exceptions; each subsystem derives its own base from it.

Messages say what went wrong and what to do next, since they are shown to users as they are.
"""

from __future__ import annotations


class GridbotError(Exception):
    """Base of every error gridbot raises on purpose. `retryable` errors may succeed if tried again."""

    retryable: bool = False


class UsageError(GridbotError):
    """The user asked for something that cannot be done as asked (exit code 2 on the command line)."""


class ServerUnavailable(GridbotError):
    """The server could not be reached or answered with a temporary failure."""

    retryable = True
