"""Reproduce the emulation of Lander, Fowler, Thorpe and Ramakrishnan, "Stateful grid resource selection for
related asynchronous tasks" (RENCI TR-08-02, 2008), Section 4, in gridbot's simulator, with gridbot's placements
`naive` and `stateful` (`gridbot.schedulers.selection`) choosing, for each job as it arrives, one of the four
clusters of Table 1 by a monitor that lags two to three minutes (`clusters.toml`).

    .venv/bin/python experiments/selection/run.py                     # Figures 2 and 3, 20 seeds (about 3 min)
    .venv/bin/python experiments/selection/run.py figure2 --seeds 5 --out /tmp/selection

Figure 2: the job trace (`trace.csv`: two cron bursts of the ten ensemble members, 30 s apart) placed by naive,
stateful with the fallback `random`, stateful with `best`, and two independent stateful streams (two ways of
splitting the trace), with the total and mean time queued, the total and mean compute time and the completion
time of the last job. Figure 3: the initial latency until saturation (CPU-seconds left unused on each cluster
from the start until it first runs full), summed over the clusters, under external load of levels 0-4. Writes
`results/figure2.md`, `results/figure3.md`, a sensitivity table (`results/sensitivity.md`: the largest cluster
fastest) and every run as JSON. README.md says what reproduces, what does not, and every choice.

Runs are one at a time, in this process. Every arm runs the same seeds (seed n: the same draws of the engine);
the arms with a random component (naive's and `random`'s fallback) differ from seed to seed.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gridbot.model.spec import StrategyChoice
from gridbot.sim.distributions import constant
from gridbot.sim.engine import Simulation
from gridbot.sim.scenario import BagModel, ExternalLoad, PoolModel, Scenario, parse_scenario

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
CLUSTERS = ("canbc01", "ci-team", "mileva", "scoops")
"""Table 1, in its order: canbc01.louisiana.edu (6 CPUs), ci-team.acis.ufl.edu (4), mileva.hpc.odu.edu (16),
scoops.itsc.uah.edu (8)."""
MEMBERS = (1080.0, 1140.0, 1200.0, 1260.0, 1320.0, 1380.0, 1440.0, 1500.0, 1800.0, 2100.0)
"""Seconds each of the ten ensemble members (Alberto's wind fields) runs on a CPU of speed 1: ours, 18-35 min
(the report gives none); the last two are the longest, as in its Run 1 of two streams."""
CPUS = 2
"""CPUs of every job: ADCIRC's 8-32 do not fit the 4- and 6-CPU clusters of Table 1; 2 fit all of them."""
BURSTS = (0.0, 60.0)
"""The live grid's cron jobs at four and five minutes past the hour: each submits the ten members, 30 s apart."""
SPACING = 30.0
EXTERNAL_RUNTIME = 200.0
"""Seconds each external job of Figure 3 runs (2 CPUs): level 1's two jobs are the report's 400 s in all, level 4's
17 fill every cluster for 200 s of the 330 s selection period, 3,400 s in all (the report: 400 s to 3,400 s)."""
LEVELS: dict[int, dict[str, int]] = {
    0: {},
    1: {"canbc01": 2},
    2: {"canbc01": 1, "ci-team": 1, "mileva": 3, "scoops": 2},
    3: {"canbc01": 2, "ci-team": 1, "mileva": 6, "scoops": 3},
    4: {"canbc01": 3, "ci-team": 2, "mileva": 8, "scoops": 4},
}
"""External jobs of 2 CPUs started on each cluster at the beginning, per level: level 1 two small jobs on one
cluster (the report's words), levels 2-4 7, 12 and 17 jobs (every CPU) shared in proportion to the clusters'
sizes."""


@dataclass(frozen=True)
class Job:
    """One job of the trace: an ensemble member submitted by one cron burst."""

    name: str
    member: int
    burst: int
    arrival: float
    runtime: float


def trace(bursts: Sequence[float] = BURSTS) -> list[Job]:
    """The job trace: each burst submits the ten members, 30 s apart, in member order; jobs by arrival."""
    jobs = [Job(f"b{b}m{m}", m, b, at + SPACING * m, MEMBERS[m]) for b, at in enumerate(bursts)
            for m in range(len(MEMBERS))]
    return sorted(jobs, key=lambda j: (j.arrival, j.burst))


@dataclass(frozen=True)
class Arm:
    """One way of placing the trace: a placement, its fallback, and how the jobs are split into streams."""

    name: str
    placement: str
    fallback: str
    stream: Callable[[Job], str] | None = None
    """The stream a job belongs to (None: one stream, the report's single application coordinator)."""


def _halves(job: Job) -> str:
    return "a" if job.member < 5 else "b"


def _bursts(job: Job) -> str:
    return f"cron{job.burst}"


ARMS = {
    "naive": Arm("naive", "naive", "random"),
    "stateful, random": Arm("stateful, random", "stateful", "random"),
    "stateful, best": Arm("stateful, best", "stateful", "best"),
    "two streams, run 1": Arm("two streams, run 1", "stateful", "best", _halves),
    "two streams, run 2": Arm("two streams, run 2", "stateful", "best", _bursts),
}
"""Figure 2's rows. The streams use `best`, as the report's did. Run 1 splits the members into halves (the two
longest in one stream: the report's first split); run 2 splits by cron burst (each stream has every member once:
an even split)."""
FIGURE3_ARMS = ("naive", "stateful, random", "stateful, best")


def load(path: Path = HERE / "clusters.toml") -> Scenario:
    return parse_scenario(path.read_text(), str(path))


def scenario(base: Scenario, arm: Arm, level: int = 0, jobs: Sequence[Job] | None = None) -> Scenario:
    """The clusters with the trace placed by `arm`, under external load `level` (Figure 3)."""
    bags = []
    for j in jobs if jobs is not None else trace():
        options: dict[str, str | float | int | bool] = {"fallback": arm.fallback, "runtime": j.runtime}
        if arm.stream is not None:
            options["stream"] = arm.stream(j)
        bags.append(BagModel(j.name, 1, constant(j.runtime), j.arrival, 86400.0, 3, {},
                             strategy=StrategyChoice(placement=arm.placement, options=options), cpus=CPUS))
    return dataclasses.replace(base, bags=bags, pools=[_loaded(p, LEVELS[level].get(p.name, 0)) for p in base.pools])


def _loaded(pool: PoolModel, jobs: int) -> PoolModel:
    load = (ExternalLoad(0.0, CPUS, constant(EXTERNAL_RUNTIME), jobs),) if jobs else ()
    return dataclasses.replace(pool, external=load)


@dataclass
class Outcome:
    """What one run measured, in the report's terms."""

    arm: str
    level: int
    seed: int
    queued: list[float]
    """Per job, from its arrival to its start (its time queued)."""
    compute: list[float]
    """Per job, from its start to its end."""
    completion: float
    """When the last job ended, from the first arrival."""
    latency: dict[str, float]
    """Per cluster, CPU-seconds unused from the start until it first ran full (until the end if it never did)."""
    saturated: dict[str, float | None]
    jobs_per_cluster: dict[str, int]
    pilots: dict[str, int]
    """Batch jobs (pilots) started per cluster: fewer than its jobs where a pilot ran two in a row."""
    instances: int
    """Instances sent in all: one per job unless one was sent before its placement and moved."""
    placed_by: dict[str, int]
    """Jobs whose story holds a decision of each strategy (`placement=stateful`: the selector's own code)."""
    fallbacks: int
    """Jobs placed by the fallback, no cluster seeming to have their CPUs free (the live grid: 143 of 240)."""
    seconds: float

    @property
    def total_queued(self) -> float:
        return sum(self.queued)

    @property
    def total_latency(self) -> float:
        return sum(self.latency.values())


def run(sc: Scenario, arm: str, level: int, seed: int) -> Outcome:
    t = time.time()
    sim = Simulation(sc, seed)
    r = sim.run()
    per_cluster: dict[str, int] = dict.fromkeys(CLUSTERS, 0)
    placed_by: dict[str, int] = {}
    fallbacks = 0
    for b in r.bags:
        if b.state != "completed" or b.first_start is None or b.finished is None:
            raise RuntimeError(f"{arm}, level {level}, seed {seed}: job {b.name} is {b.state}")
        for pool, n in b.jobs_per_pool.items():
            per_cluster[pool] += n
    assert sim.memory is not None, "clusters.toml keeps the stories (store = \"memory\")"
    for job_id in range(1, len(r.bags) + 1):
        story = sim.memory.story(job_id)
        decisions = story.decisions if story is not None else []
        for who in sorted({d.strategy for d in decisions}):
            placed_by[who] = placed_by.get(who, 0) + 1
        fallbacks += any(": fallback " in d.why for d in decisions)
    return Outcome(
        arm, level, seed, [round(b.queue_time or 0.0, 3) for b in r.bags],
        [round(b.finished - b.first_start, 3) for b in r.bags if b.finished is not None and b.first_start is not None],
        round(max(b.finished or 0.0 for b in r.bags), 3), {c.name: c.initial_latency for c in r.clusters},
        {c.name: c.saturated_at for c in r.clusters}, per_cluster, {c.name: c.pilots for c in r.clusters},
        sum(b.instances for b in r.bags), placed_by, fallbacks, round(time.time() - t, 3))


def runs(base: Scenario, arms: Sequence[str], levels: Sequence[int], seeds: Sequence[int],
         log: Callable[[str], None] = print) -> dict[tuple[str, int], list[Outcome]]:
    """Every arm at every level, each over `seeds`."""
    out: dict[tuple[str, int], list[Outcome]] = {}
    for level in levels:
        for name in arms:
            sc = scenario(base, ARMS[name], level)
            got = out[(name, level)] = [run(sc, name, level, seed) for seed in seeds]
            log(f"  level {level}, {name}: queued {_mean([o.total_queued for o in got]):,.0f} s, completion "
                f"{_mean([o.completion for o in got]):,.0f} s, initial latency "
                f"{_mean([o.total_latency for o in got]):,.0f} CPU-s ({sum(o.seconds for o in got):.1f} s)")
    return out


# -- tables ----------------------------------------------------------------------------------------------------


def _mean(xs: Sequence[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def _sd(xs: Sequence[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def _pm(xs: Sequence[float], unit: str = "") -> str:
    m, sd = _mean(xs), _sd(xs)
    return f"{m:,.0f}{unit}" + (f" ± {sd:,.0f}" if sd >= 0.5 else "")


def figure2_markdown(out: dict[tuple[str, int], list[Outcome]], arms: Sequence[str], title: str, note: str) -> str:
    seeds = len(next(iter(out.values())))
    rows = [f"## {title}\n", note,
            f"\nMeans over {seeds} seeds (± one standard deviation across seeds, where they differ); seconds.\n",
            "| protocol | total time queued | total compute time | last job completes | mean time queued | "
            "mean compute time | jobs per cluster (" + ", ".join(CLUSTERS) + ") | batch jobs per cluster | "
            "placed by the fallback |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name in arms:
        os_ = out[(name, 0)]
        rows.append(
            f"| {name} | {_pm([o.total_queued for o in os_])} | {_pm([sum(o.compute) for o in os_])} | "
            f"{_pm([o.completion for o in os_])} | {_pm([_mean(o.queued) for o in os_])} | "
            f"{_pm([_mean(o.compute) for o in os_])} | "
            + " / ".join(f"{_mean([o.jobs_per_cluster[c] for o in os_]):.1f}" for c in CLUSTERS) + " | "
            + " / ".join(f"{_mean([o.pilots[c] for o in os_]):.1f}" for c in CLUSTERS) + " | "
            + f"{_mean([o.fallbacks for o in os_]):.1f} of {len(os_[0].queued)} |")
    return "\n".join(rows) + "\n"


def figure3_markdown(out: dict[tuple[str, int], list[Outcome]], levels: Sequence[int]) -> str:
    seeds = len(next(iter(out.values())))
    rows = ["## Figure 3: initial latency until saturation under external load\n",
            "CPU-seconds left unused on each cluster from the start of the run until it first runs full (fewer "
            "free CPUs than one job needs), summed over the four clusters; a cluster that never runs full counts "
            f"until the last job ends. Means over {seeds} seeds (± one standard deviation). In brackets: clusters "
            "that never ran full (mean per run).\n",
            "| external load | external jobs (CPU-seconds) | " + " | ".join(FIGURE3_ARMS) + " |",
            "|---|---|" + "---|" * len(FIGURE3_ARMS)]
    for level in levels:
        n = sum(LEVELS[level].values())
        cells = []
        for name in FIGURE3_ARMS:
            os_ = out[(name, level)]
            never = _mean([sum(1 for s in o.saturated.values() if s is None) for o in os_])
            cells.append(f"{_pm([o.total_latency for o in os_])} [{never:.1f}]")
        rows.append(f"| level {level} | {n} x {CPUS} CPUs x {EXTERNAL_RUNTIME:.0f} s = {n * EXTERNAL_RUNTIME:,.0f} s "
                    f"of run time | " + " | ".join(cells) + " |")
    rows += ["", "The same runs' total time queued and completion time (seconds):\n",
             "| external load | " + " | ".join(f"{a}: queued / completion" for a in FIGURE3_ARMS) + " |",
             "|---|" + "---|" * len(FIGURE3_ARMS)]
    for level in levels:
        rows.append(f"| level {level} | " + " | ".join(
            f"{_mean([o.total_queued for o in out[(a, level)]]):,.0f} / "
            f"{_mean([o.completion for o in out[(a, level)]]):,.0f}" for a in FIGURE3_ARMS) + " |")
    return "\n".join(rows) + "\n"


def checks_markdown(out: dict[tuple[str, int], list[Outcome]]) -> str:
    """That the runs used the selector's own code, and what each run's jobs did beyond the protocol."""
    placed: dict[str, int] = {}
    for os_ in out.values():
        for o in os_:
            for who, n in o.placed_by.items():
                placed[who] = placed.get(who, 0) + n
    jobs = sum(len(o.queued) for os_ in out.values() for o in os_)
    extra = sum(o.instances - len(o.queued) for os_ in out.values() for o in os_)
    return (f"\nOf {jobs:,} jobs run, the stories hold decisions of: "
            + ", ".join(f"`{who}` for {n:,}" for who, n in sorted(placed.items()))
            + f" (jobs with none, sent before a placement chose their cluster: {jobs - sum(placed.values())}); "
            f"instances beyond one per job: {extra}.\n")


def write_trace(path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job", "member", "cron_burst", "arrival_s", "cpus", "runtime_s_at_speed_1"])
        for j in trace():
            w.writerow([j.name, j.member, j.burst, f"{j.arrival:g}", CPUS, f"{j.runtime:g}"])


def _json(dump: dict[str, Any]) -> str:
    """The runs as JSON, one run a line."""
    return "{\n" + ",\n".join(f"{json.dumps(k)}: [\n" + ",\n".join(json.dumps(o) for o in v) + "\n]"
                               for k, v in dump.items()) + "\n}\n"


def _dump(out: dict[tuple[str, int], list[Outcome]]) -> dict[str, Any]:
    return {f"{arm}, level {level}": [dataclasses.asdict(o) for o in os_] for (arm, level), os_ in out.items()}


@dataclass
class Report:
    """What `main` ran, for the tests and the tables."""

    figure2: dict[tuple[str, int], list[Outcome]] = field(default_factory=dict)
    figure3: dict[tuple[str, int], list[Outcome]] = field(default_factory=dict)
    sensitivity: dict[tuple[str, int], list[Outcome]] = field(default_factory=dict)


def largest_fastest(base: Scenario) -> Scenario:
    """The same clusters with their speeds given in order of size: the 16-CPU cluster fastest, the 4-CPU slowest."""
    speeds = sorted((p.speed.mean for p in base.pools), reverse=True)
    by_size = sorted(base.pools, key=lambda p: -p.cluster_cpus)
    speed = {p.name: s for p, s in zip(by_size, speeds, strict=True)}
    pools = [dataclasses.replace(p, speed=constant(speed[p.name])) for p in base.pools]
    return dataclasses.replace(base, pools=pools)


def variants(base: Scenario) -> dict[str, tuple[str, str, Scenario]]:
    """Figure 2's setup changed one way at a time: which cluster is fastest, the monitor's lag, pilot reuse."""
    return {
        "largest fastest": (
            "The largest cluster fastest",
            "The same trace, with the clusters' speeds given in order of size (mileva 1.0, scoops 0.952, canbc01 "
            "0.909, ci-team 0.870).", largest_fastest(base)),
        "no lag": (
            "A monitor without hysteresis",
            "The same, with the monitor showing work as soon as it started (`monitor_lag = 0`, still read every "
            "60 s).", dataclasses.replace(base, pools=[dataclasses.replace(p, monitor_lag=constant(0.0))
                                                        for p in base.pools])),
        "pilots reused": (
            "Pilots reused, as gridbot's worker does",
            "The same, with `jobs_per_pilot = 0`: a pilot that ended its job takes the next one placed on its "
            "cluster before it idles out, as gridbot's real pilots do, instead of each job being a batch job of "
            "its own.", dataclasses.replace(base, pools=[dataclasses.replace(p, jobs_per_pilot=0)
                                                          for p in base.pools])),
    }


def source_version() -> str:
    """The placements' and the simulator's source as these runs read them (others edit them: tables name it)."""
    import hashlib

    root = HERE.parents[1] / "src" / "gridbot"
    text = b"".join((root / p).read_bytes() for p in ("schedulers/selection.py", "sim/engine.py"))
    return hashlib.sha256(text).hexdigest()[:12]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="*", help="figure2, figure3, sensitivity (default: all)")
    ap.add_argument("--seeds", type=int, default=20, help="seeds per arm (default 20, as the report's runs)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    what = args.what or ["figure2", "figure3", "sensitivity"]
    if set(what) - {"figure2", "figure3", "sensitivity"}:
        ap.error(f"unknown: {', '.join(sorted(set(what) - {'figure2', 'figure3', 'sensitivity'}))}")
    args.out.mkdir(parents=True, exist_ok=True)
    write_trace(HERE / "trace.csv")
    seeds = tuple(range(1, args.seeds + 1))
    base = load()
    t0 = time.time()
    stamp = f"\nsource {source_version()} (sha256 of src/gridbot/schedulers/selection.py and sim/engine.py).\n"
    if "figure2" in what:
        out = runs(base, tuple(ARMS), (0,), seeds)
        text = figure2_markdown(out, tuple(ARMS), "Figure 2: summary for multiple runs",
                                "The trace of `trace.csv` (20 jobs of 2 CPUs) on the four clusters, no external "
                                "load.") + checks_markdown(out) + stamp
        (args.out / "figure2.md").write_text("# Stateful resource selection: Figure 2\n\n" + text)
        (args.out / "figure2.json").write_text(_json(_dump(out)))
    if "figure3" in what:
        out = runs(base, FIGURE3_ARMS, tuple(LEVELS), seeds)
        text = figure3_markdown(out, tuple(LEVELS)) + checks_markdown(out) + stamp
        (args.out / "figure3.md").write_text("# Stateful resource selection: Figure 3\n\n" + text)
        (args.out / "figure3.json").write_text(_json(_dump(out)))
    if "sensitivity" in what:
        arms = ("naive", "stateful, random", "stateful, best")
        text = ""
        dump: dict[str, Any] = {}
        for key, (title, note, sc) in variants(base).items():
            out = runs(sc, arms, (0,), seeds)
            text += figure2_markdown(out, arms, title, note) + "\n"
            dump.update({f"{key}: {k}": v for k, v in _dump(out).items()})
        (args.out / "sensitivity.md").write_text("# Stateful resource selection: sensitivity\n\n" + text + stamp)
        (args.out / "sensitivity.json").write_text(_json(dump))
    print(f"done in {time.time() - t0:.0f} s; tables in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
