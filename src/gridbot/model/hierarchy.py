"""The grid execution hierarchy's queues, as a pools file (or a scenario) declares them (issue 17).

    [queues.q1]
    level = 1                    # 1 is the top: small, responsive pools; bags enter here
    pools = ["server"]
    queue_time_limit = "6m"      # Tq: the longest a bag may stay in the queue
    exec_time_limit = "3m"       # Te <= Tq: the longest a bag may run in it
    max_cpus = 2                 # N: the most slots one bag may hold in the queue
    performance = 1.0            # P: its machines' speed relative to a speed-1 CPU (default: measured)
    max_bags = 2                 # a queue length limit (optional; the paper's follows from Tq / Te)
    policies = ["overload", "complexity_mismatch", "overdue", "task_potential_overdue", "queue_potential_overdue"]
    at_lowest = "terminate"      # a bag violating the lowest level's limits: "terminate" or "run"

The limits follow the paper's Eq. 1: a queue may hold C_q = Tq x N x P x beta of work and run a bag of at
most C_e = Te x N x P x beta (complexity in CPU-seconds of a speed-1 CPU; beta, the bag's CPU-bound
fraction, is the bag's). Validated like a bag spec: every problem with its line and a hint.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from gridbot.model.spec import closest, parse_duration

POLICIES = ("overload", "complexity_mismatch", "overdue", "task_potential_overdue", "queue_potential_overdue")
"""The paper's migration policies (Figures 1 and 2), each of which a queue may switch off."""
QUEUE_KEYS = ("level", "pools", "queue_time_limit", "exec_time_limit", "max_cpus", "performance", "max_bags",
              "policies", "at_lowest")
AT_LOWEST = ("terminate", "run")


class QueueSpec(msgspec.Struct, frozen=True):
    """One queue of the hierarchy, validated."""

    name: str
    level: int
    pools: tuple[str, ...]
    queue_time_limit: float
    exec_time_limit: float
    max_cpus: int
    performance: float | None = None
    """Relative speed of its machines (None: measured from the bags' results, 1 until then)."""
    max_bags: int | None = None
    policies: frozenset[str] = frozenset(POLICIES)
    at_lowest: str = "terminate"


Fail = Callable[[tuple[str, ...], str, str], None]


def parse_queues(table: object, pool_names: list[str], fail: Fail) -> list[QueueSpec]:
    """The `[queues.NAME]` tables of a pools file or scenario; every problem is reported through `fail`
    (path, message, hint)."""
    if not isinstance(table, dict):
        fail(("queues",), "'queues' must hold one table per queue", "[queues.q1]\nlevel = 1\npools = [\"here\"]")
        return []
    out = []
    for name, t in table.items():
        q = _queue(name, t, pool_names, fail)
        if q is not None:
            out.append(q)
    seen: dict[tuple[str, int], str] = {}
    for q in out:
        for p in q.pools:
            other = seen.get((p, q.level))
            if other == q.name:
                fail(("queues", q.name, "pools"), f"pool '{p}' is listed twice in queue '{q.name}'", "list it once")
            elif other is not None:
                fail(("queues", q.name, "pools"), f"pool '{p}' is in queues '{other}' and '{q.name}' of the same "
                     f"level {q.level}", "queues of one level share load by moving bags, not by sharing pools")
            seen.setdefault((p, q.level), q.name)
    if out and min(q.level for q in out) != 1:
        fail(("queues",), f"the top level is {min(q.level for q in out)}, not 1", "bags enter at level 1: number "
             "the levels from 1")
    return out


def _queue(name: str, t: object, pool_names: list[str], fail: Fail) -> QueueSpec | None:
    path = ("queues", name)
    if not isinstance(t, dict):
        fail(path, f"queue '{name}' must be a table", f"[queues.{name}]\nlevel = 1\npools = [\"here\"]")
        return None
    ok = True

    def bad(key: str, message: str, hint: str = "") -> None:
        nonlocal ok
        ok = False
        fail((*path, key), f"queue '{name}': {message}", hint)

    for key in t:
        if key not in QUEUE_KEYS:
            bad(key, f"unknown key '{key}'", closest(key, QUEUE_KEYS) or f"the keys are {', '.join(QUEUE_KEYS)}")
    for key in ("level", "pools", "queue_time_limit", "exec_time_limit", "max_cpus"):
        if key not in t:
            bad(key, f"'{key}' is missing", _EXAMPLE)
    level = _int(t, "level", 1, bad)
    pools = t.get("pools", [])
    if not isinstance(pools, list) or not pools or not all(isinstance(p, str) for p in pools):
        bad("pools", "'pools' must be a list of the pools file's pool names", 'pools = ["cluster"]')
        pools = []
    for p in pools:
        if p not in pool_names:
            bad("pools", f"pool '{p}' is not in the pools file", closest(p, pool_names) or
                f"the pools are {', '.join(pool_names)}")
    tq = _duration(t, "queue_time_limit", bad)
    te = _duration(t, "exec_time_limit", bad)
    if tq is not None and te is not None and te > tq:
        bad("exec_time_limit", f"exec_time_limit ({te:g} s) is above queue_time_limit ({tq:g} s)",
            "a bag's run in a queue is part of its stay there: Te <= Tq")
    max_cpus = _int(t, "max_cpus", 1, bad)
    performance: float | None = None
    if "performance" in t:
        v = t["performance"]
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:
            bad("performance", f"'performance' must be a positive number (a relative speed), not {v!r}",
                "performance = 1.5 (its machines are half again as fast as a speed-1 CPU), or leave it out")
        else:
            performance = float(v)
    max_bags = _int(t, "max_bags", 1, bad) if "max_bags" in t else None
    policies = t.get("policies", list(POLICIES))
    if not isinstance(policies, list) or not all(isinstance(p, str) and p in POLICIES for p in policies):
        bad("policies", f"'policies' must list some of: {', '.join(POLICIES)}", 'policies = ["overdue"]')
        policies = list(POLICIES)
    at_lowest = t.get("at_lowest", "terminate")
    if at_lowest not in AT_LOWEST:
        bad("at_lowest", f"'at_lowest' must be one of {', '.join(AT_LOWEST)}, not {at_lowest!r}",
            'at_lowest = "terminate" ends a bag that violates the lowest level\'s limits; "run" lets it run')
    if not ok or tq is None or te is None:
        return None
    return QueueSpec(name, level, tuple(pools), tq, te, max_cpus, performance, max_bags, frozenset(policies),
                     str(at_lowest))


_EXAMPLE = ('[queues.q1]\nlevel = 1\npools = ["server"]\nqueue_time_limit = "6m"\nexec_time_limit = "3m"\n'
            "max_cpus = 2")


def _int(t: Mapping[str, Any], key: str, low: int, bad: Callable[..., None]) -> int:
    v = t.get(key, low)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= 1_000_000_000:
        bad(key, f"'{key}' must be a whole number of at least {low}, not {v!r}", f"{key} = {max(low, 1)}")
        return low
    return v


def _duration(t: Mapping[str, Any], key: str, bad: Callable[..., None]) -> float | None:
    if key not in t:
        return None
    try:
        return parse_duration(t[key])
    except ValueError as e:
        bad(key, f"'{key}' = {t[key]!r}: {e}", f'{key} = "10m"')
        return None
