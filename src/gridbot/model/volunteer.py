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

import math
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


PREFETCH_PER_CPU = 4
"""Instances a volunteer host may hold queued beyond one per CPU: the BOINC client asks for hours of work (its
buffer), and a bag's short jobs would otherwise pile up on one host, as in the paper's community grid, "a batch
of jobs is sent to a host for sequential execution"."""


def runtime_estimate(bag_means: list[float], default: float) -> float:
    """Seconds one job is taken to run, to turn a client's request in seconds into instances: the mean of the
    active bags' mean run times so far (`default`, the pool's `runtime_estimate`, before any job has ended).
    The BOINC side and the simulator's volunteer hosts both use it."""
    means = [m for m in bag_means if m > 0]
    return max(1.0, sum(means) / len(means)) if means else default


def instances_for(work_req_seconds: float, cpu_req_secs: float, cpu_req_instances: float, estimate: float,
                  max_assign: int) -> int:
    """Instances to send for a scheduler request of so many seconds of work: the seconds over the estimate, at
    least one per idle CPU the client names, at most `max_assign` (0: it asks for none)."""
    seconds = max(work_req_seconds, cpu_req_secs)
    if seconds <= 0:
        return 0
    want = max(math.ceil(seconds / estimate), math.ceil(cpu_req_instances))
    return max(1, min(want, max_assign))


def volunteer_prefetch(want: int, ncpus: int) -> int:
    """The host's `prefetch` as the dispatcher sees it: instances asked for beyond one per CPU, at most
    `PREFETCH_PER_CPU` per CPU (the default Concurrency then lets it hold that many)."""
    return min(max(0, want - ncpus), PREFETCH_PER_CPU * ncpus)


def rpc_delay(next_rpc_delay: float, host_timeout: float) -> float:
    """The `next_rpc_delay` sent in every reply: the client's heartbeat, well inside the server's host timeout."""
    return min(next_rpc_delay, host_timeout / 3)


def empty_delay(backoff: float) -> float:
    """The `request_delay` of a reply that asked for work and got none: the dispatcher's backoff, at least 1 s."""
    return max(1.0, backoff)
