"""The `gridbot` command: run a bag here, or run the server, workers and submissions apart.

Exit codes: 0 all went well; 1 a job failed for good or something broke; 2 the input was wrong
(spec, option, unknown bag); 130 interrupted.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import msgspec
from rich.markup import escape

from gridbot.cli import render
from gridbot.cli.options import KNOBS, DispatchCommand, Finite, dispatch_options, knob_option
from gridbot.client import (
    DEFAULT_SERVER,
    TERMINAL_BAG_STATES,
    ApiError,
    Client,
    load_lines_file,
    load_spec_file,
    with_policies,
)
from gridbot.core.config import DispatchConfig
from gridbot.errors import GridbotError, ServerUnavailable
from gridbot.model.records import MAX_PILOT_CPUS
from gridbot.model.spec import (
    DEFAULT_MAX_JOBS,
    HARD_MAX_JOBS,
    BagSpec,
    SpecError,
    parse_bag_deadline,
    parse_duration,
    with_qos_placement,
)
from gridbot.model.states import BagState, JobState
from gridbot.protocol import BagInfo, QosChange
from gridbot.results import ResultsFolder

F = TypeVar("F", bound=Callable[..., Any])


server_option = click.option("--server", envvar="GRIDBOT_SERVER", default=None,
                             help=f"URL of the gridbot server (or set GRIDBOT_SERVER) [default: the access file's, "
                                  f"else {DEFAULT_SERVER}].")
access_option = click.option("--access", type=click.Path(dir_okay=False, path_type=Path), envvar="GRIDBOT_ACCESS",
                             help="Access file with your key (or set GRIDBOT_ACCESS) [default: ./gridbot-access.json "
                                  "if there is one].")
admin_option = click.option("--admin", is_flag=True, help="Use the access file's admin key: see every bag.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
policy_option = click.option("--policy", "policies", multiple=True, metavar="NAME=EXPRESSION",
                              help="Set a ClassAd policy of the bag (repeatable); wins over the spec's [policy].")
max_jobs_option = click.option("--max-jobs", type=click.IntRange(1), default=DEFAULT_MAX_JOBS, show_default=True,
                               help=f"Refuse bags with more jobs than this (never more than {HARD_MAX_JOBS:,}: "
                                    "the server writes every job into its database when a bag is submitted).")
max_failures_option = click.option("--max-failures", type=click.IntRange(1),
                                   help="With --each-line: failed instances after which a job fails for good, as "
                                        "a spec's max_failures [default: 3].")
deadline_option = click.option("--deadline", metavar="WHEN",
                               help="The bag's QoS deadline: a duration after submission (2h) or a time with its zone "
                                    "(2026-11-27T17:00:00Z); with a budget, DBC scheduling keeps both.")
budget_option = click.option("--budget", type=Finite(0), metavar="MONEY",
                             help="What the bag may spend on priced pools at most, in their currency.")
timeout_option = click.option("--timeout", metavar="DURATION",
                              help="With --each-line: kill a job that runs longer than this (90, 10m, 2h), as a "
                                   "spec's timeout [default: none].")


def each_line_settings(bag_spec: BagSpec, from_spec: bool, max_failures: int | None, timeout: str | None) -> BagSpec:
    """An each-line bag with what a spec would say of it (`--max-failures`, `--timeout`); a spec file says
    them itself, so there they are refused rather than silently overriding it."""
    if from_spec:
        given = [o for o, v in (("--max-failures", max_failures), ("--timeout", timeout)) if v is not None]
        if given:
            verb = "goes" if len(given) == 1 else "go"
            raise click.UsageError(f"{' and '.join(given)} {verb} with --each-line; a spec sets max_failures and "
                                   "timeout itself")
        return bag_spec
    if max_failures is not None:
        bag_spec = msgspec.structs.replace(bag_spec, max_failures=max_failures)
    if timeout is not None:
        try:
            bag_spec = msgspec.structs.replace(bag_spec, timeout=parse_duration(timeout))
        except ValueError as e:
            raise click.BadParameter(f"{timeout!r}: {e}", param_hint="--timeout") from None
    return bag_spec


def friendly(fn: F) -> F:
    """Turn gridbot's errors into a message and an exit code instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SpecError as e:
            render.err_console.print(f"[bold red]error:[/] {escape(e.source)} has {len(e.problems)} problem(s):",
                                     markup=True,
                                     soft_wrap=True)
            render.err_console.print(str(e), markup=False, soft_wrap=True)
            sys.exit(2)
        except ApiError as e:
            # the message is the server's words, with TOML tables like [validators.x] in its hints: not markup
            render.err_console.print(f"[bold red]error:[/] {escape(str(e))}", markup=True, soft_wrap=True)
            sys.exit(2)
        except ServerUnavailable as e:
            render.err_console.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
            sys.exit(1)
        except GridbotError as e:
            render.err_console.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
            sys.exit(2)

    return wrapper  # type: ignore[return-value]


SERVERS_OWN_USER = ("local", "slurm", "pbs", "lsf", "cobalt", "flux")
"""Pool kinds whose pilots start as the server's own user, on its machine or its cluster (and its files)."""


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="gridbot")
@click.option("--log-level", envvar="GRIDBOT_LOG_LEVEL", default="warning", show_envvar=True,
              type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
              help="How much the log says (stderr).")
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
@max_failures_option
@timeout_option
@knob_option(KNOBS["max_result_bytes"])
@deadline_option
@budget_option
@click.option("--retry-failed", is_flag=True,
              help="Run the failed jobs of the stored bag again; with a changed spec or inputs, as the bag's next "
                   "revision (done jobs keep their results, the others run the new command).")
@click.option("--force", is_flag=True, help="Write the results even into a folder that holds other files.")
@click.option("--console", is_flag=True, help="Print the URL of the web console that watches this run (with its key).")
@friendly
def run(spec: Path | None, each_line: Path | None, workers: int, db: str, results_dir: Path | None,
        name: str | None, max_jobs: int, policies: tuple[str, ...], max_failures: int | None, timeout: str | None,
        max_result_bytes: int, deadline: str | None, budget: float | None, retry_failed: bool, force: bool,
        console: bool) -> None:
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
    bag_spec = with_policies(each_line_settings(bag_spec, spec is not None, max_failures, timeout), policies)
    bag_spec = with_qos(bag_spec, deadline, budget)
    sys.exit(run_here(bag_spec, lines, inputs, workers, db, results_dir, max_result_bytes, max_jobs,
                      retry_failed=retry_failed, force=force, console=console))


@cli.command(cls=DispatchCommand)
@click.option("--db", default="sqlite:///gridbot.db", show_default=True,
              help="sqlite:///path.db (add ?synchronous=NORMAL to trade power-loss safety for speed), "
                   "postgresql://user@host/dbname, or memory://")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: all).")
@click.option("--port", type=click.IntRange(0, 65535), default=8470, show_default=True)
@dispatch_options
@max_jobs_option
@click.option("--heartbeat", type=Finite(0.1), default=15.0, show_default=True,
              help="Seconds between a busy worker's contacts (how soon it learns of a cancel).")
@click.option("--pools", "pools_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Pools file: submit pilots to these pools as demand comes (the overlay).")
@click.option("--cancel-pilots-on-exit", is_flag=True,
              help="Cancel the pools' pilots, queued and running, when the server stops [default: they go on, and "
                   "the server takes them up again when it restarts].")
@click.option("--public-url", help="URL pilots and the access file give for this server [default: "
                                   "http(s)://HOST:PORT, with 127.0.0.1 for 0.0.0.0: give the name other hosts use].")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("gridbot-state"),
              show_default=True, help="Where pilots' work and log files go.")
@click.option("--access-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Where the access file (keys for clients, mode 0600) is made and kept [default: beside the "
                   "SQLite store, else in --state-dir].")
@click.option("--keys-file", type=click.Path(dir_okay=False, path_type=Path),
              help="The server's key registry (hashes only) [default: gridbot-keys.json beside the access file].")
@click.option("--no-auth", is_flag=True, help="No keys at all: only with a loopback --host, for a quick test.")
@click.option("--tls", "tls_mode", type=click.Choice(["self-signed"]),
              help="Serve HTTPS with a certificate made here once; the access file pins its fingerprint.")
@click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Serve HTTPS with this PEM certificate (chain) ...")
@click.option("--tls-key", type=click.Path(dir_okay=False, exists=True, path_type=Path), help="... and its key.")
@click.option("--max-hosts-per-key", type=click.IntRange(1), default=10_000, show_default=True,
              help="Hosts one pool's worker key may register while the server runs.")
@click.option("--max-bags-per-submitter", type=click.IntRange(1), default=1_000, show_default=True,
              help="Active bags one submitter may have at once.")
@friendly
def server(db: str, host: str, port: int, dispatch: DispatchConfig, max_jobs: int, heartbeat: float,
           pools_file: Path | None, cancel_pilots_on_exit: bool, public_url: str | None, state_dir: Path,
           access_file: Path | None,
           keys_file: Path | None, no_auth: bool, tls_mode: str | None, tls_cert: Path | None, tls_key: Path | None,
           max_hosts_per_key: int, max_bags_per_submitter: int) -> None:
    """Run the work-dispatch server that workers pull from and users submit to.

    On its first start it makes an access file (mode 0600) with an admin key, a submitter key and a
    worker key per pool: `gridbot submit/status/...` and `gridbot worker` find it in the current folder,
    or take it with --access. docs/security.md says who may do what.
    """
    from aiohttp import web

    from gridbot.model.hierarchy import QueueSpec
    from gridbot.model.pools import PoolSpec, parse_server_file
    from gridbot.model.validators import ValidatorSpec
    from gridbot.server import secure
    from gridbot.server.app import Server
    from gridbot.server.service import Service, ServiceConfig
    from gridbot.store.base import ClaimLost
    from gridbot.store.sql import open_store

    logging.getLogger("gridbot").setLevel(min(logging.INFO, logging.getLogger().level))
    from gridbot.server.app import tune_gc

    tune_gc()
    pool_specs: list[PoolSpec] = []
    queues: list[QueueSpec] = []
    validators: list[ValidatorSpec] = []
    if pools_file is not None:
        try:
            text = pools_file.read_text(encoding="utf-8")
        except OSError as e:
            raise GridbotError(f"cannot read pools file {pools_file}: {e.strerror}") from e
        except UnicodeDecodeError:
            raise GridbotError(f"{pools_file} is not a text file; a pools file is TOML in UTF-8 (see "
                               "docs/pools.md)") from None
        pool_specs, queues, validators = parse_server_file(text, str(pools_file))
    secure.check_options(host, no_auth, tls_mode, tls_cert, tls_key)
    store = open_store(db)  # a wrong --db is refused before any key or certificate is made
    try:
        security = secure.prepare(db, host, port, pool_specs, state_dir, access_file, keys_file, no_auth, tls_mode,
                                  tls_cert, tls_key, public_url)
    except GridbotError:
        store.close()
        raise
    if dispatch.failover_after and not dispatch.reliable_pools:
        raise click.UsageError("--failover-after needs at least one --reliable-pool to send the jobs to")
    config = ServiceConfig(dispatch, max_jobs=max_jobs, heartbeat=heartbeat,
                           max_bags_per_submitter=max_bags_per_submitter, queues=tuple(queues),
                           validators=tuple(validators))
    service = Service(store, config)
    serving: list[bool] = []

    def stop(lost: ClaimLost) -> None:
        if serving:  # run_app's own way to stop; before it serves, the check before run_app stops the server
            os.kill(os.getpid(), signal.SIGTERM)

    service.on_lost.append(stop)
    overlay = None
    if pool_specs:
        from gridbot.server.overlay import Overlay

        overlay = Overlay(service, pool_specs, security.url, state_dir.resolve(), access=security.access,
                          fingerprint=security.fingerprint, cancel_on_exit=cancel_pilots_on_exit)
    srv = Server(service, overlay=overlay, access=security.access, max_hosts_per_key=max_hosts_per_key)
    if any(p.kind == "volunteer" for p in pool_specs):  # stock BOINC clients, each pool on its own port
        from gridbot.volunteer.server import accounts_path, serve_volunteers

        access_path = security.access.access_path if security.access is not None else None
        serve_volunteers(srv, [p for p in pool_specs if p.kind == "volunteer"], state_dir.resolve(), host,
                         access_path, security.ssl)
        accounts = accounts_path(access_path, state_dir.resolve())
        beside = "; beside the access file, --access-file finds it too" if access_path is not None else ""
        click.echo(f"volunteer accounts: {accounts} (`gridbot volunteers add NAME --volunteers-file {accounts}`"
                   f"{beside})", err=True)
    scheme = "https" if security.ssl is not None else "http"
    shown = re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", db)  # a PostgreSQL URL's password is not for the log
    click.echo(f"gridbot server on {scheme}://{host}:{port} with {shown}", err=True)
    if security.access is not None and security.access.access_path is not None:
        made = "made" if security.access.created else "in"
        click.echo(f"keys: {made} {security.access.access_path} (mode 0600; `gridbot access` hands out "
                   "smaller ones)", err=True)
        for spec in pool_specs:
            if spec.kind in SERVERS_OWN_USER and not spec.run_as:
                click.echo(f"warning: pool '{spec.name}' runs its jobs as this server's own user, who can read "
                           f"{security.access.access_path} (the admin key): if others submit to this server, give "
                           'the pool run_as = "USER" (docs/security.md)', err=True)
    if service.lost is not None:  # taken while the server started, before a signal could stop it
        store.close()
        raise GridbotError(f"the server stopped: {service.lost}")

    async def started(app: web.Application) -> None:
        serving.append(True)  # run_app's handler of SIGTERM is in place from here on

    srv.app.on_startup.append(started)
    try:
        web.run_app(srv.app, host=host, port=port, print=None, access_log=None, ssl_context=security.ssl)
    except OSError as e:
        raise GridbotError(f"cannot listen on {host}:{port}: {e.strerror}; choose another --port") from e
    finally:
        store.close()
    if service.lost is not None:
        raise GridbotError(f"the server stopped: {service.lost}")



@cli.command()
@server_option
@access_option
@click.option("--slots", type=click.IntRange(1, MAX_PILOT_CPUS), default=os.cpu_count() or 1, show_default=True,
              help="Instances run at once.")
@click.option("--prefetch", type=click.IntRange(0, MAX_PILOT_CPUS), default=0, show_default=True,
              help="Instances held beyond --slots, so the next starts without a round trip.")
@click.option("--name", "slot_name", default="worker", show_default=True,
              help="Slot name: with the machine, it makes the stable host id.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=Path("gridbot-work"),
              show_default=True, help="Where job directories are made.")
@click.option("--idle-timeout", type=Finite(0), default=300.0, show_default=True,
              help="Exit after this many seconds with no work (0: never).")
@click.option("--leave-when-refused", is_flag=True,
              help="Also exit at once, holding nothing, when the server's bags refuse this host (their GridPolicy, "
                   "JobRequirements or Concurrency), with an idle timeout: how the overlay's pilots run.")
@click.option("--give-up-after", type=Finite(0), default=0.0, show_default=True,
              help="Exit when the server stays unreachable this long (0: never).")
@click.option("--pool", default="local", show_default=True, help="Pool this worker belongs to.")
@click.option("--keep-dirs", is_flag=True, help="Keep job directories after each job.")
@click.option("--lifetime", type=Finite(0), default=0.0, show_default=True,
              help="Stop after this many seconds, giving back what is held (0: never); pilots set it.")
@click.option("--min-cpu", type=Finite(0, 1), default=0.0, show_default=True,
              help="Leave when a job uses less than this fraction of a CPU over --cpu-window (0: never).")
@click.option("--cpu-window", type=Finite(1), default=600.0, show_default=True,
              help="Seconds over which --min-cpu judges a job's CPU use.")
@click.option("--exit-with-parent", is_flag=True, hidden=True)
@click.option("--prefetch-seconds", type=Finite(0), default=0.0, show_default=True,
              help="Also hold enough instances for this many seconds of work, judged from the jobs run so far "
                   "(short jobs then come in bundles; 0: --prefetch only).")
@click.option("--executor", type=click.Choice(["shell", "noop"]), default="shell", show_default=True,
              help="noop: report every instance done at once without running it, to measure the server.")
@click.option("--pass-env", multiple=True, metavar="NAME",
              help="Also give jobs this variable of the worker's environment (repeatable); they get only PATH, "
                   "HOME, LANG, LC_ALL, LC_CTYPE, TMPDIR, USER, LOGNAME, TZ and SHELL otherwise.")
@click.option("--run-as", metavar="USER", help="Run jobs as this user (the worker must start as root).")
@click.option("--allow-root", is_flag=True,
              help="Run jobs as root when the worker is root and --run-as is not given (refused otherwise).")
@click.option("--max-jobs", type=click.IntRange(0), default=0, show_default=True,
              help="Ask for no more after this many jobs and leave once they are done (0: no limit): a pilot that "
                   "is one job's own batch job.")
@click.option("--drop", type=Finite(0, 1), default=0.0, hidden=True,
              help="Testing: hold this fraction of instances without running them until their deadline, and never "
                   "report them (a host of an unreliable pool that loses work silently).")
@click.option("--slot-threads/--no-slot-threads", default=True, hidden=True,
              help="Run single-slot jobs in threads of the worker (the default), or every job on its event loop "
                   "(to compare the two: bench/suite.py).")
@friendly
def worker(server: str | None, access: Path | None, slots: int, prefetch: int, slot_name: str, workdir: Path,
           idle_timeout: float, leave_when_refused: bool, give_up_after: float, pool: str, keep_dirs: bool,
           lifetime: float, min_cpu: float,
           cpu_window: float, exit_with_parent: bool, prefetch_seconds: float, executor: str,
           pass_env: tuple[str, ...], run_as: str | None, allow_root: bool, max_jobs: int, drop: float,
           slot_threads: bool) -> None:
    """Pull jobs from a server and run them (connects out only).

    The worker key comes from GRIDBOT_WORKER_KEY (how pilots get it) or from the access file's key for
    --pool; the host credential the server gives in exchange is kept under the worker's state folder.
    """
    from gridbot.security.access import ENV_WORKER_KEY, env_key, find_access
    from gridbot.worker.worker import WorkerConfig, run_worker

    logging.getLogger("gridbot").setLevel(min(logging.INFO, logging.getLogger().level))
    grants = find_access(access)
    key = env_key(ENV_WORKER_KEY)
    if not key:
        pool, key = grants.worker_key(pool)
    url = Client(server, access=grants).url  # validates the URL
    sys.exit(run_worker(WorkerConfig(url, slots, prefetch, slot_name, workdir, idle_timeout, pool,
                                     keep_dirs, give_up_after=give_up_after, exit_with_parent=exit_with_parent,
                                     lifetime=lifetime, min_cpu=min_cpu, cpu_window=cpu_window,
                                     prefetch_seconds=prefetch_seconds, key=key, fingerprint=grants.fingerprint,
                                     executor=executor, pass_env=pass_env, run_as=run_as, allow_root=allow_root,
                                     drop=drop, max_jobs=max_jobs, slot_threads=slot_threads,
                                     leave_refused=leave_when_refused)))


@cli.command()
@click.argument("spec", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--each-line", type=click.Path(dir_okay=False, path_type=Path),
              help="Submit one job per line of FILE, each line a shell command.")
@click.option("--name", help="Bag name [default: the spec's name, or the file's stem].")
@server_option
@access_option
@admin_option
@max_jobs_option
@policy_option
@max_failures_option
@timeout_option
@deadline_option
@budget_option
@json_option
@friendly
def submit(spec: Path | None, each_line: Path | None, name: str | None, server: str | None,
           access: Path | None, admin: bool, max_jobs: int,
           policies: tuple[str, ...], max_failures: int | None, timeout: str | None, deadline: str | None,
           budget: float | None, as_json: bool) -> None:
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
    bag_spec = with_qos(each_line_settings(bag_spec, spec is not None, max_failures, timeout), deadline, budget)
    with Client(server, access=access, admin=admin) as client:
        info = client.submit(with_policies(bag_spec, policies), lines, inputs)
    if as_json:
        render.print_json(info)
    else:
        click.echo(f"submitted bag {info.bag_id} '{info.name}' with {info.total:,} jobs")


@cli.command()
@server_option
@access_option
@admin_option
@json_option
@friendly
def status(server: str | None, access: Path | None, admin: bool, as_json: bool) -> None:
    """One line per bag with its jobs counted by state."""
    with Client(server, access=access, admin=admin) as client:
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
            for describe in (render.tail_plan, render.money, render.level):
                if (text := describe(b)) is not None:
                    render.console.print(text, soft_wrap=True, markup=False)


@cli.command()
@server_option
@access_option
@admin_option
@json_option
@friendly
def levels(server: str | None, access: Path | None, admin: bool, as_json: bool) -> None:
    """The execution hierarchy's queues: their levels, limits, work and bags (docs/hierarchy.md)."""
    with Client(server, access=access, admin=admin) as client:
        queues = client.levels()
    if as_json:
        render.print_json(queues)
    elif not queues:
        click.echo("this server has no queues: declare [queues.NAME] in its pools file (docs/hierarchy.md)")
    else:
        render.console.print(render.levels_table(queues))


@cli.command()
@click.argument("bag")
@click.option("--deadline", metavar="WHEN", help="The bag's new deadline: a duration from now (90, 10m, "
              "2h, 1d) or a time with its zone (2026-11-27T17:00:00Z); 'none' removes it.")
@click.option("--budget", metavar="MONEY", help="The bag's new budget, in the pools' currency; 'none' removes it.")
@server_option
@access_option
@admin_option
@json_option
@friendly
def qos(bag: str, deadline: str | None, budget: str | None, server: str | None, access: Path | None, admin: bool,
        as_json: bool) -> None:
    """Change a running bag's deadline or budget: its placement plans with them from the next decision on."""
    if deadline is None and budget is None:
        raise click.UsageError("give --deadline or --budget (or both)")
    change = QosChange(
        budget=msgspec.UNSET if budget is None else None if budget.lower() == "none" else _money(budget),
        bag_deadline=msgspec.UNSET if deadline is None else None if deadline.lower() == "none" else deadline)
    with Client(server, access=access, admin=admin) as client:
        info = client.set_qos(bag, change)
    if as_json:
        render.print_json(info)
        return
    # the placement plans again at its next decision: the plan in this answer is the one before the change
    line = render.money(msgspec.structs.replace(info, qos=None))
    click.echo(f"{line}; its placement plans with them from its next decision" if line else
               f"bag {info.name}: no deadline, no budget")
    if info.budget is not None and info.spent >= info.budget:
        click.echo(f"bag {info.name} has spent {info.spent:,.2f} already, all of the budget: it starts no more jobs "
                   "on pools that cost money")


@cli.command()
@click.argument("bag")
@server_option
@access_option
@admin_option
@json_option
@friendly
def cost(bag: str, server: str | None, access: Path | None, admin: bool, as_json: bool) -> None:
    """What a bag spent per pool (instances' CPU-hours, its share of pilot-hours), against its budget."""
    with Client(server, access=access, admin=admin) as client:
        info = client.cost(bag)
    if as_json:
        render.print_json(info)
        return
    render.console.print(render.cost_table(info))
    budget = f" of a budget of {info.budget:,.2f}" if info.budget is not None else ""
    click.echo(f"bag {info.bag}: spent {info.spent:,.2f}{budget}")
    if info.qos is not None:
        q = info.qos
        click.echo(f"committed by running instances {q.committed:,.2f}; projected to completion "
                   f"{q.projected_cost:,.2f} ({q.strategy})")
    if info.idle_pilots > 0:
        click.echo(f"pilots that ran nothing cost {info.idle_pilots:,.2f} more (no bag's share)")


def _money(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a number (or 'none')", param_hint="--budget") from None
    if not 0 <= value < float("inf"):
        raise click.BadParameter(f"{text!r} must be a finite number >= 0", param_hint="--budget")
    return value


def with_qos(spec: BagSpec, deadline: str | None, budget: float | None) -> BagSpec:
    """The spec with the command line's --deadline and --budget (they override the spec's)."""
    values: dict[str, float | None] = {}
    if deadline is not None:
        try:
            values = {"bag_deadline": None, "bag_deadline_at": None, **parse_bag_deadline(deadline)}
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--deadline") from None
    if budget is not None:
        values["budget"] = budget
    return with_qos_placement(msgspec.structs.replace(spec, **values)) if values else spec


@cli.command()
@click.argument("bag")
@click.argument("job", required=False, type=click.IntRange(0), metavar="[JOB]")
@click.option("--story", is_flag=True, help="With JOB: the job's life, each instance with its host and outcome, "
                                            "what caused it, and which strategy decided what and why.")
@click.option("--state", type=click.Choice([s.value for s in JobState]),
              help="Only jobs in this state.")
@click.option("--limit", type=click.IntRange(1), default=100, show_default=True, help="Show at most this many.")
@click.option("--all", "show_all", is_flag=True, help="Show every job (fetched in pages).")
@server_option
@access_option
@admin_option
@json_option
@friendly
def jobs(bag: str, job: int | None, story: bool, state: str | None, limit: int, show_all: bool, server: str | None,
         access: Path | None, admin: bool, as_json: bool) -> None:
    """The jobs of a bag (by name or id), with the reason of each failure; `gridbot jobs BAG JOB --story`: the
    life of one job, JOB its index in the bag (as in the results folder: 0, 1, 2, ...)."""
    if job is not None or story:
        if job is None or not story:
            raise click.UsageError(f"JOB goes with --story: gridbot jobs {bag} {job} --story (`gridbot logs {bag} "
                                   f"{job}` shows its output)" if job is not None else
                                   f"--story tells one job's life: gridbot jobs {bag} JOB --story")
        if state is not None or show_all:
            raise click.UsageError("--story tells one job's life; --state and --all list jobs")
        with Client(server, access=access, admin=admin) as client:
            told = client.story(bag, job)
        if as_json:
            render.print_json(told)
        else:
            from gridbot.cli.story import job_story

            job_story(told)
        return
    total = None
    with Client(server, access=access, admin=admin) as client:
        rows = list(client.all_jobs(bag, state, None if show_all else limit))
        if not show_all and len(rows) >= limit:
            info = client.bag(bag)
            total = info.total if state is None else getattr(info.counts, state)
    if as_json:
        render.print_json(rows)
    elif not rows:
        click.echo(f"no {state or ''} jobs".replace("  ", " "))
    else:
        render.console.print(render.jobs_table(rows))
    if total is not None and total > len(rows):
        render.err_console.print(f"showing the first {len(rows):,} of {total:,} {state or ''} jobs; --all shows "
                                 "every one, --limit N the first N".replace("  ", " "), soft_wrap=True)


@cli.command()
@click.argument("bag")
@click.argument("name", required=False)
@click.argument("expression", required=False)
@server_option
@access_option
@admin_option
@json_option
@friendly
def policy(bag: str, name: str | None, expression: str | None, server: str | None, access: Path | None,
           admin: bool, as_json: bool) -> None:
    """Show a bag's policies, or change one while it runs: gridbot policy BAG NAME 'EXPRESSION'."""
    if (name is None) != (expression is None):
        raise click.UsageError("give both NAME and EXPRESSION to change a policy, or neither to show them")
    with Client(server, access=access, admin=admin) as client:
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
@click.argument("bag", required=False)
@click.option("--scenario", type=click.Path(dir_okay=False, path_type=Path),
              help="Plan a bag of this simulation scenario before it runs (BAG: its name; default its first bag).")
@click.option("--utility", metavar="NAME|EXPR",
              help="makespan, cost, product (makespan x cost), or an expression over Makespan and Cost "
                   "[default: the bag's expert utility, else product].")
@click.option("--budget", type=Finite(0), help="The fastest strategy costing at most this per task.")
@click.option("--deadline", metavar="DURATION", help="The cheapest strategy whose tail ends within this (90, 10m, 2h).")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the frontier as a PNG (the paper's Figures 8 and 9a).")
@click.option("--apply", "apply_it", is_flag=True,
              help='Set tail = "expert" with this utility on the running bag (its strategy changes at once).')
@click.option("--history", "history_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Characterize the pools offline from this history of a run that is over (CSV or JSON lines of "
                   "sent_at, ended_at, success, pool: docs/expert.md) instead of the bag's own instances.")
@click.option("--from-bag", "from_bag", metavar="NAME",
              help="Characterize the pools offline from a previous bag on the same server (its stored instances).")
@server_option
@access_option
@admin_option
@json_option
@friendly
def plan(bag: str | None, scenario: Path | None, utility: str | None, budget: float | None, deadline: str | None,
         plot_file: Path | None, apply_it: bool, history_file: Path | None, from_bag: str | None, server: str | None,
         access: Path | None, admin: bool, as_json: bool) -> None:
    """ExPERT's Pareto frontier of tail strategies (N, T, D, Mr) for a running bag, from its own instances, and
    the best one for a utility; with --scenario, for a scenario's bag before it runs; with --history or
    --from-bag, characterized offline from a run that is over."""
    from gridbot.cli import plan as planning

    if history_file is not None and from_bag is not None:
        raise click.UsageError("give one of --history and --from-bag")
    if plot_file is not None:
        planning.plot_format(plot_file)  # a name that cannot be an image is refused before the work
    previous = planning.read_history(history_file) if history_file is not None else None

    seconds = None
    stalled: list[str] = []
    if deadline is not None:
        try:
            seconds = parse_duration(deadline)
        except ValueError as e:
            raise click.BadParameter(f"{deadline!r}: {e}", param_hint="--deadline") from None
    if scenario is not None:
        if apply_it:
            raise click.UsageError("--apply sets the strategy of a running bag; a scenario's bag sets it in its "
                                   "[bags.NAME.strategy] table")
        if from_bag is not None:
            with Client(server, access=access, admin=admin) as client:
                previous = planning.previous_bag(client.bag_history(from_bag))
        report = planning.for_scenario(scenario, bag, utility, budget, seconds, previous)
        if plot_file is not None:
            planning.write_plot(report, plot_file)
    else:
        if bag is None:
            raise click.UsageError("give a running BAG, or --scenario FILE")
        with Client(server, access=access, admin=admin) as client:
            if from_bag is not None:
                previous = planning.previous_bag(client.bag_history(from_bag))
            given = client.plan_input(bag)
            # (a DBC placement past its deadline or out of budget starts nothing more: a tail strategy then
            # changes nothing, which the owner must hear before applying one)
            stalled = [d for d in client.bag(bag).diagnostics if "nothing more is started" in d]
            report = planning.for_bag(given, utility, budget, seconds, previous)
            if plot_file is not None:  # before --apply: a plot that cannot be written leaves the bag as it was
                planning.write_plot(report, plot_file)
            if apply_it and report.planning.chosen is not None:  # (else nothing to apply: said below, exit 1)
                text = planning.settings(given.strategy, planning.chosen_utility(utility, budget, seconds)).utility
                chosen = planning.apply_choice(given.strategy, text)
                client.set_strategy(bag, chosen)
    if scenario is None and stalled:
        click.echo(f"warning: bag {bag}: {stalled[0]}; no tail strategy starts jobs until then", err=True)
    if as_json:
        render.print_json(planning.as_dict(report))
    else:
        planning.show(report)
        if plot_file is not None:
            click.echo(f"wrote {plot_file}")
        if scenario is None and apply_it and report.planning.chosen is not None:
            click.echo(f'bag {bag}: tail = "expert" with utility = {chosen.options["utility"]!r} from now on')
        elif apply_it:
            click.echo(f"bag {bag}: nothing applied, its strategy is as it was")
    if report.planning.chosen is None:
        sys.exit(1)  # no strategy keeps the bound asked for (said above)


@cli.command()
@click.argument("bag")
@server_option
@access_option
@admin_option
@json_option
@friendly
def cancel(bag: str, server: str | None, access: Path | None, admin: bool, as_json: bool) -> None:
    """Cancel a bag: its queued jobs never run and its running ones are killed."""
    with Client(server, access=access, admin=admin) as client:
        info = client.cancel(bag)
    if as_json:
        render.print_json(info)
    else:
        click.echo(f"bag {info.bag_id} '{info.name}' is {info.state}")


@cli.command()
@click.argument("bags", metavar="BAG...", nargs=-1, required=True)
@click.option("--timeout", metavar="DURATION", help="Give up after this long (90, 10m, 2h): exit code 4.")
@server_option
@access_option
@admin_option
@json_option
@friendly
def wait(bags: tuple[str, ...], timeout: str | None, server: str | None, access: Path | None, admin: bool,
         as_json: bool) -> None:
    """Wait until each bag named has ended, and say how. The server answers as soon as a bag's end is stored (no
    polling): a script can run `gridbot submit` for a sweep's bags and then one `gridbot wait` for them all.
    --timeout is for them all together.

    Exit code 0 if every bag completed, 3 if one ended failed or cancelled (and none is still running), 4 if
    one was still running at --timeout; 1 if the server cannot be reached, 2 for anything else wrong (no such
    bag: checked for every bag named before waiting for any)."""
    try:
        seconds = parse_duration(timeout) if timeout is not None else None
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--timeout") from None
    deadline = None if seconds is None else time.monotonic() + seconds
    ended: list[BagInfo] = []
    late: set[int] = set()
    with Client(server, access=access, admin=admin) as client:
        for bag in bags:
            client.bag(bag)  # a bag that does not exist is said before any wait
        for bag in bags:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                info = client.wait(bag, timeout=left)
            except TimeoutError:
                info = client.bag(bag)
                if info.state not in TERMINAL_BAG_STATES:
                    late.add(info.bag_id)
            ended.append(info)
    if as_json:
        render.print_json(ended[0] if len(ended) == 1 else ended)
    else:
        for info in ended:
            c = info.counts
            click.echo(f"bag {info.bag_id} '{info.name}' is {info.state}"
                       f"{f' after --timeout {timeout}' if info.bag_id in late else ''}: "
                       f"{c.done:,} of {info.total:,} jobs done, {c.failed:,} failed")
    if late:
        sys.exit(4)
    if any(info.state != BagState.COMPLETED for info in ended):
        sys.exit(3)


@cli.command()
@click.argument("bag")
@click.option("--failed", "all_failed", is_flag=True, help="Every failed job (what is done without --jobs).")
@click.option("--jobs", "indices", metavar="LIST", help="Only the failed jobs at these indices: 3,7-9.")
@click.option("--spec", "spec_file", type=click.Path(dir_okay=False, path_type=Path),
              help="First make this changed spec (command, inputs, policies) the bag's next revision: every job not "
                   "done runs it.")
@click.option("--each-line", type=click.Path(dir_okay=False, path_type=Path),
              help="The same for an each-line bag: its changed commands, one per line.")
@server_option
@access_option
@admin_option
@json_option
@friendly
def retry(bag: str, all_failed: bool, indices: str | None, spec_file: Path | None, each_line: Path | None,
          server: str | None, access: Path | None, admin: bool, as_json: bool) -> None:
    """Run failed jobs of a bag again, their failure counts reset; an ended bag becomes active again.

    Done jobs keep their results. To change the command or inputs first, give the changed spec (--spec): it
    becomes the bag's next revision, with as many jobs, and the bag's deadline and budget stay unless it sets
    its own; or, for an each-line bag, its changed lines (--each-line), with every setting kept. On your own
    machine, `gridbot run SPEC --retry-failed` makes the revision from the spec as it is.
    """
    if all_failed and indices is not None:
        raise click.UsageError("give --failed (every failed job) or --jobs LIST, not both")
    if spec_file is not None and each_line is not None:
        raise click.UsageError("give --spec FILE or --each-line FILE, not both")
    revised, before = spec_file is not None or each_line is not None, 0
    if revised and indices is not None:
        raise click.UsageError("a revision queues every job not done: give --jobs LIST or --spec/--each-line, "
                               "not both")
    chosen = render.parse_indices(indices) if indices is not None else None
    with Client(server, access=access, admin=admin) as client:
        if revised:
            stored, before = client.spec(bag), client.bag(bag).revision
            lines: list[str] | None = None
            inputs: dict[str, bytes] = {}
            if spec_file is not None:
                new, inputs = load_spec_file(spec_file)
                new = msgspec.structs.replace(new, name=stored.name)
                if new.budget is None:
                    new = msgspec.structs.replace(new, budget=stored.budget)
                if new.bag_deadline is None and new.bag_deadline_at is None:
                    new = msgspec.structs.replace(new, bag_deadline=stored.bag_deadline,
                                                  bag_deadline_at=stored.bag_deadline_at)
            else:
                assert each_line is not None
                if not stored.each_line:
                    raise click.UsageError(f"bag {stored.name} is made from a spec, not from lines: give --spec FILE")
                _, lines = load_lines_file(each_line, stored.name)
                new = stored  # the same settings (max_failures, timeout, policies, strategy, limits), new lines
            answer = client.revise(new, lines, inputs)
        else:
            answer = client.retry(bag, chosen)
    if as_json:
        render.print_json(answer)
    elif revised and answer.bag.revision == before:
        click.echo(f"bag {answer.bag.name}: the same spec as its own, so no revision; {answer.requeued:,} failed "
                   f"job(s) queued again; it is {answer.bag.state} (a deadline or budget changes with gridbot qos)")
    elif revised:
        click.echo(f"bag {answer.bag.name}: revision {answer.bag.revision}; {answer.requeued:,} failed job(s) queued "
                   f"again; it is {answer.bag.state}")
    elif not answer.requeued:
        click.echo(f"bag {answer.bag.name} has no failed jobs: nothing to retry (it is {answer.bag.state})")
    else:
        click.echo(f"bag {answer.bag.name}: {answer.requeued:,} failed job(s) queued again; it is {answer.bag.state}")


@cli.command()
@click.argument("bag")
@click.option("--keep-results", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Download the bag's results into DIR first (cancelling it first if it is active).")
@click.option("--force", "--yes", "force", is_flag=True,
              help="Delete even if its results were never downloaded (and write --keep-results over other files).")
@server_option
@access_option
@admin_option
@json_option
@friendly
def delete(bag: str, keep_results: Path | None, force: bool, server: str | None, access: Path | None, admin: bool,
           as_json: bool) -> None:
    """Remove a bag from the server: its jobs, results, inputs and history; an active bag is cancelled first.

    Refused while some of its results were never downloaded (`gridbot results`), unless --keep-results DIR
    (download them now) or --force (lose them). Its name is free again afterwards.
    """
    kept = None
    with Client(server, access=access, admin=admin) as client:
        if keep_results is not None:
            info = client.bag(bag)
            # the folder is checked (and made) before the bag is cancelled: a folder that cannot take its
            # results must leave an active bag running, since a cancelled bag cannot be retried
            ResultsFolder(keep_results, info, force).prepare()
            if info.state == BagState.ACTIVE:
                client.cancel(bag)
            kept = client.download_results(bag, keep_results, force)
        gone = client.delete(bag, force)
    if as_json:
        render.print_json({"deleted": gone, "results": str(keep_results) if kept is not None else None})
    else:
        where = f"; the results of {kept:,} jobs are in {keep_results}" if kept is not None else ""
        click.echo(f"deleted bag {gone.bag_id} '{gone.name}' ({gone.state}, {gone.total:,} jobs){where}")


@cli.command()
@click.argument("bag")
@click.argument("job", type=click.IntRange(0), metavar="JOB")
@server_option
@access_option
@admin_option
@json_option
@friendly
def logs(bag: str, job: int, server: str | None, access: Path | None, admin: bool, as_json: bool) -> None:
    """A job's story: every instance with its host and reason, and the kept result's stdout and stderr.

    JOB is the job's index in the bag, as in the results folder (0, 1, 2, ...).
    """
    with Client(server, access=access, admin=admin) as client:
        story = client.logs(bag, job)
    if as_json:
        render.print_json(story)
    else:
        render.job_log(story)


@cli.command()
@click.argument("bag")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True,
              help="Write into DIRECTORY even if it holds another bag's results (which go first) or other "
                   "files.")
@server_option
@access_option
@admin_option
@json_option
@friendly
def results(bag: str, directory: Path, force: bool, server: str | None, access: Path | None, admin: bool,
            as_json: bool) -> None:
    """Write the results of a bag's ended jobs into DIRECTORY (one folder per job, and jobs.jsonl)."""
    with Client(server, access=access, admin=admin) as client:
        n = client.download_results(bag, directory, force)
    if as_json:
        render.print_json({"bag": bag, "jobs": n, "directory": str(directory)})
    else:
        click.echo(f"wrote results of {n:,} jobs to {directory}")


@cli.command()
@server_option
@access_option
@admin_option
@json_option
@friendly
def pools(server: str | None, access: Path | None, admin: bool, as_json: bool) -> None:
    """Each pool: pilots queued, running and ended; hosts; jobs done; throughput."""
    with Client(server, access=access, admin=admin) as client:
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
            if p.monitor is not None:
                m = p.monitor
                render.console.print(f"pool {p.name}: {m.free_cpus} of {m.total_cpus} CPUs free, {m.pending_jobs} "
                                     f"job(s) waiting ({m.pending_cpus} CPUs), by {m.source}", soft_wrap=True)


@cli.command()
@click.argument("bag")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="The HTML file to write [default: report-BAG.html].")
@server_option
@access_option
@admin_option
@friendly
def report(bag: str, out: Path | None, server: str | None, access: Path | None, admin: bool) -> None:
    """Write one self-contained HTML file with a bag's plots and tables (the console's), to attach or archive."""
    from gridbot.cli.report import write_report

    with Client(server, access=access, admin=admin) as client:
        path = write_report(client, bag, out or Path(f"report-{bag.replace('/', '_')}.html"))
    click.echo(f"wrote {path}")


@cli.command()
@server_option
@access_option
@admin_option
@json_option
@friendly
def hosts(server: str | None, access: Path | None, admin: bool, as_json: bool) -> None:
    """The hosts that have pulled work, with their statistics."""
    with Client(server, access=access, admin=admin) as client:
        rows = client.hosts()
    if as_json:
        render.print_json(rows)
    else:
        render.console.print(render.hosts_table(rows))


def seed_option(value: int | None) -> int | None:
    """`simulate --seed`, in the range and words of a scenario's `seed`: it took any number of 0 or more, where
    the scenario refuses one beyond 2**53."""
    from gridbot.sim.scenario import check_seed

    try:
        return None if value is None else check_seed(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--seed", type=int, callback=lambda _ctx, _param, value: seed_option(value),
              help="Seed of the run [default: the scenario's].")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for metrics.json and the plots (incomplete.png, throughput.png).")
@click.option("--scale", type=Finite(0, 1, min_open=True), default=1.0,
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


def _access_commands() -> None:
    from gridbot.cli.access import access

    for command in access.commands.values():
        assert command.callback is not None
        command.callback = friendly(command.callback)
    cli.add_command(access)
    from gridbot.cli.volunteers import volunteers

    for command in volunteers.commands.values():
        assert command.callback is not None
        command.callback = friendly(command.callback)
    cli.add_command(volunteers)


_access_commands()


def main() -> None:
    cli(prog_name="gridbot")
