"""Volunteer accounts (the BOINC authenticators) and the BOINC hosts seen with them.

An account is a name and a secret authenticator, `gridbot volunteers add NAME` prints it once; the file
keeps only its SHA-256, as the server's key registry does (security/keys.py), written atomically with mode
0600. The BOINC client sends the authenticator in plain text inside every scheduler request: that is the
check (use HTTPS in front, docs/volunteers.md). A running server re-reads the file when it changes, so an
account added or revoked takes effect within a second.

Hosts are the server's own record (in its state folder): each BOINC host gets an integer host id in its first
reply, and the gridbot host id `boinc-N`; a client that comes back with host id 0 (re-attached) gets its old
record again by its cross-project id (CPID), which the client derives from its MAC address and data folder.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from pathlib import Path

import msgspec

from gridbot.errors import GridbotError
from gridbot.security.keys import SUBMITTER_RE, write_private

ACCOUNTS_NAME = "gridbot-volunteers.json"
HOSTS_NAME = "hosts.json"
ID_CHARS = 12
RELOAD_EVERY = 1.0
MAX_HOSTS_PER_ACCOUNT = 1_000
"""Hosts one account may have: a client cannot fill the host table by inventing CPIDs."""
AUTH_RE = re.compile(r"[0-9a-f]{52}\Z")


class AccountError(GridbotError):
    """An account cannot be made, found or read."""


class Account(msgspec.Struct):
    """One volunteer account: never the authenticator, only its digest."""

    account_id: str
    name: str
    digest: str
    created: float
    revoked: bool = False


class Accounts(msgspec.Struct):
    """Every volunteer account of a server."""

    accounts: list[Account] = msgspec.field(default_factory=list)
    version: int = 1

    def add(self, name: str, now: float) -> str:
        """A new account for `name`; returns its authenticator (the only time it exists)."""
        if not SUBMITTER_RE.match(name):
            raise AccountError(f"volunteer name {name[:70]!r} is not allowed: use 1-64 letters, digits, '.', '_' "
                               "or '-', starting with a letter or digit")
        if any(a.name == name and not a.revoked for a in self.accounts):
            raise AccountError(f"volunteer '{name}' has an account already; revoke it first to make a new key")
        account_id = secrets.token_hex(ID_CHARS // 2)
        secret = secrets.token_hex(20)
        self.accounts.append(Account(account_id, name, _digest(secret), now))
        return account_id + secret

    def revoke(self, name: str) -> list[Account]:
        """Revoke every live account of `name`; returns them."""
        hit = [a for a in self.accounts if a.name == name and not a.revoked]
        for a in hit:
            a.revoked = True
        return hit


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def load_accounts(path: Path) -> Accounts:
    """The accounts file at `path` (none yet: an empty set)."""
    if not path.exists():
        return Accounts()
    try:
        return msgspec.json.decode(path.read_bytes(), type=Accounts)
    except OSError as e:
        raise AccountError(f"cannot read the volunteer accounts {path}: {e.strerror}") from e
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise AccountError(f"the volunteer accounts file {path} is damaged ({e}); restore it from a backup") from e


def save_accounts(path: Path, accounts: Accounts) -> None:
    write_private(path, msgspec.json.format(msgspec.json.encode(accounts), indent=2) + b"\n")


class AccountBook:
    """The server's view of the accounts file: checks authenticators, re-reading the file when it changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._checked = -RELOAD_EVERY
        self._live: dict[str, Account] = {}
        self.refresh(force=True)

    def refresh(self, force: bool = False) -> None:
        """Take up a file rewritten by `gridbot volunteers` (looked at once a second at most, unless `force`)."""
        now = time.monotonic()
        if not force and now - self._checked < RELOAD_EVERY:
            return
        self._checked = now
        try:
            st = self.path.stat()
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_ino)
        except OSError:
            stamp = None
        if stamp == self._stamp:
            return
        try:
            accounts = load_accounts(self.path)
        except AccountError:
            return  # half-written by hand: keep what is in force
        self._stamp = stamp
        self._live = {a.account_id: a for a in accounts.accounts if not a.revoked}

    def authenticate(self, authenticator: str) -> Account | None:
        """The live account of `authenticator`, or None. An unknown account makes the file be looked at at once
        (a stat): a key added a moment ago is not refused, which would send its client away for an hour."""
        self.refresh()
        if not AUTH_RE.match(authenticator):
            return None
        account = self._live.get(authenticator[:ID_CHARS])
        if account is None:
            self.refresh(force=True)
            account = self._live.get(authenticator[:ID_CHARS])
        if account is None or not hmac.compare_digest(account.digest, _digest(authenticator[ID_CHARS:])):
            return None
        return account


class VolunteerHost(msgspec.Struct):
    """A BOINC host as the server knows it."""

    hostid: int
    account_id: str
    cpid: str
    pool: str
    created: float
    name: str = ""
    """The client's domain name, as it last said."""
    ncpus: int = 0
    fpops: float = 0.0
    """Its CPUs' speed by the client's benchmark (floating-point operations a second, per CPU)."""


class HostTable(msgspec.Struct):
    hosts: list[VolunteerHost] = msgspec.field(default_factory=list)
    next_id: int = 1


NOTE_EVERY = 10.0
"""Seconds between two rewrites of the hosts file for what clients say of themselves (`Hosts.note`)."""


class Hosts:
    """BOINC host ids, kept in the server's state folder (written when a host is new)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.table = msgspec.json.decode(path.read_bytes(), type=HostTable) if path.exists() else HostTable()
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
            raise AccountError(f"cannot read the volunteer hosts {path}: {e}") from e
        self._by_id = {h.hostid: h for h in self.table.hosts}
        self._noted_at = -NOTE_EVERY

    def resolve(self, account: Account, hostid: int, cpid: str, pool: str, now: float) -> tuple[VolunteerHost, bool]:
        """The host a request comes from, and whether it is new (its id must then go in the reply).

        The id the client sent counts if it is this account's in this pool; else the account's host in this pool
        with the same CPID; else a new host (AccountError past MAX_HOSTS_PER_ACCOUNT). A client attached to two
        volunteer pools is two hosts, as it is two hosts to two BOINC projects: each pool's requests list only
        that pool's results, and one host would lose the other pool's instances at every request."""
        known = self._by_id.get(hostid)
        if known is not None and known.account_id == account.account_id and known.pool == pool:
            return known, False
        mine = [h for h in self.table.hosts if h.account_id == account.account_id]
        same = next((h for h in mine if cpid and h.cpid == cpid and h.pool == pool), None)
        if same is not None:
            return same, True
        if len(mine) >= MAX_HOSTS_PER_ACCOUNT:
            raise AccountError(f"account '{account.name}' has {len(mine):,} hosts, the most one account may have")
        host = VolunteerHost(self.table.next_id, account.account_id, cpid, pool, now)
        self.table.next_id += 1
        self.table.hosts.append(host)
        self._by_id[host.hostid] = host
        self._save()
        return host, True

    def note(self, host: VolunteerHost, name: str, ncpus: int, fpops: float) -> None:
        """Keep what the client says of itself, rewriting the file when that changed (by 5% for speed), at most
        every NOTE_EVERY seconds: a client that changed its name at every request made the server rewrite and
        fsync the file at each (the security review of 2026-11-29). What is noted in between is written with
        the next change after that, or with a new host."""
        if host.name == name and host.ncpus == ncpus and abs(host.fpops - fpops) <= 0.05 * fpops:
            return
        host.name, host.ncpus, host.fpops = name, ncpus, fpops
        now = time.monotonic()
        if now - self._noted_at >= NOTE_EVERY:
            self._noted_at = now
            self._save()

    def _save(self) -> None:
        write_private(self.path, msgspec.json.encode(self.table))


def load_hosts(path: Path) -> list[VolunteerHost]:
    """The hosts file as it is (for `gridbot volunteers hosts`)."""
    return Hosts(path).table.hosts if path.exists() else []
