"""What the server learns about each host, kept across restarts of the worker and of the server.

Black holes are hosts that fail jobs right after starting them (a broken install, a full disk). Two
signals, each of which spares a bag of jobs that fail everywhere (the job's fault, not the host's):
a host is blamed when a job it failed quickly is later done by another host; and a host whose last
STREAK failures were all quick, while another host produced a good result in the PAROLE seconds
before or during the streak, is one too (a black hole fails jobs far faster than good hosts finish
them: measured here, 41 jobs in 124 ms before any other host finished one, so neither blame nor
"others succeeded since" catches it in time). A black hole is paroled PAROLE seconds after its last
failure: one more job tells.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from gridbot.model.records import HostInfo

DAY = 86_400.0
CPU_HALF_LIFE = DAY
QUICK_FAILURE_S = 60.0
"""A failure within this many seconds of wall time is 'right after starting'."""
BLACK_HOLE_BLAME = 3
"""Quick failures later done elsewhere, with no success in between, that make a black hole."""
BLACK_HOLE_STREAK = 5
"""Quick failures in a row, while other hosts succeed, that make a black hole."""
PAROLE = 600.0


class HostStats(msgspec.Struct):
    """Counters and averages about one host; see policy.policies.HOST_ATTRS for their meaning."""

    done: int = 0
    failed: int = 0
    day: int = 0
    jobs_today: int = 0
    recent_cpu: float = 0.0
    recent_at: float = 0.0
    turnaround_sum: float = 0.0
    turnarounds: int = 0
    blame: int = 0
    streak: int = 0
    streak_start: float = 0.0
    last_failure: float = 0.0
    refused: int = 0
    """Reports the host sent for instances it was not running (see Dispatcher.report)."""
    valid: int = 0
    invalid: int = 0
    """Its results a quorum accepted, and those it outvoted (a bag with `quorum`)."""
    valid_streak: int = 0
    """Valid results in a row since its last invalid one (adaptive replication trusts a long streak)."""

    def validated(self, ok: bool) -> None:
        """A quorum judged one of its results."""
        if ok:
            self.valid += 1
            self.valid_streak += 1
        else:
            self.invalid += 1
            self.valid_streak = 0

    @property
    def invalid_rate(self) -> float:
        n = self.valid + self.invalid
        return self.invalid / n if n else 0.0

    def good(self, now: float, cpu_s: float, turnaround_s: float) -> None:
        """A good result from this host."""
        self.done += 1
        day = int(now // DAY)
        self.jobs_today = self.jobs_today + 1 if day == self.day else 1
        self.day = day
        self.recent_cpu = self.cpu_at(now) + max(0.0, cpu_s)
        self.recent_at = now
        self.turnaround_sum += max(0.0, turnaround_s)
        self.turnarounds += 1
        self.blame = 0
        self.streak = 0

    def bad(self, now: float, quick: bool) -> None:
        """A failure (quick: right after starting) or a lost instance."""
        self.failed += 1
        self.last_failure = now
        if quick:
            if self.streak == 0:
                self.streak_start = now
            self.streak += 1

    def cpu_at(self, now: float) -> float:
        """Good CPU seconds decayed to `now` with a half-life of one day."""
        if self.recent_cpu == 0.0 or now == self.recent_at:
            return self.recent_cpu
        return self.recent_cpu * math.pow(0.5, max(0.0, now - self.recent_at) / CPU_HALF_LIFE)

    @property
    def error_rate(self) -> float:
        n = self.done + self.failed
        return self.failed / n if n else 0.0

    def black_hole(self, now: float, others_good_at: float, others_busy: bool = False) -> bool:
        """Whether the host fails jobs right after starting them while others do them (see the module).

        `others_good_at` is when another host last produced a good result (-inf: never); `others_busy`
        says another host is running a job past the quick-failure window right now. The second signal
        catches a black hole at the start of a bag, before anyone has finished a job: jobs that fail
        everywhere fail quickly everywhere, so nobody would be busy.
        """
        if now - self.last_failure > PAROLE:
            return False
        return self.blame >= BLACK_HOLE_BLAME or (
            self.streak >= BLACK_HOLE_STREAK and (others_busy or others_good_at >= self.streak_start - PAROLE))

    def attrs(self, info: HostInfo, running: int, now: float, others_good_at: float,
              others_busy: bool = False) -> dict[str, Any]:
        """The host's ClassAd attributes as of `now` (the dispatcher adds `Reliable`)."""
        return {
            "Name": info.name, "HostId": info.host_id, "Pool": info.pool, "Platform": info.platform,
            "NumCpus": info.ncpus, "Slots": info.slots, "Prefetch": info.prefetch, "Memory": info.memory_mb,
            "RunningJobs": running,
            "JobsDone": self.done, "JobsFailed": self.failed, "ErrorRate": self.error_rate,
            "JobsToday": self.jobs_today if int(now // DAY) == self.day else 0,
            "RecentGoodCpuTime": self.cpu_at(now),
            "AvgTurnaround": self.turnaround_sum / self.turnarounds if self.turnarounds else 0.0,
            "BlackHole": self.black_hole(now, others_good_at, others_busy),
            "InvalidRate": self.invalid_rate, "ValidStreak": self.valid_streak, "Speed": info.speed,
        }
