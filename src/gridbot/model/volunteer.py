"""The settings of a volunteer pool (`kind = "volunteer"`: stock BOINC clients) as a pools file gives them.

    [pools.community]
    kind = "volunteer"
    port = 8471                 # where the BOINC side listens (its own port: the master page, the scheduler,
    path = "/"                  #   downloads and uploads, under this path)
    url = "https://grid.example.org/"   # the master URL volunteers attach to, if a proxy stands in front
    project_name = "gridbot"    # what the BOINC Manager shows
    next_rpc_delay = 60         # seconds between a client's contacts, busy or idle (its heartbeat)
    runtime_estimate = 300      # seconds a job is taken to run before any has ended (the client's estimate)

Pure: the pools file's validator (`model.pools`) calls `volunteer_problems`; the server's BOINC side
(`gridbot.volunteer`) reads the same keys through `VolunteerSettings.of`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KEYS = ("port", "listen", "path", "url", "project_name", "next_rpc_delay", "runtime_estimate")
"""A volunteer pool's own keys (beside the common ones)."""
DEFAULT_RPC_DELAY = 60.0
DEFAULT_RUNTIME = 300.0


@dataclass(frozen=True)
class VolunteerSettings:
    """A volunteer pool's BOINC side, validated (see the module's docstring for each key)."""

    port: int
    listen: str = ""
    """Address to listen on ("": the server's --host)."""
    path: str = "/"
    url: str = ""
    """The master URL ("": http://LISTEN:PORT/PATH)."""
    project_name: str = "gridbot"
    next_rpc_delay: float = DEFAULT_RPC_DELAY
    runtime_estimate: float = DEFAULT_RUNTIME

    @staticmethod
    def of(options: Mapping[str, Any]) -> VolunteerSettings:
        """The settings from a validated pool's `options` (its table's own keys)."""
        return VolunteerSettings(
            port=int(options["port"]), listen=str(options.get("listen", "")), path=str(options.get("path", "/")),
            url=str(options.get("url", "")), project_name=str(options.get("project_name", "gridbot")),
            next_rpc_delay=float(options.get("next_rpc_delay", DEFAULT_RPC_DELAY)),
            runtime_estimate=float(options.get("runtime_estimate", DEFAULT_RUNTIME)))


def master_url_problem(url: str) -> str:
    """Why the stock client would refuse `url` as a master URL ("" if it takes it): it must be http(s), end in
    '/', and its host must contain a dot (`http://localhost/` is refused; use 127.0.0.1)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("http", "https"):
        return "must start with http:// or https://"
    if not url.endswith("/"):
        return "must end with '/'"
    host = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    if "." not in host.split(":")[0] and not host.startswith("["):
        return "needs a host name with a dot (the BOINC client refuses http://localhost/: use 127.0.0.1)"
    return ""


def volunteer_problems(name: str, table: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A (message, hint) for each wrong key of volunteer pool `name`'s table."""
    out: list[tuple[str, str]] = []
    port = table.get("port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535):
        out.append((f"'port' of pool '{name}' must be a port number from 1 to 65535, not {port!r}",
                    "port = 8471 (0: any free port, for tests)"))
    path = table.get("path", "/")
    if not isinstance(path, str) or not path.startswith("/") or not path.endswith("/") or "//" in path:
        out.append((f"'path' of pool '{name}' must start and end with '/', not {path!r}", 'path = "/boinc/"'))
    for key in ("listen", "project_name"):
        value = table.get(key, "x")
        if not isinstance(value, str) or not value or len(value) > 200 or any(c in value for c in "<>&\n"):
            out.append((f"'{key}' of pool '{name}' must be a short plain string, not {value!r}", ""))
    url = table.get("url")
    if url is not None:
        problem = master_url_problem(url) if isinstance(url, str) else "must be a string"
        if problem:
            out.append((f"'url' of pool '{name}' {problem}", 'url = "https://grid.example.org/"'))
    for key, low in (("next_rpc_delay", 5.0), ("runtime_estimate", 1.0)):
        value = table.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not low <= value <= 86400):
            out.append((f"'{key}' of pool '{name}' must be seconds from {low:g} to 86400, not {value!r}", ""))
    return out
