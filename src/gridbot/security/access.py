"""The access file: what a client needs to talk to a server (its URL, keys, the TLS fingerprint).

`gridbot server` writes one on its first start (mode 0600) holding an admin key, a submitter key and a
worker key per pool; `gridbot access` makes smaller ones to hand out (a submitter's, a pool's worker
key). Clients find it through `--access FILE`, `GRIDBOT_ACCESS`, or `gridbot-access.json` in the
current folder. Keys also come from the environment (`GRIDBOT_KEY`, and for workers
`GRIDBOT_WORKER_KEY`), which is how the overlay hands a pilot its pool's key without putting it on a
command line that `ps` shows.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from gridbot.model.pools import PoolSpec
from gridbot.security.keys import (
    ADMIN_NAME,
    AccessError,
    Authenticator,
    Registry,
    default_user,
    load_registry,
    new_registry,
    save_registry,
    write_private,
)

ACCESS_NAME = "gridbot-access.json"
REGISTRY_NAME = "gridbot-keys.json"
ENV_ACCESS, ENV_KEY, ENV_WORKER_KEY, ENV_FINGERPRINT = ("GRIDBOT_ACCESS", "GRIDBOT_KEY", "GRIDBOT_WORKER_KEY",
                                                         "GRIDBOT_TLS_FINGERPRINT")
DEFAULT_POOL = "local"
"""The pool of workers started by hand (`gridbot worker`'s default `--pool`)."""


class Access(msgspec.Struct, omit_defaults=True):
    """The contents of an access file; every field is optional, so a file can carry just one key."""

    server: str = ""
    fingerprint: str = ""
    admin: str = ""
    submitter: str = ""
    workers: dict[str, str] = msgspec.field(default_factory=dict)
    """Worker keys by pool name."""

    def user_key(self, admin: bool = False) -> str:
        """The key a submitting client uses: the submitter's, or the admin's when asked (or the only one)."""
        if admin:
            return self.admin
        return self.submitter or self.admin

    def worker_key(self, pool: str | None) -> tuple[str, str]:
        """(pool, key) of the worker key for `pool`, or of the only one the file holds."""
        if pool is not None and pool in self.workers:
            return pool, self.workers[pool]
        if len(self.workers) == 1 and pool in (None, DEFAULT_POOL):
            return next(iter(self.workers.items()))
        if not self.workers:
            return pool or DEFAULT_POOL, ""
        raise AccessError(f"the access file has worker keys for pools {sorted(self.workers)}, not '{pool}'; "
                          "pass --pool with one of them")


def read_access(path: Path) -> Access:
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as e:
        raise AccessError(f"cannot read the access file {path}: {e.strerror}") from e
    if mode & 0o077:
        raise AccessError(f"the access file {path} can be read by others (mode {mode & 0o777:o}): it holds keys; "
                          f"run: chmod 600 {path}")
    try:
        access = msgspec.json.decode(data, type=Access)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise AccessError(f"the access file {path} is not one gridbot wrote ({e})") from e
    where = f"the access file {path}"
    access.admin = clean_key(access.admin, f"{where}: its admin key")
    access.submitter = clean_key(access.submitter, f"{where}: its submitter key")
    access.workers = {pool: clean_key(key, f"{where}: its worker key of pool {pool!r}")
                      for pool, key in access.workers.items()}
    return access


def clean_key(key: str, source: str) -> str:
    """`key` without the whitespace around it (`echo KEY > file` leaves a newline), or an AccessError naming
    `source` if anything but printable ASCII is left: every key gridbot makes is, and a control character
    (or a non-Latin-1 one) ended in the HTTP library's ValueError when the key went into a header."""
    key = key.strip()
    for at, char in enumerate(key, 1):
        if not " " < char < "\x7f":
            raise AccessError(f"{source} has {char!r} at character {at}: a gridbot key is printable ASCII with no "
                              "space or control character; copy the key again as gridbot wrote it")
    return key


def env_key(name: str) -> str:
    """The key in the environment variable `name` (GRIDBOT_KEY, GRIDBOT_WORKER_KEY), "" if unset, checked
    as `clean_key` does one from a file."""
    return clean_key(os.environ.get(name, ""), f"the environment variable {name}")


def write_access(path: Path, access: Access) -> None:
    write_private(path, msgspec.json.format(msgspec.json.encode(access), indent=2) + b"\n")


def find_access(explicit: str | Path | None) -> Access:
    """The access a client uses: `explicit` file, else GRIDBOT_ACCESS, else ./gridbot-access.json if it
    exists, else nothing; GRIDBOT_KEY and GRIDBOT_TLS_FINGERPRINT fill in what the file leaves empty."""
    path = explicit or os.environ.get(ENV_ACCESS)
    if path:
        access = read_access(Path(path))
    elif Path(ACCESS_NAME).is_file():
        access = read_access(Path(ACCESS_NAME))
    else:
        access = Access()
    fp = os.environ.get(ENV_FINGERPRINT, "")
    if not access.submitter and not access.admin and (key := env_key(ENV_KEY)):  # (read only when it is used)
        access = msgspec.structs.replace(access, submitter=key)
    fp = fp.strip()
    if fp and not access.fingerprint:
        access = msgspec.structs.replace(access, fingerprint=fp)
    return access


@dataclass
class ServerAccess:
    """The server's side: the authenticator, and where its keys and access file live."""

    auth: Authenticator
    access_path: Path | None
    registry_path: Path | None
    created: bool = False
    """The keys were made by this start (the server says where they are)."""

    def access(self) -> Access:
        """The access file as it is now (the overlay reads pools' worker keys from it at each submission,
        so a rotation reaches new pilots)."""
        if self.access_path is None:
            return Access()
        return read_access(self.access_path)


def ensure_keys(access_path: Path, registry_path: Path, pools: Iterable[PoolSpec], url: str,
                fingerprint: str, now: float) -> ServerAccess:
    """Load the server's keys, creating them on the first start: an admin key, a submitter key named after
    the user, and a worker key for each pool (and for workers started by hand). Pools added to the pools
    file later get their worker key here too. The access file is rewritten only when something in it
    changed (a new pool, a new URL or certificate)."""
    names = [DEFAULT_POOL, *(p.name for p in pools if p.kind != "volunteer")]
    created = not registry_path.exists()
    if created:
        if access_path.exists():
            raise AccessError(f"{access_path} exists but the key registry {registry_path} does not: the keys in it "
                              "would not be accepted. Move the access file away (or pass --keys-file with the "
                              "registry it belongs to) and start again")
        registry, access = new_registry(), Access()
        access.admin = registry.add("admin", ADMIN_NAME, now)
        access.submitter = registry.add("submitter", default_user(), now)
    else:
        registry = load_registry(registry_path)
        access = read_access(access_path) if access_path.exists() else Access()
    before = msgspec.json.encode(access)
    for pool in names:
        if pool not in access.workers and not registry.live("worker", pool):
            access.workers[pool] = registry.add("worker", pool, now)
    access.server, access.fingerprint = url, fingerprint
    if created or msgspec.json.encode(access) != before:
        save_registry(registry_path, registry)
        write_access(access_path, access)
    return ServerAccess(Authenticator(registry, registry_path), access_path, registry_path, created)


def ephemeral_keys(pools: Iterable[str] = (DEFAULT_POOL,), user: str | None = None) -> tuple[ServerAccess, Access]:
    """Keys that live in memory for one embedded run (`gridbot run`): nothing to set up or keep. The
    submitter is `user` (the login name by default): a resumed bag keeps the owner it was stored with."""
    registry: Registry = new_registry()
    submitter = registry.add("submitter", default_user() if user is None else user, 0.0)
    access = Access(admin=registry.add("admin", ADMIN_NAME, 0.0), submitter=submitter)
    for pool in pools:
        access.workers[pool] = registry.add("worker", pool, 0.0)
    return ServerAccess(Authenticator(registry), None, None), access
