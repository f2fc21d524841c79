"""Reproduce ExPERT's Figures 9a, 9b and 10 (Agmon Ben-Yehuda et al., HPDC'11, section 6) with gridbot's
ExPERT core (`gridbot.schedulers.expert`) and write their tables and plots.

    .venv/bin/python experiments/expert/run.py                 # the paper's setup, 10 repetitions
    .venv/bin/python experiments/expert/run.py --reps 3 --out /tmp/expert

The paper's setup (sections 5-6): a bag of 150 tasks on 50 unreliable machines, T_ur = 2,066 s and
gamma = 0.827 (its Experiment 11, Tables 2 and 5), T_r = T_ur, C_ur = 1 cent/h (100 W at 10 cents/kWh),
C_r = 34 cents/h (EC2 m1.large) charged by the second; the strategy space N = 0..3,
Mr = 0.02..Mr_max (5 points), 0 <= T <= D <= 4 T_ur at 5 points each; a throughput phase without
replicas (T = D = 4 T_ur). Figure 9 is evaluated by the whole bag's makespan, Figure 10 by the tail's.

Runtimes: the paper's turnaround CDF of Experiment 11 (its Figure 6) is not published as data, so the
shape comes from the 2,200 measured `blastall` runtimes of WfCommons' makeflow BLAST instances on
Chameleon (wfcommons/WfInstances, LGPL-3.0; gridbot/sim/traces/task_runtimes.csv.gz, provenance in
gridbot/sim/traces/README.md), scaled so that their mean is the paper's T_ur. BLAST is a bioinformatics
bag like the paper's linkage analysis, but its runtimes are more skewed (coefficient of variation 1.44).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gridbot.schedulers.expert import (
    Characterization,
    Estimate,
    NTDMr,
    Plan,
    Prices,
    Setup,
    Utility,
    best,
    dominating,
    estimate,
    from_runtimes,
    pareto,
    sample_space,
    static_plans,
)
from gridbot.sim.traces import task_runtimes

HERE = Path(__file__).resolve().parent
TUR = 2066.0
"""Paper, Table 2: mean CPU time of successful instances on the unreliable pool, Experiment 11."""
GAMMA = 0.827
"""Paper, Table 5: average reliability of the unreliable pool, Experiment 11."""
TASKS, UNRELIABLE = 150, 50
PRICES = Prices(unreliable_per_hour=1.0, reliable_per_hour=34.0, charging_period=1.0)
MR_MAXES = (0.1, 0.3, 0.5)
MR_FIXED = (0.02, 0.06, 0.1, 0.2, 0.3, 0.4, 0.5)
"""Figure 10: seven frontiers, Mr = 0.02 ... 0.50."""
RECOMMENDED = NTDMr(3, TUR, 2 * TUR, 0.02)
"""The paper's "ExPERT recommended" (section 6.1), the knee of its Figure 9a frontier."""
STATIC = ("AR", "TRR", "TR", "AUR", "B", "CN∞", "CN1T0")

PAPER = (
    ("Figure 9a", "the frontier dominates every static strategy except AUR (the cheapest, by definition)"),
    ("ExPERT recommended (N=3, T=Tur, D=2Tur, Mr=0.02)",
     "15,640 s, 0.78 cent/task; cuts CN∞'s cost by 72% and its makespan by 33%"),
    ("AR", "around 70,000 s, 22 cent/task (off the plot)"),
    ("Figure 9b (makespan x cost)", "recommended 25% better than AUR (second best), 72-78% better than the others, "
     "orders of magnitude better than AR"),
    ("Figure 10", "the Mr = 0.02 frontier starts at a tail makespan over 5,500 s, 25% above what Mr >= 0.3 reaches; "
     "at equal makespan, lower Mr costs less"),
    ("runtime (section 6.4)", '"several minutes" to sample and analyze the space (Core 2 Duo P8400, 2.26 GHz)'),
)


@dataclass(frozen=True)
class Space:
    """One Mr_max: the sampled strategies and the static ones, estimated."""

    mr_max: float
    strategies: list[NTDMr]
    sampled: Estimate
    statics: list[Plan]
    static: Estimate

    @property
    def frontier(self) -> np.ndarray:
        return pareto(self.sampled.makespan, self.sampled.cost)

    def index(self, strategy: NTDMr) -> int:
        return self.strategies.index(strategy)

    def product(self, i: int | None = None, name: str | None = None) -> float:
        e, j = (self.sampled, i) if name is None else (self.static, [p.name for p in self.statics].index(name))
        assert j is not None
        return float(e.makespan[j] * e.cost[j])


@dataclass(frozen=True)
class Results:
    spaces: dict[float, Space]
    by_mr: dict[float, tuple[list[NTDMr], Estimate]]
    seconds: float
    strategies: int


def characterization() -> Characterization:
    runtimes = np.asarray(task_runtimes("blastall"))
    return from_runtimes(runtimes, GAMMA, scale=TUR / float(runtimes.mean()))


def run(reps: int = 10, seed: int = 0, out: Path | None = HERE / "results",
        mr_maxes: Sequence[float] = MR_MAXES) -> Results:
    char = characterization()
    setup = Setup(tasks=TASKS, unreliable=UNRELIABLE, prices=PRICES, bag=True)
    started, count = time.perf_counter(), 0
    spaces = {}
    for mr_max in mr_maxes:
        strategies = sample_space(char.tur, mr_max)
        statics = list(static_plans(char.tur, mr_max, TASKS).values())
        spaces[mr_max] = Space(mr_max, strategies, estimate(char, strategies, setup, reps, seed), statics,
                               estimate(char, statics, setup, reps, seed))
        count += len(strategies) + len(statics)
    by_mr = {}
    for mr in MR_FIXED:
        strategies = [NTDMr(s.n, s.t, s.d, mr) for s in sample_space(char.tur, mr, mr_points=1)]
        by_mr[mr] = (strategies, estimate(char, strategies, setup, reps, seed))
        count += len(strategies)
    results = Results(spaces, by_mr, time.perf_counter() - started, count)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "expert.md").write_text(report(results, reps, seed))
        plot(results, out)
    return results


# -- the report ---------------------------------------------------------------------------------------------------


def _pct(new: float, old: float) -> str:
    return f"{100 * (1 - new / old):.0f}%"


def report(r: Results, reps: int, seed: int) -> str:
    maxes = list(r.spaces)
    s = r.spaces[maxes[0]]
    e, st = s.sampled, s.static
    front = s.frontier
    rec = s.index(RECOMMENDED)
    cn = [p.name for p in s.statics].index("CN∞")
    pick = best(e.makespan, e.cost, Utility.product(), front)
    assert pick is not None
    lines = [
        "# ExPERT, Figures 9 and 10, reproduced with gridbot's ExPERT core",
        "",
        f"Generated by `experiments/expert/run.py` ({reps} repetitions per strategy, seed {seed}; {r.strategies} "
        f"strategies estimated in {r.seconds:.1f} s). Bag of {TASKS} tasks, {UNRELIABLE} unreliable machines, "
        f"T_ur = {TUR:,.0f} s, gamma = {GAMMA}, runtimes shaped like WfCommons' blastall (see run.py). Makespans "
        "in seconds, costs in cents per task.",
        "",
        "## The paper's figures",
        "",
        "| what | paper (Experiment 11 input) |",
        "|---|---|",
        *(f"| {what} | {says} |" for what, says in PAPER),
        "",
        f"## Figure 9a: static strategies against the frontier (Mr_max = {s.mr_max})",
        "",
        "| strategy | makespan | tail | cost | reliable instances | frontier points dominating it | "
        "best of them (makespan, cost saved) |",
        "|---|---|---|---|---|---|---|",
    ]
    for j, plan in enumerate(s.statics):
        dom = dominating(e.makespan, e.cost, (st.makespan[j], st.cost[j]))
        if dom.size:
            k = dom[np.argmin(e.makespan[dom] * e.cost[dom])]
            what = (f"{s.strategies[k].describe(TUR)}: {_pct(e.makespan[k], st.makespan[j])}, "
                    f"{_pct(e.cost[k], st.cost[j])}")
        else:
            what = "none"
        lines.append(f"| {plan.name} | {st.makespan[j]:,.0f} | {st.tail_makespan[j]:,.0f} | {st.cost[j]:.2f} | "
                     f"{st.reliable[j]:.1f} | {dom.size} | {what} |")
    lines += [
        "",
        "| ExPERT point | makespan | tail | cost | vs CN∞: makespan, cost saved |",
        "|---|---|---|---|---|",
        f"| paper's recommended, {RECOMMENDED.describe(TUR)} | {e.makespan[rec]:,.0f} | {e.tail_makespan[rec]:,.0f} "
        f"| {e.cost[rec]:.2f} | {_pct(e.makespan[rec], st.makespan[cn])}, {_pct(e.cost[rec], st.cost[cn])} "
        "(paper: 33%, 72%) |",
        f"| best makespan x cost on our frontier, {s.strategies[pick].describe(TUR)} | {e.makespan[pick]:,.0f} | "
        f"{e.tail_makespan[pick]:,.0f} | {e.cost[pick]:.2f} | {_pct(e.makespan[pick], st.makespan[cn])}, "
        f"{_pct(e.cost[pick], st.cost[cn])} |",
        "",
        f"The frontier ({len(front)} of {len(s.strategies)} sampled strategies; equal points listed once):",
        "",
        "| strategy | makespan | tail | cost |",
        "|---|---|---|---|",
    ]
    seen = set()
    for i in front:
        key = (round(e.makespan[i], 3), round(e.cost[i], 6))
        if key not in seen:
            seen.add(key)
            lines.append(f"| {s.strategies[i].describe(TUR)} | {e.makespan[i]:,.0f} | {e.tail_makespan[i]:,.0f} | "
                         f"{e.cost[i]:.3f} |")
    lines += ["", "## Figure 9b: makespan x cost (s x cent/task; lower is better)", "",
              "| strategy | " + " | ".join(f"Mr_max = {m}" for m in maxes) + " |",
              "|---|" + "---|" * len(maxes)]
    for name in STATIC:
        lines.append(f"| {name} | " + " | ".join(f"{r.spaces[m].product(name=name):,.0f}" for m in maxes) + " |")
    lines.append("| ExPERT recommended (paper's point) | "
                 + " | ".join(f"{r.spaces[m].product(r.spaces[m].index(RECOMMENDED)):,.0f}" for m in maxes) + " |")
    lines.append("| ExPERT's pick for makespan x cost | " + " | ".join(
        f"{_best_product(r.spaces[m])[1]:,.0f} ({r.spaces[m].strategies[_best_product(r.spaces[m])[0]].describe(TUR)})"
        for m in maxes) + " |")
    lines += ["", "| Mr_max | best static strategy (second best overall) | ExPERT's pick better than it by | "
              "paper's point better by | ExPERT's pick better than the others (but AR) by |", "|---|---|---|---|---|"]
    for m in maxes:
        sp = r.spaces[m]
        ranked = sorted(STATIC, key=lambda n: sp.product(name=n))
        pick_value = _best_product(sp)[1]
        rec_value = sp.product(sp.index(RECOMMENDED))
        others = [sp.product(name=n) for n in ranked[1:] if n != "AR"]
        lines.append(f"| {m} | {ranked[0]} | {_pct(pick_value, sp.product(name=ranked[0]))} | "
                     f"{_pct(rec_value, sp.product(name=ranked[0]))} | "
                     f"{_pct(pick_value, min(others))}-{_pct(pick_value, max(others))} |")
    lines += ["", "## Figure 10: frontiers at a fixed Mr (tail makespan)", "",
              "| Mr | frontier points | shortest tail makespan (its cost) | cheapest (its tail makespan) | "
              "cost at the Mr = 0.02 frontier's shortest tail |", "|---|---|---|---|---|"]
    shortest_002 = _shortest(r.by_mr[0.02][1])
    for mr in MR_FIXED:
        _, est = r.by_mr[mr]
        f = pareto(est.tail_makespan, est.cost)
        fast = f[np.argmin(est.tail_makespan[f])]
        cheap = f[np.argmin(est.cost[f])]
        within = f[est.tail_makespan[f] <= shortest_002]
        at = f"{est.cost[within].min():.3f}" if within.size else "-"
        lines.append(f"| {mr} | {len(f)} | {est.tail_makespan[fast]:,.0f} ({est.cost[fast]:.2f}) | "
                     f"{est.cost[cheap]:.3f} ({est.tail_makespan[cheap]:,.0f}) | {at} |")
    lines += ["", "Plots: [figure9a.png](figure9a.png), [figure9b.png](figure9b.png), [figure10.png](figure10.png). "
              "What reproduces and what does not: [../README.md](../README.md).", ""]
    return "\n".join(lines)


def _best_product(space: Space) -> tuple[int, float]:
    e = space.sampled
    i = best(e.makespan, e.cost, Utility.product(), space.frontier)
    assert i is not None
    return i, float(e.makespan[i] * e.cost[i])


def _shortest(est: Estimate) -> float:
    return float(est.tail_makespan.min())


# -- the plots ----------------------------------------------------------------------------------------------------


def plot(r: Results, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    maxes = list(r.spaces)
    s = r.spaces[maxes[0]]
    e, st = s.sampled, s.static
    front = s.frontier
    fig, ax = plt.subplots(figsize=(7, 5))
    ax.scatter(e.makespan, e.cost, s=6, c="0.75", label="sampled NTDMr strategies")
    ax.plot(e.makespan[front], e.cost[front], "-o", ms=3, c="tab:blue", label="Pareto frontier")
    for j, plan in enumerate(s.statics):
        if plan.name == "AR":
            continue
        ax.scatter(st.makespan[j], st.cost[j], marker="s", s=30, c="tab:red")
        ax.annotate(plan.name, (st.makespan[j], st.cost[j]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    rec = s.index(RECOMMENDED)
    ax.scatter(e.makespan[rec], e.cost[rec], marker="*", s=140, c="tab:green", label="paper's ExPERT recommended")
    ax.set_xlabel("bag makespan [s]")
    ax.set_ylabel("cost [cent/task]")
    ax.set_title(f"Figure 9a: static strategies vs the frontier (Mr_max = {s.mr_max}; AR off the plot)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "figure9a.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = [*STATIC, "recommended", "ExPERT pick"]
    width = 0.8 / len(maxes)
    for k, m in enumerate(maxes):
        sp = r.spaces[m]
        values = [sp.product(name=n) for n in STATIC] + [sp.product(sp.index(RECOMMENDED)), _best_product(sp)[1]]
        ax.bar(np.arange(len(names)) + k * width, values, width, label=f"Mr_max = {m}")
    ax.set_xticks(np.arange(len(names)) + width, names, fontsize=8, rotation=20)
    ax.set_yscale("log")
    ax.set_ylabel("makespan x cost [s x cent/task]")
    ax.set_title("Figure 9b: makespan x cost, lower is better")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "figure9b.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 5))
    for mr in MR_FIXED:
        _, est = r.by_mr[mr]
        f = pareto(est.tail_makespan, est.cost)
        ax.plot(est.tail_makespan[f], est.cost[f], "-o", ms=3, label=f"Mr = {mr}")
    ax.set_xlabel("tail makespan [s]")
    ax.set_ylabel("cost [cent/task]")
    ax.set_title("Figure 10: Pareto frontiers at a fixed Mr")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "figure10.png", dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=10, help="repetitions per strategy (paper: 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    results = run(args.reps, args.seed, args.out)
    print(f"{results.strategies} strategies x {args.reps} repetitions in {results.seconds:.1f} s; "
          f"wrote {args.out / 'expert.md'}")


if __name__ == "__main__":
    main()
