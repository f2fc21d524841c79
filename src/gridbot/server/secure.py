"""What `gridbot server` sets up before it listens: its keys, its access file and TLS, safe by default.

Keys are always on. A server without keys (`--no-auth`) may listen on loopback only; one that listens
beyond this machine without TLS is allowed (a cluster's private network may be trusted) but warned
about, since keys then cross the network in clear.
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gridbot.errors import UsageError
from gridbot.model.pools import PoolSpec
from gridbot.security import tls
from gridbot.security.access import ACCESS_NAME, REGISTRY_NAME, ServerAccess, ensure_keys

log = logging.getLogger("gridbot.server")


@dataclass(frozen=True)
class ServerSecurity:
    """How the server authenticates and encrypts: its keys (None: --no-auth), TLS context and URL."""

    access: ServerAccess | None
    ssl: ssl.SSLContext | None
    url: str
    fingerprint: str


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def store_folder(db: str, state_dir: Path) -> Path:
    """Where the access file goes by default: beside a SQLite store, else in the state folder."""
    if db.startswith("sqlite:///"):
        return Path(db.removeprefix("sqlite:///").split("?", 1)[0]).resolve().parent
    return state_dir.resolve()


def check_options(host: str, no_auth: bool, tls_mode: str | None, tls_cert: Path | None,
                  tls_key: Path | None) -> None:
    """Refuse a combination of options that is unsafe or meaningless, before anything is opened or made."""
    if no_auth and not is_loopback(host):
        raise UsageError(f"--no-auth with --host {host} would let anyone who reaches this port run commands on "
                         "every worker; drop --no-auth (the server makes keys and an access file for you), "
                         "or listen on 127.0.0.1")
    if (tls_cert is None) != (tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    if tls_mode is not None and tls_cert is not None:
        raise UsageError("give either --tls self-signed or --tls-cert/--tls-key, not both")


def prepare(db: str, host: str, port: int, pools: Sequence[PoolSpec], state_dir: Path,
            access_file: Path | None = None, keys_file: Path | None = None, no_auth: bool = False,
            tls_mode: str | None = None, tls_cert: Path | None = None, tls_key: Path | None = None,
            public_url: str | None = None) -> ServerSecurity:
    """Check the options, create what is missing (keys, access file, self-signed certificate), and say
    where they are."""
    check_options(host, no_auth, tls_mode, tls_cert, tls_key)
    folder = access_file.resolve().parent if access_file is not None else store_folder(db, state_dir)
    access_path = access_file or folder / ACCESS_NAME
    registry_path = keys_file or access_path.with_name(REGISTRY_NAME)
    context, fingerprint = None, ""
    if tls_mode == "self-signed":
        tls_cert, tls_key = folder / "gridbot-tls.crt", folder / "gridbot-tls.key"
        fingerprint = tls.self_signed(tls_cert, tls_key, tls.default_names(host))
    elif tls_cert is not None:
        fingerprint = tls.fingerprint_of_file(tls_cert)
    if tls_cert is not None and tls_key is not None:
        context = tls.server_context(tls_cert, tls_key)
    scheme = "https" if context is not None else "http"
    url = public_url or f"{scheme}://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{port}"
    if not is_loopback(host) and context is None:
        log.warning("listening on %s without TLS: keys and results cross the network in clear; add --tls "
                    "self-signed (workers then pin the certificate from the access file)", host)
    if no_auth:
        log.warning("keys are off (--no-auth): anyone on this machine can submit commands to the workers")
        return ServerSecurity(None, context, url, fingerprint)
    access = ensure_keys(access_path, registry_path, pools, url, fingerprint, time.time())
    return ServerSecurity(access, context, url, fingerprint)
