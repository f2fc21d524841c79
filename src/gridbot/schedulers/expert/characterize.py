"""The statistical characterization of ExPERT's section 4.3: F(t, t') = Fs(t) * gamma(t').

Fs is the CDF of the turnaround of successful instances on the unreliable pools; gamma(t') is the
probability that an instance sent at t' returns a result at all. Online, gamma is known in three epochs
counted back from the tail's start T_tail, with D the deadline of the instances then out:
- full knowledge, t' < T_tail - D: the fraction of results, per set of consecutively sent instances;
- partial knowledge, T_tail - D <= t' < T_tail: results so far over what Fs says should have come back by
  now (equation 2), bounded below by the least full-knowledge value and above by 1;
- zero knowledge, t' >= T_tail: the equal-weight average of the two epochs' means.

Times in a `Characterization` are relative to its `origin` (T_tail online): the estimator's clock starts
there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from gridbot.errors import GridbotError

Floats = NDArray[np.float64]


class CharacterizationError(GridbotError, ValueError):
    """There is not enough to characterize the pools with (say what to give instead)."""


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """One instance as the dispatcher saw it."""

    sent_at: float
    ended_at: float | None
    """When its result or its failure came back; None: still out, or lost."""
    success: bool
    """A good result came back (before the instance's deadline)."""
    reliable: bool = False
    """It was sent to a reliable pool."""


@dataclass(frozen=True)
class Characterization:
    """Fs, gamma and the reliable pool's runtime, as the estimator draws from them."""

    turnarounds: Floats
    """Sorted turnarounds (seconds) of successful unreliable instances: the sample behind Fs."""
    reliable_runtimes: Floats
    """Sorted runtimes (seconds) of instances on the reliable pool (one value: always that long)."""
    gamma_future: float
    """gamma for instances sent at or after the origin (the zero-knowledge epoch)."""
    gamma_sent: Floats = field(default_factory=lambda: np.zeros(0))
    """Start times, relative to the origin and increasing, of the sets of instances gamma was measured on."""
    gamma_values: Floats = field(default_factory=lambda: np.zeros(0))
    origin: float = 0.0

    def __post_init__(self) -> None:
        if self.turnarounds.size == 0 or self.reliable_runtimes.size == 0:
            raise CharacterizationError("a characterization needs at least one successful unreliable turnaround "
                                        "and one reliable runtime")
        if not 0.0 < self.gamma_future <= 1.0:
            raise CharacterizationError(f"the unreliable pools' reliability must be in (0, 1], not "
                                        f"{self.gamma_future}")

    @property
    def tur(self) -> float:
        """T_ur, the paper's time unit: the mean turnaround of a successful unreliable instance."""
        return float(self.turnarounds.mean())

    @property
    def tr(self) -> float:
        """T_r: the mean runtime on the reliable pool."""
        return float(self.reliable_runtimes.mean())

    def fs(self, t: ArrayLike) -> Floats:
        """Fs(t): the fraction of successful instances that returned within t seconds."""
        found = np.searchsorted(self.turnarounds, np.asarray(t, dtype=float), side="right")
        return np.asarray(found, dtype=float) / self.turnarounds.size

    def fs_inverse(self, p: ArrayLike) -> Floats:
        """The least sampled turnaround t with Fs(t) >= p, for p in (0, 1]."""
        n = self.turnarounds.size
        index = np.clip(np.ceil(np.asarray(p, dtype=float) * n).astype(np.int64) - 1, 0, n - 1)
        out: Floats = self.turnarounds[index]
        return out

    def gamma(self, sent: ArrayLike) -> Floats:
        """gamma(t') for instances sent at `sent` (relative to the origin)."""
        t = np.asarray(sent, dtype=float)
        if self.gamma_sent.size == 0:
            return np.full(t.shape, self.gamma_future)
        past = self.gamma_values[np.clip(np.searchsorted(self.gamma_sent, t, side="right") - 1, 0, None)]
        return np.where(t >= 0.0, self.gamma_future, past)

    def turnaround(self, u: ArrayLike, sent: ArrayLike, age: ArrayLike = 0.0) -> Floats:
        """Turnarounds (inf: no result ever) of instances sent at `sent`, given uniform draws `u`; an
        instance already out for `age` seconds without a result is drawn from F conditioned on that."""
        gamma = self.gamma(sent)
        a = np.asarray(age, dtype=float)
        floor = np.where(a > 0.0, gamma * self.fs(a), 0.0)
        x = floor + np.asarray(u, dtype=float) * (1.0 - floor)
        ok = x <= gamma
        return np.where(ok, self.fs_inverse(np.where(ok, x / np.maximum(gamma, 1e-12), 1.0)), np.inf)

    def reliable_time(self, u: ArrayLike) -> Floats:
        """Runtimes on the reliable pool for uniform draws `u`."""
        n = self.reliable_runtimes.size
        index = np.clip((np.asarray(u, dtype=float) * n).astype(np.int64), 0, n - 1)
        return self.reliable_runtimes[index]


def from_runtimes(runtimes: Iterable[float], success: float, reliable_runtime: float | Sequence[float] | None = None,
                  scale: float = 1.0) -> Characterization:
    """An offline characterization: successful turnarounds drawn from `runtimes` (a trace, times `scale`),
    a constant reliability `success`, and the reliable pool's runtime (default: T_ur, as the paper's
    Table 2 does when nothing was measured)."""
    turnarounds = np.sort(np.asarray(list(runtimes), dtype=float) * scale)
    if turnarounds.size == 0 or np.any(turnarounds < 0) or not np.all(np.isfinite(turnarounds)):
        raise CharacterizationError("runtimes must be a non-empty list of finite, non-negative seconds")
    reliable = _reliable(reliable_runtime, float(turnarounds.mean()))
    return Characterization(turnarounds, reliable, float(success))


def characterize(records: Iterable[InstanceRecord], tail_start: float, deadline: float, bin_size: int = 20,
                 reliable_runtime: float | Sequence[float] | None = None) -> Characterization:
    """The online characterization at the tail's start, from the instances sent before it.

    `deadline` is D of the instances out (the throughput phase's), `bin_size` the number of consecutively
    sent instances gamma is measured on. The reliable runtime comes from reliable records if there are
    any, else from `reliable_runtime`, else T_ur."""
    if bin_size < 1:
        raise CharacterizationError(f"bin_size must be at least 1, not {bin_size}")
    rs = sorted((r for r in records if r.sent_at < tail_start), key=lambda r: r.sent_at)
    unreliable = [r for r in rs if not r.reliable]
    turnarounds = np.sort(np.array([_took(r) for r in unreliable if _returned(r, tail_start)], dtype=float))
    if turnarounds.size == 0:
        raise CharacterizationError("no instance has returned a result from the unreliable pools yet: characterize "
                                    "offline instead (from_runtimes, with a runtime trace and a success rate)")
    reliable_took = [_took(r) for r in rs if r.reliable and _returned(r, tail_start)]
    reliable = _reliable(reliable_took or reliable_runtime, float(turnarounds.mean()))
    probe = Characterization(turnarounds, reliable, 1.0)
    starts, values, full = [], [], []
    for i in range(0, len(unreliable), bin_size):
        chunk = unreliable[i:i + bin_size]
        sent = np.array([r.sent_at for r in chunk])
        returned = sum(_returned(r, tail_start) for r in chunk)
        if sent[-1] < tail_start - deadline:
            value = returned / len(chunk)
        else:
            expected = float(probe.fs(tail_start - sent).sum())
            value = returned / expected if expected > 0 else np.nan
        starts.append(sent[0] - tail_start)
        values.append(value)
        full.append(sent[-1] < tail_start - deadline)
    return _epochs(turnarounds, reliable, np.array(starts), np.array(values), np.array(full, dtype=bool), tail_start)


def from_history(records: Iterable[InstanceRecord], deadline: float, end: float | None = None,
                 reliable_runtime: float | Sequence[float] | None = None) -> Characterization:
    """An offline characterization from a run that is over (a previous bag, a history file): gamma fully known.

    The outcome of an instance is known when it returned, failed, or was sent more than `deadline` (the
    run's instance deadline) before `end` (default: the last time in the records) without a result: it was
    lost. Fs and gamma come from those sent before `end - deadline`, every outcome of which is known; the
    later ones are left out, since their losses are not known yet and their results are the short ones (both
    would bias the estimate). A run too short for any such result is characterized as it would be online
    at `end` (`characterize`: the paper's partial-knowledge epoch), and its gamma taken as constant. The
    reliable runtime comes from reliable results, else from `reliable_runtime`, else T_ur."""
    rs = list(records)
    if not rs:
        raise CharacterizationError("the history holds no instance")
    last = max(max(r.sent_at, r.ended_at if r.ended_at is not None else r.sent_at) for r in rs)
    end = last if end is None else end
    known = [r for r in rs if not r.reliable and r.sent_at < end - deadline]
    turnarounds = [_took(r) for r in known if _returned(r, end)]
    reliable_took = [_took(r) for r in rs if r.reliable and _returned(r, end)]
    if turnarounds:
        tur = float(np.mean(turnarounds))
        return Characterization(np.sort(np.array(turnarounds, dtype=float)),
                                _reliable(reliable_took or reliable_runtime, tur), len(turnarounds) / len(known),
                                origin=end)
    online = characterize(rs, end + 1e-9, deadline, reliable_runtime=reliable_took or reliable_runtime)
    return Characterization(online.turnarounds, online.reliable_runtimes, online.gamma_future, origin=end)


def _epochs(turnarounds: Floats, reliable: Floats, starts: Floats, values: Floats, full: NDArray[np.bool_],
            origin: float) -> Characterization:
    lowest = float(values[full].min()) if full.any() else 0.0
    partial = ~full
    values = np.where(partial, np.clip(np.nan_to_num(values, nan=lowest), lowest, 1.0), values)
    means = [float(values[m].mean()) for m in (full, partial) if m.any()]
    future = sum(means) / len(means)
    if future <= 0.0:
        raise CharacterizationError("no instance sent to the unreliable pools has returned a result: their "
                                    "reliability is 0, so every strategy but N = 0 never ends")
    return Characterization(turnarounds, reliable, future, starts, values, origin)


def _reliable(given: float | Sequence[float] | None, tur: float) -> Floats:
    if given is None:
        return np.array([tur])
    values = np.sort(np.atleast_1d(np.asarray(given, dtype=float)))
    if values.size == 0 or np.any(values < 0) or not np.all(np.isfinite(values)):
        raise CharacterizationError("the reliable runtime must be finite, non-negative seconds")
    return values


def _returned(r: InstanceRecord, now: float) -> bool:
    return r.success and r.ended_at is not None and r.ended_at <= now


def _took(r: InstanceRecord) -> float:
    assert r.ended_at is not None
    return max(0.0, r.ended_at - r.sent_at)
