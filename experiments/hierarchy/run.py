"""Reproduce the grid execution hierarchy's Table 1 and Section 6 (Silberstein, Geiger, Schuster, Livny,
HPDC'06) in gridbot's simulator, with placement "hierarchy" (issue 17), and write their tables.

    .venv/bin/python experiments/hierarchy/run.py                 # both, as in README.md (about 12 minutes)
    .venv/bin/python experiments/hierarchy/run.py table1 --seeds 2
    .venv/bin/python experiments/hierarchy/run.py section6 --days 14 --ablation-days 0

Table 1 (`table1.toml`): a long bag (3,000 jobs of about an hour) and, a minute later, a short one (one job
of 30 s), under FCFS, FCFS+H, MQ and MQ+H; run.py builds each arm from the file (which is MQ+H).

Section 6 (`table2.toml`: the paper's Table 2 queues on grids at a tenth of their size): a stream of bags
whose arrivals are the user bursts of the CESNET MetaCentrum log `wagap-2013` (Klusacek et al., in the
Parallel Workloads Archive's format; shipped in src/gridbot/sim/traces/, provenance in the README there)
and whose sizes follow a mix like the paper's Figure 7 (see `stream`), then the same stream with each
migration policy switched off in turn. Simulations run one at a time.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from gridbot.model.hierarchy import POLICIES, QueueSpec
from gridbot.model.spec import StrategyChoice
from gridbot.sim import traces
from gridbot.sim.distributions import constant
from gridbot.sim.engine import simulate
from gridbot.sim.metrics import BagResult, Results
from gridbot.sim.scenario import BagModel, PoolModel, Scenario, parse_scenario

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ROOT = HERE.parents[1]
SWF_LOG = "wagap-2013.swf.gz"
"""CESNET MetaCentrum, 1 Jan - 31 Mar 2013 (Alea's data set), shipped with gridbot's simulator (provenance and
citation in src/gridbot/sim/traces/README.md)."""


def load(name: str) -> Scenario:
    path = HERE / name
    return parse_scenario(path.read_text(), str(path))


def with_strategy(sc: Scenario, placement: str, options: dict[str, dict[str, float]] | None = None) -> Scenario:
    """Every bag placed by `placement`, with per-bag strategy options (by bag name)."""
    options = options or {}
    return dataclasses.replace(sc, bags=[dataclasses.replace(
        b, strategy=StrategyChoice(placement=placement, options=dict(options.get(b.name, {})))) for b in sc.bags])


def _fmt(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


# =============================================================================================================
# Table 1
# =============================================================================================================

LONG_WORK = 3000 * 3600.0
"""The long bag's work in CPU-seconds of a speed-1 CPU: 3,000 jobs of 55-65 min."""
LONG_BOUND = 2 * LONG_WORK
"""What the long bag's owner (the paper: its complexity estimator) gives as `complexity`: an upper bound,
twice the work (the paper's bounds "might be much larger than the actual value", L155)."""
PAPER_T1 = {"FCFS": ("6.2 h", "4.7 h"), "FCFS+H": ("6.4 h", "4.2 h"), "MQ": ("6.1 h", "3.5 min"),
            "MQ+H": ("6.3 h", "44 s")}


def _flat_mq(sc: Scenario) -> Scenario:
    """Flat MQ: the multilevel feedback queue over one flat grid. Both queues hold every pool (all the
    resources, as one big pool), each bag may use all of them, and the only policy is the plain MQ's: a bag
    past its queue's time limit moves down (overdue). Q1's limits are the paper's (Tq 6 min, Te 3 min)."""
    every = tuple(p.name for p in sc.pools)
    n = sum(p.max_size for p in sc.pools)
    queues = [QueueSpec("q1", 1, every, 360.0, 180.0, n, 1.0, policies=frozenset({"overdue"}), at_lowest="run"),
              QueueSpec("q2", 2, every, 172800.0, 172800.0, n, 1.0, policies=frozenset({"overdue"}), at_lowest="run")]
    return dataclasses.replace(sc, queues=queues)


def _no_levels(sc: Scenario) -> Scenario:
    pools = [dataclasses.replace(p, spec=msgspec.structs.replace(p.spec, level=0)) for p in sc.pools]
    return dataclasses.replace(sc, queues=[], pools=pools)


@dataclass(frozen=True)
class Arm:
    name: str
    column: str
    """The paper's column it stands for."""
    complexity: str
    """"given" (the owner's upper bound: the paper's estimator) or "measured" (none: the bag's own run times)."""
    build: Callable[[Scenario, dict[str, dict[str, float]]], Scenario]
    """The arm's scenario from table1.toml's and the long bag's `complexity` option."""
    note: str


ARMS_T1 = [
    Arm("FCFS", "FCFS", "-", lambda sc, _: with_strategy(_no_levels(sc), "gridbot"),
        "one flat grid (the server and the big pool, no levels); placement gridbot: bags by Rank then age"),
    Arm("FCFS+H", "FCFS+H", "-", lambda sc, _: with_strategy(dataclasses.replace(sc, queues=[]), "gridbot"),
        "the pools as a hierarchy (`level` 1 and 2: the overlay fills level 1 first), served FCFS by placement "
        "gridbot: nothing keeps the long bag off level 1"),
    Arm("MQ", "MQ", "measured", lambda sc, _: with_strategy(_flat_mq(sc), "hierarchy"),
        "queues q1 (Tq 6 min, Te 3 min) and q2 over the same flat grid, overdue only (the plain MQ)"),
    Arm("MQ, complexity given", "MQ", "given", lambda sc, given: with_strategy(_flat_mq(sc), "hierarchy", given),
        "the same, the long bag's complexity given: it enters q2 at once"),
    Arm("MQ+H, no estimate", "MQ+H", "measured", lambda sc, _: with_strategy(sc, "hierarchy"),
        "table1.toml: q1 = the server, q2 = the big pool, all policies; the long bag's complexity unknown "
        "(measured once 3 of its jobs end)"),
    Arm("MQ+H", "MQ+H", "given", lambda sc, given: with_strategy(sc, "hierarchy", given),
        "the same with the long bag's complexity given, as the paper's estimator gives it at Q1"),
]


def table1_scenario(scale: float = 1.0, short_at: float | None = None) -> Scenario:
    """table1.toml with the big pool, its queue's N and the long bag scaled by `scale` (the server keeps its
    two CPUs and the short bag its one job), so that the long bag keeps its six hours."""
    sc = load("table1.toml")
    if scale != 1.0:
        def pool(p: PoolModel) -> PoolModel:
            if p.name == "server":
                return p
            size = [dataclasses.replace(s, size=max(1, round(s.size * scale))) for s in p.size]
            top = max(s.size for s in size)
            return dataclasses.replace(p, size=size, hosts=top,
                                       spec=msgspec.structs.replace(p.spec, max_running=top, max_queued=top))
        sc = dataclasses.replace(
            sc, pools=[pool(p) for p in sc.pools],
            queues=[msgspec.structs.replace(q, max_cpus=max(1, round(q.max_cpus * scale))) if q.level > 1 else q
                    for q in sc.queues],
            bags=[dataclasses.replace(b, jobs=max(1, round(b.jobs * scale))) if b.name == "long" else b
                  for b in sc.bags])
    if short_at is not None:
        sc = dataclasses.replace(sc, bags=[dataclasses.replace(b, arrival=short_at) if b.name == "short" else b
                                           for b in sc.bags])
    return sc


def table1(seeds: Sequence[int] = (1, 2, 3), scale: float = 1.0, arms: Sequence[Arm] = tuple(ARMS_T1),
           short_at: float | None = None, log: Callable[[str], None] = print) -> dict[str, list[Results]]:
    base = table1_scenario(scale, short_at)
    given = {"long": {"complexity": LONG_BOUND * scale}}
    out: dict[str, list[Results]] = {}
    for arm in arms:
        sc = arm.build(base, given)
        for seed in seeds:
            t = time.time()
            r = simulate(sc, seed)
            out.setdefault(arm.name, []).append(r)
            log(f"  table 1 {arm.name} seed {seed}: long {_fmt(r.bag('long').makespan)}, short "
                f"{_fmt(r.bag('short').makespan)} ({time.time() - t:.0f} s)")
    return out


def _stat(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    if len(known) == 1:
        return _fmt(known[0])
    return f"{_fmt(statistics.fmean(known))} ({_fmt(min(known))} - {_fmt(max(known))})"


def _where(r: Results, name: str) -> str:
    b = r.bag(name)
    return ", ".join(f"{p} {n}" for p, n in b.jobs_per_pool.items()) or "-"


def table1_markdown(runs: dict[str, list[Results]], late: dict[str, list[Results]] | None = None) -> str:
    seeds = len(next(iter(runs.values())))
    head = ("| | " + " | ".join(PAPER_T1) + " |\n|---|" + "---|" * len(PAPER_T1) + "\n"
            + "| long bag, paper | " + " | ".join(v[0] for v in PAPER_T1.values()) + " |\n"
            + "| short bag, paper | " + " | ".join(v[1] for v in PAPER_T1.values()) + " |\n")
    main = {"FCFS": "FCFS", "FCFS+H": "FCFS+H", "MQ": "MQ", "MQ+H": "MQ+H"}
    head += ("| long bag, here | " + " | ".join(_stat([r.bag("long").makespan for r in runs[a]]) for a in main)
             + " |\n| short bag, here | " + " | ".join(_stat([r.bag("short").makespan for r in runs[a]])
                                                       for a in main) + " |\n")
    rows = ["| arm | paper's column | long bag's complexity | long bag | short bag | short bag ran on | setup |",
            "|---|---|---|---|---|---|---|"]
    arms = {a.name: a for a in ARMS_T1}
    for name, rs in runs.items():
        a = arms[name]
        rows.append(f"| {name} | {a.column} | {a.complexity} | {_stat([r.bag('long').makespan for r in rs])} | "
                    f"{_stat([r.bag('short').makespan for r in rs])} | {_where(rs[0], 'short')} | {a.note} |")
    text = (f"# Table 1: a long bag and a short one, FCFS vs MQ, flat vs hierarchy\n\n"
            f"Mean over {seeds} seeds (range in brackets). The short bag arrives 1 min after the long one. "
            f"Main columns: MQ without the long bag's complexity (the plain MQ needs none), MQ+H with it (the "
            f"paper's hierarchy estimates it at Q1 first).\n\n{head}\nEvery arm:\n\n" + "\n".join(rows) + "\n")
    if late:
        lines = ["| arm | long bag | short bag | short bag ran on |", "|---|---|---|---|"]
        for name, rs in late.items():
            lines.append(f"| {name} | {_stat([r.bag('long').makespan for r in rs])} | "
                         f"{_stat([r.bag('short').makespan for r in rs])} | {_where(rs[0], 'short')} |")
        text += ("\nThe short bag arriving 10 min after the long one, when the long bag holds every CPU "
                 f"({len(next(iter(late.values())))} seed(s)):\n\n" + "\n".join(lines) + "\n")
    return text


# =============================================================================================================
# Section 6: a stream of bags on the Table 2 queues
# =============================================================================================================

SCALE = 0.1
"""table2.toml's grids are a tenth of the paper's (Q2 N = 10, Q3 and Q4 N = 50, the pools alike); a bag's
work at levels 2 and 3 is scaled alike (its CPUs, not its duration)."""
N2, N3 = 55 * SCALE, 141 * SCALE
"""CPUs a bag gets at levels 2 and 3 (Table 3: 55 in Q2, 141 in Q4 on average), at our scale."""
P2, P3 = 0.948, 0.795
JOB2, JOB3 = 600.0, 900.0
"""Job lengths (speed-1 CPU-seconds) of level-2 and level-3 bags: Table 3's 9.4 and 15.3 min."""
SHARES = (0.60, 0.28, 0.12)
"""Figure 7 (L240): about 60% take a few minutes or less, 28% under three hours, the rest longer."""
ALPHA, D_MAX = 1.0, 3000 * 3600.0
"""The long bags' expected duration: Pareto of shape 1 from 3 h, cut at 3,000 h (top 1% > half the load)."""
BURST_GAP = 600.0
"""A user's log jobs at most 10 min apart are one bag (a burst of jobs: one bag of tasks)."""
KEEP = 1 / 3
"""Share of the log's bursts taken (each by a seeded draw): 35 bursts a day in January 2013, so about 12 bags
a day (the paper: 2,300 tasks in seven months, 11 a day), with the log's bursts of bags kept in part."""
LOOSE = (1.0, 3.0)
"""The complexity estimator's upper bound: the bag's work times a factor drawn log-uniformly from 1 to 3."""
STREAM_SEED = 2006
PAPER_CPU = {1: 0.3, 2: 17.7, 3: 82.0}
POOL_LEVEL = {"server": 1, "technion": 2, "madison3": 2, "madison4": 3}
SHORT_CPU = 180.0
"""The paper's "very short tasks which require less than three minutes of CPU time" (L287)."""


@dataclass(frozen=True)
class Meta:
    """What the generator made of one bag."""

    name: str
    kind: str
    """"short" (60%), "medium" (28%) or "long" (12%)."""
    expected: float
    """Expected duration at its level (Figure 7's axis), seconds."""
    work: float
    """CPU-seconds of a speed-1 CPU."""
    runtime: float
    jobs: int
    bound: float
    """The complexity given to gridbot: an upper bound on `work`."""


def stream(days: float = 31.0, start_day: float = 0.0, seed: int = STREAM_SEED,
           keep: float = KEEP) -> tuple[list[BagModel], dict[str, Meta]]:
    """The bags: arrivals from the log's user bursts in [start_day, start_day + days); sizes from the mix.

    Each burst's CPU demand in the log (sum of run time x processors) ranks it among the window's bursts, and
    its rank (a quantile) is mapped onto the mix, so bigger bursts in the log become bigger bags while the
    mix is exactly the one below (a quantile mapping: the log gives the arrival process and which bags are
    big, the mix gives how big):
    - the lowest 60%: short, one job of 10 s to 3 min (log-uniform), run directly (Q1's tasks);
    - the next 28%: medium, an expected duration D of 3 min to 3 h at level 2 (log-uniform), N2 CPUs for D:
      jobs of min(D, 9.4 min), as many as N2 x D / job;
    - the top 12%: long, D from 3 h on, Pareto of shape ALPHA (heavy: the top 1% of bags carry over half of
      the work), cut at D_MAX, N3 CPUs for D: jobs of 15.3 min.
    """
    recs = traces.swf_records(str(SWF_LOG))
    t0 = recs[0].submit
    lo, hi = t0 + start_day * 86400, t0 + (start_day + days) * 86400
    rng = random.Random(seed)
    bursts = [g for g in traces.swf_bursts([r for r in recs if lo <= r.submit < hi], BURST_GAP)
              if rng.random() < keep]
    demand = [sum(r.run * r.procs for r in g) for g in bursts]
    order = sorted(range(len(bursts)), key=lambda i: (demand[i], i))
    rank = {i: k for k, i in enumerate(order)}
    n = len(bursts)
    models, meta = [], {}
    first = bursts[0][0].submit if bursts else lo
    cut1, cut2 = SHARES[0], SHARES[0] + SHARES[1]
    for i, g in enumerate(bursts):
        q = (rank[i] + 0.5) / n
        if q < cut1:
            kind, u = "short", q / cut1
            d = 10.0 * 18.0 ** u
            runtime, jobs = d, 1
        elif q < cut2:
            kind, u = "medium", (q - cut1) / (cut2 - cut1)
            d = 180.0 * 60.0 ** u
            runtime = min(d, JOB2)
            jobs = max(2, round(N2 * d / runtime))
        else:
            kind, u = "long", (q - cut2) / (1 - cut2)
            d = min(3 * 3600.0 * (1 - u) ** (-1 / ALPHA), D_MAX)
            runtime = JOB3
            jobs = max(2, round(N3 * d / runtime))
        work = runtime * jobs
        bound = work * math.exp(rng.uniform(math.log(LOOSE[0]), math.log(LOOSE[1])))
        name = f"{kind[0]}{i:04d}"
        meta[name] = Meta(name, kind, d, work, runtime, jobs, bound)
        models.append(BagModel(name, jobs, constant(runtime), g[0].submit - first, 86400.0, 20, {},
                               strategy=StrategyChoice(placement="hierarchy", options={"complexity": bound})))
    return models, meta


def stream_scenario(days: float, start_day: float = 0.0, given: bool = True, off: str | None = None,
                    drain_days: float = 6.0, keep: float = KEEP,
                    q4_potential: bool = False) -> tuple[Scenario, dict[str, Meta]]:
    """table2.toml with the stream; `given`: each bag's complexity bound is given (else measured); `off`: a
    migration policy switched off in every queue; `q4_potential`: both potential overdue policies on in Q4
    too; the run stops `drain_days` after the last arrival day."""
    sc = load("table2.toml")
    bags, meta = stream(days, start_day, keep=keep)
    if not given:
        bags = [dataclasses.replace(b, strategy=StrategyChoice(placement="hierarchy")) for b in bags]
    queues = sc.queues
    if off is not None:
        queues = [msgspec.structs.replace(q, policies=q.policies - {off}) for q in queues]
    if q4_potential:
        potential = {"task_potential_overdue", "queue_potential_overdue"}
        queues = [msgspec.structs.replace(q, policies=q.policies | potential) if q.name == "q4" else q
                  for q in queues]
    return dataclasses.replace(sc, bags=bags, queues=queues, horizon=(days + drain_days) * 86400), meta


Q1_CE = 360.0
"""Q1's C_e: Te 180 s x N 2 x P 1."""
QUEUE_OF_POOL = {"server": "q1", "technion": "q2", "madison3": "q3", "madison4": "q4"}


@dataclass
class BagOutcome:
    meta: Meta
    result: BagResult
    level: int
    """Where it finished: the lowest level (largest number) any of its results came from, else the level the
    hierarchy last reported (0: none, a bag rejected before the first sample)."""
    queue: str
    host_s: dict[int, float]
    """Host-seconds of its kept results, per level."""
    migrations: list[Any]


def outcomes(sc: Scenario, r: Results, meta: dict[str, Meta]) -> list[BagOutcome]:
    speed = {p.name: p.speed.mean for p in sc.pools}
    out = []
    for b in r.bags:
        m = meta[b.name]
        host: dict[int, float] = {}
        for pool, n in b.jobs_per_pool.items():
            host[POOL_LEVEL[pool]] = host.get(POOL_LEVEL[pool], 0.0) + n * m.runtime / speed[pool]
        rep = b.level or {}
        level = max(host) if host else int(rep.get("level") or 0)
        pools = [p for p in b.jobs_per_pool if POOL_LEVEL[p] == level]
        queue = QUEUE_OF_POOL[pools[0]] if pools else str(rep.get("queue") or "-")
        out.append(BagOutcome(m, b, level, queue, host, list(rep.get("migrations") or [])))
    return out


def _busy_at(r: Results, t: float, pools: Sequence[str]) -> float:
    i = max(0, bisect.bisect_right(r.times, t) - 1)
    return float(sum(r.busy[p][i] for p in pools)) if r.times else 0.0


def _mean(xs: Sequence[float | None]) -> float | None:
    known = [x for x in xs if x is not None]
    return statistics.fmean(known) if known else None


@dataclass
class Summary:
    name: str
    bags: int
    completed: int
    terminated: int
    """Ended by the hierarchy after running (Q4's limits)."""
    rejected: int
    """Ended without a result (a bound over Q4's C_e)."""
    active: int
    per_level_bags: dict[int, int]
    """Completed bags per level where they finished."""
    per_level_cpu: dict[int, float]
    """Share (%) of the kept host time of completed bags, per level (the paper's Figure 4 counts completed
    tasks only)."""
    per_level_cpu_all: dict[int, float]
    """The same over every bag's kept results."""
    ended_cpu_pct: float
    """Share (%) of all host time spent on bags that did not complete."""
    host_hours: float
    wasted_pct: float
    """Host time not in a kept result (preempted on migration, evicted, lost), % of all."""
    short_q1: float | None
    """Mean turnaround of completed bags of under 3 CPU-min that ran at Q1 (the paper's 72 s)."""
    short_q1_n: int
    short_q1_idle: float | None
    short_q1_busy: float | None
    """short_q1 for bags arriving while the lower levels ran fewer / more jobs than their median."""
    short_all: float | None
    """Mean turnaround of all the generator's short bags (completed)."""
    short_below: int
    """Short bags (the generator's) that finished below level 1 ..."""
    short_below_bound: int
    """... of which admitted below it by their bound (over Q1's C_e) ..."""
    shorts: int
    medium: float | None
    long: float | None
    per_queue: dict[str, tuple[int, float]]
    """Completed bags and their mean turnaround, per final queue (Figure 5)."""
    medium_queues: dict[str, int]
    """Completed medium bags per final queue."""
    migrations: dict[str, int]
    seconds: float


def summarize(name: str, sc: Scenario, r: Results, meta: dict[str, Meta], wall: float) -> Summary:
    outs = outcomes(sc, r, meta)
    done = [o for o in outs if o.result.state == "completed"]
    ended = [o for o in outs if o.result.state not in ("completed", "active")]
    per_level_bags: dict[int, int] = {}
    cpu = dict.fromkeys((1, 2, 3), 0.0)
    cpu_all = dict.fromkeys((1, 2, 3), 0.0)
    for o in outs:
        for lv, s in o.host_s.items():
            cpu_all[lv] += s
            if o in done:
                cpu[lv] += s
    for o in done:
        per_level_bags[o.level] = per_level_bags.get(o.level, 0) + 1
    used = sum(o.result.cpu_hours for o in outs)
    kept = sum(cpu_all.values()) / 3600
    shorts = [o for o in done if o.meta.work < SHORT_CPU and o.queue == "q1"]
    loads = [_busy_at(r, o.result.arrival, ("technion", "madison3", "madison4")) for o in shorts]
    med = statistics.median(loads) if loads else 0.0
    gen_short = [o for o in outs if o.meta.kind == "short"]
    below = [o for o in gen_short if o.level > 1]
    per_queue: dict[str, tuple[int, float]] = {}
    for qn in ("q1", "q2", "q3", "q4"):
        xs = [o.result.makespan for o in done if o.queue == qn and o.result.makespan is not None]
        if xs:
            per_queue[qn] = (len(xs), statistics.fmean(xs))
    migrations: dict[str, int] = {}
    for o in outs:
        for m in o.migrations:
            policy = str(m[3]).split(":")[0].split(" at the lowest")[0]
            migrations[policy] = migrations.get(policy, 0) + 1
    return Summary(
        name, len(outs), len(done), sum(1 for o in ended if o.result.done), sum(1 for o in ended if not o.result.done),
        sum(1 for o in outs if o.result.state == "active"), dict(sorted(per_level_bags.items())),
        {lv: 100.0 * s / (sum(cpu.values()) or 1.0) for lv, s in cpu.items()},
        {lv: 100.0 * s / (sum(cpu_all.values()) or 1.0) for lv, s in cpu_all.items()},
        100.0 * sum(o.result.cpu_hours for o in outs if o.result.state != "completed") / (used or 1.0),
        used, 100.0 * max(0.0, used - kept) / used if used else 0.0,
        _mean([o.result.makespan for o in shorts]), len(shorts),
        _mean([o.result.makespan for o, x in zip(shorts, loads, strict=True) if x <= med]),
        _mean([o.result.makespan for o, x in zip(shorts, loads, strict=True) if x > med]),
        _mean([o.result.makespan for o in gen_short if o.result.state == "completed"]),
        len(below), sum(1 for o in below if o.meta.bound > Q1_CE), len(gen_short),
        _mean([o.result.makespan for o in done if o.meta.kind == "medium"]),
        _mean([o.result.makespan for o in done if o.meta.kind == "long"]),
        per_queue, {q: sum(1 for o in done if o.meta.kind == "medium" and o.queue == q) for q in ("q2", "q3", "q4")},
        dict(sorted(migrations.items())), wall)


VARIANTS: dict[str, dict[str, Any]] = {
    "baseline": {"given": True, "off": None}, "no estimate": {"given": False, "off": None},
    **{f"{p} off": {"given": True, "off": p} for p in POLICIES},
    "potential overdue on in Q4": {"given": True, "off": None, "q4_potential": True}}
"""The Table 2 configuration with every bag's complexity bound given (the paper's estimator), the same without
it (measured from the bag's run times), each migration policy switched off in every queue in turn, and the
potential overdue policies switched on in Q4 (the paper had them off there, L291)."""
BURST_OFF = {"baseline": frozenset(), "overload off": frozenset({"overload"}),
             "queue_potential_overdue off": frozenset({"queue_potential_overdue"}),
             "both off": frozenset({"overload", "queue_potential_overdue"})}
"""The burst (`burst_scenario`) with overload, queue potential overdue or both switched off in every queue."""


def table2(days: float = 31.0, start_day: float = 0.0, variants: Sequence[str] = tuple(VARIANTS), seed: int = 1,
           drain_days: float = 6.0, keep: float = KEEP, log: Callable[[str], None] = print
           ) -> tuple[dict[str, Summary], dict[str, Meta]]:
    out: dict[str, Summary] = {}
    meta: dict[str, Meta] = {}
    for v in variants:
        sc, meta = stream_scenario(days, start_day, drain_days=drain_days, keep=keep, **VARIANTS[v])
        t = time.time()
        r = simulate(sc, seed)
        s = out[v] = summarize(v, sc, r, meta, time.time() - t)
        log(f"  section 6, {days:g} days, {v}: {s.completed}/{s.bags} completed, CPU per level "
            + " / ".join(f"{x:.1f}%" for x in s.per_level_cpu.values())
            + f", short bags at Q1 {_fmt(s.short_q1)} ({s.seconds:.0f} s)")
    return out, meta


def burst_scenario(off: frozenset[str]) -> tuple[Scenario, dict[str, Meta]]:
    """A burst of bags, as the paper's users sent them (L302): 12 short bags (one job of 60-170 s, bounds up to
    1.5 times the work) 5 s apart, then 10 medium ones (40 jobs of 9.4 min, exact bounds: 22,560 CPU-s each,
    which together exceed Q2's C_q of 182,016) 10 s apart, on the Table 2 queues with `off` switched off."""
    sc = load("table2.toml")
    rng = random.Random(STREAM_SEED)
    bags, meta = [], {}
    for i in range(12):
        work = rng.uniform(60.0, 170.0)
        meta[f"s{i:02d}"] = Meta(f"s{i:02d}", "short", work, work, work, 1, work * rng.uniform(1.0, 1.5))
    for i in range(10):
        meta[f"m{i:02d}"] = Meta(f"m{i:02d}", "medium", 40 * 564.0 / N2, 40 * 564.0, 564.0, 40, 40 * 564.0)
    for i, m in enumerate(meta.values()):
        at = 5.0 * i if m.kind == "short" else 60.0 + 10.0 * (i - 12)
        bags.append(BagModel(m.name, m.jobs, constant(m.runtime), at, 86400.0, 20, {},
                             strategy=StrategyChoice(placement="hierarchy", options={"complexity": m.bound})))
    queues = [msgspec.structs.replace(q, policies=q.policies - off) for q in sc.queues]
    # (the bags' level is sampled: every 5 s, every migration of these short-lived bags is seen)
    return dataclasses.replace(sc, bags=bags, queues=queues, horizon=86400.0, sample=5.0), meta


def bursts(seeds: Sequence[int] = (1, 2, 3), log: Callable[[str], None] = print) -> dict[str, list[Summary]]:
    out: dict[str, list[Summary]] = {}
    for name, off in BURST_OFF.items():
        sc, meta = burst_scenario(off)
        for seed in seeds:
            t = time.time()
            r = simulate(sc, seed)
            s = summarize(name, sc, r, meta, time.time() - t)
            out.setdefault(name, []).append(s)
            log(f"  burst, {name}, seed {seed}: short bags {_fmt(s.short_all)}, medium {_fmt(s.medium)}")
    return out


def bursts_markdown(runs: dict[str, list[Summary]]) -> str:
    seeds = len(next(iter(runs.values())))
    rows = [f"## A burst: overload and queue potential overdue ({seeds} seeds, mean)\n",
            "12 short bags (one job of 60-170 s) 5 s apart, then 10 medium bags (40 jobs of 9.4 min) 10 s apart "
            "(`burst_scenario`): in the stream above both fire only a few times, since at 12 bags a day the "
            "queues rarely fill.\n",
            "| variant | short bags | finished at Q1 | medium bags | mediums per final queue Q2 / Q3 / Q4 | "
            "migrations (all seeds) |", "|---|---|---|---|---|---|"]
    for name, ss in runs.items():
        mig: dict[str, int] = {}
        for s in ss:
            for k, v in s.migrations.items():
                mig[k] = mig.get(k, 0) + v
        rows.append(
            f"| {name} | {_fmt(_mean([s.short_all for s in ss]))} | "
            f"{statistics.fmean(s.short_q1_n for s in ss):.1f} of 12 | {_fmt(_mean([s.medium for s in ss]))} | "
            + " / ".join(f"{statistics.fmean(s.medium_queues.get(q, 0) for s in ss):.1f}" for q in ("q2", "q3", "q4"))
            + f" | {', '.join(f'{k} {v}' for k, v in sorted(mig.items()))} |")
    return "\n".join(rows) + "\n"


def mix_table(meta: dict[str, Meta]) -> str:
    ms = list(meta.values())
    rows = ["| kind | bags | share | expected duration at its level | jobs per bag | work (CPU-h) | share of the "
            "work |", "|---|---|---|---|---|---|---|"]
    total = sum(m.work for m in ms) or 1.0
    for kind in ("short", "medium", "long"):
        k = [m for m in ms if m.kind == kind]
        if k:
            rows.append(
                f"| {kind} | {len(k)} | {100 * len(k) / len(ms):.0f}% | {_fmt(min(m.expected for m in k))} - "
                f"{_fmt(max(m.expected for m in k))} (median {_fmt(statistics.median(m.expected for m in k))}) | "
                f"{min(m.jobs for m in k)} - {max(m.jobs for m in k)} | {sum(m.work for m in k) / 3600:,.0f} | "
                f"{100 * sum(m.work for m in k) / total:.1f}% |")
    works = sorted((m.work for m in ms), reverse=True)
    n = max(1, len(ms) // 100)
    return ("\n".join(rows) + f"\n\n{len(ms)} bags; the largest 1% ({n}) carry {100 * sum(works[:n]) / total:.0f}% "
            "of the work.")


def _lv(d: dict[int, float]) -> str:
    return " / ".join(f"{d.get(k, 0.0):.1f}" for k in (1, 2, 3)) + "%"


def findings_markdown(b: Summary, meta: dict[str, Meta], days: float) -> str:
    nb = b.per_level_bags
    upper = nb.get(1, 0) + nb.get(2, 0)
    return "\n".join([
        f"## The stream: {days:g} days of arrivals\n", mix_table(meta), "",
        "## Section 6's findings (baseline: every bag's complexity bound given, as the paper's estimator gives it)\n",
        "| finding | paper | here |", "|---|---|---|",
        f"| CPU time per level, L1 / L2 / L3, completed bags | 0.3 / 17.7 / 82% | {_lv(b.per_level_cpu)} |",
        f"| ... every bag's kept results | | {_lv(b.per_level_cpu_all)} |",
        f"| completed bags per level where they finished, L1 / L2 / L3 | \"the first two levels served significantly "
        f"more tasks than the lower level\" | {nb.get(1, 0)} / {nb.get(2, 0)} / {nb.get(3, 0)} "
        f"({100 * upper / max(1, sum(nb.values())):.0f}% at levels 1-2) |",
        f"| mean turnaround, bags under 3 CPU-min served by Q1 | 72 s | {_fmt(b.short_q1)} ({b.short_q1_n} bags) |",
        f"| ... arriving while levels 2-3 ran fewer / more jobs than their median | \"regardless of the load in the "
        f"other queues\" | {_fmt(b.short_q1_idle)} / {_fmt(b.short_q1_busy)} |",
        f"| short bags that finished below level 1 | about 11% of the tasks expected at level 1 ran at level 2 | "
        f"{b.short_below} of {b.shorts} ({100 * b.short_below / max(1, b.shorts):.0f}%): {b.short_below_bound} "
        f"admitted there by a bound over Q1's C_e, {b.short_below - b.short_below_bound} moved from Q1 |",
        f"| bags not completed | 27% of the CPU time: tasks terminated at Q4's limit (partial results) | "
        f"{b.terminated} terminated at Q4's limit, {b.rejected} rejected (bound over Q4's C_e); "
        f"{b.ended_cpu_pct:.0f}% of the CPU time |",
        "| mean turnaround per final queue, Q1 / Q2 / Q3 / Q4 (Figure 5) | shown per queue, not in the text | "
        + " / ".join(f"{_fmt(b.per_queue[q][1])} ({b.per_queue[q][0]})" if q in b.per_queue else "-"
                     for q in ("q1", "q2", "q3", "q4")) + " |",
        f"| migrations seen (the level is sampled every 10 min) | | "
        f"{', '.join(f'{k} {v}' for k, v in b.migrations.items()) or '-'} |", ""])


def ablation_markdown(sums: dict[str, Summary], days: float) -> str:
    rows = [f"## Each migration policy switched off in turn, in every queue ({days:g} days of arrivals)\n",
            "Short bags: the generator's (under 3 CPU-min); at Q1: those that finished there. Migrations seen: "
            "the simulator records a bag's level every 10 min, so the moves of bags that ended in between are "
            "missing.\n",
            "| variant | completed (terminated, rejected) | CPU L1 / L2 / L3 (completed) | bags at L1 / L2 / L3 | "
            "short bags at Q1 | all short bags | short bags below L1 | medium bags | long bags | Q4 | "
            "host hours (not kept) | migrations seen | run |", "|" + "---|" * 13]
    for name, s in sums.items():
        n = s.per_level_bags
        q4 = _fmt(s.per_queue["q4"][1]) if "q4" in s.per_queue else "-"
        rows.append(
            f"| {name} | {s.completed}/{s.bags} ({s.terminated}, {s.rejected}) | {_lv(s.per_level_cpu)} | "
            f"{n.get(1, 0)} / {n.get(2, 0)} / {n.get(3, 0)} | {_fmt(s.short_q1)} ({s.short_q1_n}) | "
            f"{_fmt(s.short_all)} | {s.short_below} | {_fmt(s.medium)} | {_fmt(s.long)} | {q4} | "
            f"{s.host_hours:,.0f} ({s.wasted_pct:.0f}%) | "
            f"{', '.join(f'{k} {v}' for k, v in s.migrations.items()) or '-'} | {s.seconds:.0f} s |")
    return "\n".join(rows) + "\n"


# =============================================================================================================


def _source_version() -> str:
    """The hierarchy's source as these runs read it (another engineer edits it: results name the version)."""
    import hashlib

    text = b"".join((ROOT / "src" / "gridbot" / p).read_bytes()
                    for p in ("schedulers/hierarchy.py", "model/hierarchy.py"))
    return hashlib.sha256(text).hexdigest()[:12]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="*", help="table1, section6 (default: both)")
    ap.add_argument("--seeds", type=int, default=3, help="Table 1's seeds (default 3)")
    ap.add_argument("--days", type=float, default=31.0, help="Section 6: days of arrivals (default 31)")
    ap.add_argument("--ablation-days", type=float, default=None,
                    help="Section 6: days of arrivals of the policy ablation (default: --days; 0: none)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.ablation_days is None:
        args.ablation_days = args.days
    what = args.what or ["table1", "section6"]
    if set(what) - {"table1", "section6"}:
        ap.error(f"unknown: {', '.join(sorted(set(what) - {'table1', 'section6'}))} (table1, section6)")
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    stamp = f"hierarchy source {_source_version()} (sha256 of src/gridbot/{{schedulers,model}}/hierarchy.py)"
    if "table1" in what:
        runs = table1(seeds=tuple(range(1, args.seeds + 1)))
        late = table1(seeds=(1,), arms=[a for a in ARMS_T1 if a.name in ("MQ", "MQ, complexity given", "MQ+H")],
                      short_at=600.0)
        (args.out / "table1.md").write_text(table1_markdown(runs, late) + f"\n{stamp}.\n")
        (args.out / "table1.json").write_text(json.dumps(
            {k: [{"seed": r.seed, **{b.name: {"makespan": b.makespan, "jobs_per_pool": b.jobs_per_pool,
                                               "level": b.level} for b in r.bags}} for r in v]
             for k, v in {**runs, **{f"{k} [short at 10 min]": v for k, v in late.items()}}.items()}, indent=1))
    if "section6" in what:
        days, ablation = args.days, args.ablation_days
        variants = tuple(VARIANTS) if ablation == days else ("baseline",)
        sums, meta = table2(days, variants=variants)
        text = ("# Section 6: a stream of bags on the Table 2 queues\n\n"
                + findings_markdown(sums["baseline"], meta, days))
        dump: dict[str, Any] = {f"{days:g} days, {k}": dataclasses.asdict(v) for k, v in sums.items()}
        if ablation and ablation != days:
            sums, _ = table2(ablation)
            dump.update({f"{ablation:g} days, {k}": dataclasses.asdict(v) for k, v in sums.items()})
        if ablation:
            text += "\n" + ablation_markdown(sums, ablation)
        burst = bursts()
        text += "\n" + bursts_markdown(burst)
        dump.update({f"burst, {k}": [dataclasses.asdict(s) for s in v] for k, v in burst.items()})
        (args.out / "section6.md").write_text(text + f"\n{stamp}.\n")
        (args.out / "section6.json").write_text(json.dumps(dump, indent=1))
    print(f"done in {time.time() - t0:.0f} s; tables in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
