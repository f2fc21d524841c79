"""The pools file: every pool gridbot may send pilots to, with its limits, pilot size, price and class.

    [pools.cluster]
    kind = "slurm"            # local, slurm (and the other batch systems psij-python knows), ec2, static
    partition = "fast"
    max_running = 20          # pilots running at once
    max_queued = 10           # pilots waiting in the pool's queue at once (not for local: it has no queue)
    cpus = 4                  # slots of each pilot
    walltime = "4h"
    price_per_cpu_hour = 0.0  # charged per CPU-hour an instance holds a slot (Nimrod-G's price per CPU time)
    price_per_pilot_hour = 0.0  # charged per pilot per started charging_period (a cloud instance's hourly bill)
    charging_period = "1h"
    reliability = "reliable"  # unreliable (a grid that preempts), reliable (a cluster or a cloud), volunteer
    level = 1                 # the grid execution hierarchy's level
    startup = "2m"            # from asking for a pilot to its taking work (default: the kind's, see KINDS)
    queue_patience = "1h"     # a pilot queued longer no longer counts as capacity (default 0: always counts)
    [pools.cluster.attributes]
    Site = "technion"         # free attributes, published in the pool's ad for GridPolicy

Validated like a bag spec: every problem with its line and a hint, and nothing used if one is wrong.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from gridbot.model.hierarchy import QueueSpec, parse_queues
from gridbot.model.records import MAX_PILOT_CPUS
from gridbot.model.spec import NAME_RE, Problem, SpecError, closest, key_lines, parse_duration
from gridbot.model.validators import ValidatorSpec, parse_validators
from gridbot.model.volunteer import KEYS as VOLUNTEER_KEYS
from gridbot.model.volunteer import volunteer_problems

RELIABILITY = ("unreliable", "reliable", "volunteer")
RESERVED_ATTRIBUTES = {"Name": "the table's name", "Kind": "kind", "Reliability": "reliability", "Level": "level",
                       "Cpus": "cpus", "Memory": "memory_mb", "Walltime": "walltime",
                       "PricePerCpuHour": "price_per_cpu_hour", "PricePerPilotHour": "price_per_pilot_hour",
                       "ChargingPeriod": "charging_period", "MaxRunning": "max_running", "Trusted": "trusted",
                       "Startup": "startup"}
"""The attributes the pool's ad sets from its validated keys (`PoolSpec.ad`): [attributes] may not replace them
(a price written as a string there once made a pool free)."""


def classad_int_problem(key: str, value: object) -> str:
    """Why `value`, an attribute of a pool's ad, is an integer a ClassAd cannot hold (64 bits), or ""."""
    if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**63:
        return (f"{key} = {value} is beyond what a ClassAd integer holds (64 bits): write it as a float (1e30) or "
                "a string")
    return ""


COMMON_KEYS = ("kind", "max_running", "max_queued", "cpus", "memory_mb", "walltime", "price_per_cpu_hour",
               "price_per_pilot_hour",
               "charging_period", "reliability", "level", "attributes", "idle_timeout", "min_cpu", "cpu_window",
               "run_as", "allow_root", "monitor_interval", "trusted", "jobs_per_pilot", "startup", "queue_patience")
DURATIONS = {"walltime": " (0: none of ours; a Slurm or PBS pilot gets its queue's default time limit)",
             "charging_period": "", "idle_timeout": " (0: never)", "cpu_window": "",
             "monitor_interval": " (0: never)", "queue_patience": " (0: a queued pilot always counts)"}
"""The pools file's durations, each with what 0 means where 0 is allowed (as PoolSpec reads it), else ""."""
CPU_WINDOW_MIN = 1.0
"""The shortest `cpu_window`: a pilot's worker takes no `--cpu-window` below a second."""


@dataclass(frozen=True)
class PoolKind:
    """One kind of pool, declared once in `KINDS`: its own keys, what a pool of it must say, how its pilots
    behave and the adapter that submits them. Validation, the server's adapters and the overlay's limits
    all read it, so adding a kind is one entry (and its adapter class)."""

    adapter: str
    """The adapter class as `module:Class`; `gridbot.pools.adapters.adapter_class` imports it, so this layer
    imports nothing that does I/O."""
    keys: tuple[str, ...] = ()
    """The kind's own keys, beside COMMON_KEYS; `PoolSpec.options` holds them."""
    required: tuple[tuple[str, str], ...] = ()
    """Keys a pool of this kind must have, each with the hint shown when it is missing."""
    queue: bool = True
    """Its pilots wait in a queue before they run, and `max_queued` limits them (a local pilot runs at once)."""
    pilots: bool = True
    """gridbot submits its pilots (a `static` pool's hosts come by themselves)."""
    check: Callable[[str, Mapping[str, Any]], list[tuple[str, str]]] | None = None
    """The kind's own rule over a pool's table (pool name, table): a (message, hint) for each problem."""
    walltime_optional: bool = True
    """`walltime = 0` (no limit of ours) may be given: its batch system has a default limit, or none is needed
    (PSI/J's executors for LSF, Cobalt and Flux need a duration)."""
    exposes_pilot_env: bool = False
    """Its pilots' jobs can read what the pilot was started with (an EC2 instance's user data, from the
    metadata service): its pilots get an enrollment token, not the pool's worker key (security/keys.py)."""
    startup: float = 0.0
    """Typical seconds from the overlay asking for a pilot to the pilot taking work, when the pools file does not
    say (`startup`): ExPERT's estimate adds it to an instance sent to a reliable pool, whose pilots the tail asks
    for only once a task is due there, until the tail has measured its own (docs/expert.md)."""


def _runs_jobs_as_someone(name: str, table: Mapping[str, Any]) -> list[tuple[str, str]]:
    """An ec2 pool's pilots start as root: it must say whom jobs run as; its `install` is a pip requirement."""
    out = []
    install = table.get("install")
    if install is not None and not (isinstance(install, str) and install.strip()):
        out.append((f"pool '{name}': install must be what pip installs, as text, not {install!r}",
                    'e.g. install = "gridbot==0.1.0" or "gridbot @ https://example.org/gridbot.whl"; leave it out '
                    "for the server's own version"))
    if "run_as" in table or "allow_root" in table:
        return out
    return [*out, (f"pool '{name}' (kind ec2) starts its pilots as root, which then refuse to run jobs",
                   'add run_as = "USER" (a user of the image, e.g. "ec2-user") or allow_root = true')]


def _batch(queues: str, walltime_optional: bool = True) -> PoolKind:
    """A batch system reached through psij-python (its executor has the kind's name), one queue a pool."""
    return PoolKind("gridbot.pools.adapters:BatchAdapter", ("partition", "account", "work_dir"),
                    (("partition", f'add partition = "NAME" ({queues})'),), startup=60.0,
                    walltime_optional=walltime_optional)


KINDS: dict[str, PoolKind] = {
    "local": PoolKind("gridbot.pools.adapters:LocalAdapter", queue=False, startup=5.0),
    "slurm": _batch("see `sinfo`"),
    "pbs": _batch("see `qstat -Q`"),
    "lsf": _batch("see `bqueues`", walltime_optional=False),
    "cobalt": _batch("the Cobalt queue", walltime_optional=False),
    "flux": _batch("the Flux queue", walltime_optional=False),
    "ec2": PoolKind("gridbot.pools.adapters:EC2Adapter",
                    ("region", "instance_type", "image", "spot", "subnet", "security_group", "key_name",
                     "endpoint_url", "install"),
                    tuple((key, f'add {key} = "..."') for key in ("region", "instance_type", "image")),
                    check=_runs_jobs_as_someone, exposes_pilot_env=True, startup=120.0),
    "static": PoolKind("gridbot.pools.adapters:StaticAdapter", queue=False, pilots=False),
    "volunteer": PoolKind("gridbot.pools.adapters:StaticAdapter", VOLUNTEER_KEYS,
                          (("port", "add port = 8471 (where the BOINC clients connect)"),),
                          queue=False, pilots=False, check=volunteer_problems),
}
"""Every kind of pool, by the name a pools file gives as `kind`."""


class PoolMonitor(msgspec.Struct, frozen=True):
    """What a pool's own monitoring says of it (Slurm's squeue and sinfo for a partition, a simulated MDS): the
    reading a resource selector would trust, taken at `observed_at`.

    Work started after `observed_at - lag` is not in it yet (the RENCI report's hysteresis: MDS collected every
    minute and showed a job two to three minutes after it was placed); a live query has lag 0 but is as old
    as the poll that took it."""

    free_cpus: int
    """CPUs nobody holds, as far as the monitor saw (ours included: a pilot holds its CPUs)."""
    total_cpus: int
    pending_jobs: int = 0
    """Batch jobs waiting in the pool's queue (ours and others')."""
    pending_cpus: int = 0
    observed_at: float = 0.0
    lag: float = 0.0
    source: str = ""
    """Where it comes from ("squeue/scontrol, partition fast", "simulated monitor, lag 150 s")."""


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
    """Money per hour an instance holds one of the pool's slots (its reported wall time), as Nimrod-G prices CPU
    time; 0: free (own machines, volunteers)."""
    price_per_pilot_hour: float = 0.0
    """Money per hour a pilot lives, billed per started `charging_period` (a cloud instance bills by the started
    hour), from its worker's first call to its last; shared by the bags it served in proportion to use."""
    charging_period: float = 3600.0
    reliability: str = "reliable"
    level: int = 0
    idle_timeout: float = 120.0
    """A pilot's worker exits after this long with no work, and at once when the bags refuse its host
    (`--leave-when-refused`; GridBot: pilots never idle); 0: never."""
    min_cpu: float = 0.05
    """A pilot leaves when its job uses less than this fraction of a CPU over cpu_window (0: never)."""
    cpu_window: float = 600.0
    monitor_interval: float = 30.0
    """Seconds between two readings of the pool's own monitoring, where it has one (Slurm: squeue, sinfo), for
    the placements `stateful` and `naive`; 0: never read it."""
    run_as: str = ""
    """The user a pilot's worker runs jobs as when it starts as root ("": its own user)."""
    allow_root: bool = False
    """Let a pilot's worker started as root run jobs as root (else it refuses to start without run_as)."""
    jobs_per_pilot: int = 0
    """Jobs a pilot runs before it leaves (0: as many as come): 1 makes each pilot one job's own batch job."""
    trusted: bool = False
    """Its hosts' results count as a quorum alone (bags with `quorum`: your own cluster's, not volunteers')."""
    startup: float | None = None
    """Seconds from the overlay asking for a pilot to its taking work (None: the kind's `PoolKind.startup`: a
    local worker's 5 s are the overlay's next step, up to 3 s, and the worker's start; a batch queue's 60 s and
    an EC2 instance's 120 s are typical, not measured)."""
    queue_patience: float = 0.0
    """Seconds a pilot may wait in the pool's queue and still count as capacity for the bags' demand (0: it
    always counts). One queued longer (a job held, a partition down, a priority that never comes) keeps its place
    and counts against max_queued, but the overlay sends new pilots for the demand it was absorbing, and cancels
    it first once capacity exceeds demand (`schedulers.overlay.plan`)."""
    attributes: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)
    options: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)
    """The kind's own settings (partition, region, instance_type, ...)."""

    def ad(self) -> dict[str, Any]:
        """The pool's ClassAd attributes, for GridPolicy."""
        return {**self.attributes, "Name": self.name, "Kind": self.kind, "Reliability": self.reliability,
                "Level": self.level, "Cpus": self.cpus, "Memory": self.memory_mb, "Walltime": self.walltime,
                "PricePerCpuHour": self.price_per_cpu_hour, "PricePerPilotHour": self.price_per_pilot_hour,
                "ChargingPeriod": self.charging_period, "MaxRunning": self.max_running, "Trusted": self.trusted,
                "Startup": self.startup_seconds}

    @property
    def startup_seconds(self) -> float:
        """`startup`, else the kind's (0 for a kind gridbot does not submit pilots to)."""
        if self.startup is not None:
            return self.startup
        kind = KINDS.get(self.kind)
        return kind.startup if kind is not None else 0.0

    @property
    def queues(self) -> bool:
        """Its pilots wait in a queue that `max_queued` limits (a simulated pool, of no kind of `KINDS`, has one)."""
        kind = KINDS.get(self.kind)
        return kind is None or kind.queue

    @property
    def submits(self) -> bool:
        """gridbot submits its pilots (`submits_pilots`)."""
        return submits_pilots(self.kind)


def submits_pilots(kind: str) -> bool:
    """Whether gridbot submits the pilots of a pool of this kind: a `static` or `volunteer` pool's hosts come by
    themselves, and so do a simulated community grid's BOINC clients; a simulated grid, cluster or cloud (of no
    kind of KINDS) is submitted to."""
    known = KINDS.get(kind)
    return known.pilots if known is not None else kind != "community"


def parse_pools(text: str, source: str) -> list[PoolSpec]:
    """Validate a pools file into PoolSpecs, or raise SpecError with every problem."""
    return parse_pools_file(text, source)[0]


def parse_pools_file(text: str, source: str) -> tuple[list[PoolSpec], list[QueueSpec]]:
    """Validate a pools file into its pools and the hierarchy's queues (docs/hierarchy.md), or raise SpecError
    with every problem."""
    pools, queues, _ = parse_server_file(text, source)
    return pools, queues


def parse_server_file(text: str, source: str) -> tuple[list[PoolSpec], list[QueueSpec], list[ValidatorSpec]]:
    """Validate a pools file into its pools, the hierarchy's queues (docs/hierarchy.md) and the quorums'
    validators (docs/volunteers.md), or raise SpecError with every problem. A file of validators only has no
    pools: the server then starts no pilots."""
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
        if key not in ("pools", "queues", "validators"):
            fail((key,), f"unknown key '{key}'", "a pools file has one table per pool, [pools.NAME], the "
                 "hierarchy's queues, [queues.NAME], and the quorums' validators, [validators.NAME]")
    validators = parse_validators(data["validators"], fail) if "validators" in data else []
    pools = data.get("pools", {})
    if not isinstance(pools, dict) or (not pools and not validators) or ("pools" in data and not pools):
        fail(("pools",), "no pools are defined", '[pools.here]\nkind = "local"')
        raise SpecError(source, problems)
    out = [p for name, table in pools.items() if (p := _pool(name, table, fail)) is not None]
    queues = parse_queues(data["queues"], list(pools), fail) if "queues" in data else []
    if problems:
        raise SpecError(source, problems)
    return out, queues, validators


def _pool(name: str, table: object, fail: Any) -> PoolSpec | None:
    path = ("pools", name)
    if not NAME_RE.match(name):  # it names worker keys, pilots' jobs, metrics' labels and `--pool`
        fail(path, f"pool name {name[:64]!r} is not allowed", "use 1-64 letters, digits, '.', '_' or '-', starting "
             "with a letter or digit")
        return None
    if not isinstance(table, dict):
        fail(path, f"pool '{name}' must be a table", f'[pools.{name}]\nkind = "local"')
        return None
    kind = table.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        hint = closest(str(kind), tuple(KINDS)) or f'write kind = "NAME", NAME one of {", ".join(KINDS)}'
        fail((*path, "kind"), f"pool '{name}' has unknown kind {kind!r}" if kind else f"pool '{name}' has no kind",
             hint)
        return None
    rules = KINDS[kind]
    allowed = COMMON_KEYS + rules.keys
    ok = True
    for key in table:
        if key not in allowed:
            fail((*path, key), f"unknown key '{key}' in pool '{name}' (kind {kind})", _key_hint(key, kind, allowed))
            ok = False
    values: dict[str, Any] = {}
    for key, low, high in (("max_running", 0, 10**7), ("max_queued", 0, 10**7), ("cpus", 1, MAX_PILOT_CPUS),
                           ("memory_mb", 0, 10**12), ("level", 0, 10**6), ("jobs_per_pilot", 0, 10**12)):
        if key in table:
            v = table[key]
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
                fail((*path, key), f"'{key}' of pool '{name}' must be a whole number from {low} to {high:,}, "
                     f"not {v!r}")
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
    if "startup" in table:  # 0 is allowed: hosts that are there already
        try:
            values["startup"] = parse_duration(table["startup"], zero=True)
        except ValueError as e:
            fail((*path, "startup"), f"'startup' of pool '{name}': {e}", 'write startup = "90s" (0: no wait)')
            ok = False
    for key, zero in DURATIONS.items():
        if key in table:
            try:
                values[key] = parse_duration(table[key], zero=bool(zero))
            except ValueError as e:
                fail((*path, key), f"'{key}' of pool '{name}': {e}", f'write {key} = "10m"{zero}')
                ok = False
    if values.get("cpu_window", CPU_WINDOW_MIN) < CPU_WINDOW_MIN:
        fail((*path, "cpu_window"), f"'cpu_window' of pool '{name}' must be at least {CPU_WINDOW_MIN:g} s, not "
             f"{values['cpu_window']:g}: a pilot judges its job's CPU over whole seconds", 'write cpu_window = "10m"')
        ok = False
    if values.get("walltime") == 0.0 and not rules.walltime_optional:
        fail((*path, "walltime"), f"'walltime' of pool '{name}' cannot be 0 for kind '{kind}': its batch system is "
             "asked for a limit", 'write walltime = "4h"')
        ok = False
    for key in ("price_per_cpu_hour", "price_per_pilot_hour"):
        if key in table:
            v = table[key]
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf"):
                fail((*path, key), f"'{key}' of pool '{name}' must be a finite number >= 0, not {v!r}")
                ok = False
            else:
                values[key] = float(v)
    if "run_as" in table:
        v = table["run_as"]
        if not isinstance(v, str) or not v or not v.replace("-", "").replace("_", "").replace(".", "").isalnum():
            fail((*path, "run_as"), f"'run_as' of pool '{name}' must be a user name, not {v!r}",
                 'write run_as = "gridbot" (a user on the pool\'s hosts)')
            ok = False
        else:
            values["run_as"] = v
    for key in ("allow_root", "trusted"):
        if key in table:
            if not isinstance(table[key], bool):
                fail((*path, key), f"'{key}' of pool '{name}' must be true or false")
                ok = False
            else:
                values[key] = table[key]
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
    reserved = {k.lower(): v for k, v in RESERVED_ATTRIBUTES.items()}
    for key, value in attributes.items():
        if key.lower() in reserved:  # (ClassAd names ignore case: `kind` is `Kind`)
            fail((*path, "attributes", key), f"attribute '{key}' of pool '{name}' is the pool's own ad attribute",
                 f"set it with the pool's key ({reserved[key.lower()]}), not in [attributes]")
            ok = False
        elif problem := classad_int_problem(key, value):
            fail((*path, "attributes", key), f"attribute of pool '{name}': {problem}")
            ok = False
    for key, hint in rules.required:
        if key not in table:
            fail(path, f"pool '{name}' (kind {kind}) has no {key}", hint)
            ok = False
    for message, hint in rules.check(name, table) if rules.check is not None else ():
        fail(path, message, hint)
        ok = False
    if not ok:
        return None
    options = {k: table[k] for k in rules.keys if k in table}
    if kind == "volunteer":  # stock BOINC clients: Host.Reliable is false, and the pool says so
        values.setdefault("reliability", "volunteer")
    return PoolSpec(name=name, kind=kind, attributes=dict(attributes), options=options, **values)


def _key_hint(key: str, kind: str, allowed: tuple[str, ...]) -> str:
    """What to write instead of an unknown key: a near one, the kinds that take it, or the kind's keys."""
    if near := closest(key, allowed):
        return near
    if others := [k for k, rules in KINDS.items() if key in rules.keys]:
        kinds = f"kind{'s' if len(others) > 1 else ''} {', '.join(others)}"
        return f"'{key}' is for pools of {kinds}: remove it, or change this pool's kind"
    return f"keys for {kind}: {', '.join(allowed)}"
