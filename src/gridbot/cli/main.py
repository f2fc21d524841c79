"""The `gridbot` command: run a bag here, or run the server, workers and submissions apart.

Exit codes: 0 all went well; 1 a job failed for good or something broke; 2 the input was wrong
(spec, option, unknown bag); 130 interrupted.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from gridbot.cli import render
from gridbot.client import DEFAULT_SERVER, ApiError, Client, load_lines_file, load_spec_file, with_policies
from gridbot.errors import GridbotError, ServerUnavailable
from gridbot.model.spec import DEFAULT_MAX_JOBS, SpecError

F = TypeVar("F", bound=Callable[..., Any])
server_option = click.option("--server", envvar="GRIDBOT_SERVER", default=DEFAULT_SERVER, show_default=True,
                             help="URL of the gridbot server (or set GRIDBOT_SERVER).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
policy_option = click.option("--policy", "policies", multiple=True, metavar="NAME=EXPRESSION",
                              help="Set a ClassAd policy of the bag (repeatable); wins over the spec's [policy].")
max_jobs_option = click.option("--max-jobs", type=click.IntRange(1), default=DEFAULT_MAX_JOBS, show_default=True,
                               help="Refuse bags with more jobs than this.")


def friendly(fn: F) -> F:
    """Turn gridbot's errors into a message and an exit code instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SpecError as e:
            render.err_console.print(f"[bold red]error:[/] {e.source} has {len(e.problems)} problem(s):", markup=True,
                                     soft_wrap=True)
            render.err_console.print(str(e), markup=False, soft_wrap=True)
            sys.exit(2)
        except ApiError as e:
            render.err_console.print(f"[bold red]error:[/] {e}", markup=True, soft_wrap=True)
            sys.exit(2)
        except ServerUnavailable as e:
            render.err_console.print(f"[bold red]error:[/] {e}", soft_wrap=True)
            sys.exit(1)
        except GridbotError as e:
            render.err_console.print(f"[bold red]error:[/] {e}", soft_wrap=True)
            sys.exit(2)

    return wrapper  # type: ignore[return-value]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="gridbot")
@click.option("--log-level", default=os.environ.get("GRIDBOT_LOG_LEVEL", "warning"),
              type=click.Choice(["debug", "info", "warning", "error"]), help="How much the log says (stderr).")
def cli(log_level: str) -> None:
    """gridbot runs bags of tasks (parameter sweeps, one job per line) on every pool you can reach."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")


@cli.command()
@click.argument("spec", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--each-line", type=click.Path(dir_okay=False, path_type=Path),
              help="Run one job per line of FILE, each line a shell command (no spec needed).")
@click.option("--workers", type=click.IntRange(1), default=os.cpu_count() or 1, show_default=True,
              help="Local worker processes to start.")
@click.option("--db", default="sqlite:///.gridbot/gridbot.db", show_default=True,
              help="Store to keep the bag in; run again on the same store to resume.")
@click.option("--results", "results_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the results [default: results/<bag name>].")
@click.option("--name", help="Bag name [default: the spec's name, or the file's stem].")
@max_jobs_option
@policy_option
@click.option("--max-result-size", default="16M", show_default=True, help="Largest result a job may return.")
@friendly
def run(spec: Path | None, each_line: Path | None, workers: int, db: str, results_dir: Path | None,
        name: str | None, max_jobs: int, policies: tuple[str, ...], max_result_size: str) -> None:
    """Run a bag on this machine: embedded server, local workers, live progress, results collected."""
    from gridbot.cli.run import run_here

    if (spec is None) == (each_line is None):
        raise click.UsageError("give either a SPEC file or --each-line FILE")
    if spec is not None:
        bag_spec, inputs = load_spec_file(spec, name, max_jobs)
        lines = None
    else:
        assert each_line is not None
        bag_spec, lines = load_lines_file(each_line, name, max_jobs)
        inputs = {}
    bag_spec = with_policies(bag_spec, policies)
    sys.exit(run_here(bag_spec, lines, inputs, workers, db, results_dir, render.parse_size(max_result_size),
                      max_jobs))


@cli.command()
@click.option("--db", default="sqlite:///gridbot.db", show_default=True,
              help="sqlite:///path.db (add ?synchronous=NORMAL to trade power-loss safety for speed), "
                   "postgresql://user@host/dbname, or memory://")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: all).")
@click.option("--port", type=click.IntRange(0, 65535), default=8470, show_default=True)
@click.option("--max-result-size", default="16M", show_default=True, help="Largest result a job may return.")
@max_jobs_option
@click.option("--host-timeout", type=click.FloatRange(1), default=600.0, show_default=True,
              help="Seconds of silence after which a host's instances are re-queued.")
@click.option("--heartbeat", type=click.FloatRange(0.1), default=15.0, show_default=True,
              help="Seconds between a busy worker's contacts (how soon it learns of a cancel).")
@click.option("--buffer-size", type=click.IntRange(1), default=20_000, show_default=True,
              help="Queued jobs held in memory for dispatch (shared among bags).")
@click.option("--buffer-ttl", type=click.FloatRange(1), default=600.0, show_default=True,
              help="Seconds a bag matching no host keeps its share of the buffer while others wait.")
@click.option("--tail-threshold", type=click.IntRange(0), default=0, show_default=True,
              help="A bag is in its Tail with fewer jobs queued than this (0: its share of the buffer).")
@click.option("--tail-sticky", is_flag=True, help="Once in the Tail, a bag stays there.")
@click.option("--max-replicas", type=click.IntRange(1), default=5, show_default=True,
              help="Most instances of one job out at once.")
@click.option("--reliable-pool", "reliable_pools", multiple=True, metavar="POOL",
              help="A pool whose hosts are reliable (Host.Reliable; the fail-over pool). Repeatable.")
@click.option("--failover-after", type=click.IntRange(0), default=0, show_default=True,
              help="Jobs that failed this many times run only on reliable pools (0: never).")
@click.option("--pools", "pools_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Pools file: submit pilots to these pools as demand comes (the overlay).")
@click.option("--public-url", help="URL pilots use to reach this server [default: http://HOST:PORT].")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("gridbot-state"),
              show_default=True, help="Where pilots' work and log files go.")
@friendly
def server(db: str, host: str, port: int, max_result_size: str, max_jobs: int, host_timeout: float,
           heartbeat: float, buffer_size: int, buffer_ttl: float, tail_threshold: int, tail_sticky: bool,
           max_replicas: int, reliable_pools: tuple[str, ...], failover_after: int, pools_file: Path | None,
           public_url: str | None, state_dir: Path) -> None:
    """Run the work-dispatch server that workers pull from and users submit to."""
    from aiohttp import web

    from gridbot.core.dispatcher import DispatchConfig
    from gridbot.server.app import Server
    from gridbot.server.service import Service, ServiceConfig
    from gridbot.store.sql import open_store

    logging.getLogger("gridbot").setLevel(min(logging.INFO, logging.getLogger().level))
    store = open_store(db)
    if failover_after and not reliable_pools:
        raise click.UsageError("--failover-after needs at least one --reliable-pool to send the jobs to")
    dispatch = DispatchConfig(buffer_size=buffer_size, host_timeout=host_timeout,
                              max_result_bytes=render.parse_size(max_result_size), buffer_ttl=buffer_ttl,
                              tail_threshold=tail_threshold, tail_sticky=tail_sticky, max_replicas=max_replicas,
                              reliable_pools=frozenset(reliable_pools), failover_after=failover_after)
    config = ServiceConfig(dispatch, max_jobs=max_jobs, heartbeat=heartbeat)
    service = Service(store, config)
    overlay = None
    if pools_file is not None:
        from gridbot.model.pools import parse_pools
        from gridbot.server.overlay import Overlay

        try:
            text = pools_file.read_text()
        except OSError as e:
            raise GridbotError(f"cannot read pools file {pools_file}: {e.strerror}") from e
        url = public_url or f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
        overlay = Overlay(service, parse_pools(text, str(pools_file)), url, state_dir.resolve())
    srv = Server(service, overlay=overlay)
    click.echo(f"gridbot server on http://{host}:{port} with {db}", err=True)
    try:
        web.run_app(srv.app, host=host, port=port, print=None, access_log=None)
    except OSError as e:
        raise GridbotError(f"cannot listen on {host}:{port}: {e.strerror}; choose another --port") from e
    finally:
        store.close()


@cli.command()
@server_option
@click.option("--slots", type=click.IntRange(1), default=os.cpu_count() or 1, show_default=True,
              help="Instances run at once.")
@click.option("--prefetch", type=click.IntRange(0), default=0, show_default=True,
              help="Instances held beyond --slots, so the next starts without a round trip.")
@click.option("--name", "slot_name", default="worker", show_default=True,
              help="Slot name: with the machine, it makes the stable host id.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=Path("gridbot-work"),
              show_default=True, help="Where job directories are made.")
@click.option("--idle-timeout", type=click.FloatRange(0), default=300.0, show_default=True,
              help="Exit after this many seconds with no work (0: never).")
@click.option("--give-up-after", type=click.FloatRange(0), default=0.0, show_default=True,
              help="Exit when the server stays unreachable this long (0: never).")
@click.option("--pool", default="local", show_default=True, help="Pool this worker belongs to.")
@click.option("--keep-dirs", is_flag=True, help="Keep job directories after each job.")
@click.option("--lifetime", type=click.FloatRange(0), default=0.0, show_default=True,
              help="Stop after this many seconds, giving back what is held (0: never); pilots set it.")
@click.option("--min-cpu", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Leave when a job uses less than this fraction of a CPU over --cpu-window (0: never).")
@click.option("--cpu-window", type=click.FloatRange(1), default=600.0, show_default=True)
@click.option("--exit-with-parent", is_flag=True, hidden=True)
@click.option("--prefetch-seconds", type=click.FloatRange(0), default=0.0, show_default=True,
              help="Also hold enough instances for this many seconds of work, judged from the jobs run so far "
                   "(short jobs then come in bundles; 0: --prefetch only).")
@click.option("--executor", type=click.Choice(["shell", "noop"]), default="shell", show_default=True,
              help="noop: report every instance done at once without running it, to measure the server.")
@friendly
def worker(server: str, slots: int, prefetch: int, slot_name: str, workdir: Path, idle_timeout: float,
           give_up_after: float, pool: str, keep_dirs: bool, lifetime: float, min_cpu: float, cpu_window: float,
           exit_with_parent: bool, prefetch_seconds: float, executor: str) -> None:
    """Pull jobs from a server and run them (connects out only)."""
    from gridbot.worker.worker import WorkerConfig, run_worker

    logging.getLogger("gridbot").setLevel(min(logging.INFO, logging.getLogger().level))
    Client(server)  # validates the URL
    sys.exit(run_worker(WorkerConfig(server.rstrip("/"), slots, prefetch, slot_name, workdir, idle_timeout, pool,
                                     keep_dirs, give_up_after=give_up_after, exit_with_parent=exit_with_parent,
                                     lifetime=lifetime, min_cpu=min_cpu, cpu_window=cpu_window,
                                     prefetch_seconds=prefetch_seconds, executor=executor)))


@cli.command()
@click.argument("spec", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--each-line", type=click.Path(dir_okay=False, path_type=Path),
              help="Submit one job per line of FILE, each line a shell command.")
@click.option("--name", help="Bag name [default: the spec's name, or the file's stem].")
@server_option
@max_jobs_option
@policy_option
@json_option
@friendly
def submit(spec: Path | None, each_line: Path | None, name: str | None, server: str, max_jobs: int,
           policies: tuple[str, ...], as_json: bool) -> None:
    """Submit a bag to a running server."""
    if (spec is None) == (each_line is None):
        raise click.UsageError("give either a SPEC file or --each-line FILE")
    lines: list[str] | None = None
    inputs: dict[str, bytes] = {}
    if spec is not None:
        bag_spec, inputs = load_spec_file(spec, name, max_jobs)
    else:
        assert each_line is not None
        bag_spec, lines = load_lines_file(each_line, name, max_jobs)
    with Client(server) as client:
        info = client.submit(with_policies(bag_spec, policies), lines, inputs)
    if as_json:
        render.print_json(info)
    else:
        click.echo(f"submitted bag {info.bag_id} '{info.name}' with {info.total:,} jobs")


@cli.command()
@server_option
@json_option
@friendly
def status(server: str, as_json: bool) -> None:
    """One line per bag with its jobs counted by state."""
    with Client(server) as client:
        bags = client.bags()
    if as_json:
        render.print_json(bags)
    elif not bags:
        click.echo("no bags")
    else:
        render.console.print(render.bags_table(bags))
        for b in bags:
            for message in b.diagnostics:
                render.console.print(f"[yellow]bag {b.name}:[/] {message}", soft_wrap=True)


@cli.command()
@click.argument("bag")
@click.option("--state", type=click.Choice(["queued", "running", "done", "failed", "cancelled"]),
              help="Only jobs in this state.")
@click.option("--limit", type=click.IntRange(1), default=100, show_default=True)
@server_option
@json_option
@friendly
def jobs(bag: str, state: str | None, limit: int, server: str, as_json: bool) -> None:
    """The jobs of a bag (by name or id), with the reason of each failure."""
    with Client(server) as client:
        rows = client.jobs(bag, state, limit)
    if as_json:
        render.print_json(rows)
    elif not rows:
        click.echo(f"no {state or ''} jobs".replace("  ", " "))
    else:
        render.console.print(render.jobs_table(rows))


@cli.command()
@click.argument("bag")
@click.argument("name", required=False)
@click.argument("expression", required=False)
@server_option
@json_option
@friendly
def policy(bag: str, name: str | None, expression: str | None, server: str, as_json: bool) -> None:
    """Show a bag's policies, or change one while it runs: gridbot policy BAG NAME 'EXPRESSION'."""
    if (name is None) != (expression is None):
        raise click.UsageError("give both NAME and EXPRESSION to change a policy, or neither to show them")
    with Client(server) as client:
        if name is not None and expression is not None:
            info = client.set_policy(bag, name, expression)
            if as_json:
                render.print_json(info)
            else:
                click.echo(f"bag {info.name}: {name} = {expression}")
            return
        texts = client.policy(bag)
    if as_json:
        render.print_json(texts)
    else:
        for k, v in texts.items():
            click.echo(f"{k} = {v}")


@cli.command()
@click.argument("bag")
@server_option
@json_option
@friendly
def cancel(bag: str, server: str, as_json: bool) -> None:
    """Cancel a bag: its queued jobs never run and its running ones are killed."""
    with Client(server) as client:
        info = client.cancel(bag)
    if as_json:
        render.print_json(info)
    else:
        click.echo(f"bag {info.bag_id} '{info.name}' is {info.state}")


@cli.command()
@click.argument("bag")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@server_option
@json_option
@friendly
def results(bag: str, directory: Path, server: str, as_json: bool) -> None:
    """Write the results of a bag's ended jobs into DIRECTORY (one folder per job, and jobs.jsonl)."""
    with Client(server) as client:
        n = client.download_results(bag, directory)
    if as_json:
        render.print_json({"bag": bag, "jobs": n, "directory": str(directory)})
    else:
        click.echo(f"wrote results of {n:,} jobs to {directory}")


@cli.command()
@server_option
@json_option
@friendly
def pools(server: str, as_json: bool) -> None:
    """Each pool: pilots queued, running and ended; hosts; jobs done; throughput."""
    with Client(server) as client:
        rows = client.pools()
    if as_json:
        render.print_json(rows)
    elif not rows:
        click.echo("no pools (start the server with --pools FILE)")
    else:
        render.console.print(render.pools_table(rows))
        for p in rows:
            if p.error:
                render.console.print(f"[yellow]pool {p.name}:[/] {p.error}", soft_wrap=True)


@cli.command()
@server_option
@json_option
@friendly
def hosts(server: str, as_json: bool) -> None:
    """The hosts that have pulled work, with their statistics."""
    with Client(server) as client:
        rows = client.hosts()
    if as_json:
        render.print_json(rows)
    else:
        render.console.print(render.hosts_table(rows))


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--seed", type=click.IntRange(0), help="Seed of the run [default: the scenario's].")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for metrics.json and the plots (incomplete.png, throughput.png).")
@click.option("--scale", type=click.FloatRange(0, 1, min_open=True), default=1.0,
              help="Run at this fraction of the size: jobs, pools and buffer scaled alike (try 0.1 first).")
@click.option("--no-plots", is_flag=True, help="Write metrics.json only.")
@click.option("--quiet", is_flag=True, help="Print nothing but errors.")
@json_option
@friendly
def simulate(scenario: Path, seed: int | None, out: Path | None, scale: float, no_plots: bool, quiet: bool,
             as_json: bool) -> None:
    """Simulate SCENARIO: its bags on its pools, with the real dispatcher and policies, on a virtual clock.

    The same scenario and seed always give the same result (docs/simulation.md describes the format).
    """
    from gridbot.cli.simulate import run_simulation

    run_simulation(scenario, seed, out, quiet, as_json, not no_plots, scale)


def main() -> None:
    cli(prog_name="gridbot")
