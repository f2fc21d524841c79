"""`gridbot simulate`: run a scenario in the simulator, print its table, write metrics and plots."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gridbot.cli.render import width_for
from gridbot.errors import GridbotError
from gridbot.sim.engine import simulate
from gridbot.sim.metrics import Results
from gridbot.sim.plots import write_plots
from gridbot.sim.scenario import Scenario, parse_scenario, scaled


def load_scenario(path: Path) -> Scenario:
    """Read and validate a scenario file (SpecError lists every problem; GridbotError if unreadable)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise GridbotError(f"cannot read scenario {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise GridbotError(f"{path} is not a text file; a scenario is TOML (see docs/simulation.md)") from None
    sc = parse_scenario(text, str(path))
    if not sc.bags:  # it would simulate its pools to the horizon for nothing, and say nothing
        raise GridbotError(f"scenario {path} has no bag to run: its [bags] table is empty, or its [swf_bags] replay "
                           "no job (look at their skip, count and filters); add [bags.NAME] with jobs and runtime")
    return sc


def _hours(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.2f} h"


def render(results: Results, console: Console) -> None:
    """The per-bag and per-pool tables a person reads first."""
    bags = Table(title=f"Bags (seed {results.seed}, simulated {_hours(results.end)}, {results.events:,} events)")
    for col in ("bag", "state", "jobs", "makespan", "tail", "replicas %", "waste %", "discarded %"):
        bags.add_column(col, justify="left" if col in ("bag", "state") else "right")
    for b in results.bags:
        bags.add_row(b.name, b.state, f"{b.jobs:,}", _hours(b.makespan), _hours(b.tail_makespan),
                     f"{b.replicas_pct:g}", f"{b.waste_pct:g}", f"{b.discarded_pct:g}")
    console.print(bags)
    pools = Table(title="Pools")
    for col in ("pool", "peak pilots", "instances", "results kept", "share %", "failed", "lost"):
        pools.add_column(col, justify="left" if col == "pool" else "right")
    for p in results.pools:
        pools.add_row(p.name, f"{p.pilots_peak:,}", f"{p.instances:,}", f"{p.done:,}", f"{p.throughput_share_pct:g}",
                      f"{p.failed:,}", f"{p.lost:,}")
    console.print(pools)


def run_simulation(path: Path, seed: int | None, out: Path | None, quiet: bool, as_json: bool,
                   plots: bool, scale: float = 1.0) -> Results:
    scenario = load_scenario(path)
    if scale != 1.0:
        scenario = scaled(scenario, scale)
    if out is not None:  # before the run, which may be long: a folder we cannot write fails now
        try:
            out.mkdir(parents=True, exist_ok=True)
            probe = out / ".gridbot-write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise GridbotError(f"cannot write the results to {out}: {e.strerror or e}; choose another --out") \
                from None
    console = Console(stderr=True, width=width_for(sys.stderr) if sys.stderr.isatty() else None)
    if not quiet:  # allowed, but probably not what was meant (jobs of a replayed log that cannot finish)
        for warning in scenario.warnings:
            console.print(f"warning: {warning.format(scenario.source)}", markup=False, highlight=False, soft_wrap=True)
    progress = Progress(TextColumn("simulating"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,} jobs"),
                        TextColumn("sim time {task.fields[sim]}"), TimeElapsedColumn(), console=console,
                        disable=quiet or as_json or not console.is_terminal)
    total = sum(b.jobs for b in scenario.bags)
    with progress:
        task = progress.add_task("sim", total=total, sim="0 h")

        def report(now: float, ended: int, _total: int) -> None:
            progress.update(task, completed=ended, sim=_hours(now))

        results = simulate(scenario, seed, report)
    if out is not None:
        results.write(out)
        if plots:
            write_plots(results, out)
    if as_json:
        print(json.dumps(results.to_json()))
    elif not quiet:
        stdout = Console(width=width_for(sys.stdout))
        if not stdout.is_terminal:
            stdout = Console(width=120)
        render(results, stdout)
        for bag in results.bags:  # as `gridbot status` would show them on a server
            for note in bag.diagnostics:
                console.print(f"bag {bag.name!r}: {note}", markup=False, highlight=False, soft_wrap=True)
        if out is not None:
            stdout.print(f"metrics and plots in {out}/ (metrics.json, incomplete.png, throughput.png)")
    return results
