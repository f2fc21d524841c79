"""The pictures of a run, as the paper draws them: incomplete jobs over time per bag (Figures 5, 6a, 9a)
and results per hour per pool over time (Figure 6b). PNG files, written with matplotlib's Agg backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gridbot.sim.metrics import Results

MANY_BAGS = 12
"""Past this many bags a run's lines are drawn thinner and without a legend."""


def _hours(times: list[float]) -> list[float]:
    return [t / 3600.0 for t in times]


def draw_incomplete(ax: Any, results: Results, label: str | None = None) -> bool:
    """Each bag's incomplete jobs over time (hours) on the matplotlib axes `ax`, a line a bag named after it, or
    after `label` (a run of one bag among others'); True if the lines are named (False past MANY_BAGS bags)."""
    hours = _hours(results.times)
    many = len(results.incomplete) > MANY_BAGS
    for name, series in results.incomplete.items():
        xs = [h for h, v in zip(hours, series, strict=True) if v is not None]
        ys = [v for v in series if v is not None]
        ax.plot(xs, ys, linewidth=0.8 if many else 1.5, label=label if label is not None else None if many else name)
    return not many


def write_plots(results: Results, out: Path) -> list[Path]:
    """Write incomplete.png and throughput.png into `out`; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    hours = _hours(results.times)
    paths = []

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    named = draw_incomplete(ax, results)
    ax.set_xlabel("time (hours)")
    ax.set_ylabel("incomplete jobs")
    ax.set_title(f"Incomplete jobs over time — {Path(results.scenario).name}, seed {results.seed}")
    ax.grid(alpha=0.3)
    if named and results.incomplete:
        ax.legend(fontsize="small")
    fig.tight_layout()
    paths.append(out / "incomplete.png")
    fig.savefig(paths[-1])
    plt.close(fig)

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), dpi=110, sharex=True)
    for name, rate in results.throughput.items():
        top.plot(hours, rate, linewidth=1.2, label=name)
        bottom.plot(hours, results.pilots[name], linewidth=1.2, label=name)
    top.set_ylabel("results per hour")
    top.set_title("Throughput per pool")
    bottom.set_ylabel("pilots (hosts) running")
    bottom.set_xlabel("time (hours)")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    paths.append(out / "throughput.png")
    fig.savefig(paths[-1])
    plt.close(fig)
    return paths
