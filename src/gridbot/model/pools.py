"""The pools file: every pool gridbot may send pilots to, with its limits, pilot size, price and class.

    [pools.cluster]
    kind = "slurm"            # local, slurm (and the other batch systems psij-python knows), ec2, static
    partition = "fast"
    max_running = 20          # pilots running at once
    max_queued = 10           # pilots waiting in the pool's queue at once (not for local: it has no queue)
    cpus = 4                  # slots of each pilot
    walltime = "4h"
    price_per_cpu_hour = 0.0
    reliability = "reliable"  # unreliable (a grid that preempts), reliable (a cluster or a cloud), volunteer
    level = 1                 # the grid execution hierarchy's level
    [pools.cluster.attributes]
    Site = "technion"         # free attributes, published in the pool's ad for GridPolicy

Validated like a bag spec: every problem with its line and a hint, and nothing used if one is wrong.
"""

from __future__ import annotations

import tomllib
from typing import Any

import msgspec

from gridbot.model.spec import Problem, SpecError, closest, key_lines, parse_duration

KINDS = ("local", "slurm", "pbs", "lsf", "cobalt", "flux", "ec2", "static")
"""`slurm`, `pbs`, `lsf`, `cobalt` and `flux` are batch systems reached through psij-python."""
BATCH_KINDS = frozenset({"slurm", "pbs", "lsf", "cobalt", "flux"})
RELIABILITY = ("unreliable", "reliable", "volunteer")
COMMON_KEYS = ("kind", "max_running", "max_queued", "cpus", "memory_mb", "walltime", "price_per_cpu_hour",
               "charging_period", "reliability", "level", "attributes", "idle_timeout", "min_cpu", "cpu_window",
               "run_as", "allow_root")
KIND_KEYS: dict[str, tuple[str, ...]] = {
    "local": (),
    "static": (),
    "ec2": ("region", "instance_type", "image", "spot", "subnet", "security_group", "key_name", "endpoint_url"),
    **{k: ("partition", "account", "work_dir") for k in BATCH_KINDS},
}


class PoolSpec(msgspec.Struct, frozen=True):
    """One pool, validated."""

    name: str
    kind: str
    max_running: int = 10
    max_queued: int = 10
    cpus: int = 1
    memory_mb: int = 0
    walltime: float = 4 * 3600.0
    price_per_cpu_hour: float = 0.0
    charging_period: float = 3600.0
    reliability: str = "reliable"
    level: int = 0
    idle_timeout: float = 120.0
    """A pilot's worker exits after this long with no work (GridBot: pilots never idle)."""
    min_cpu: float = 0.05
    """A pilot leaves when its job uses less than this fraction of a CPU over cpu_window (0: never)."""
    cpu_window: float = 600.0
    run_as: str = ""
    """The user a pilot's worker runs jobs as when it starts as root ("": its own user)."""
    allow_root: bool = False
    """Let a pilot's worker started as root run jobs as root (else it refuses to start without run_as)."""
    attributes: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)
    options: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)
    """The kind's own settings (partition, region, instance_type, ...)."""

    def ad(self) -> dict[str, Any]:
        """The pool's ClassAd attributes, for GridPolicy."""
        return {"Name": self.name, "Kind": self.kind, "Reliability": self.reliability, "Level": self.level,
                "Cpus": self.cpus, "Memory": self.memory_mb, "Walltime": self.walltime,
                "PricePerCpuHour": self.price_per_cpu_hour, "MaxRunning": self.max_running, **self.attributes}


def parse_pools(text: str, source: str) -> list[PoolSpec]:
    """Validate a pools file into PoolSpecs, or raise SpecError with every problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(source, [Problem(f"TOML syntax error: {e}", None,
                                         "check quotes, brackets and '=' signs")]) from e
    lines = key_lines(text)
    problems: list[Problem] = []

    def fail(path: tuple[str, ...], message: str, hint: str = "") -> None:
        line = next((lines[path[:n]] for n in range(len(path), 0, -1) if path[:n] in lines), None)
        problems.append(Problem(message, line, hint))

    for key in data:
        if key != "pools":
            fail((key,), f"unknown key '{key}'", "a pools file has one table per pool: [pools.NAME]")
    pools = data.get("pools", {})
    if not isinstance(pools, dict) or not pools:
        fail(("pools",), "no pools are defined", '[pools.here]\nkind = "local"')
        raise SpecError(source, problems)
    out = [p for name, table in pools.items() if (p := _pool(name, table, fail)) is not None]
    if problems:
        raise SpecError(source, problems)
    return out


def _pool(name: str, table: object, fail: Any) -> PoolSpec | None:
    path = ("pools", name)
    if not isinstance(table, dict):
        fail(path, f"pool '{name}' must be a table", f'[pools.{name}]\nkind = "local"')
        return None
    kind = table.get("kind")
    if kind not in KINDS:
        hint = closest(str(kind), KINDS) or f"the kinds are {', '.join(KINDS)}"
        fail((*path, "kind"), f"pool '{name}' has unknown kind {kind!r}" if kind else f"pool '{name}' has no kind",
             hint)
        return None
    allowed = COMMON_KEYS + KIND_KEYS[kind]
    ok = True
    for key in table:
        if key not in allowed:
            fail((*path, key), f"unknown key '{key}' in pool '{name}' (kind {kind})",
                 closest(key, allowed) or f"keys for {kind}: {', '.join(allowed)}")
            ok = False
    values: dict[str, Any] = {}
    for key, low in (("max_running", 0), ("max_queued", 0), ("cpus", 1), ("memory_mb", 0), ("level", 0)):
        if key in table:
            v = table[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                fail((*path, key), f"'{key}' of pool '{name}' must be a whole number of at least {low}, not {v!r}")
                ok = False
            else:
                values[key] = v
    if "min_cpu" in table:
        v = table["min_cpu"]
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1:
            fail((*path, "min_cpu"), f"'min_cpu' of pool '{name}' must be a fraction from 0 to 1, not {v!r}")
            ok = False
        else:
            values["min_cpu"] = float(v)
    for key in ("walltime", "charging_period", "idle_timeout", "cpu_window"):
        if key in table:
            try:
                values[key] = parse_duration(table[key])
            except ValueError as e:
                fail((*path, key), f"'{key}' of pool '{name}': {e}")
                ok = False
    if "price_per_cpu_hour" in table:
        v = table["price_per_cpu_hour"]
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
            fail((*path, "price_per_cpu_hour"), f"'price_per_cpu_hour' of pool '{name}' must be a number >= 0")
            ok = False
        else:
            values["price_per_cpu_hour"] = float(v)
    if "run_as" in table:
        v = table["run_as"]
        if not isinstance(v, str) or not v or not v.replace("-", "").replace("_", "").replace(".", "").isalnum():
            fail((*path, "run_as"), f"'run_as' of pool '{name}' must be a user name, not {v!r}",
                 'write run_as = "gridbot" (a user on the pool\'s hosts)')
            ok = False
        else:
            values["run_as"] = v
    if "allow_root" in table:
        if not isinstance(table["allow_root"], bool):
            fail((*path, "allow_root"), f"'allow_root' of pool '{name}' must be true or false")
            ok = False
        else:
            values["allow_root"] = table["allow_root"]
    if "reliability" in table:
        if table["reliability"] not in RELIABILITY:
            fail((*path, "reliability"), f"reliability {table['reliability']!r} of pool '{name}' is unknown",
                 closest(str(table["reliability"]), RELIABILITY) or f"use one of {', '.join(RELIABILITY)}")
            ok = False
        else:
            values["reliability"] = table["reliability"]
    attributes = table.get("attributes", {})
    if not isinstance(attributes, dict) or not all(isinstance(v, str | int | float | bool) for v in
                                                    attributes.values()):
        fail((*path, "attributes"), f"attributes of pool '{name}' must be a table of plain values")
        ok = False
        attributes = {}
    if kind in BATCH_KINDS and "partition" not in table:
        fail(path, f"pool '{name}' (kind {kind}) has no partition", 'add partition = "NAME" (see `sinfo`)')
        ok = False
    if kind == "ec2":
        for key in ("region", "instance_type", "image"):
            if key not in table:
                fail(path, f"pool '{name}' (kind ec2) has no {key}", f'add {key} = "..."')
                ok = False
        if "run_as" not in table and "allow_root" not in table:
            fail(path, f"pool '{name}' (kind ec2) starts its pilots as root, which then refuse to run jobs",
                 'add run_as = "USER" (a user of the image, e.g. "ec2-user") or allow_root = true')
            ok = False
    if not ok:
        return None
    options = {k: table[k] for k in KIND_KEYS[kind] if k in table}
    return PoolSpec(name=name, kind=kind, attributes=dict(attributes), options=options, **values)
