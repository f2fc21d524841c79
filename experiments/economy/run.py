"""Reproduce the evaluation of Buyya, Murshed, Abramson and Venugopal, "Scheduling parameter sweep
applications on global Grids: a deadline and budget constrained cost-time optimization algorithm" (SPE 35,
2005) in gridbot's simulator, with gridbot's DBC placements (`gridbot.schedulers.economy`).

    .venv/bin/python experiments/economy/run.py                 # both sections, full size (2-3 minutes)
    .venv/bin/python experiments/economy/run.py --section 6 --seeds 3 --out /tmp/economy

Section 5 (the GridSim study): 200 jobs on the eleven WWG resources of Table I (`wwg.toml`), deadlines 100
to 3,600 in steps of 500, budgets 5,000 to 22,000 G$ in steps of 1,000, the cost and cost-time placements:
the data of Figures 4 to 8. Section 6 (the Nimrod-G run): the 200 calc jobs of Figure 9 (`calc.pln`) on
the seven machines of Table II (`nimrod.toml`), deadline 2 hours, budget 600 G$, cost against cost-time,
several seeds (the testbed's queue waits are random). Writes into `results/`: every run as CSV and JSON,
`economy.md` (the tables beside the paper's numbers) and the figures as PNG. README.md says what
reproduces, what does not, and every assumption.

Runs are one at a time, in this process. A run that cannot finish by its deadline stays active (the
placement starts nothing after the deadline), so each scenario's horizon is a little past the deadline, and
a run is judged by the jobs done by the deadline.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from gridbot.model.plan_file import parse_plan
from gridbot.model.states import InstanceState
from gridbot.sim.distributions import constant, parse_dist
from gridbot.sim.engine import Simulation
from gridbot.sim.metrics import Recorder
from gridbot.sim.scenario import BagModel, Scenario, parse_scenario

HERE = Path(__file__).resolve().parent
DEADLINES = tuple(range(100, 3601, 500))
"""Section 5.3: "The deadline is varied in simulation time from 100 to 3600 in steps of 500"."""
BUDGETS = tuple(range(5000, 22001, 1000))
"""Section 5.3: "The budget is varied from G$ 5000 to 22 000 in steps of 1000"."""
STRATEGIES = ("cost", "cost-time")
SHORT, LONG, HIGH = 100, 3100, 22000
"""Figure 5's short and long deadlines, Figures 6-8's high budget."""
SLACK5 = 300.0
"""Section 5: seconds of simulation past the deadline (jobs started before it end; nothing new starts)."""
PAPER6 = {"cost": (87.0, 188.0), "cost-time": (28.0, 277.0)}
"""Table III: execution time (min) and budget consumed (G$)."""
GROUPING6 = 0.6
"""Section 6's cost-time groups the five machines of 1 G$ per CPU-second (README.md); their costs per unit
of work here differ by up to 50%, so cost_tolerance 0.6 (any value from 0.5 to 2 groups exactly these)."""


# -- one run --------------------------------------------------------------------------------------------


class Timeline(Recorder):
    """The simulator's recorder, also noting when each job's result came back and from which pool."""

    def __init__(self, scenario: Scenario, pools: list[str], clock: Callable[[], float]) -> None:
        super().__init__(scenario, pools)
        self.clock = clock
        self.done_at: list[tuple[float, str]] = []

    def ended(self, pool: str, bag_id: int, state: InstanceState, wall: float) -> None:
        super().ended(pool, bag_id, state, wall)
        if state is InstanceState.DONE:
            self.done_at.append((self.clock(), pool))


@dataclass
class Run:
    """One bag's outcome, as the paper measures it."""

    strategy: str
    deadline: float
    budget: float
    seed: int
    state: str
    done: int
    done_by_deadline: int
    time_used: float
    """When the last job done by the deadline ended (the makespan if every job was)."""
    makespan: float | None
    spent: float
    spent_per_pool: dict[str, float]
    jobs_per_pool: dict[str, int]
    """Jobs done by the deadline, per pool."""
    replicas: int
    done_at: list[tuple[float, str]] = field(default_factory=list)

    def row(self, pools: Sequence[str]) -> dict[str, Any]:
        out: dict[str, Any] = {k: v for k, v in dataclasses.asdict(self).items()
                               if k not in ("spent_per_pool", "jobs_per_pool", "done_at")}
        out["spent"] = round(self.spent, 2)
        out["time_used"] = round(self.time_used, 1)
        out["makespan"] = None if self.makespan is None else round(self.makespan, 1)
        for p in pools:
            out[f"jobs_{p}"] = self.jobs_per_pool.get(p, 0)
        for p in pools:
            out[f"spent_{p}"] = round(self.spent_per_pool.get(p, 0.0), 2)
        return out


def with_bag(sc: Scenario, strategy: str, deadline: float, budget: float, slack: float,
             options: dict[str, Any] | None = None) -> Scenario:
    """The scenario with its one bag under `strategy` (options replaced by `options` if given), the deadline
    and the budget, and a horizon `slack` seconds past the deadline."""
    (bag,) = sc.bags
    choice = bag.strategy
    choice = msgspec.structs.replace(choice, placement=strategy,
                                     options=dict(choice.options if options is None else options))
    b: BagModel = dataclasses.replace(bag, bag_deadline=float(deadline), budget=float(budget), strategy=choice)
    return dataclasses.replace(sc, bags=[b], horizon=deadline + slack)


def run_once(sc: Scenario, seed: int | None = None) -> Run:
    sim = Simulation(sc, seed)
    timeline = Timeline(sc, [p.name for p in sc.pools], lambda: sim.now)
    sim.recorder = timeline
    results = sim.run()
    (bag,) = results.bags
    deadline = bag.bag_deadline if bag.bag_deadline is not None else math.inf
    by_deadline = [(t, p) for t, p in timeline.done_at if t <= bag.arrival + deadline]
    per_pool: dict[str, int] = {}
    for _, p in by_deadline:
        per_pool[p] = per_pool.get(p, 0) + 1
    model = sc.bags[0]
    return Run(model.strategy.placement, deadline, model.budget or math.inf, results.seed, bag.state, bag.done,
               bag.done_by_deadline or 0, max((t for t, _ in by_deadline), default=0.0) - bag.arrival,
               bag.makespan, bag.spent, dict(bag.spent_per_pool), dict(sorted(per_pool.items())), bag.replicas,
               sorted(timeline.done_at))


# -- Section 5 ------------------------------------------------------------------------------------------


def wwg() -> Scenario:
    return parse_scenario((HERE / "wwg.toml").read_text(), str(HERE / "wwg.toml"))


def section5(deadlines: Iterable[int] = DEADLINES, budgets: Iterable[int] = BUDGETS,
             strategies: Iterable[str] = STRATEGIES, progress: bool = False) -> list[Run]:
    """Every (strategy, deadline, budget) of the grid, one run each (GridSim's study is deterministic; so are
    these runs but for the jobs' lengths, drawn once per seed)."""
    base = wwg()
    runs = []
    grid = [(s, d, b) for s in strategies for d in deadlines for b in budgets]
    for i, (strategy, deadline, budget) in enumerate(grid):
        runs.append(run_once(with_bag(base, strategy, deadline, budget, SLACK5)))
        if progress and (i + 1) % 24 == 0:
            print(f"  section 5: {i + 1}/{len(grid)} runs", file=sys.stderr)
    return runs


# -- Section 6 ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arm:
    """One configuration of Section 6: a placement, its options, a change of the testbed."""

    name: str
    strategy: str
    options: dict[str, Any]
    testbed: str = "as modelled"
    edit: Callable[[Scenario], Scenario] | None = None


def _performing_well(sc: Scenario) -> Scenario:
    """The paper's "if the least expensive machines had performed well": no machine makes a pilot wait."""
    return dataclasses.replace(sc, pools=[dataclasses.replace(p, queue_wait=constant(0.0)) for p in sc.pools])


def pbs_waits(mean: float) -> Callable[[Scenario], Scenario]:
    """The testbed with every PBS cluster's pilots waiting an exponential time of `mean` seconds (lem, "slow
    to pick up", twice that); hpc76 and gnet01 (fork job managers) as modelled."""
    def edit(sc: Scenario) -> Scenario:
        pools = []
        for p in sc.pools:
            if p.spec.attributes.get("manager") == "pbs":
                m = mean * (2 if p.name == "lem" else 1)
                wait = parse_dist({"dist": "exponential", "mean": m}, "queue_wait") if m > 0 else constant(0.0)
                p = dataclasses.replace(p, queue_wait=wait)
            pools.append(p)
        return dataclasses.replace(sc, pools=pools)
    return edit


RUNTIME6 = {"runtime": 40.0}
"""calc's mean seconds on a speed-1 CPU (time base 10 plus 0-60): the placement plans from the start."""
PAPER_GROUPS = {**RUNTIME6, "cost_tolerance": GROUPING6}
COST6 = Arm("cost", "cost", RUNTIME6)
COST_TIME6 = Arm("cost-time (the paper's groups)", "cost-time", PAPER_GROUPS)
ARMS = (
    COST6,
    COST_TIME6,
    Arm("cost-time (gridbot's groups)", "cost-time", RUNTIME6),
    Arm("cost, probing first (no runtime)", "cost", {}),
    Arm("cost-time (the paper's groups), probing first (no runtime)", "cost-time", {"cost_tolerance": GROUPING6}),
    Arm("cost, machines performing well", "cost", RUNTIME6, "no queue waits", _performing_well),
    Arm("cost-time (the paper's groups), machines performing well", "cost-time", PAPER_GROUPS, "no queue waits",
        _performing_well),
)
PBS_MEANS = (0.0, 300.0, 600.0, 1200.0, 1800.0)
"""The PBS clusters' mean pilot queue wait, seconds, for the sensitivity of the speed-up (600 as modelled)."""


def nimrod() -> Scenario:
    """Table II's testbed and the calc bag; its job count checked against the plan file of Figure 9."""
    sc = parse_scenario((HERE / "nimrod.toml").read_text(), str(HERE / "nimrod.toml"))
    plan = parse_plan((HERE / "calc.pln").read_text(), str(HERE / "calc.pln"), "calc")
    jobs = math.prod(p.size for p in plan.parameters)
    assert sc.bags[0].jobs == jobs, f"nimrod.toml has {sc.bags[0].jobs} jobs, calc.pln {jobs}"
    return sc


def section6(seeds: int = 5, arms: Sequence[Arm] = ARMS) -> dict[str, list[Run]]:
    base = nimrod()
    (bag,) = base.bags
    assert bag.bag_deadline is not None and bag.budget is not None
    slack = base.horizon - bag.bag_deadline
    out = {}
    for arm in arms:
        sc = arm.edit(base) if arm.edit is not None else base
        sc = with_bag(sc, arm.strategy, bag.bag_deadline, bag.budget, slack, arm.options)
        out[arm.name] = [run_once(sc, seed) for seed in range(1, seeds + 1)]
    return out


def pbs_sweep(seeds: int = 5, means: Sequence[float] = PBS_MEANS) -> dict[float, dict[str, list[Run]]]:
    """Cost and cost-time (the paper's groups) as the PBS clusters' queue waits grow."""
    return {m: section6(seeds, [dataclasses.replace(a, testbed=f"PBS waits {m / 60:g} min", edit=pbs_waits(m))
                                for a in (COST6, COST_TIME6)]) for m in means}


# -- tables -----------------------------------------------------------------------------------------------


def _grid(runs: list[Run], strategy: str, value: Callable[[Run], float], fmt: str = "{:.0f}") -> str:
    deadlines = sorted({r.deadline for r in runs})
    budgets = sorted({r.budget for r in runs})
    cell = {(r.deadline, r.budget): r for r in runs if r.strategy == strategy}
    rows = ["| deadline \\ budget | " + " | ".join(f"{b / 1000:g}k" for b in budgets) + " |",
            "|---|" + "---|" * len(budgets)]
    for d in deadlines:
        rows.append(f"| {d:g} | " + " | ".join(fmt.format(value(cell[d, b])) if (d, b) in cell else ""
                                              for b in budgets) + " |")
    return "\n".join(rows)


def _pools_table(runs: list[Run], strategy: str, pools: Sequence[str], key: Callable[[Run], float],
                 label: str) -> str:
    chosen = sorted((r for r in runs if r.strategy == strategy), key=key)
    rows = [f"| {label} | " + " | ".join(pools) + " | all |", "|---|" + "---|" * (len(pools) + 1)]
    for r in chosen:
        rows.append(f"| {key(r):g} | " + " | ".join(str(r.jobs_per_pool.get(p, 0) or "") for p in pools)
                    + f" | {r.done_by_deadline} |")
    return "\n".join(rows)


def table_i(sc: Scenario) -> str:
    rows = ["| resource | PEs | MIPS | price (G$/PE s) | MIPS per G$ | manager | WWG equivalent | "
            "pool here: size, speed, price per CPU-hour |", "|---|---|---|---|---|---|---|---|"]
    for p in sc.pools:
        a = p.spec.attributes
        mips, price = float(a["mips"]), float(a["price"])
        rows.append(f"| {p.name} | {p.max_size} | {mips:g} | {price:g} | {mips / price:.2f} | {a['manager']} | "
                    f"{a['wwg']} | {p.max_size}, {p.speed.mean:g}, {p.spec.price_per_cpu_hour:g} |")
    return "\n".join(rows)


def section5_markdown(runs: list[Run], sc: Scenario) -> str:
    pools = [p.name for p in sc.pools]
    out = ["## Section 5: the GridSim study (Figures 4 to 8)", "", "Table I as simulated:", "", table_i(sc), ""]
    for strategy in STRATEGIES:
        tag = "a, c, e" if strategy == "cost" else "b, d, f"
        out += [f"### {strategy} (Figures 4{tag[0]}, 4{tag[3]}, 4{tag[6]})", "",
                "Jobs done by the deadline:", "", _grid(runs, strategy, lambda r: r.done_by_deadline), "",
                "Time used (s): when the last job done by the deadline ended:", "",
                _grid(runs, strategy, lambda r: r.time_used), "",
                "Budget spent (G$):", "", _grid(runs, strategy, lambda r: r.spent), ""]
    for fig, d in (("5(a)/(b)", SHORT), ("5(c)/(d)", LONG)):
        for strategy in STRATEGIES:
            sub = [r for r in runs if r.deadline == d]
            out += [f"Figure {fig}, {strategy}, deadline {d}: jobs done by the deadline per resource, by budget:", "",
                    _pools_table(sub, strategy, pools, lambda r: r.budget, "budget"), ""]
    for strategy in STRATEGIES:
        sub = [r for r in runs if r.budget == HIGH]
        out += [f"Figure 6, {strategy}, budget {HIGH:,}: jobs per resource, by deadline:", "",
                _pools_table(sub, strategy, pools, lambda r: r.deadline, "deadline"), ""]
    sub = {(r.strategy, r.deadline): r for r in runs if r.budget == HIGH}
    deadlines = sorted({d for _, d in sub})
    out += [f"Figures 7 and 8, budget {HIGH:,}: time used and budget spent by deadline:", "",
            "| deadline | " + " | ".join(f"time, {s}" for s in STRATEGIES) + " | "
            + " | ".join(f"spent, {s}" for s in STRATEGIES) + " |", "|---|" + "---|" * (2 * len(STRATEGIES))]
    for d in deadlines:
        cells = [f"{sub[s, d].time_used:.0f}" if (s, d) in sub else "" for s in STRATEGIES]
        cells += [f"{sub[s, d].spent:,.0f}" if (s, d) in sub else "" for s in STRATEGIES]
        out.append(f"| {d:g} | " + " | ".join(cells) + " |")
    over = [r for r in runs if r.spent > r.budget + 1e-6]
    out += ["", f"Runs that spent more than their budget: {len(over)} of {len(runs)}."]
    return "\n".join(out)


def _mean_sd(xs: Sequence[float]) -> str:
    if len(xs) < 2:
        return f"{xs[0]:.0f}" if xs else "-"
    return f"{statistics.fmean(xs):.0f} ± {statistics.stdev(xs):.0f}"


def _minutes(r: Run) -> float:
    return (r.makespan if r.makespan is not None else r.time_used) / 60


def section6_markdown(arms: dict[str, list[Run]], sc: Scenario,
                      sweep: dict[float, dict[str, list[Run]]] | None = None) -> str:
    pools = [p.name for p in sc.pools]
    paper = {COST6.name: PAPER6["cost"], COST_TIME6.name: PAPER6["cost-time"]}
    testbed = {a.name: a.testbed for a in ARMS}
    out = ["## Section 6: the Nimrod-G run (Table III, Figures 10 and 11)", "",
           "| arm | testbed | seeds | execution time (min) | budget consumed (G$) | jobs by the deadline | paper |",
           "|---|---|---|---|---|---|---|"]
    for name, runs in arms.items():
        times = [_minutes(r) for r in runs]
        p = paper.get(name)
        out.append(f"| {name} | {testbed.get(name, '')} | {len(runs)} | {_mean_sd(times)} "
                   f"({min(times):.0f}-{max(times):.0f}) | {_mean_sd([r.spent for r in runs])} | "
                   f"{min(r.done_by_deadline for r in runs)}-{max(r.done_by_deadline for r in runs)} | "
                   f"{'' if p is None else f'{p[0]:g} min, {p[1]:g} G$'} |")
    out += ["", "Jobs per machine (mean over the seeds):", "",
            "| arm | " + " | ".join(pools) + " |", "|---|" + "---|" * len(pools)]
    for name, runs in arms.items():
        out.append(f"| {name} | " + " | ".join(
            f"{statistics.fmean(r.jobs_per_pool.get(p, 0) for r in runs):.0f}" for p in pools) + " |")
    cost, ct = arms.get(COST6.name), arms.get(COST_TIME6.name)
    if cost and ct:
        tc, tt = statistics.fmean(map(_minutes, cost)), statistics.fmean(map(_minutes, ct))
        sc_, st = statistics.fmean(r.spent for r in cost), statistics.fmean(r.spent for r in ct)
        out += ["", f"Cost-time against cost: {tc / tt:.1f}x faster (paper {87 / 28:.1f}x), "
                f"{st / sc_:.2f}x the spend (paper {277 / 188:.2f}x)."]
    if sweep:
        out += ["", "The speed-up against the PBS clusters' queue waits (exponential, this mean; lem twice it; "
                "hpc76 and gnet01 as modelled):", "",
                "| PBS mean wait (min) | cost: min | cost: G$ | cost-time: min | cost-time: G$ | faster by | spend x |",
                "|---|---|---|---|---|---|---|"]
        for mean, by in sweep.items():
            c, t = by[COST6.name], by[COST_TIME6.name]
            tc, tt = statistics.fmean(map(_minutes, c)), statistics.fmean(map(_minutes, t))
            sc_, st = statistics.fmean(r.spent for r in c), statistics.fmean(r.spent for r in t)
            out.append(f"| {mean / 60:g} | {_mean_sd([_minutes(r) for r in c])} | {sc_:.0f} | "
                       f"{_mean_sd([_minutes(r) for r in t])} | {st:.0f} | {tc / tt:.1f}x | {st / sc_:.2f} |")
    return "\n".join(out)


# -- figures ----------------------------------------------------------------------------------------------


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure4(runs: list[Run], out: Path) -> Path:
    plt = _plt()
    deadlines = sorted({r.deadline for r in runs})
    fig, axes = plt.subplots(3, 2, figsize=(11, 11), dpi=100, sharex=True, sharey="row")
    cmap = plt.get_cmap("viridis")
    measures = (("jobs done by the deadline", lambda r: r.done_by_deadline),
                ("time used (s)", lambda r: r.time_used), ("budget spent (G$)", lambda r: r.spent))
    for col, strategy in enumerate(STRATEGIES):
        for row, (label, value) in enumerate(measures):
            ax = axes[row][col]
            for i, d in enumerate(deadlines):
                pts = sorted((r.budget, value(r)) for r in runs if r.strategy == strategy and r.deadline == d)
                ax.plot([b for b, _ in pts], [v for _, v in pts], marker=".",
                        color=cmap(i / max(1, len(deadlines) - 1)), label=f"deadline {d:g}")
            if row == 2:
                lim = sorted({r.budget for r in runs})
                ax.plot(lim, lim, color="grey", linestyle=":", linewidth=1, label="budget")
                ax.set_xlabel("budget (G$)")
            ax.set_ylabel(label)
            ax.set_title(f"Figure 4({'abcdef'[2 * row + col]}): {strategy}")
            ax.grid(alpha=0.3)
    axes[0][1].legend(fontsize="small", ncol=2)
    fig.tight_layout()
    path = out / "figure4.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def _heat(ax: Any, runs: list[Run], strategy: str, pools: Sequence[str], key: Callable[[Run], float],
          xlabel: str) -> None:
    chosen = sorted((r for r in runs if r.strategy == strategy), key=key)
    names = [*pools, "all"]
    data = [[r.jobs_per_pool.get(p, 0) for r in chosen] for p in pools] + [[r.done_by_deadline for r in chosen]]
    ax.imshow(data, aspect="auto", cmap="Blues", vmin=0, vmax=200)
    ax.set_yticks(range(len(names)), names)
    ax.set_xticks(range(len(chosen)), [f"{key(r) / 1000:g}k" if key(r) >= 1000 and xlabel.startswith("budget")
                                       else f"{key(r):g}" for r in chosen], fontsize="small")
    for y, row in enumerate(data):
        for x, v in enumerate(row):
            if v:
                ax.text(x, y, str(v), ha="center", va="center", fontsize=6, color="white" if v > 120 else "black")
    ax.set_xlabel(xlabel)


def figure5(runs: list[Run], pools: Sequence[str], out: Path) -> Path:
    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(13, 8), dpi=100)
    for row, d in enumerate((SHORT, LONG)):
        for col, strategy in enumerate(STRATEGIES):
            ax = axes[row][col]
            _heat(ax, [r for r in runs if r.deadline == d], strategy, pools, lambda r: r.budget, "budget (G$)")
            ax.set_title(f"Figure 5({'abcd'[2 * row + col]}): {strategy}, deadline {d}: jobs per resource")
    fig.tight_layout()
    path = out / "figure5.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def figure6(runs: list[Run], pools: Sequence[str], out: Path) -> Path:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), dpi=100)
    for col, strategy in enumerate(STRATEGIES):
        ax = axes[col]
        _heat(ax, [r for r in runs if r.budget == HIGH], strategy, pools, lambda r: r.deadline, "deadline")
        ax.set_title(f"Figure 6({'ab'[col]}): {strategy}, budget {HIGH:,}: jobs per resource")
    fig.tight_layout()
    path = out / "figure6.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def figure7_8(runs: list[Run], out: Path) -> list[Path]:
    plt = _plt()
    paths = []
    for name, label, value in (("figure7.png", "time used (s)", lambda r: r.time_used),
                               ("figure8.png", "budget spent (G$)", lambda r: r.spent)):
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
        for strategy, style in zip(STRATEGIES, ("-o", "-s"), strict=True):
            pts = sorted((r.deadline, value(r)) for r in runs if r.strategy == strategy and r.budget == HIGH)
            ax.plot([d for d, _ in pts], [v for _, v in pts], style, label=strategy)
        if name == "figure7.png":
            pts = sorted({r.deadline for r in runs})
            ax.plot(pts, pts, color="grey", linestyle=":", linewidth=1, label="deadline")
        ax.set_xlabel("deadline (s)")
        ax.set_ylabel(label)
        ax.set_title(f"Figure {name[6]}: {label.split(' (')[0]} by deadline, budget {HIGH:,} G$")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        paths.append(out / name)
        fig.savefig(paths[-1])
        plt.close(fig)
    return paths


def figure10_11(arms: dict[str, list[Run]], pools: Sequence[str], out: Path) -> Path:
    """Cumulative jobs completed per machine against time, the first seed of cost and of cost-time."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), dpi=100)
    for ax, (fig_no, name) in zip(axes, (("10", COST6.name), ("11", COST_TIME6.name)), strict=True):
        run = arms[name][0]
        for p in pools:
            times = [t / 60 for t, q in run.done_at if q == p]
            if times:
                ax.step([0.0, *times], range(len(times) + 1), where="post", label=f"{p} ({len(times)})")
        ax.set_xlabel("time (min)")
        ax.set_ylabel("jobs completed")
        ax.set_title(f"Figure {fig_no}: {name}, seed {run.seed}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    path = out / "figure10_11.png"
    fig.savefig(path)
    plt.close(fig)
    return path


# -- output -----------------------------------------------------------------------------------------------


def write_runs(runs: list[Run], pools: Sequence[str], stem: Path, arm: Callable[[Run], str] | None = None) -> None:
    rows = [({"arm": arm(r)} if arm else {}) | r.row(pools) for r in runs]
    with stem.with_suffix(".csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    full = [({"arm": arm(r)} if arm else {}) | {k: v for k, v in dataclasses.asdict(r).items() if k != "done_at"}
            for r in runs]
    stem.with_suffix(".json").write_text(json.dumps(full, indent=1) + "\n")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", choices=("5", "6", "both"), default="both")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per arm of Section 6 (default 5)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    if args.section in ("5", "both"):
        t0 = time.perf_counter()
        sc = wwg()
        pools = [p.name for p in sc.pools]
        runs = section5(progress=True)
        write_runs(runs, pools, out / "section5")
        figure4(runs, out)
        figure5(runs, pools, out)
        figure6(runs, pools, out)
        figure7_8(runs, out)
        parts.append(section5_markdown(runs, sc))
        print(f"section 5: {len(runs)} runs in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if args.section in ("6", "both"):
        t0 = time.perf_counter()
        sc = nimrod()
        pools = [p.name for p in sc.pools]
        arms = section6(args.seeds)
        sweep = pbs_sweep(args.seeds)
        names = {id(r): name for name, rs in arms.items() for r in rs}
        names |= {id(r): f"{name}, PBS waits {m / 60:g} min" for m, by in sweep.items() for name, rs in by.items()
                  for r in rs}
        every = [r for rs in arms.values() for r in rs] + [r for by in sweep.values() for rs in by.values() for r in rs]
        write_runs(every, pools, out / "section6", lambda r: names[id(r)])
        figure10_11(arms, pools, out)
        parts.append(section6_markdown(arms, sc, sweep))
        print(f"section 6: {len(every)} runs in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    head = ("# Buyya et al., SPE 2005, in gridbot's simulator: the tables\n\n"
            "Written by `experiments/economy/run.py`; README.md sets them beside the paper.\n")
    name = "economy.md" if args.section == "both" else f"section{args.section}.md"
    (out / name).write_text(head + "\n" + "\n\n".join(parts) + "\n")
    print(f"wrote {out / name}", file=sys.stderr)


if __name__ == "__main__":
    main()
