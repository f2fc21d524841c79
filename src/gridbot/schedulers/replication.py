"""GridBot's tail strategy: tail detection (section 6.3) and the speculative half of Algorithm 2.

When fewer of a bag's jobs are queued than `replicate_below` (the configuration's; by default, none),
ReplicationRequirements is evaluated for each of its running jobs against the job's ad (its replicas,
their run times and hosts: Figure 3) and the ad of the host of its first instance; among the jobs it
accepts, as many as there is room for are chosen at random, each with weight inverse to the number of
its instances out, so a job with fewer replicas is more likely to get one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from gridbot.core.records import SplitMix
from gridbot.core.strategy import Choice
from gridbot.core.view import BagView, DispatchView
from gridbot.model.spec import StrategyOption
from gridbot.schedulers.base import TailStrategy

T = TypeVar("T")


class GridBotTail(TailStrategy):
    """The paper's: tail by queue length, replicas where ReplicationRequirements says."""

    name = "gridbot"

    def __init__(self, bag_id: int, seed: int, options: Mapping[str, StrategyOption]) -> None:
        super().__init__(bag_id, seed, options)
        self.rng = SplitMix(seed)
        self.peak = 0
        """Most of the bag's jobs seen running at once (since the server started)."""

    def in_tail(self, view: DispatchView, bag: BagView, now: float) -> bool:
        """Section 6.3: the tail begins when fewer of the bag's jobs are queued than a threshold, and with
        `tail_sticky` it does not end when failed jobs are queued again.

        The paper's threshold is "about the size of the scheduling buffer": the bag's share of it, which
        a bag smaller than its share is below from its first moment (20,000 / 5 bags = 4,000 > a bag of
        1,200: every `!Tail || ...` policy then held from the start, issue 14). So by default the
        threshold is also at most the most jobs the bag has had running at once: the tail begins when
        the queue would no longer fill the hosts the bag had once more. `tail_threshold` sets it instead.
        """
        cfg = view.config
        self.peak = max(self.peak, bag.running)
        threshold = cfg.tail_threshold or max(1, min(cfg.buffer_size // max(1, view.active), self.peak))
        return (bag.tail and cfg.tail_sticky) or bag.queued < threshold

    def replicas(self, view: DispatchView, bag: BagView, room: int, now: float) -> Sequence[Choice]:
        cfg = view.config
        if bag.queued >= cfg.replicate_below:
            return ()
        eligible = []
        for job in view.running_jobs(bag.bag_id):
            if job.replica_pending or len(job.live) >= cfg.max_replicas:
                continue
            first = view.instances(job.job_id)[0]
            if bag.policies.should_replicate(view.job_ad(job.job_id, now), view.host_ad(first.host_id, now)):
                eligible.append((job.job_id, len(job.live), now - first.sent_at))
        chosen = weighted_sample(self.rng, eligible, [1.0 / live for _, live, _ in eligible], room)
        return [Choice(job_id, f"ReplicationRequirements holds: {live} instance(s) out, the first running "
                               f"{age:.0f} s (bag mean {bag.mean_run_time:.0f} s)") for job_id, live, age in chosen]


def weighted_sample(rng: SplitMix, items: list[T], weights: list[float], k: int) -> list[T]:
    """Up to k items without replacement, each draw proportional to its weight (Efraimidis-Spirakis)."""
    if len(items) <= k:
        return list(items)
    keyed = sorted(((rng.random() ** (1.0 / w), i) for i, w in enumerate(weights)), reverse=True)
    return [items[i] for _, i in keyed[:k]]
