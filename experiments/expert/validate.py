"""ExPERT's Table 5 (Agmon Ben-Yehuda et al., HPDC'11, section 6.3) in gridbot's simulator: the tail makespan and
cost per task that the estimator predicts for a strategy, against what gridbot's simulator measures when the bag
runs with that strategy applied.

    .venv/bin/python experiments/expert/validate.py                  # full size: 3 workloads x 12 strategies x 3 seeds
    .venv/bin/python experiments/expert/validate.py --seeds 1 --out /tmp/v

Each run is a scenario (docs/simulation.md) with an unreliable grid pool and a reliable cloud pool, and a bag
whose `[strategy]` is `tail = "expert"` with the strategy pinned (`pin`), so the dispatcher applies it at T_tail
as a user's bag would. Three numbers come out of a run, as in the paper's table:

- measured: the tail makespan (T_tail, when nothing was queued any more, to the last task's first result) and the
  cost per tail task, counted as the estimator counts it (every instance that returns a result is paid, at C_ur
  or C_r per CPU hour by the second, including the replicas still running when the last task ends: the server
  runs with `let_replicas_finish`, the paper's "not aborted");
- online: what `tail = "expert"` predicted at T_tail from the bag's own instances (the paper's three epochs);
- offline: the estimate for the same tail (the instances out at T_tail, their ages) from a characterization of
  a previous run of the workload (another seed, without replicas), written as a history file and read back
  (`gridbot plan --history`), gamma known for every instance as the paper's offline model has it.

As the paper did (its Table 2), the estimator is given T_r, the mean CPU time of a task on the reliable pool
(`reliable_runtime`). The pools are the paper's model as far as gridbot's simulator has it: an unreliable
machine loses an instance without a word (its pilot is preempted at a constant rate; the server hears nothing
until the instance's deadline, host_timeout being longer, and the replacement pilot lands on another machine
of a large pool), a task's turnaround is drawn anew for each instance (the run time varies little from task to
task, the turnaround ratio of the grid's machines a lot), and reliable machines never fail. Workload W3 breaks the
estimator's assumption on purpose: its tasks' run times are the blastall trace's, the same on every host.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from gridbot import history
from gridbot.model.states import InstanceState
from gridbot.schedulers import registry
from gridbot.schedulers.expert.planner import Settings, offline, plan_with
from gridbot.schedulers.expert.tail import ExpertTail
from gridbot.sim.engine import Simulation
from gridbot.sim.scenario import parse_scenario
from gridbot.sim.traces import task_runtimes

HERE = Path(__file__).resolve().parent
PROBE = "expert-validated"

PAPER = {"offline": (10.0, 7.0), "online": (20.0, 13.0)}
"""Table 5's average absolute deviations, percent: (tail makespan, cost)."""
PAPER_ROWS = (
    # No., WL, N, gamma, RI, TMS, C, offline dTMS, dC, online dTMS, dC (Table 5)
    (1, "WL1", "0", 0.995, 50, 6908, 1.60, 8, 3, 35, 33),
    (2, "WL1", "2", 0.983, 0, 3704, 39, 21, -4, 8, -4),
    (3, "WL6", "inf", 0.981, 0, 6005, 41, 1, -4, 4, -4),
    (4, "WL3", "0", 0.974, 49, 10487, 1.10, 2, 2, -56, -32),
    (5, "WL6", "CN-inf", 0.970, 41, 6113, 1.48, 37, -2, 29, -2),
    (6, "WL5", "inf", 0.942, 0, 6394, 0.42, 3, -4, -40, -4),
    (7, "WL1", "0", 0.864, 77, 10130, 2.38, 3, 2, 32, 26),
    (8, "WL2", "1", 0.857, 16, 4162, 0.88, 19, 15, -37, -10),
    (9, "WL1", "0", 0.853, 108, 14029, 3.28, 7, 0, -1, -4),
    (10, "WL7", "0", 0.844, 118, 11761, 3.67, -14, -35, -7, -28),
    (11, "WL1", "0", 0.827, 89, 11656, 2.86, 8, 1, -7, -7),
    (12, "WL1", "0", 0.788, 107, 12869, 3.09, -9, -13, -2, -5),
    (13, "WL4", "0", 0.746, 100, 20239, 1.54, -3, -7, -7, -10),
)

SCENARIO = """\
[simulation]
seed = {seed}
tick = "5s"
overlay_interval = "30s"
store = "memory"

[server]
reliable_pools = ["cloud"]
replicate_below = 0         # no replicas before the tail: the paper's throughput phase
host_timeout = "{host_timeout}"
let_replicas_finish = true  # a replica already sent runs on and its result is paid (the paper's model)
max_replicas = 10

[pools.grid]
kind = "grid"
size = {ur}
hosts = {hosts}             # a replacement pilot lands on another machine: the lost instance stays unheard of
queue_wait = "0s"
idle_timeout = "1d"         # the grid's machines stay while the tail needs none (the model's #ur machines)
preemption = {preemption}
turnaround_ratio = {ratio}
price_per_cpu_hour = 1.0    # the paper's C_ur: 1 cent an hour

[pools.cloud]
kind = "cloud"
size = {reliable}
queue_wait = "{cloud_wait}"
price_per_cpu_hour = 34.0   # the paper's C_r: EC2 m1.large, 34 cents an hour
charging_period = "1s"

[bags.w]
jobs = {jobs}
runtime = {runtime}
instance_deadline = "{deadline:.0f}s"
max_failures = 100

[bags.w.policy]
GridPolicy = 'Bag.Tail || Pool.Reliability != "reliable"'

[bags.w.strategy]
tail = "{tail}"
{options}
"""


@dataclass(frozen=True)
class Workload:
    """A bag and its pools; the unreliable pool loses an instance of t seconds with probability 1 - exp(-p t)."""

    name: str
    description: str
    runtime: str
    """The task's run time on a speed-1 machine (TOML distribution), the same for all its instances."""
    runtime_mean: float
    """Its mean: T_r, a task's CPU time on the reliable pool (the cloud's machines run at speed 1)."""
    ratio: str
    """Execution time over turnaround of an unreliable instance (TOML distribution), drawn per instance."""
    preemption: float
    """Pilots preempted per hour on the grid."""
    deadline: float
    """The bag's instance deadline (the throughput phase's D): about 4 T_ur, as the paper's T = D = 4 T_ur."""
    jobs: int = 500
    ur: int = 100
    reliable: int = 10
    """The cloud's size: Mr_max = 0.1 of the grid, as in the paper's Figure 9a."""
    cloud_wait: float = 0.0
    host_timeout: float = 36_000.0

    def scenario(self, seed: int, tail: str = PROBE, options: str = "") -> str:
        return SCENARIO.format(seed=seed, ur=self.ur, hosts=self.ur * 100, preemption=self.preemption,
                               ratio=self.ratio, reliable=self.reliable, cloud_wait=f"{self.cloud_wait:.0f}s",
                               host_timeout=f"{self.host_timeout:.0f}s", jobs=self.jobs, runtime=self.runtime,
                               deadline=self.deadline, tail=tail, options=options)


BLASTALL = 1600.0 / float(np.mean(task_runtimes("blastall")))
"""Scales blastall's runtimes to a mean of 1,600 s."""

WORKLOADS = (
    Workload("W1", "reliable grid (gamma ~0.94): run time 1,400-1,800 s, turnaround ratio 0.5-1, D 4,000 s",
             '{ dist = "uniform", low = "1400s", high = "1800s" }', 1600.0,
             '{ dist = "uniform", low = 0.5, high = 1 }', 0.1, 4000.0),
    Workload("W2", "lossy, slower grid (gamma ~0.8): run time 1,400-1,800 s, turnaround ratio 0.3-1, D 6,500 s",
             '{ dist = "uniform", low = "1400s", high = "1800s" }', 1600.0,
             '{ dist = "uniform", low = 0.3, high = 1 }', 0.35, 6500.0),
    Workload("W3", "task-dependent run times: the blastall trace (77% near 420 s, 23% 4,750-7,100 s; mean 1,600 s), "
             "turnaround ratio 0.7-1, gamma ~0.85, D 11,000 s", f'{{ trace = "blastall", unit = {BLASTALL:.6g} }}',
             1600.0, '{ dist = "uniform", low = 0.7, high = 1 }', 0.25, 11000.0, jobs=800),
)

STRATEGIES = (
    ("AUR", "N=inf T=D D=D Mr=0"),
    ("TRR", "N=0 T=0 D=D Mr=0.1"),
    ("TR", "N=0 T=D D=D Mr=0.1"),
    ("CN1T0 (tail)", "N=1 T=0 D=D Mr=0.1"),
    ("", "N=0 T=1Tur D=2Tur Mr=0.1"),
    ("", "N=1 T=1Tur D=2Tur Mr=0.1"),
    ("", "N=1 T=2Tur D=2Tur Mr=0.02"),
    ("", "N=2 T=0Tur D=3Tur Mr=0.06"),
    ("", "N=2 T=1Tur D=2Tur Mr=0.06"),
    ("paper's recommended", "N=3 T=1Tur D=2Tur Mr=0.02"),
    ("", "N=3 T=2Tur D=3Tur Mr=0.1"),
    ("", "N=inf T=1Tur D=2Tur Mr=0"),
)
"""A dozen strategies: the tail parts of the paper's static strategies TRR (and AR's), TR, AUR and CN1T0 (T and D
given as D: the bag's instance deadline, the throughput phase's), its recommended one, and others of its sampled
space (T and D in units of the T_ur that ExPERT measures at T_tail)."""

REPETITIONS = 10
"""Of the estimate, as the paper's (it compared each real run with the mean of 10 simulated ones)."""


class Probe(ExpertTail):
    """`tail = "expert"` that keeps itself where the experiment can read its plan after the run."""

    name = PROBE
    made: ClassVar[list[Probe]] = []

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        Probe.made.append(self)

    def predicted(self) -> tuple[float, float]:
        """The prediction at T_tail, as `gridbot status` shows it: (tail makespan, cost per tail task)."""
        assert self.planning is not None and self.planning.chosen is not None and self.tail_start is not None
        m, c = self.planning.prediction()
        left = max(1, self.planning.observed.tasks)
        return self.planned_at - self.tail_start + m, (self.spent_at_plan + c * left) / max(1, self.tasks)


registry.TAILS.setdefault(PROBE, Probe)


@dataclass
class Run:
    """One simulated run with its predictions. Makespans in seconds, costs in cents per tail task."""

    workload: str
    strategy: str
    seed: int
    applied: str
    tasks: int
    unreliable: int
    gamma: float
    """Results over unreliable instances whose outcome is known (those sent a deadline before the end)."""
    reliable: int
    """Instances sent to the reliable pool (the paper's RI)."""
    makespan: float
    cost: float
    straggler_cost: float
    """Of `cost`: results that came after the last task's (replicas run on; the estimator pays them too)."""
    online: tuple[float, float]
    offline: tuple[float, float]
    online_gamma: float
    offline_gamma: float

    def deviation(self, model: str) -> tuple[float, float]:
        """(predicted - measured) / measured, percent: the paper's Delta TMS / TMS and Delta C / C."""
        m, c = self.online if model == "online" else self.offline
        return 100.0 * (m / self.makespan - 1.0), 100.0 * (c / self.cost - 1.0)


@dataclass
class Simulated:
    """What a simulated run leaves: its instances (sent_at, ended_at, state, pool), the probe, the bag's end."""

    rows: list[tuple[float, float | None, InstanceState, str]]
    probe: Probe | None
    finished: float
    straggling: list[tuple[float, float, str]] = field(default_factory=list)
    """Instances still running when the bag ended that will return a result: (sent_at, ends_at, pool)."""


def simulate(w: Workload, seed: int, tail: str = PROBE, options: str = "") -> Simulated:
    Probe.made.clear()
    sim = Simulation(parse_scenario(w.scenario(seed, tail, options), f"{w.name}.toml"))
    result = sim.run().bag("w")
    assert result.state == "completed" and result.finished is not None, (w.name, seed, result.state)
    store = sim.memory
    assert store is not None
    row = store.bag("w")
    assert row is not None
    rows = [(i.sent_at, i.ended_at, i.state, i.host_id.rsplit("-", 1)[0])
            for j in store.jobs(row.bag_id, limit=10**9) for i in store.instances_of(j.job_id)]
    # the simulator knows how the instances still out will end; the server, which forgot the bag, does not
    straggling = []
    for pool in sim.pools.values():
        for pilot in pool.pilots.values():
            for iid, ends in pilot.running.items():
                outcome, _, bag_id, started = pilot.outcome[iid]
                if bag_id == row.bag_id and outcome.value == "success":
                    straggling.append((started, ends, pool.model.name))
    return Simulated(rows, Probe.made[-1] if Probe.made else None, result.finished, straggling)


def gamma_of(rows: Sequence[tuple[float, float | None, InstanceState, str]], end: float, deadline: float) -> float:
    known = [r for r in rows if r[3] != "cloud" and r[0] < end - deadline
             and r[2] not in (InstanceState.CANCELLED, InstanceState.INTERRUPTED)]
    return sum(r[2] in (InstanceState.DONE, InstanceState.WASTED) for r in known) / max(1, len(known))


def pinned(w: Workload, pin: str) -> str:
    """The strategy as `pin` takes it: D stands for the bag's instance deadline (seconds)."""
    return " ".join(f"{part[:2]}{w.deadline:.0f}" if part[2:] == "D" else part for part in pin.split())


def options(w: Workload, pin: str) -> str:
    return (f'pin = "{pinned(w, pin)}"\nrepetitions = {REPETITIONS}\nreliable_runtime = {w.runtime_mean}\n'
            "replan_growth = 1000000.0   # predicted once, at T_tail (the paper's online model)")


_previous: dict[tuple[str, int], str] = {}


def previous_history(w: Workload, seed: int) -> str:
    """A previous run of the workload (another seed, no replicas: AUR), as a history file."""
    key = (w.name, seed)
    if key not in _previous:
        done = simulate(w, 10_000 + seed, "gridbot")
        _previous[key] = history.dump_csv(history.rows_from_states(done.rows))
    return _previous[key]


def run_one(w: Workload, label: str, pin: str, seed: int) -> Run:
    done = simulate(w, seed, PROBE, options(w, pin))
    probe = done.probe
    assert probe is not None and probe.planning is not None and probe.strategy is not None
    assert probe.tail_start is not None
    planning, start = probe.planning, probe.tail_start
    prices = planning.prices

    def paid(sent: float, ended: float, pool: str) -> float:
        took = np.array([max(0.0, ended - sent)])
        return float((prices.reliable(took) if pool == "cloud" else prices.unreliable(took))[0])

    returned = sum(paid(s, e, p) for s, e, st, p in done.rows
                   if e is not None and e > start and st in (InstanceState.DONE, InstanceState.WASTED))
    late = sum(paid(s, e, p) for s, e, p in done.straggling)
    tasks = max(1, probe.tasks)
    plan = probe.predicted()
    # offline: the same tail (tasks left, instances out and their ages at T_tail) from a previous run's history
    s = probe.planner_settings()
    applied = probe.strategy
    pin_seconds = f"N={'inf' if applied.n is None else applied.n} T={applied.t:.3f} D={applied.d:.3f} Mr={applied.mr}"
    settings = Settings(s.utility, s.mr_max, s.repetitions, s.price_unreliable, s.price_reliable, s.charging_period,
                        s.min_results, s.seed, pin_seconds, s.reliable_runtime)
    rows = history.parse(previous_history(w, seed), f"{w.name} seed {10_000 + seed}")
    char, source, known = offline(history.records(rows, {"cloud"}), w.deadline, settings, "a previous run")
    off = plan_with(char, source, planning.observed, settings, known)
    assert off.chosen is not None
    m, c = off.prediction()
    left = max(1, planning.observed.tasks)
    offline_point = (probe.planned_at - start + m, (probe.spent_at_plan + c * left) / tasks)
    return Run(w.name, label or pin, seed, planning.describe(applied), tasks, planning.unreliable,
               gamma_of(done.rows, done.finished, w.deadline),
               sum(1 for r in done.rows if r[3] == "cloud" and r[0] >= start), done.finished - start,
               (returned + late) / tasks, late / tasks, plan, offline_point, planning.char.gamma_future,
               char.gamma_future)


def validate(workloads: Sequence[Workload] = WORKLOADS, strategies: Sequence[tuple[str, str]] = STRATEGIES,
             seeds: Sequence[int] = (1, 2, 3), progress: bool = False) -> list[Run]:
    runs = []
    for w in workloads:
        for label, pin in strategies:
            for seed in seeds:
                started = time.perf_counter()
                r = run_one(w, label, pin, seed)
                runs.append(r)
                if progress:
                    off, on = r.deviation("offline"), r.deviation("online")
                    print(f"{w.name} {r.strategy:26s} seed {seed}: tail {r.makespan:7,.0f} s, {r.cost:6.3f} c/task; "
                          f"offline {off[0]:+4.0f}% {off[1]:+4.0f}%, online {on[0]:+4.0f}% {on[1]:+4.0f}% "
                          f"({time.perf_counter() - started:.1f} s)", flush=True)
    return runs


def averages(runs: Sequence[Run], model: str) -> tuple[float, float]:
    """The mean absolute deviation (percent) of tail makespan and cost, over runs: the paper's last row."""
    devs = np.array([r.deviation(model) for r in runs])
    return float(np.abs(devs[:, 0]).mean()), float(np.abs(devs[:, 1]).mean())


def biases(runs: Sequence[Run], model: str) -> tuple[float, float]:
    """The mean signed deviation (percent) over runs: what is left of the model's error once each run's own
    luck averages out (the paper's average absolute deviation bounds it)."""
    devs = np.array([r.deviation(model) for r in runs])
    return float(devs[:, 0].mean()), float(devs[:, 1].mean())


def rows(runs: Sequence[Run]) -> dict[tuple[str, str], list[Run]]:
    out: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        out.setdefault((r.workload, r.strategy), []).append(r)
    return out


def _row(name: str, strategy: str, group: Sequence[Run]) -> str:
    def mean(values: Sequence[float]) -> float:
        return float(np.mean(values))

    def of_means(model: str, k: int) -> float:
        """The deviation of the mean prediction from the mean measured (each run's luck averaged out)."""
        measured = mean([r.makespan if k == 0 else r.cost for r in group])
        predicted = mean([(r.offline if model == "offline" else r.online)[k] for r in group])
        return 100.0 * (predicted / measured - 1.0)

    off, on = np.array([r.deviation("offline") for r in group]), np.array([r.deviation("online") for r in group])
    return (f"| {name} | {strategy} | {group[0].applied} | {mean([r.tasks for r in group]):.0f} | "
            f"{mean([r.unreliable for r in group]):.0f} | {mean([r.gamma for r in group]):.3f} | "
            f"{mean([r.reliable for r in group]):.1f} | {mean([r.makespan for r in group]):,.0f} | "
            f"{mean([r.cost for r in group]):.3f} | {mean([r.straggler_cost for r in group]):.3f} | "
            f"{np.abs(off[:, 0]).mean():.0f} ({of_means('offline', 0):+.0f}) | "
            f"{np.abs(off[:, 1]).mean():.0f} ({of_means('offline', 1):+.0f}) | "
            f"{np.abs(on[:, 0]).mean():.0f} ({of_means('online', 0):+.0f}) | "
            f"{np.abs(on[:, 1]).mean():.0f} ({of_means('online', 1):+.0f}) |")


# -- the report ---------------------------------------------------------------------------------------------------


def report(runs: Sequence[Run], seconds: float, seeds: int) -> str:
    off, on = averages(runs, "offline"), averages(runs, "online")
    boff, bon = biases(runs, "offline"), biases(runs, "online")
    good = [r for r in runs if r.workload != "W3"]
    lines = [
        "# ExPERT's Table 5 in gridbot's simulator: predicted against simulated tails",
        "",
        f"Generated by `experiments/expert/validate.py` ({len(runs)} simulated runs, {seeds} seed(s) per row, "
        f"{seconds / 60:.0f} min). Each row is a workload and a strategy that `tail = \"expert\"` applied (pinned) in "
        "gridbot's simulator. TMS: the measured tail makespan (seconds), C: the measured cost (cents per tail "
        "task), late C: the part of C paid for replicas still running when the last task ended; means over the "
        "seeds. dTMS and dC: the deviation (predicted - measured) / measured of each run, in percent, its absolute "
        "value averaged over the seeds (the paper's statistic: one real run against the estimate), and in "
        "brackets the deviation of the mean prediction from the mean measured (each run's luck averaged out).",
        "",
        "| model | runs | tail makespan: mean abs deviation (mean deviation) | cost: mean abs deviation (mean) |",
        "|---|---|---|---|",
        f"| offline, paper (Table 5) | 13 | {PAPER['offline'][0]:.0f}% | {PAPER['offline'][1]:.0f}% |",
        f"| offline, here, all | {len(runs)} | {off[0]:.1f}% ({boff[0]:+.1f}%) | {off[1]:.1f}% ({boff[1]:+.1f}%) |",
        f"| online, paper | 13 | {PAPER['online'][0]:.0f}% | {PAPER['online'][1]:.0f}% |",
        f"| online, here, all | {len(runs)} | {on[0]:.1f}% ({bon[0]:+.1f}%) | {on[1]:.1f}% ({bon[1]:+.1f}%) |",
    ]
    if good and len(good) < len(runs):
        o, n, bo, bn = averages(good, "offline"), averages(good, "online"), biases(good, "offline"), biases(good,
                                                                                                         "online")
        lines += [f"| offline, here, W1 and W2 | {len(good)} | {o[0]:.1f}% ({bo[0]:+.1f}%) | {o[1]:.1f}% "
                  f"({bo[1]:+.1f}%) |",
                  f"| online, here, W1 and W2 | {len(good)} | {n[0]:.1f}% ({bn[0]:+.1f}%) | {n[1]:.1f}% "
                  f"({bn[1]:+.1f}%) |"]
    lines += ["", "Per workload (mean absolute deviation of tail makespan / cost):", ""]
    for w in WORKLOADS:
        sub = [r for r in runs if r.workload == w.name]
        if sub:
            o, n = averages(sub, "offline"), averages(sub, "online")
            lines.append(f"- {w.name}, {w.description}: offline {o[0]:.1f}% / {o[1]:.1f}%, online {n[0]:.1f}% / "
                         f"{n[1]:.1f}% ({len(sub)} runs)")
    lines += [
        "",
        "| WL | strategy | applied at T_tail | tasks | #ur | gamma | RI | TMS [s] | C [c/task] | late C | "
        "offline dTMS % | dC % | online dTMS % | dC % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(_row(name, strategy, group) for (name, strategy), group in rows(runs).items()),
        "",
        "The paper's Table 5 (13 real GridBoT runs, one each, against the mean of 10 simulated ones):",
        "",
        "| No. | WL | N | gamma | RI | TMS [s] | C [c/task] | offline dTMS | dC | online dTMS | dC |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *(f"| {no} | {wl} | {n} | {g} | {ri} | {tms:,} | {c} | {a:+d}% | {b:+d}% | {x:+d}% | {y:+d}% |"
          for no, wl, n, g, ri, tms, c, a, b, x, y in PAPER_ROWS),
        "| avg of abs | | | 0.894 | 58 | 9,574 | 1.78 | 10% | 7% | 20% | 13% |",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    started = time.perf_counter()
    runs = validate(seeds=range(1, args.seeds + 1), progress=True)
    (args.out / "validation.json").parent.mkdir(parents=True, exist_ok=True)
    (args.out / "validation.json").write_text(json.dumps([dataclasses.asdict(r) for r in runs], indent=1))
    text = report(runs, time.perf_counter() - started, args.seeds)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "validation.md").write_text(text)
    print(text)
    if not all(math.isfinite(r.makespan) for r in runs):
        raise SystemExit("a run did not end")


if __name__ == "__main__":
    main()
