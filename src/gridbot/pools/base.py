"""What every pool adapter does: three batched verbs over pilots, and the worker command a pilot runs.

Adapters follow Parsl's ExecutionProvider and PSI/J: `submit(n, pilot) -> ids`, `status(ids)`,
`cancel(ids)`, plus a polling interval. A pilot is one `gridbot worker` in the pool, pointed at the
server, which exits on its own when it gets no work (`idle_timeout`) or nears its walltime.
"""

from __future__ import annotations

import shlex
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gridbot.errors import GridbotError
from gridbot.model.pools import PoolMonitor, PoolSpec
from gridbot.model.states import PilotState
from gridbot.security.access import ENV_FINGERPRINT, ENV_WORKER_KEY

PILOT_PATIENCE = 86_400.0
"""Seconds a pilot of a pool without walltime waits for an unreachable server before it gives up."""
LIFETIME_MARGIN = 0.9
"""A pilot's worker stops taking work at this fraction of its walltime, and exits before it is killed."""


class PoolError(GridbotError):
    """A pool refused or could not do what was asked; `retryable` when trying later may help."""


@dataclass(frozen=True)
class PilotRequest:
    """What a pilot needs to know: where the server is, how long it may live, and its pool's worker key.

    The key and the server's TLS fingerprint travel in the pilot's environment (`env`), never on its
    command line, which any user of the machine can read with `ps`.
    """

    server: str
    python: str = sys.executable
    key: str = ""
    fingerprint: str = ""

    @property
    def env(self) -> dict[str, str]:
        """The variables a pilot's worker reads its key and the certificate pin from."""
        env = {ENV_WORKER_KEY: self.key} if self.key else {}
        if self.fingerprint:
            env[ENV_FINGERPRINT] = self.fingerprint
        return env

    def worker_args(self, pool: PoolSpec) -> list[str]:
        """The worker command line a pilot of `pool` runs (walltime 0: no lifetime).

        A pilot waits for an unreachable server as long as its walltime allows (its lifetime ends it), and
        a day where the pool has no walltime, holding its finished results meanwhile."""
        give_up = 0.0 if pool.walltime else PILOT_PATIENCE
        args = ["-m", "gridbot", "worker", "--server", self.server, "--slots", str(pool.cpus), "--pool", pool.name,
                "--idle-timeout", f"{pool.idle_timeout:g}", "--leave-when-refused", "--give-up-after", f"{give_up:g}",
                "--min-cpu", f"{pool.min_cpu:g}", "--cpu-window", f"{pool.cpu_window:g}"]
        if pool.walltime:
            args += ["--lifetime", f"{pool.walltime * LIFETIME_MARGIN:g}"]
        if pool.run_as:
            args += ["--run-as", pool.run_as]
        if pool.allow_root:
            args.append("--allow-root")
        if pool.jobs_per_pilot:
            args += ["--max-jobs", str(pool.jobs_per_pilot)]
        return args

    def command(self, pool: PoolSpec) -> str:
        return shlex.join([self.python, *self.worker_args(pool)])


class PoolAdapter(ABC):
    """One pool's pilots."""

    poll_interval: float = 5.0

    def __init__(self, spec: PoolSpec) -> None:
        self.spec = spec

    @classmethod
    def for_pool(cls, spec: PoolSpec, workdir: Path) -> PoolAdapter:
        """The adapter of pool `spec`, its pilots' files under `workdir` if it keeps any (`make_adapter`)."""
        return cls(spec)

    @abstractmethod
    def submit(self, n: int, pilot: PilotRequest) -> list[str]:
        """Submit `n` pilots; return their ids (raise PoolError if the pool refuses)."""

    @abstractmethod
    def status(self, ids: Sequence[str]) -> dict[str, PilotState]:
        """The state of each pilot (unknown ids: COMPLETED, they left the pool's view)."""

    @abstractmethod
    def cancel(self, ids: Sequence[str]) -> None:
        """Cancel pilots, queued or running."""

    def attach(self, pilots: Mapping[str, PilotState]) -> None:  # noqa: B027 - a pool that knows any id
        """Take up pilots submitted before the server restarted, with the state last recorded of each, so that
        `status` and `cancel` know them (by default the pool answers for any id, as EC2 does)."""

    def close(self) -> None:  # noqa: B027 - optional
        """Release what the adapter holds (threads, connections); the pilots go on."""

    def why_failed(self, pilot: str) -> str:
        """What the pool knows of why pilot `pilot` failed, in a line ("": nothing), for the pool's error."""
        return ""

    def monitor(self, now: float) -> PoolMonitor | None:
        """What the pool's own monitoring says of it now (free CPUs, jobs waiting), for stateful selection; None:
        the pool has none (gridbot then counts it from its own records). Raise PoolError if it fails."""
        return None
