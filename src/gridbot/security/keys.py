"""Keys and who holds them: the server's key registry, the tokens clients send, and host credentials.

A key is `gb1.<key id>.<secret>`: the id finds the key, the 256-bit secret proves it. The server keeps
only the SHA-256 of each secret (a key this long needs no slow hash: nothing can be guessed), and
compares in constant time. Three roles hold keys: `admin` (sees and changes everything), `submitter`
(owns the bags it submits) and `worker` (one per pool: may only register hosts).

A host registers with its pool's worker key and gets a host credential,
`gbh.<key id>.<host id>.<mac>`, where the MAC is an HMAC-SHA-256 of the key id and the host id under the
registry's secret. The server issues the host id, so a worker cannot pick another host's; nothing is
stored per host, the credential survives a server restart, and revoking the pool's worker key revokes
every host registered with it.

A pilot whose environment its jobs can read (an EC2 instance's user data, which any process on the instance
can fetch from the metadata service) gets no worker key but an enrollment token,
`gbe.<key id>.<nonce>.<uses>.<expires>.<mac>`: it registers at most `uses` hosts (the overlay makes one per
instance), until `expires` (Unix time), and only while the pool's worker key lives. By the time a job runs, its
worker has registered, so the token a job finds is spent. The server counts the uses in memory: a server
restarted before the token expires takes it as unused.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import hmac
import os
import re
import secrets
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import msgspec

from gridbot.errors import GridbotError

Role = Literal["admin", "submitter", "worker", "host"]
ROLES: tuple[Role, ...] = ("admin", "submitter", "worker", "host")
ADMIN_NAME = "@admin"
"""The name behind the admin key: no submitter can have it (their names cannot start with "@")."""
_DIGITS = re.compile(r"[0-9]{1,12}")
"""A count or a Unix time in an enrollment token (ASCII digits: `str.isdigit` takes '²', which `int` refuses)."""
SUBMITTER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
KEY_PREFIX = "gb1"
HOST_PREFIX = "gbh"
ENROLL_PREFIX = "gbe"
ENROLLMENT_TTL = 3600.0
"""Seconds an enrollment token registers hosts: an instance boots, installs gridbot and registers within
minutes; a token found later is worth nothing."""
RELOAD_EVERY = 1.0
"""Seconds between checks of the registry file for changes (rotation and revocation by `gridbot access`):
a revoked key is refused within a second, and at once where it matters most (`refresh(force=True)`)."""


class AccessError(GridbotError):
    """A key, an access file or the registry is missing, malformed or refused."""


class Key(msgspec.Struct):
    """One key as the server keeps it: never the secret, only its digest."""

    key_id: str
    role: Role
    name: str
    """The submitter's name (bags are owned by it), the pool of a worker key, or the admin's name."""
    digest: str
    created: float
    revoked: bool = False


class Registry(msgspec.Struct):
    """Every key the server knows, and the secret its host credentials are made with."""

    secret: str
    keys: list[Key] = msgspec.field(default_factory=list)
    version: int = 1

    def add(self, role: Role, name: str, now: float) -> str:
        """A new key for `role` and `name`; returns the token to hand out (the only time it exists)."""
        key_id = secrets.token_hex(6)
        secret = secrets.token_urlsafe(32)
        self.keys.append(Key(key_id, role, name, _digest(secret), now))
        return f"{KEY_PREFIX}.{key_id}.{secret}"

    def live(self, role: Role | None = None, name: str | None = None) -> list[Key]:
        """Keys not revoked, of `role` and `name` when given."""
        return [k for k in self.keys if not k.revoked and role in (None, k.role) and name in (None, k.name)]

    def revoke(self, key_id: str | None = None, role: Role | None = None, name: str | None = None) -> list[Key]:
        """Revoke one key by id, or every live key of a role (and name); returns what was revoked."""
        hit = [k for k in self.keys if not k.revoked and (k.key_id == key_id if key_id is not None else
                                                           k.role == role and name in (None, k.name))]
        for k in hit:
            k.revoked = True
        return hit


class Principal(msgspec.Struct, frozen=True):
    """Who made a request: the role, the key's name (the owner of bags, or the pool), and for a host its id."""

    role: Role
    name: str
    key_id: str
    host_id: str = ""
    enrollment: str = ""
    """The nonce of the enrollment token it came with ("": a key or a host credential)."""
    uses: int = 0
    """The hosts that token may register."""
    expires: float = 0.0

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_registry() -> Registry:
    """An empty registry with a fresh host-credential secret."""
    return Registry(secrets.token_hex(32))


def default_user() -> str:
    """The name a first submitter key gets: the login name of whoever started the server (if it makes a
    valid submitter name)."""
    with contextlib.suppress(Exception):
        name = getpass.getuser()
        if SUBMITTER_RE.match(name):
            return name
    return "default"


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` readable by its owner alone (mode 0600), atomically, making its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data, 0o600)


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace `path` with `data` whole, as a file of `mode`: written and synced under a temporary name beside
    it that no other writer picks (mkstemp, O_EXCL), then renamed over it, so a reader sees the old file or
    the new one, never half of one, and two writers never share a temporary file. The temporary file is
    removed on any failure; an OSError says why. Whatever is at `path` is replaced, so a caller that must
    not replace a link, pipe or device checks first."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:180]}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load_registry(path: Path) -> Registry:
    try:
        return msgspec.json.decode(path.read_bytes(), type=Registry)
    except OSError as e:
        raise AccessError(f"cannot read the key registry {path}: {e.strerror}") from e
    except msgspec.DecodeError as e:
        raise AccessError(f"the key registry {path} is damaged ({e}); restore it from a backup, or move it "
                          "away and start the server to create new keys") from e


def save_registry(path: Path, registry: Registry) -> None:
    write_private(path, msgspec.json.format(msgspec.json.encode(registry), indent=2))


class Authenticator:
    """Checks the bearer tokens of requests against a registry (re-read when its file changes)."""

    def __init__(self, registry: Registry, path: Path | None = None) -> None:
        self.path = path
        self._stamp = self._stat()
        self._checked = time.monotonic()
        self._use(registry)

    def _use(self, registry: Registry) -> None:
        self.registry = registry
        self._secret = bytes.fromhex(registry.secret)
        self._keys = {k.key_id: k for k in registry.keys if not k.revoked}
        self._seen: dict[str, Principal] = {}

    def _stat(self) -> tuple[int, int] | None:
        if self.path is None:
            return None
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_ino

    def refresh(self, force: bool = False) -> None:
        """Pick up a registry rewritten by `gridbot access` (checked at most once a second unless `force`)."""
        if self.path is None or (not force and time.monotonic() - self._checked < RELOAD_EVERY):
            return
        self._checked = time.monotonic()
        stamp = self._stat()
        if stamp == self._stamp:
            return
        try:
            registry = load_registry(self.path)
        except AccessError:
            return  # a half-written file by hand: keep the keys in force
        self._stamp = stamp
        self._use(registry)

    def authenticate(self, token: str, fresh: bool = False) -> Principal | None:
        """The principal of a valid, unrevoked token; None otherwise (`fresh`: against the registry file as
        it is now, not as it was up to a second ago)."""
        self.refresh(force=fresh)
        known = self._seen.get(token)
        if known is not None:
            return known
        principal = self._check(token)
        if principal is None and not fresh and self._stamp != self._stat():
            self.refresh(force=True)  # a key made in the last second (`gridbot access add-submitter`)
            principal = self._check(token)
        if principal is not None and not principal.enrollment and len(self._seen) < 100_000:
            self._seen[token] = principal  # (an enrollment token is checked each time: it expires)
        return principal

    def _check(self, token: str) -> Principal | None:
        """The principal of `token` against the keys loaded now."""
        if not token.isascii():  # (compare_digest and encode refuse other text with an error: no key is such)
            return None
        parts = token.split(".")
        principal: Principal | None = None
        if len(parts) == 3 and parts[0] == KEY_PREFIX:
            key = self._keys.get(parts[1])
            if key is not None and hmac.compare_digest(key.digest, _digest(parts[2])):
                principal = Principal(key.role, key.name, key.key_id)
        elif len(parts) == 4 and parts[0] == HOST_PREFIX:
            key = self._keys.get(parts[1])
            mac = self._mac(parts[1], parts[2])
            if key is not None and key.role == "worker" and hmac.compare_digest(parts[3], mac):
                principal = Principal("host", key.name, key.key_id, parts[2])
        elif len(parts) == 6 and parts[0] == ENROLL_PREFIX and _DIGITS.fullmatch(parts[3]) and _DIGITS.fullmatch(
                parts[4]):
            key = self._keys.get(parts[1])
            mac = self._mac(parts[1], ".".join(("enroll", *parts[2:5])))
            if (key is not None and key.role == "worker" and hmac.compare_digest(parts[5], mac)
                    and time.time() < int(parts[4])):
                principal = Principal("worker", key.name, key.key_id, enrollment=parts[2], uses=int(parts[3]),
                                      expires=float(parts[4]))
        return principal

    def enrollment(self, worker_token: str, uses: int, now: float, ttl: float = ENROLLMENT_TTL) -> str:
        """An enrollment token for `uses` hosts of the pool whose worker key is `worker_token`, valid `ttl`
        seconds from `now` (AccessError: that key is unknown or revoked)."""
        parts = worker_token.split(".")
        if len(parts) == 3 and parts[0] == KEY_PREFIX and parts[1] not in self._keys:
            self.refresh(force=True)  # (a key rotated a moment ago: the access file has it before we do)
        key = self._keys.get(parts[1]) if len(parts) == 3 and parts[0] == KEY_PREFIX else None
        if key is None or key.role != "worker" or not hmac.compare_digest(key.digest, _digest(parts[2])):
            raise AccessError("an enrollment token is made from a pool's live worker key")
        nonce, expires = secrets.token_hex(8), int(now + ttl)
        # (with dots, which no host id of a host credential can hold: neither MAC passes for the other)
        mac = self._mac(key.key_id, f"enroll.{nonce}.{max(1, uses)}.{expires}")
        return f"{ENROLL_PREFIX}.{key.key_id}.{nonce}.{max(1, uses)}.{expires}.{mac}"

    def enroll(self, principal: Principal, now: float, spend: Callable[[str, int, float, float], bool]) -> bool:
        """Count one host registered with the enrollment token `principal` came with, by `spend` (the store's
        `spend_enrollment`: durable, so a restarted server does not take a spent token for a fresh one);
        False if it has expired or registered as many hosts as it may."""
        if principal.expires <= now:  # (a request checked just before its token expired, read after)
            return False
        return spend(principal.enrollment, principal.uses, float(principal.expires), now)

    def _mac(self, key_id: str, host_id: str) -> str:
        return hmac.new(self._secret, f"{key_id}:{host_id}".encode(), hashlib.sha256).hexdigest()[:40]

    def host_credential(self, worker: Principal) -> tuple[str, str]:
        """A new host id and its credential, for a host registering with `worker`'s key."""
        if worker.role != "worker":
            raise AccessError("only a worker key registers hosts")
        host_id = secrets.token_hex(10)
        return host_id, f"{HOST_PREFIX}.{worker.key_id}.{host_id}.{self._mac(worker.key_id, host_id)}"
