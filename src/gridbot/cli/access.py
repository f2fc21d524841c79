"""`gridbot access`: show, hand out, rotate and revoke the server's keys.

These commands edit the server's key registry and access file directly (on the server's machine); a
running server picks the change up within a second, so a revoked key is refused within a second.
"""

from __future__ import annotations

import time
from pathlib import Path

import click
import msgspec

from gridbot.cli import render
from gridbot.errors import unwritable
from gridbot.security.access import ACCESS_NAME, REGISTRY_NAME, Access, read_access, write_access
from gridbot.security.keys import (
    ADMIN_NAME,
    SUBMITTER_RE,
    AccessError,
    Registry,
    Role,
    default_user,
    load_registry,
    save_registry,
    write_private,
)

access_file_option = click.option("--access-file", type=click.Path(dir_okay=False, path_type=Path),
                                  default=Path(ACCESS_NAME), show_default=True,
                                  help="The server's access file (as `gridbot server` made it).")
keys_file_option = click.option("--keys-file", type=click.Path(dir_okay=False, path_type=Path),
                                help="The server's key registry [default: gridbot-keys.json beside the access file].")


def _files(access_file: Path, keys_file: Path | None) -> tuple[Path, Path, Registry, Access]:
    registry_path = keys_file or access_file.with_name(REGISTRY_NAME)
    if not registry_path.exists():
        raise AccessError(f"no key registry at {registry_path}: run this on the server's machine, in the folder "
                          "of its access file, or pass --access-file/--keys-file")
    return access_file, registry_path, load_registry(registry_path), read_access(access_file)


OUT_FIX = "give --out a file in a folder you may write"
IN_PLACE_FIX = "make it writable (or pass --access-file/--keys-file), then run this again"


def _write(path: Path, grants: Access, fix: str) -> None:
    """Write the access file `path`, or an AccessError naming it, what is wrong and what to do (`fix`)."""

    try:
        write_access(path, grants)
    except OSError as e:
        raise AccessError(str(unwritable(path, e, "the access file", fix))) from None


def _commit(registry_path: Path, registry: Registry, access_path: Path, grants: Access, fix: str) -> None:
    """Write the access file that holds new keys, then save the registry that makes them valid.

    In this order a failure changes nothing: an access file that cannot be written leaves the registry as
    it was (a key is never registered while its secret, kept nowhere else, is lost), and a registry that
    cannot be saved puts the access file back as it was (or removes a new one), so that its keys stay the
    ones the registry knows. Either is an AccessError naming the file and what is wrong.
    """
    before = access_path.read_bytes() if access_path.is_file() else None
    _write(access_path, grants, fix)
    try:
        _save(registry_path, registry)
    except AccessError as e:
        try:
            if before is None:
                access_path.unlink(missing_ok=True)
            else:
                write_private(access_path, before)
        except OSError:
            raise AccessError(f"{e}; and {access_path} could not be put back as it was: it holds keys the server "
                              "does not know, so restore it from a backup") from None
        raise


def _save(registry_path: Path, registry: Registry) -> None:
    """Save the key registry, or an AccessError naming it and what is wrong."""
    try:
        save_registry(registry_path, registry)
    except OSError as e:
        raise AccessError(f"cannot save the key registry {registry_path}: {e.strerror or e}; {IN_PLACE_FIX}") \
            from None


@click.group()
def access() -> None:
    """Keys: list them, hand out a submitter's or a pool's, rotate or revoke them."""


@access.command("show")
@access_file_option
@keys_file_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def show(access_file: Path, keys_file: Path | None, as_json: bool) -> None:
    """Every key the server knows: id, role, name, when made, whether revoked (never the secrets)."""
    _, _, registry, _ = _files(access_file, keys_file)
    rows = [{"key_id": k.key_id, "role": k.role, "name": k.name, "created": k.created, "revoked": k.revoked}
            for k in registry.keys]
    if as_json:
        render.print_json(rows)
        return
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(str(r["created"]))))
        click.echo(f"{r['key_id']}  {r['role']:<9} {r['name']:<20} {when}{'  revoked' if r['revoked'] else ''}")


@access.command("add-submitter")
@click.argument("name")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the new submitter's own access file (mode 0600).")
@access_file_option
@keys_file_option
def add_submitter(name: str, out: Path, access_file: Path, keys_file: Path | None) -> None:
    """A key for a new submitter NAME, who sees and changes only their own bags."""
    _, registry_path, registry, grants = _files(access_file, keys_file)
    if not SUBMITTER_RE.match(name):
        raise AccessError(f"submitter name {name[:70]!r} is not allowed: use 1-64 letters, digits, '.', '_' or '-', "
                          "starting with a letter or digit")
    if registry.live("submitter", name):
        raise AccessError(f"a submitter named '{name}' has a key already: bags are owned by name, so a second one "
                          f"would share them; choose another name, or `gridbot access rotate` to replace the key")
    if out.exists():
        raise AccessError(f"{out} exists; choose another --out")
    token = registry.add("submitter", name, time.time())
    _commit(registry_path, registry, out, Access(server=grants.server, fingerprint=grants.fingerprint,
                                                 submitter=token), OUT_FIX)
    click.echo(f"wrote {out}: give it to {name} (gridbot submit --access {out.name} ...)")


@access.command("export-worker")
@click.argument("pool")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the pool's worker access file (mode 0600), for hosts started by hand.")
@access_file_option
@keys_file_option
def export_worker(pool: str, out: Path, access_file: Path, keys_file: Path | None) -> None:
    """An access file with only POOL's worker key: it lets a host pull work, and nothing else."""
    _, _, _, grants = _files(access_file, keys_file)
    if out.exists():
        raise AccessError(f"{out} exists; choose another --out")
    if pool not in grants.workers:
        raise AccessError(f"the access file has no worker key for pool '{pool}'; it has {sorted(grants.workers)}")
    _write(out, Access(server=grants.server, fingerprint=grants.fingerprint, workers={pool: grants.workers[pool]}),
           OUT_FIX)
    click.echo(f"wrote {out}: gridbot worker --access {out.name} --pool {pool}")


@access.command("rotate")
@click.argument("role", type=click.Choice(["admin", "submitter", "worker", "all"]), default="all")
@click.option("--pool", help="With ROLE worker: only this pool's key.")
@access_file_option
@keys_file_option
def rotate(role: str, pool: str | None, access_file: Path, keys_file: Path | None) -> None:
    """New keys for ROLE in the access file; the old ones are revoked at once.

    Hosts registered with a rotated worker key are refused from their next exchange: start new ones
    with the new access file (the server's own pilots get the new key by themselves).
    """
    access_path, registry_path, registry, grants = _files(access_file, keys_file)
    now = time.time()
    roles: list[Role] = ["admin", "submitter", "worker"] if role == "all" else [role]  # type: ignore[list-item]
    changed = []
    if "admin" in roles and (grants.admin or role == "admin"):  # named alone: one revoked is made again
        if grants.admin:
            registry.revoke(key_id=grants.admin.split(".")[1])
        grants.admin = registry.add("admin", ADMIN_NAME, now)
        changed.append("admin")
    if "submitter" in roles and (grants.submitter or role == "submitter"):
        old = grants.submitter.split(".")[1] if grants.submitter else ""
        # the access file's own submitter, revoked by id: the newest submitter whose every key is revoked (its
        # bags are owned by that name), not whoever runs this command
        orphaned = [k.name for k in registry.keys if k.role == "submitter" and not registry.live("submitter", k.name)]
        name = next((k.name for k in registry.keys if k.key_id == old), "") or \
            (orphaned[-1] if orphaned else default_user())
        if old:
            registry.revoke(key_id=old)
        grants.submitter = registry.add("submitter", name, now)
        changed.append(f"submitter {name}")
    if "worker" in roles:
        names = [p for p in grants.workers if pool in (None, p)]
        if pool is not None and not names and any(k.role == "worker" and k.name == pool for k in registry.keys):
            names = [pool]  # its key was revoked (`gridbot access revoke --pool`): this is how it gets a new one
        for name in names:
            registry.revoke(role="worker", name=name)
            grants.workers[name] = registry.add("worker", name, now)
            changed.append(f"worker of pool {name}")
    if not changed:
        known = sorted({k.name for k in registry.keys if k.role == "worker"})
        raise AccessError("nothing to rotate: the access file has no such key" + (
            f" (the pools with worker keys: {', '.join(known)})" if pool is not None and known else ""))
    _commit(registry_path, registry, access_path, grants, IN_PLACE_FIX)
    click.echo(f"rotated: {', '.join(changed)}; new keys in {access_path}")


@access.command("revoke")
@click.argument("key_id", required=False)
@click.option("--pool", help="Revoke the worker key of this pool (its hosts are refused at their next exchange).")
@access_file_option
@keys_file_option
def revoke(key_id: str | None, pool: str | None, access_file: Path, keys_file: Path | None) -> None:
    """Revoke one key by its id (see `gridbot access show`), or a pool's worker key."""
    if (key_id is None) == (pool is None):
        raise click.UsageError("give a KEY_ID or --pool POOL")
    access_path, registry_path, registry, grants = _files(access_file, keys_file)
    hit = registry.revoke(key_id=key_id) if key_id else registry.revoke(role="worker", name=pool)
    if not hit:
        raise AccessError(f"no live key {'with id ' + key_id if key_id else 'for pool ' + str(pool)}")
    _save(registry_path, registry)  # first: a revocation never waits on the access file
    revoked = {k.key_id for k in hit}
    kept = msgspec.structs.replace(grants, workers={p: t for p, t in grants.workers.items()
                                                    if t.split(".")[1] not in revoked})
    for field in ("admin", "submitter"):
        token = getattr(kept, field)
        if token and token.split(".")[1] in revoked:
            kept = msgspec.structs.replace(kept, **{field: ""})
    if kept != grants:
        _write(access_path, kept, "the keys are revoked all the same (refused within a second); remove them from "
                                  "it by hand, or make it writable and run `gridbot access rotate`")
    click.echo(f"revoked {', '.join(f'{k.role} key {k.key_id} ({k.name})' for k in hit)}")
    for name in sorted({k.name for k in hit if k.role == "worker"}):
        click.echo(f"a new key for pool {name}: gridbot access rotate worker --pool {name}")
    for field in ("admin", "submitter"):
        if getattr(grants, field) and not getattr(kept, field):
            click.echo(f"the access file's {field} key was among them; a new one: gridbot access rotate {field}")
