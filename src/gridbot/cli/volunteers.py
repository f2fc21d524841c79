"""`gridbot volunteers`: the accounts stock BOINC clients attach with (docs/volunteers.md).

Like `gridbot access`, these edit the server's files directly, on the server's machine: the accounts live
beside the key registry (`gridbot-volunteers.json`, mode 0600, digests only), and a running server takes a
change up within a second.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from gridbot.cli import render
from gridbot.security.access import ACCESS_NAME
from gridbot.volunteer.accounts import ACCOUNTS_NAME, HOSTS_NAME, AccountError, load_accounts, load_hosts, save_accounts

access_file_option = click.option("--access-file", type=click.Path(dir_okay=False, path_type=Path),
                                  default=Path(ACCESS_NAME), show_default=True,
                                  help="The server's access file: the accounts are kept beside it.")
volunteers_file_option = click.option("--volunteers-file", type=click.Path(dir_okay=False, path_type=Path),
                                      help=f"The accounts file [default: {ACCOUNTS_NAME} beside the access file].")


def _path(access_file: Path, volunteers_file: Path | None) -> Path:
    return volunteers_file or access_file.with_name(ACCOUNTS_NAME)


@click.group()
def volunteers() -> None:
    """Volunteer accounts: the keys stock BOINC clients attach to a volunteer pool with."""


@volunteers.command("add")
@click.argument("name")
@access_file_option
@volunteers_file_option
def add(name: str, access_file: Path, volunteers_file: Path | None) -> None:
    """A new account for volunteer NAME; prints its account key (shown this once).

    The volunteer attaches with: boinccmd --project_attach MASTER_URL KEY
    """
    path = _path(access_file, volunteers_file)
    accounts = load_accounts(path)
    key = accounts.add(name, time.time())
    save_accounts(path, accounts)
    click.echo(key)
    click.echo(f"(account key of volunteer {name}, shown only now; attach with `boinccmd --project_attach "
               "MASTER_URL KEY`)", err=True)


@volunteers.command("revoke")
@click.argument("name")
@access_file_option
@volunteers_file_option
def revoke(name: str, access_file: Path, volunteers_file: Path | None) -> None:
    """Revoke volunteer NAME's account: its clients get no more work from their next contact."""
    path = _path(access_file, volunteers_file)
    accounts = load_accounts(path)
    if not accounts.revoke(name):
        raise AccountError(f"no live account of volunteer '{name[:64]}' in {path}")
    save_accounts(path, accounts)
    click.echo(f"revoked the account of volunteer {name}")


@volunteers.command("list")
@access_file_option
@volunteers_file_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of lines.")
def list_accounts(access_file: Path, volunteers_file: Path | None, as_json: bool) -> None:
    """Every volunteer account: name, id, when made, whether revoked (never the keys)."""
    accounts = load_accounts(_path(access_file, volunteers_file)).accounts
    if as_json:
        render.print_json([{"name": a.name, "account_id": a.account_id, "created": a.created, "revoked": a.revoked}
                           for a in accounts])
        return
    for a in accounts:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(a.created))
        click.echo(f"{a.account_id}  {a.name:<20} {when}{'  revoked' if a.revoked else ''}")


@volunteers.command("hosts")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("gridbot-state"),
              show_default=True, help="The server's --state-dir.")
@access_file_option
@volunteers_file_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of lines.")
def hosts(state_dir: Path, access_file: Path, volunteers_file: Path | None, as_json: bool) -> None:
    """The BOINC hosts seen so far: BOINC host id (gridbot host `boinc-ID`), volunteer, CPID, CPUs and speed.

    Their statistics (jobs done, error rate) are gridbot's: `gridbot hosts`."""
    names = {a.account_id: a.name for a in load_accounts(_path(access_file, volunteers_file)).accounts}
    rows = [{"hostid": h.hostid, "host_id": f"boinc-{h.hostid}", "volunteer": names.get(h.account_id, "?"),
             "pool": h.pool, "cpid": h.cpid, "name": h.name, "ncpus": h.ncpus, "fpops": h.fpops,
             "created": h.created} for h in load_hosts(state_dir / "volunteer" / HOSTS_NAME)]
    if as_json:
        render.print_json(rows)
        return
    for r in rows:
        click.echo(f"boinc-{r['hostid']:<6} {r['volunteer']:<16} {r['pool']:<12} {r['name']:<20} {r['ncpus']:>4} CPUs "
                   f"{float(str(r['fpops'])) / 1e9:6.2f} GFLOPS  cpid {r['cpid']}")
