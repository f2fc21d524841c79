"""`gridbot plan`: ExPERT's frontier for a running bag (or a scenario's bag before it runs), computed here.

The server sends what it saw of the bag (`GET /v1/bags/{bag}/history`: its instances, the tasks left, the
pools and their prices); this process characterizes, estimates and chooses with the very code
`tail = "expert"` runs at T_tail (`gridbot.schedulers.expert.planner`), so the server's loop never waits
for it. The paper's static strategies are estimated on the same tail and placed against the frontier,
and the best strategy is marked for each of the utilities of the paper's Figure 8 and the user's.
"""

from __future__ import annotations

import io
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gridbot import history
from gridbot.cli.outfile import refuse_not_regular, write_user_file
from gridbot.errors import GridbotError, unwritable
from gridbot.model.spec import StrategyChoice
from gridbot.protocol import BagHistory, PlanInput
from gridbot.schedulers.expert.characterize import Characterization, CharacterizationError, from_runtimes
from gridbot.schedulers.expert.frontier import FINITE_FIX, best, dominating, utility
from gridbot.schedulers.expert.planner import (
    Observed,
    Planning,
    PoolFacts,
    Settings,
    offline,
    plan,
    plan_with,
    pool_price,
    statics,
)
from gridbot.schedulers.expert.tail import ExpertTail


@dataclass(frozen=True)
class Report:
    """A planning, the static strategies on the same tail, and the best strategy for each utility."""

    title: str
    planning: Planning
    statics: dict[str, tuple[float, float]]
    bests: dict[str, int | None]
    """Utility name -> index into the planning's space (None: no strategy meets its bound)."""


def settings(choice: StrategyChoice, chosen_utility: str | None) -> Settings:
    """The planner's settings: the bag's expert options when its tail is ExPERT's, with `chosen_utility`."""
    given = {**ExpertTail.options, **(choice.options if choice.tail == ExpertTail.name else {})}

    def price(key: str) -> float | None:
        value = float(given[key])
        return None if value < 0 else value

    return Settings(chosen_utility or str(given["utility"]), float(given["mr_max"]), int(given["repetitions"]),
                    price("price_unreliable"), price("price_reliable"), price("charging_period"),
                    int(given["min_results"]), reliable_runtime=price("reliable_runtime") or None)


def chosen_utility(name: str | None, budget: float | None, deadline: float | None) -> str | None:
    given = [u for u in (name, None if budget is None else f"budget:{budget:g}",
                         None if deadline is None else f"deadline:{deadline:g}") if u is not None]
    if len(given) > 1:
        raise GridbotError("give one of --utility, --budget and --deadline")
    return given[0] if given else None


def report(title: str, planning: Planning, budget: float | None, mr_max: float) -> Report:
    est = planning.estimate
    bests: dict[str, int | None] = {}
    for name in ("makespan", "cost", "product"):
        u = utility(name)
        bests[u.name] = best(est.tail_makespan, est.cost, u, planning.frontier)
    bests[planning.utility.name] = planning.chosen
    return Report(title, planning, statics(planning, mr_max, budget), bests)


@dataclass(frozen=True)
class Previous:
    """A run that is over, to characterize the pools from offline: a previous bag or a history file."""

    rows: list[history.HistoryRow]
    name: str
    """For people: "bag NAME", "history FILE"."""
    deadline: float | None = None
    """Its instance deadline (None: the planned bag's)."""
    reliable: frozenset[str] | None = None
    """Its reliable pools (None: the planned bag's, as the server or the scenario says)."""


def read_history(path: Path) -> Previous:
    """A history file (`gridbot.history`: CSV or JSON lines of sent_at, ended_at, success,
    pool), or GridbotError naming the line."""
    try:
        text = path.read_text()
    except OSError as e:
        raise GridbotError(f"cannot read history {path}: {e.strerror}") from e
    except UnicodeDecodeError:
        raise GridbotError(f"history {path} is not text: write CSV or JSON lines of "
                           f"{', '.join(history.COLUMNS)}") from None
    return Previous(history.parse(text, str(path)), f"history {path.name}")


def previous_bag(found: BagHistory) -> Previous:
    """A previous bag's instances, as the server sent them (`Client.bag_history`)."""
    rows = [history.HistoryRow(sent, ended, ok, pool) for sent, ended, ok, pool in found.instances]
    if not rows:
        raise GridbotError(f"bag {found.bag} has no instance to characterize the pools from")
    return Previous(rows, f"bag {found.bag}", found.instance_deadline, frozenset(found.reliable_pools))


def characterized(previous: Previous, observed: Observed, chosen: Settings) -> tuple[Characterization, str, int]:
    """ExPERT's offline characterization (gamma fully known) from a run that is over, for the bag `observed`."""
    reliable = previous.reliable if previous.reliable is not None else frozenset(
        p.name for p in observed.pools if p.reliable)
    deadline = previous.deadline if previous.deadline is not None else observed.throughput_deadline
    try:
        return offline(history.records(previous.rows, reliable), deadline, chosen, previous.name)
    except CharacterizationError as e:
        raise GridbotError(f"{previous.name}: {e}") from None


def for_bag(given: PlanInput, name: str | None, budget: float | None, deadline: float | None,
            previous: Previous | None = None) -> Report:
    """The frontier for a running bag, characterized from its own instances (online), or offline from a
    `previous` run (a bag that is over, a history file) with the bag's tasks left and instances out."""
    chosen = settings(given.strategy, chosen_utility(name, budget, deadline))
    if previous is None:
        planning = plan(given.observed, chosen)
    else:
        char, source, known = characterized(previous, given.observed, chosen)
        planning = plan_with(char, source, given.observed, chosen, known)
    return report(f"bag {given.bag}", planning, budget, chosen.mr_max)


def for_scenario(path: Path, bag_name: str | None, name: str | None, budget: float | None,
                 deadline: float | None, previous: Previous | None = None) -> Report:
    """A scenario's bag before it runs: an offline characterization from its runtime distribution and its
    pools' model (success = no failure, no black hole, no preemption during the run), or from a `previous`
    run, for the whole bag."""
    from gridbot.cli.simulate import load_scenario

    sc = load_scenario(path)
    bags = [b for b in sc.bags if bag_name is None or b.name == bag_name]
    if not bags:
        raise GridbotError(f"scenario {path} has no bag {bag_name!r}; its bags: {', '.join(b.name for b in sc.bags)}")
    bag = bags[0]
    reliable = {p.name for p in sc.pools if p.name in sc.dispatch.reliable_pools
                or (not sc.dispatch.reliable_pools and p.spec.reliability == "reliable")}
    if len(reliable) == len(sc.pools):  # the estimate would invent an unreliable pool, its size and its price
        raise GridbotError(f"scenario {path} has no unreliable pool (reliable: {', '.join(sorted(reliable))}): "
                           "ExPERT plans the tail of a bag sent to unreliable pools, reliable ones backing them; "
                           'mark a pool reliability = "unreliable" (a grid, volunteers)')
    facts = tuple(PoolFacts(p.name, p.name in reliable,
                            *pool_price(p.spec.price_per_cpu_hour, p.spec.price_per_pilot_hour, p.spec.cpus,
                                        p.spec.charging_period),
                            p.max_size * p.spec.cpus, p.max_size * p.spec.cpus, p.queue_wait.mean) for p in sc.pools)
    chosen = settings(bag.strategy, chosen_utility(name, budget, deadline))
    observed = Observed(0.0, (), (), (), bag.jobs, facts, bag.instance_deadline, tick=sc.tick)
    if previous is None:
        char = _offline(sc.pools, reliable, bag.runtime, sc.seed)
        source = f"offline from the scenario: runtimes {bag.runtime.describe}, success {char.gamma_future:.2f}"
        known = 0
    else:
        char, source, known = characterized(previous, observed, chosen)
    planning = plan_with(char, source, observed, chosen, known)
    return report(f"bag {bag.name} of {path.name} (before it runs)", planning, budget, chosen.mr_max)


def _offline(pools: list[Any], reliable: set[str], runtime: Any, seed: int, draws: int = 2000) -> Characterization:
    rng = random.Random(seed)
    unreliable = [p for p in pools if p.name not in reliable] or pools
    weights = [max(1, p.max_size * p.spec.cpus) for p in unreliable]
    lives = {p.name: [p.preemption.sample(rng) for _ in range(500)] for p in unreliable if p.preemption is not None}
    turnarounds, good = [], 0.0
    for _ in range(draws):
        p = rng.choices(unreliable, weights)[0]
        took = runtime.sample(rng) / max(1e-3, p.speed.sample(rng))
        took /= min(1.0, max(1e-3, p.turnaround_ratio.sample(rng)))
        survives = rng.random() >= p.failure_rate and rng.random() >= p.black_holes
        if p.name in lives:  # a pilot met at a random moment of its life outlives the run (residual life)
            life = lives[p.name]
            survives = survives and rng.random() < sum(max(0.0, x - took) for x in life) / max(1e-9, sum(life))
        turnarounds.append(took)
        good += survives
    fast = [p for p in pools if p.name in reliable]
    speed = sum(p.speed.mean for p in fast) / len(fast) if fast else 1.0
    reliable_runs = [runtime.sample(rng) / max(1e-3, speed) for _ in range(200)]
    return from_runtimes(turnarounds, max(0.05, good / draws), reliable_runs)


# -- what is shown ----------------------------------------------------------------------------------------


def as_dict(r: Report) -> dict[str, Any]:
    p = r.planning
    est = p.estimate

    def point(i: int) -> dict[str, Any]:
        m, c = p.point(i)
        s = p.space[i]
        return {"strategy": p.describe(s), "n": s.n, "t": s.t, "d": s.d, "mr": s.mr,
                "reliable_machines": max(1, s.reliable_machines(p.unreliable)) if s.mr > 0 else 0,
                "tail_makespan": _finite(m), "cost": c}

    return {
        "title": r.title, "characterization": p.source, "tur": p.char.tur, "tr": p.char.tr,
        "gamma": p.char.gamma_future, "unreliable": p.unreliable, "reliable_capacity": p.reliable_capacity,
        "prices": {"unreliable_per_hour": p.prices.unreliable_per_hour, "reliable_per_hour": p.prices.reliable_per_hour,
                   "charging_period": p.prices.charging_period},
        "tasks": p.observed.tasks, "simulated_tasks": p.setup.tasks, "whole_bag": p.setup.bag,
        "repetitions": int(est.runs_cost.shape[1]), "sampled": len(p.space), "utility": p.utility.name,
        "chosen": {**point(p.chosen), **_predicted(p), "tail_makespan_error": p.error[0], "cost_error": p.error[1],
                   **_ranges(p)}
        if p.chosen is not None else None,
        "frontier": [point(i) for i in p.distinct_frontier()],
        "statics": {name: {"tail_makespan": _finite(m), "cost": c,
                           "dominated_by": _against(p, (m, c))[0], "dominates": _against(p, (m, c))[1]}
                    for name, (m, c) in r.statics.items()},
        "bests": {name: (point(i) if i is not None else None) for name, i in r.bests.items()},
    }


def _predicted(p: Planning) -> dict[str, Any]:
    m, c = p.prediction()
    return {"tail_makespan": _finite(m), "cost": c}


def _against(p: Planning, point: tuple[float, float]) -> tuple[int, int]:
    """How many of the frontier's distinct points dominate `point`, and how many it dominates (a static strategy
    outside ExPERT's sampled space may beat it: the planner then says so rather than hide it)."""
    front = p.distinct_frontier()
    m, c = p.estimate.tail_makespan[front], p.estimate.cost[front]
    beats = sum(1 for fm, fc in zip(m, c, strict=True) if len(dominating([point[0]], [point[1]], (fm, fc))))
    return len(dominating(m, c, point)), beats


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _ranges(p: Planning) -> dict[str, Any]:
    """The range of the chosen strategy's simulated tails (`planner.spread_range`); JSON has no inf."""
    if p.ranges is None:
        return {}
    (m_lo, m_hi), (c_lo, c_hi) = p.ranges
    return {"tail_makespan_range": [_finite(m_lo), _finite(m_hi)], "cost_range": [c_lo, c_hi],
            "range_share": p.range_share}


def show(r: Report) -> None:
    from gridbot.cli import render

    p = r.planning
    out = render.console.print
    where = "the rest of the bag (throughput phase, then the tail)" if p.setup.bag else "the tail"
    out(f"[bold]{r.title}[/]: ExPERT's frontier for {where}", soft_wrap=True)
    out(f"  characterization: {p.source}; T_ur {render.duration(p.char.tur)}, T_r {render.duration(p.char.tr)}",
        soft_wrap=True, markup=False)
    out(f"  {p.observed.tasks:,} tasks left on #ur = {p.unreliable} unreliable slots, reliable capacity "
        f"{p.reliable_capacity}; prices per CPU hour {p.prices.unreliable_per_hour:g} (unreliable), "
        f"{p.prices.reliable_per_hour:g} (reliable, by {p.prices.charging_period:g} s)", soft_wrap=True)
    scaled = f", simulated as {p.setup.tasks} tasks on {p.setup.unreliable} slots" if p.scale < 1 else ""
    out(f"  {len(p.space)} strategies sampled x {p.estimate.runs_cost.shape[1]} repetitions{scaled}", soft_wrap=True)
    marks: dict[int, list[str]] = {}
    for name, i in r.bests.items():
        if i is not None:
            marks.setdefault(i, []).append(name)
    table = render._table("STRATEGY", "TAIL MAKESPAN", "COST/TASK", "BEST FOR", right=("TAIL MAKESPAN", "COST/TASK"))
    for i in p.distinct_frontier():
        m, c = p.point(i)
        tied = [k for k in marks if p.point(k) == (m, c)]
        table.add_row(p.describe(p.space[i]), render.duration(m), f"{c:.4g}",
                      ", ".join(n for k in tied for n in marks[k]))
    out(table)
    statics = render._table("STATIC", "TAIL MAKESPAN", "COST/TASK", "DOMINATED BY", right=("TAIL MAKESPAN",
                                                                                          "COST/TASK", "DOMINATED BY"))
    points = len(p.distinct_frontier())
    for name, (m, c) in r.statics.items():
        beaten, beats = _against(p, (m, c))
        statics.add_row(name, render.duration(m) if math.isfinite(m) else "never", f"{c:.4g}",
                        f"{beaten} of the frontier's {points} points" if beaten else
                        f"none: it beats {beats} of the frontier's {points} points" if beats else
                        "none: on the frontier")
    out(statics)
    if p.chosen is None:
        why = p.unchosen(render.duration)
        if not p.distinct_frontier():
            out(why, soft_wrap=True)
        elif not p.utility.bounded:
            out(f"{why}; the table above shows their tail makespans and costs; {FINITE_FIX}", soft_wrap=True)
        else:
            out(f"{why}; give a looser --deadline or --budget", soft_wrap=True)
    else:
        m, c = p.prediction()
        ms, cs = p.error
        within = ""
        if p.ranges is not None:
            (m_lo, m_hi), (c_lo, c_hi) = p.ranges
            within = (f" ({render.share(p.range_share)} of simulated tails: {render.span(m_lo)} to "
                      f"{render.span(m_hi)}, cost {c_lo:.4g} to "
                      f"{c_hi:.4g} per task)")
        out(f"best for {p.utility.name}: [bold]{p.describe(p.space[p.chosen])}[/] (T and D in units of T_ur = "
            f"{p.char.tur:.0f} s): tail {render.duration(m)} ± {render.duration(ms)}, cost {c:.4g} ± {cs:.2g} per "
            f"task{within}", soft_wrap=True)
        import numpy as np

        if not math.isfinite(float(np.asarray(p.utility.score(np.array([m]), np.array([c]))).ravel()[0])):
            sm, sc = p.point(p.chosen)
            out(f"on the whole tail its estimate is outside '{p.utility.name}', which the sampled estimate "
                f"({render.duration(sm)}, {sc:.4g} per task) kept: the bound is at the edge of what these pools "
                "can do" if p.utility.bounded else
                f"on the whole tail '{p.utility.name}' is not a finite number for its estimate, though it is for the "
                f"sampled estimate ({render.duration(sm)}, {sc:.4g} per task); {FINITE_FIX}", soft_wrap=True)
        ahead = [name for name, point in r.statics.items()
                 if len(dominating([point[0]], [point[1]], p.point(p.chosen)))]
        if ahead:
            out(f"{', '.join(ahead)} beat{'s' if len(ahead) == 1 else ''} it here: a static strategy, outside "
                "ExPERT's space of tail strategies (N, T, D, Mr), which `--apply` cannot choose", soft_wrap=True)


def plot_format(path: Path) -> str:
    """The format `--plot path` is written in: its suffix's (png, pdf, svg, ...), PNG without one; a
    GridbotError for a path with no file name, one taken by something not a regular file (a link, a pipe,
    a device: the plot is renamed over it), or a suffix matplotlib cannot write. `gridbot plan` asks
    before it plans, so a wrong name fails at once and not after the work (or after --apply)."""
    from matplotlib.backend_bases import FigureCanvasBase

    if not path.name or path.name in (".", ".."):
        raise GridbotError(f"--plot {str(path)!r} names no file; give the image to write, such as frontier.png")
    refuse_not_regular(path, "--plot", "the plot", "frontier.png")
    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = path.suffix[1:].lower() or "png"
    if suffix not in formats:
        raise GridbotError(f"--plot {path}: cannot write a .{suffix} image; end the name with one of "
                           f"{', '.join('.' + f for f in sorted(formats))}")
    return suffix


def write_plot(r: Report, path: Path) -> None:
    """The frontier, the sampled strategies, the static ones and the bests, as the paper's Figures 8 and 9a;
    a GridbotError naming the path if it cannot be written."""

    kind = plot_format(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    p = r.planning
    est = p.estimate
    m, c = est.tail_makespan, est.cost
    ok = np.isfinite(m)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    ax.scatter(m[ok], c[ok], s=8, color="0.75", label="sampled NTDMr strategies")
    front = p.distinct_frontier()
    ax.plot(m[front], c[front], "-o", color="tab:blue", markersize=4, label="Pareto frontier")
    for name, (sm, sc) in r.statics.items():
        if math.isfinite(sm):
            ax.scatter([sm], [sc], marker="s", color="tab:red", s=30)
            ax.annotate(name, (sm, sc), textcoords="offset points", xytext=(4, 4), fontsize=8, color="tab:red")
    shapes = ["*", "^", "v", "D", "P", "X"]
    for k, (name, i) in enumerate(r.bests.items()):
        if i is not None:
            ax.scatter([m[i]], [c[i]], marker=shapes[k % len(shapes)], s=120, zorder=5,
                       label=f"best for {name}: {p.describe(p.space[i])}")
    ax.set_xlabel("tail makespan [s]")
    ax.set_ylabel("cost per task")
    ax.set_title(f"{r.title}: ExPERT frontier", fontsize=10)
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    image = io.BytesIO()
    try:
        fig.savefig(image, format=kind)
    finally:
        plt.close(fig)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise unwritable(path, e, "the plot", "give --plot a file in a folder you may write") from None
    write_user_file(path, image.getvalue(), "--plot", "the plot", "frontier.png")


def apply_choice(current: StrategyChoice, chosen: str) -> StrategyChoice:
    """`tail = "expert"` with `utility = chosen`, keeping the placement and the options it or ExPERT takes."""
    from gridbot.schedulers.registry import PLACEMENTS

    placement = PLACEMENTS.get(current.placement)
    takes = {*ExpertTail.options, *(placement.options if placement is not None else {})}
    options = {k: v for k, v in current.options.items() if k in takes}
    return StrategyChoice(ExpertTail.name, current.placement, {**options, "utility": chosen})
