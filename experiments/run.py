"""Reproduce GridBot's experiments (SC'09 section 7) in gridbot's simulator and write their tables.

    .venv/bin/python experiments/run.py                      # every experiment, full size
    .venv/bin/python experiments/run.py replication --scale 0.1 --seeds 2

Each experiment is a base scenario (`experiments/NAME/base.toml`, runnable as it is with
`gridbot simulate`) and the variants the paper compares, which change a bag's policies, the server's
settings or the scenario, or run it another way (a plain batch system, or measuring the server's load).
The table goes to `experiments/results/NAME.md` beside the paper's figures. `make test` runs each at a
reduced scale with assertions on the ordering of outcomes (tests/sim/test_experiments.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from gridbot.sim.batch import simulate_batch
from gridbot.sim.distributions import parse_dist
from gridbot.sim.engine import simulate
from gridbot.sim.load import Load, measure
from gridbot.sim.metrics import Results
from gridbot.sim.plots import draw_incomplete
from gridbot.sim.scenario import BagModel, PoolModel, Scenario, SizeStep, parse_scenario, scaled, scaled_pool

HERE = Path(__file__).resolve().parent

TAIL_RELIABLE = "!Host.BlackHole && (!Tail || (Host.ErrorRate < 0.01 && Host.RecentGoodCpuTime > 0))"
REPL_PERMISSIVE = "NumberOfReplicas < 5"
REPL_RESTRICTIVE = ("Job.Replica1.Host.ErrorRate > 0.01 || Job.Replica1.Host.RecentGoodCpuTime == 0 "
                    "|| Job.Replica1.RunTime > 1800")


@dataclass
class Measured(Results):
    """A run's Results with the load it put on the server (`gridbot.sim.load`)."""

    load: Load = field(default_factory=lambda: Load(60.0))


def measured(sc: Scenario, seed: int) -> Results:
    results, load = measure(sc, seed)
    return Measured(**vars(results), load=load)


@dataclass(frozen=True)
class Variant:
    """One arm of an experiment: policies for every bag (or per bag, by name), server settings (a value
    may be a function of the scenario, as scaled), a change to the scenario, and how it is run."""

    name: str
    policy: dict[str, str] = field(default_factory=dict)
    per_bag: dict[str, dict[str, str]] = field(default_factory=dict)
    server: dict[str, object] = field(default_factory=dict)
    edit: Callable[[Scenario], Scenario] | None = None
    runner: Callable[[Scenario, int], Results] = simulate
    seeds: int = 0
    """At most this many seeds for this arm (0: the experiment's), for an ablation that needs fewer."""

    def settings(self, sc: Scenario) -> dict[str, object]:
        return {k: v(sc) if callable(v) else v for k, v in self.server.items()}

    def apply(self, sc: Scenario) -> Scenario:
        def bag(b: BagModel) -> BagModel:
            return dataclasses.replace(b, policy={**b.policy, **self.policy, **self.per_bag.get(b.name, {})})

        sc = self.edit(sc) if self.edit is not None else sc
        return dataclasses.replace(sc, bags=[bag(b) for b in sc.bags],
                                   dispatch=dataclasses.replace(sc.dispatch, **self.settings(sc)))


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    variants: list[Variant]
    paper: str
    """The paper's figures, as markdown."""
    table: Callable[[dict[str, list[Results]]], str]
    seeds: int = 1
    """Seeds per variant unless the command line says otherwise."""
    base: str = ""
    """The folder of its base scenario, if not its name (an ablation of another experiment)."""


def _h(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.1f} h"


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if len(known) == len(values) and known else None


def _span(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    if len(known) < 2:
        return ""
    return f" ({min(known) / 3600:.1f}-{max(known) / 3600:.1f})"


def single_bag_table(runs: dict[str, list[Results]]) -> str:
    """One row per variant: the bag's makespan, tail, replicas and waste, averaged over the seeds."""
    rows = ["| variant | makespan | tail | replicas % | waste % | discarded % | jobs failed |",
            "|---|---|---|---|---|---|---|"]
    for name, results in runs.items():
        bags = [r.bags[0] for r in results]
        rows.append(f"| {name} | {_h(_mean([b.makespan for b in bags]))}{_span([b.makespan for b in bags])} "
                    f"| {_h(_mean([b.tail_makespan for b in bags]))} "
                    f"| {statistics.fmean(b.replicas_pct for b in bags):.0f} "
                    f"| {statistics.fmean(b.waste_pct for b in bags):.0f} "
                    f"| {statistics.fmean(b.discarded_pct for b in bags):.1f} "
                    f"| {statistics.fmean(b.failed for b in bags):.0f} |")
    return "\n".join(rows)


def ranks_table(runs: dict[str, list[Results]]) -> str:
    """Figure 7(a): when each bag reached 1000, 500, 100 and 0 incomplete jobs, bags ordered by rank."""
    out = []
    for name, results in runs.items():
        r = results[0]
        bags = sorted(r.bags, key=lambda b: -int(b.name.rsplit("-", 1)[1]))
        marks = [m for m in ("1000", "500", "100", "0") if any(m in b.milestones for b in bags)]
        out.append(f"Variant {name}, seed {r.seed} (rank 50 first):\n")
        out.append("| rank | " + " | ".join(f"{m} left" for m in marks) + " |")
        out.append("|---|" + "---|" * len(marks))
        for b in bags:
            rank = b.name.rsplit("-", 1)[1]
            out.append(f"| {rank} | " + " | ".join(_h(b.milestones.get(m)) for m in marks) + " |")
        pairs = len(bags) * (len(bags) - 1) // 2
        counts = ", ".join(f"{rank_inversions(r, m)} at {m} left" for m in ("1000", "500", "100", "50", "0"))
        out.append(f"\nPairs of bags (of {pairs}) that reached a mark out of rank order: {counts}.")
    return "\n".join(out)


def rank_inversions(r: Results, mark: str) -> int:
    """Pairs (higher rank, lower rank) where the lower-ranked bag reached `mark` jobs left first."""
    times = [(int(b.name.rsplit("-", 1)[1]), b.milestones.get(mark, float("inf"))) for b in r.bags]
    return sum(1 for ra, ta in times for rb, tb in times if ra > rb and ta > tb)


def small_bags_table(runs: dict[str, list[Results]]) -> str:
    """One row per bag of Figure 8(b), beside the bag of the same Rank in the control run (every bag with
    B3's policy): the difference is the policy's, not the priority's. A table per pools' setting."""
    out = []
    for setting in SMALL_BAGS_SETTINGS:
        if SMALL_BAGS_FIGURE + setting in runs:
            rows = _small_bags_rows(runs[SMALL_BAGS_FIGURE + setting], runs.get(SMALL_BAGS_CONTROL + setting, []))
            out.append(f"Pools: {setting.lstrip(', ') or 'as in the base scenario'}.\n\n{rows}")
    return "\n\n".join(out)


def _small_bags_rows(figure: list[Results], control: list[Results]) -> str:
    rows = ["| bag | Rank | Concurrency | JobRequirements | makespan (seeds) | tail | same Rank, B3's policy "
            "| replicas % | waste % |", "|---|---|---|---|---|---|---|---|---|"]
    for i, label in enumerate(("B1", "B2", "B3", "B4", "B5")):
        bags = [r.bags[i] for r in figure]
        same = [r.bags[i] for r in control]
        policy = SMALL_BAGS[label]
        rows.append(f"| {label} | {i + 1} | `{policy.get('Concurrency', '1')}` | `{policy['JobRequirements']}` "
                    f"| {_h(_mean([b.makespan for b in bags]))}{_span([b.makespan for b in bags])} "
                    f"| {_h(_mean([b.tail_makespan for b in bags]))} "
                    f"| {_h(_mean([b.makespan for b in same])) + _span([b.makespan for b in same]) if same else ''} "
                    f"| {statistics.fmean(b.replicas_pct for b in bags):.0f} "
                    f"| {statistics.fmean(b.waste_pct for b in bags):.0f} |")
    return "\n".join(rows)


LANL_SPREAD = 0.75
"""How unevenly failures fall on the Los Alamos nodes (the median of `failure_spread.py`'s 13 systems)."""
UNLIKE = f"machines unlike (failure_spread {LANL_SPREAD:g})"
YOUNG_DIE = "and pilots' lives Weibull of shape 0.5"


def _machines_unlike(sc: Scenario) -> Scenario:
    """Every pool's failures and preemptions fall unevenly on its machines, as the Los Alamos nodes' did; the
    pools' rates stay what they were, on average over their machines."""
    return dataclasses.replace(sc, pools=[dataclasses.replace(p, failure_spread=LANL_SPREAD) for p in sc.pools])


def _young_pilots_die(sc: Scenario) -> Scenario:
    """Machines unlike, and each pool's constant preemption rate (exponential lives) replaced by a Weibull of
    shape 0.5 that kills the same share of pilots in their first hour: a pilot that has run a while is then
    less likely to be killed than a new one (docs/simulation.md, "Preemption: which to use")."""
    def weibull(p: PoolModel) -> PoolModel:
        if p.preemption is None or not p.preemption.describe.startswith("exponential("):
            return p
        # 1 - exp(-(1 h / scale) ** 0.5) = 1 - exp(-1 h / mean): the same share dies within the first hour
        scale = p.preemption.mean ** 2 / 3600.0
        return dataclasses.replace(p, preemption=parse_dist({"dist": "weibull", "shape": 0.5, "scale": scale},
                                                              f"preemption of pool '{p.name}'"))

    sc = _machines_unlike(sc)
    return dataclasses.replace(sc, pools=[weibull(p) for p in sc.pools])


def _records_kept(sc: Scenario) -> Scenario:
    """Machines unlike, and a host's record as long as the pools allow: a pool whose size fluctuates is held at
    the middle of its range (no shrinking pool kills pilots wherever they are; a pool with a fixed size or
    steps keeps them), and every pool is on as many machines as it has pilots at most, so a machine hosts
    pilot after pilot and has a record when the tail comes."""
    def kept(p: PoolModel) -> PoolModel:
        size = [SizeStep(0.0, (p.fluctuate[0] + p.fluctuate[1]) // 2)] if p.fluctuate else p.size
        p = dataclasses.replace(p, size=size, fluctuate=None)
        return dataclasses.replace(p, hosts=p.max_size, spec=msgspec.structs.replace(p.spec, max_running=p.max_size))

    sc = _machines_unlike(sc)
    return dataclasses.replace(sc, pools=[kept(p) for p in sc.pools])


BIGGER = 2.5
"""How much larger than the base scenario's pools the paper's must have been: its R/R bag of 6,250 CPU hours
ran in 3.2 h, at least 1,950 CPUs on average against the base's 1,450 pilots, and the paper's peak in the
scalability run was 3,700 dedicated cores."""


def _bigger_pools(sc: Scenario) -> Scenario:
    """Every pool BIGGER times its size, its machines and its queue limit. The scheduling buffer, and with it
    the tail threshold and `replicate_below`, stays as it was (a server setting, not the pools'): the tail
    starts at the same number of unsent jobs with BIGGER times the pilots running."""
    return dataclasses.replace(sc, pools=[scaled_pool(p, BIGGER) for p in sc.pools])


def _bundles(sc: Scenario) -> Scenario:
    """Every pilot holds a second job behind the one it runs (`prefetch = 1`; the default Concurrency,
    `Host.Slots + max(Host.Prefetch, Host.Slots)`, is then 2 on these one-slot hosts), as GridBot's clients
    fetched bundles (Figure 3: `Concurrency = 2*Host.NumCpus`): more of the bag is out on hosts when its
    queue empties, and a job queued behind another looks slow."""
    return dataclasses.replace(sc, pools=[dataclasses.replace(p, prefetch=1) for p in sc.pools])


GRIDS = "!Host.BlackHole && Host.Pool != \"superlink\""
SMALL_BAGS = {
    "B1": {"Concurrency": "10", "JobRequirements": "!Host.BlackHole"},
    "B2": {"Concurrency": "Host.ErrorRate < 0.01 ? 10 : 1", "JobRequirements": "!Host.BlackHole"},
    "B3": {"Concurrency": "1", "JobRequirements": "!Host.BlackHole"},
    "B4": {"Concurrency": "1", "JobRequirements": "!Host.BlackHole && Host.ErrorRate < 0.01 && "
                                                  "Host.RecentGoodCpuTime > 0"},
    "B5": {"Concurrency": "1", "JobRequirements": "!Host.BlackHole && (!Tail || Host.Pool == \"technion\")"},
}
SMALL_BAG_REPLICATION = {"ReplicationRequirements": "NumberOfReplicas < 2 && Job.Replica1.RunTime > Concurrency * 1000"}
SMALL_BAGS_FIGURE = "Figure 8(b)"
SMALL_BAGS_CONTROL = "control: every bag B3's policy"
RECORDS_KEPT = "a machine per pilot"
SMALL_BAGS_SETTINGS: dict[str, Callable[[Scenario], Scenario] | None] = {
    "": None, f", {UNLIKE} {YOUNG_DIE}": _young_pilots_die,
    f", {UNLIKE} {YOUNG_DIE}, {RECORDS_KEPT}": lambda sc: _records_kept(_young_pilots_die(sc))}
"""Suffixes of the variants' names, and how each changes the pools: as they are; with the two things a
host's record could predict (machines that fail more than others; pilots that die young); and with, on top,
as many machines as pilots, so a machine has a record when the small bags need it."""

REPLICATION_ARMS = {
    "Permissive / Permissive": {"ReplicationRequirements": REPL_PERMISSIVE},
    "Restrictive / Restrictive": {"ReplicationRequirements": REPL_RESTRICTIVE, "JobRequirements": TAIL_RELIABLE},
    "Permissive / Restrictive": {"ReplicationRequirements": REPL_PERMISSIVE, "JobRequirements": TAIL_RELIABLE},
    "Disabled / Permissive": {"ReplicationRequirements": "false"},
    "Disabled / Restrictive": {"ReplicationRequirements": "false", "JobRequirements": TAIL_RELIABLE},
}
PAPER_REPLICATION = {  # turnaround, replicas %, waste % (results discarded), average of five runs
    "Permissive / Permissive": ("4.1 h", 58, 30), "Restrictive / Restrictive": ("3.2 h", 11, 7),
    "Permissive / Restrictive": ("4.2 h", 73, 57), "Disabled / Permissive": ("5.1 h", 0, 0),
    "Disabled / Restrictive": ("5.8 h", 0, 0),
}
GRIDBOT_REPLICAS: dict[str, object] = {
    # Algorithm 2 replicates once "few unsent jobs" are left (the tail, section 6.3: about a buffer's worth);
    # every eligible running job gets a replica each cycle, queued with the unsent jobs; BOINC lets a
    # replica run on after the job's first result and discards its result (the Waste column)
    "replicate_below": lambda sc: sc.dispatch.buffer_size, "replica_queue": 1_000_000,
    "replicas_first": True, "let_replicas_finish": True}
DEADLINE_ONLY: dict[str, object] = {"host_timeout": 86400.0}
"""BOINC keeps no connection with its clients: a silent host's job is found lost only when its deadline
passes (section 6.1), not after gridbot's host timeout."""
REPLICATION_SETTINGS: dict[str, dict[str, object]] = {
    "gridbot": {},
    "gridbot, lost jobs found at their deadline": DEADLINE_ONLY,
    "GridBot's replicas, gridbot's host timeout": GRIDBOT_REPLICAS,
    "GridBot as in the paper": {**GRIDBOT_REPLICAS, **DEADLINE_ONLY},
}
RECORDS = f"{UNLIKE}, constant pools, {RECORDS_KEPT}"
BIGGER_POOLS = f"pools {BIGGER:g}x"
BUNDLES = "bundles of 2 (prefetch 1)"
REPLICATION_EDITS: dict[str, Callable[[Scenario], Scenario]] = {
    f"GridBot as in the paper, {UNLIKE}": _machines_unlike, f"GridBot as in the paper, {RECORDS}": _records_kept,
    f"GridBot as in the paper, {BIGGER_POOLS}": _bigger_pools, f"GridBot as in the paper, {BUNDLES}": _bundles}
"""The ablations: GridBot as in the paper on pools changed one way (run by replication_unlike and replication_setup,
not by replication)."""
TAIL_FROM = (2, 4)
"""The tail (and replication) from this many buffers' worth of unsent jobs: how few "few unsent jobs" were is
not in the paper, whose Figure 9 run found the true tail at about 10,000 jobs left of 30,000."""


def _tail_from(buffers: int) -> Callable[[Scenario], int]:
    """A server setting of `buffers` times the scenario's buffer, so a scaled run keeps the proportion."""
    return lambda sc: buffers * sc.dispatch.buffer_size


def tail_setting(buffers: int) -> str:
    """The column (server setting) of the replication table whose tail begins at `buffers` buffers."""
    return f"GridBot as in the paper, tail from {buffers} buffers"


ENQUEUED = "replicas enqueued after the unsent jobs"
"""Algorithm 2's "create new replica j' and enqueue", read as a queue in the order of creation: a replica waits
behind the jobs still unsent when it was made (gridbot's own order), where the paper's setting sends it first."""


MIXED = "replicas mixed in"
"""GridBot's scheduler as BOINC's scans its buffer, from a random slot (sched_array.cpp): a host gets a replica
with the chance that a slot holds one (`replicas_mixed`)."""


def enqueued(setting: str) -> str:
    """The setting with its replicas sent after the bag's unsent jobs."""
    return f"{setting}, {ENQUEUED}"


def mixed(setting: str) -> str:
    """The setting with its replicas drawn among the bag's unsent jobs."""
    return f"{setting}, {MIXED}"


def _tail_server(buffers: int) -> dict[str, object]:
    """GridBot's server as in the paper, with its tail and replication from `buffers` buffers."""
    return {**GRIDBOT_REPLICAS, **DEADLINE_ONLY, "replicate_below": _tail_from(buffers),
            "tail_threshold": _tail_from(buffers)}


ORDERED = {"GridBot as in the paper": {**GRIDBOT_REPLICAS, **DEADLINE_ONLY}, tail_setting(TAIL_FROM[0]):
           _tail_server(TAIL_FROM[0])}
"""The settings `replication_order` sends replicas of in the two other orders."""
ABLATION_SETTINGS: dict[str, dict[str, object]] = {
    **{setting: {**GRIDBOT_REPLICAS, **DEADLINE_ONLY} for setting in REPLICATION_EDITS},
    **{tail_setting(k): _tail_server(k) for k in TAIL_FROM},
    **{name: server for setting, base in ORDERED.items() for name, server in (
        (enqueued(setting), {**base, "replicas_first": False}),
        (mixed(setting), {**base, "replicas_first": False, "replicas_mixed": True}))}}
"""The ablations' server settings (GridBot as in the paper, with its tail from more unsent jobs, or with its
replicas in another order), after the replication experiment's own in the table's columns."""


def _replication_ablation(settings: tuple[str, ...], arms: tuple[str, ...]) -> list[Variant]:
    """An ablation of the replication table: each arm under each setting, with the setting's pools edit."""
    every = {**REPLICATION_SETTINGS, **ABLATION_SETTINGS}
    return [Variant(f"{arm} [{setting}]", policy=REPLICATION_ARMS[arm], server=every[setting],
                    edit=REPLICATION_EDITS.get(setting)) for setting in settings for arm in arms]


REPLICATED_ARMS = ("Permissive / Permissive", "Restrictive / Restrictive", "Permissive / Restrictive")


def replication_table(runs: dict[str, list[Results]]) -> str:
    """One row per arm, one column per server setting: the makespan (over the seeds), then replicas % and
    discarded % (the paper's Waste)."""
    settings = [s for s in {**REPLICATION_SETTINGS, **ABLATION_SETTINGS} if any(n.endswith(f"[{s}]") for n in runs)]
    out = []
    for what in ("makespan (seeds)", "replicas % / discarded %"):
        out.append(f"| {what} | paper | " + " | ".join(settings) + " |")
        out.append("|---|---|" + "---|" * len(settings))
        for arm, (turnaround, replicas, waste) in PAPER_REPLICATION.items():
            if not any(f"{arm} [{setting}]" in runs for setting in settings):
                continue
            cells = [turnaround if what.startswith("makespan") else f"{replicas} / {waste}"]
            for setting in settings:
                bags = [r.bags[0] for r in runs.get(f"{arm} [{setting}]", [])]
                if not bags:
                    cells.append("")
                elif what.startswith("makespan"):
                    cells.append(_h(_mean([b.makespan for b in bags])) + _span([b.makespan for b in bags]))
                else:
                    cells.append(f"{statistics.fmean(b.replicas_pct for b in bags):.0f} / "
                                 f"{statistics.fmean(b.discarded_pct for b in bags):.0f}")
            out.append(f"| {arm} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


COMMUNITY = "superlink"
DEADLINE_COMMUNITY = f"Host.Pool == \"{COMMUNITY}\" ? 259200 : 7200"
"""Three days on volunteers' hosts, the least their owners accept (section 7); two hours elsewhere."""
LATEST_REPLICA_OLDER_THAN_15_MIN = " : ".join(
    f"NumberOfReplicas == {n} ? Job.Replica{n}.RunTime > 900" for n in range(1, 5)) + " : false"
"""Figure 9's "allowed replication once in 15 minutes": the newest instance out has run for 15 minutes."""
PAPER_FIGURE_9 = {"R1": (188, 105), "R2": (129, 75), "R3": (49, 25), "R4": (35, 21)}
"""Replicas % and waste % of each bag (Figure 9b)."""


def figure_9_policies(threshold: int) -> dict[str, dict[str, str]]:
    """Figure 9(b)'s policies, R1 first in priority, with Restrictive-2's static tail threshold (2,000 of 30,000
    jobs in the paper, scaled with the bags)."""
    permissive = {"ReplicationRequirements": REPL_PERMISSIVE}
    restrictive_1 = {"ReplicationRequirements": f"NumberOfReplicas < 5 && Job.Replica1.Host.ErrorRate > 0.01 && "
                                                f"({LATEST_REPLICA_OLDER_THAN_15_MIN})"}
    restrictive_2 = {"ReplicationRequirements": f"NumberOfReplicas < 5 && Bag.JobsLeft < {threshold}"}
    no_volunteers_in_tail = {"JobRequirements": f"!Host.BlackHole && (!Tail || Host.Pool != \"{COMMUNITY}\")"}
    static_tail = {"JobRequirements": f"!Host.BlackHole && (Bag.JobsLeft >= {threshold} || "
                                      f"Host.Pool != \"{COMMUNITY}\")"}
    arms = {"R1": {**permissive, "JobRequirements": "!Host.BlackHole"},
            "R2": {**permissive, **no_volunteers_in_tail},
            "R3": {**restrictive_1, **no_volunteers_in_tail},
            "R4": {**restrictive_2, **static_tail}}
    return {name: {**policy, "Rank": str(4 - n), "Deadline": DEADLINE_COMMUNITY}
            for n, (name, policy) in enumerate(arms.items())}


def _figure_9(sc: Scenario) -> Scenario:
    """Each bag its Figure 9(b) policies, the static threshold scaled with the bags' size."""
    policies = figure_9_policies(max(1, round(2000 * sc.bags[0].jobs / 30000)))
    return dataclasses.replace(sc, bags=[dataclasses.replace(b, policy={**b.policy, **policies[b.name]})
                                         for b in sc.bags])


def _smaller_community(sc: Scenario) -> Scenario:
    """A quarter of the community grid: 1,000 hosts online of 4,000 (as naive_vs_policy's)."""
    def quarter(p: PoolModel) -> PoolModel:
        return dataclasses.replace(p, size=[dataclasses.replace(s, size=max(1, s.size // 4)) for s in p.size],
                                   hosts=max(1, p.hosts // 4)) if p.name == COMMUNITY else p
    return _figure_9(dataclasses.replace(sc, pools=[quarter(p) for p in sc.pools]))


def _volunteers_error_prone(sc: Scenario) -> Scenario:
    """R3's Restrictive-1 replication also replicates a job whose first instance is on a volunteer's host."""
    sc = _figure_9(sc)
    error_prone = f"(Job.Replica1.Host.ErrorRate > 0.01 || Job.Replica1.Host.Pool == \"{COMMUNITY}\")"

    def r3(b: BagModel) -> BagModel:
        if b.name != "R3":
            return b
        rule = b.policy["ReplicationRequirements"].replace("Job.Replica1.Host.ErrorRate > 0.01", error_prone)
        return dataclasses.replace(b, policy={**b.policy, "ReplicationRequirements": rule})
    return dataclasses.replace(sc, bags=[r3(b) for b in sc.bags])


FIGURE_9 = "Figure 9(b)"
FIGURE_9_VARIANTS = {
    FIGURE_9: _figure_9,
    "a quarter of the community grid (1,000 hosts online)": _smaller_community,
    "R3 counts volunteers' hosts as error-prone": _volunteers_error_prone,
}


def community_table(runs: dict[str, list[Results]]) -> str:
    """Figure 9: each bag's replicas % and waste (discarded %) beside the paper's, its makespan, and the share of
    its results that came from the community grid; one block of rows per variant."""
    rows = ["| variant | bag | replication / scheduling | paper: replicas % / waste % | replicas % "
            "| waste (discarded) % | makespan (seeds) | results from volunteers % |",
            "|---|---|---|---|---|---|---|---|"]
    names = {"R1": "Permissive / Permissive", "R2": "Permissive / Restrictive-1",
             "R3": "Restrictive-1 / Restrictive-1", "R4": "Restrictive-2 / Restrictive-2"}
    for variant, results in runs.items():
        for i, name in enumerate(names):
            bags = [r.bags[i] for r in results]
            share = [100 * b.jobs_per_pool.get(COMMUNITY, 0) / max(1, sum(b.jobs_per_pool.values())) for b in bags]
            replicas, waste = PAPER_FIGURE_9[name]
            rows.append(f"| {variant if i == 0 else ''} | {name} | {names[name]} | {replicas} / {waste} "
                        f"| {statistics.fmean(b.replicas_pct for b in bags):.0f} "
                        f"| {statistics.fmean(b.discarded_pct for b in bags):.0f} "
                        f"| {_h(_mean([b.makespan for b in bags]))}{_span([b.makespan for b in bags])} "
                        f"| {statistics.fmean(share):.0f} |")
    return "\n".join(rows)


def _queue_wait(mu: float, sigma: float) -> Callable[[Scenario], Scenario]:
    """Every pool's queue wait lognormal(mu, sigma) of seconds."""
    wait = parse_dist({"dist": "lognormal", "mu": mu, "sigma": sigma}, "queue wait")
    return lambda sc: dataclasses.replace(sc, pools=[dataclasses.replace(p, queue_wait=wait) for p in sc.pools])


BATCH_WAITS = {
    "median 2.5 min (base)": None,
    "median 1.5 min": _queue_wait(4.5, 1.0),
    "median 2.5 min, heavier tail": _queue_wait(5.0, 1.5),
}


def batch_table(runs: dict[str, list[Results]]) -> str:
    """Turnaround mean +- standard deviation over the seeds, GridBot beside the batch system."""
    rows = ["| queue wait | GridBot | plain batch system | batch / GridBot | GridBot's replicas % |",
            "|---|---|---|---|---|"]
    for wait in BATCH_WAITS:
        got = {}
        for system in ("GridBot", "plain batch system"):
            minutes = [r.bags[0].makespan / 60 for r in runs.get(f"{system}, queue wait {wait}", [])
                       if r.bags[0].makespan is not None]
            got[system] = minutes
        if not all(got.values()):
            continue
        g, b = got["GridBot"], got["plain batch system"]
        replicas = statistics.fmean(r.bags[0].replicas_pct for r in runs[f"GridBot, queue wait {wait}"])
        rows.append(f"| {wait} | {_pm(g)} | {_pm(b)} | {statistics.fmean(b) / statistics.fmean(g):.1f} "
                    f"| {replicas:.1f} |")
    return "\n".join(rows)


def _pm(minutes: list[float]) -> str:
    sd = statistics.stdev(minutes) if len(minutes) > 1 else 0.0
    return f"{statistics.fmean(minutes):.0f} +- {sd:.0f} min"


def _split_in_five(sc: Scenario) -> Scenario:
    """Each job split into five: five times the jobs, each a fifth as long (10-50 min -> 2-10 min)."""
    runtime = parse_dist({"dist": "uniform", "low": "2m", "high": "10m"}, "runtime")
    return dataclasses.replace(sc, bags=[dataclasses.replace(b, jobs=b.jobs * 5, runtime=runtime) for b in sc.bags])


WARM_UP = 600.0
"""Load peaks are taken from 10 minutes in: at 0 every volunteer host of the community pool asks at once."""


def scalability_table(runs: dict[str, list[Results]]) -> str:
    rows = ["| bag | paper | requests served /s, peak | jobs sent /s, peak (mean) | all exchanges /s, peak (mean) "
            "| dispatcher per exchange | makespan |", "|---|---|---|---|---|---|---|"]
    paper = {"42,200 jobs of 10-50 min": "4 requests/s, 20 jobs/s",
             "211,000 jobs of 2-10 min": "18 requests/s, 93 jobs/s"}
    for name, results in runs.items():
        r = results[0]
        assert isinstance(r, Measured)
        load = r.load
        rows.append(f"| {name} ({r.bags[0].jobs:,} simulated) | {paper.get(name, '')} "
                    f"| {load.peak(load.served, WARM_UP):.1f} "
                    f"| {load.peak(load.jobs, WARM_UP):.1f} ({load.mean(load.jobs):.1f}) "
                    f"| {load.peak(load.requests, WARM_UP):.1f} ({load.mean(load.requests):.1f}) "
                    f"| {load.us_per_request():.0f} us: {1e6 / max(1e-9, load.us_per_request()):,.0f} exchanges/s "
                    f"on one core | {_h(r.bags[0].makespan)} |")
    return "\n".join(rows)

EXPERIMENTS = {
    "naive_vs_policy": Experiment(
        "naive_vs_policy", "Naive execution vs policy-driven execution (Figure 5)",
        [Variant("naive (3-day deadline, no policies)"),
         Variant("policy-driven", policy={
             "Deadline": "Host.Pool == \"superlink\" ? 259200 : 7200",
             "JobRequirements": "!Host.BlackHole && (!Tail || Host.Pool != \"superlink\")",
             "ReplicationRequirements": "NumberOfReplicas < 3 && (Job.Replica1.Host.Pool == \"superlink\" "
                                        "|| Job.Replica1.RunTime > 3600)"})],
        "Paper: the naive run (unmodified BOINC server, 3-day deadline) took **280 h**; the same bag on the same "
        "resources with GridBot's policies took **8 h**.",
        single_bag_table),
    "replication": Experiment(
        "replication", "Replication x scheduling policies in collaborative grids (section 7 table)",
        [Variant(f"{arm} [{setting}]", policy=policy, server=server)
         for setting, server in REPLICATION_SETTINGS.items()
         for arm, policy in REPLICATION_ARMS.items()],
        "Paper (30,000 jobs of 10-15 min, average of 5 runs):\n\n"
        "| replication / scheduling | replicas % | waste % | turnaround |\n|---|---|---|---|\n"
        + "".join(f"| {arm} | {r} | {w} | {t} |\n" for arm, (t, r, w) in PAPER_REPLICATION.items())
        + "\nThe columns below: gridbot as it is; gridbot finding a lost job only at its deadline, as BOINC does; "
        "gridbot replicating as GridBot did (from the tail threshold on, every eligible job, replicas sent "
        "before unsent jobs and left to run after the first result); and both, GridBot as in the paper. "
        "Replicas % counts replicas sent; the paper's Waste is discarded %.",
        replication_table, seeds=2),
    "replication_unlike": Experiment(
        "replication_unlike", "Replication x scheduling with machines unlike (an ablation of the section 7 table)",
        _replication_ablation(("GridBot as in the paper", f"GridBot as in the paper, {UNLIKE}"), REPLICATED_ARMS),
        "Paper: Restrictive/Restrictive **3.2 h**, Permissive/Permissive 4.1 h, Permissive/Restrictive 4.2 h. "
        "The replication experiment's replicated arms with GridBot's server, as they are and with every pool's "
        f"failures and preemptions falling on its machines as unevenly as on the Los Alamos nodes (`failure_spread "
        f"= {LANL_SPREAD:g}`, `experiments/failure_spread.py`): restrictive scheduling keeps the tail off hosts "
        "with a bad or no record, and restrictive replication replicates the jobs on them, so if the machines' "
        "being alike were why R/R only ties P/P, it would win here.",
        replication_table, seeds=8, base="replication"),
    "replication_setup": Experiment(
        "replication_setup", "Replication x scheduling: what in the setup would let restrictive replication win "
        "(ablations of the section 7 table)",
        _replication_ablation(("GridBot as in the paper", *(f"GridBot as in the paper, {s}" for s in (
            RECORDS, BIGGER_POOLS, BUNDLES))), REPLICATED_ARMS),
        "Paper: Restrictive/Restrictive **3.2 h** (11% replicas), Permissive/Permissive 4.1 h (58%), "
        "Permissive/Restrictive 4.2 h (73%). The replicated arms with GridBot's server on the replication base, "
        "and with one thing changed that the paper does not give and that could decide the order: "
        f"hosts with a record to go by ({RECORDS}: every pool at the middle of its range, on as many machines "
        f"as pilots, their failures as uneven as Los Alamos'); larger pools ({BIGGER_POOLS}: the paper's R/R "
        "bag needed at least 1,950 CPUs on average, the base has 1,450 pilots); and clients that fetch bundles "
        f"({BUNDLES}), so more of the bag is out on hosts when its queue empties.",
        replication_table, seeds=4, base="replication"),
    "replication_tail": Experiment(
        "replication_tail", "Replication x scheduling with the tail from more unsent jobs (an ablation of the "
        "section 7 table)",
        _replication_ablation(("GridBot as in the paper", *map(tail_setting, TAIL_FROM)), REPLICATED_ARMS[:2])
        + _replication_ablation(("GridBot as in the paper", tail_setting(TAIL_FROM[0])), REPLICATED_ARMS[2:]),
        "Paper: Restrictive/Restrictive **3.2 h** (11% replicas, 7% waste), Permissive/Permissive 4.1 h (58, 30), "
        "Permissive/Restrictive 4.2 h (73, 57). GridBot's tail began when fewer unsent jobs than \"about the size "
        "of the scheduling buffer\" were left (section 6.3), and its replication with it; the paper gives no "
        "buffer size, and in its Figure 9 run the true tail began at about 10,000 jobs left. The base takes the "
        "buffer, 1,500; here the tail and replication begin at 2 and 4 buffers' worth, 3,000 and 6,000 unsent "
        "jobs, with the server as in the paper otherwise. Permissive/Restrictive runs from 1 and 2 buffers only: "
        "from 4, its tail of thousands of jobs kept to hosts with a clean record outlives every such host, and "
        "at a tenth of the size it did not end in 10 days (refused pilots leave at once, as GridBot's did, and "
        "the overlay sends others, but no machine left free has a clean record).",
        replication_table, seeds=4, base="replication"),
    "replication_order": Experiment(
        "replication_order", "Replication x scheduling with replicas enqueued behind the unsent jobs (an ablation "
        "of the section 7 table)",
        _replication_ablation(tuple(way(s) for s in ORDERED for way in (str, enqueued, mixed)), REPLICATED_ARMS),
        "Paper: Restrictive/Restrictive **3.2 h** (11% replicas, 7% waste), Permissive/Permissive 4.1 h (58, 30), "
        "Permissive/Restrictive 4.2 h (73, 57). Algorithm 2 creates a replica \"and enqueue[s]\" it; the paper's "
        "setting of the replication table sends replicas before the unsent jobs (its reading of \"replicas of the "
        "same job compete for resources\"). Here they wait behind the jobs unsent when they were made, as in a "
        "queue kept in the order of creation (gridbot's own order), or are drawn among them: GridBot's buffer was "
        "BOINC's shared-memory array, which BOINC's scheduler scans from a random slot (sched/sched_array.cpp, "
        "`rnd_off`), and in the tail the replicas sat in it among the unsent jobs, so a host got a replica with "
        "the chance that a slot held one (`replicas_mixed`). The tail from 1 and 2 buffers' worth of unsent "
        "jobs, the server as in the paper otherwise.",
        replication_table, seeds=4, base="replication"),
    "replication_community": Experiment(
        "replication_community", "Replication with several bags and the community grid (Figure 9)",
        [Variant(name, edit=edit, server={**GRIDBOT_REPLICAS, **DEADLINE_ONLY}, seeds=0 if name == FIGURE_9 else 1)
         for name, edit in FIGURE_9_VARIANTS.items()],
        "Paper (the bag of the table above four times, at once, R1 first in priority; collaborative grids and "
        "Superlink@Technion's volunteers): replicas % / waste % R1 **188 / 105**, R2 **129 / 75**, R3 **49 / 25**, "
        "R4 **35 / 21**; 30% to 70% of the jobs went to the community grid. Waste is results discarded because "
        "the job already had one. The server replicates as GridBot did (the `GridBot as in the paper` column of "
        "the table above); the volunteers' hosts are BOINC clients (docs/simulation.md, `sim.boinc`).",
        community_table, seeds=2),
    "ranks": Experiment(
        "ranks", "50 bags with distinct ranks (Figure 7a)", [Variant("ranked")],
        "Paper: no lower-ranked bag started (1000 jobs left) before a higher-ranked one; the 500-left curve "
        "follows the 1000-left one; order deviates only below about 100 jobs left (the tail).",
        ranks_table),
    "small_bags": Experiment(
        "small_bags", "Policies for small bags (Figure 8)",
        [variant for setting, edit in SMALL_BAGS_SETTINGS.items() for variant in (
            Variant(SMALL_BAGS_FIGURE + setting, edit=edit, per_bag={
                f"B-{i}": {**SMALL_BAGS[f"B{i}"], **SMALL_BAG_REPLICATION} for i in range(1, 6)}),
            Variant(SMALL_BAGS_CONTROL + setting, edit=edit, policy={**SMALL_BAGS["B3"], **SMALL_BAG_REPLICATION}))],
        "Paper: executing on potentially faulty hosts should be avoided for small bags (B4 best); a large "
        "Concurrency (B1) lengthens the tail through more preempted bundles; reserving the dedicated cluster "
        "for the tail (B5) is undesirable as the cluster gets overloaded.",
        small_bags_table, seeds=4),
    "batch": Experiment(
        "batch", "GridBot vs a plain batch system (section 7, GridBot versus Condor)",
        [Variant(f"{system}, queue wait {wait}", edit=edit, runner=runner)
         for wait, edit in BATCH_WAITS.items()
         for system, runner in (("GridBot", simulate), ("plain batch system", simulate_batch))],
        "Paper: 3,000 jobs of 30 s to 5 min on the UW Madison Condor pool, five runs each: GridBot "
        "**53 +- 10 min**, Condor **170 +- 41 min** (GridBot faster by a factor of 3); under 1% of jobs "
        "replicated.",
        batch_table, seeds=5),
    "scalability": Experiment(
        "scalability", "Requests the server sustained (section 7, Number of job requests)",
        [Variant("42,200 jobs of 10-50 min", runner=measured),
         Variant("211,000 jobs of 2-10 min", edit=_split_in_five, runner=measured)],
        "Paper: one bag of 42,200 jobs of 10-50 min on all resources, Concurrency 5: at most **4 requests/s**, "
        "**20 jobs/s**; the same bag with each job split into five (211,000 jobs): **18 requests/s**, "
        "**93 jobs/s**, with no loss of throughput. Beyond 30-40 requests/s the Technion firewall, not the "
        "server, was the limit.\n\nRates below are over one-minute windows of simulated time, peaks from "
        "10 minutes in; the dispatcher's time is its own wall-clock time per exchange (requests and ticks, "
        "no HTTP or store: see docs/performance.md for the whole server).",
        scalability_table),
}


def source_version() -> str:
    """The commit the tables come from, and whether the tree had changes beside it ("unknown" outside git)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", "experiments", ":!experiments/results"],
                               cwd=HERE.parent,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + (" with uncommitted changes" if dirty else "")


def plot(title: str, runs: dict[str, list[Results]], path: Path) -> Path | None:
    """Incomplete jobs over time, as the paper draws its figures, from each variant's first seed: one line a
    variant when every variant runs one bag; else a panel a variant, a line a bag. None if no run sampled."""
    first = {name: rs[0] for name, rs in runs.items() if rs and rs[0].incomplete and rs[0].times}
    if not first:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    single = all(len(r.incomplete) == 1 for r in first.values())
    crowded = single and len(first) > 4  # many variants on one axes: their legend beside it, the tails on a log scale
    panels = 1 if single else len(first)
    cols = min(panels, 2)
    rows = (panels + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(13 if crowded else 8 * cols, 5 if crowded else 3.6 * rows),
                             dpi=90, squeeze=False)
    flat = [ax for row in axes for ax in row]
    for k, (name, r) in enumerate(first.items()):
        ax = flat[0 if single else k]
        named = draw_incomplete(ax, r, label=name if single else None)
        if not single:
            ax.set_title(name, fontsize="small")
            if named:
                ax.legend(fontsize="x-small")
    for ax in flat[: 1 if single else len(first)]:
        ax.set_xlabel("time (hours)")
        ax.set_ylabel("incomplete jobs")
        ax.grid(alpha=0.3)
    if crowded:
        for line, color in zip(flat[0].get_lines(), plt.get_cmap("tab20").colors, strict=False):
            line.set_color(color)
        flat[0].set_yscale("symlog", linthresh=1)
        flat[0].legend(fontsize="x-small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    elif single:
        flat[0].legend(fontsize="x-small")
    for ax in flat[1 if single else len(first):]:
        ax.set_visible(False)
    fig.suptitle(f"{title}\n(first seed of each variant)", fontsize="medium")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def run(name: str, scale: float = 1.0, seeds: int | None = None, out: Path | None = None,
        only: Callable[[str], bool] | None = None) -> dict[str, list[Results]]:
    """Run every variant of an experiment (those whose name `only` accepts) over `seeds` seeds (default:
    the experiment's); write the markdown table if `out` is given."""
    exp = EXPERIMENTS[name]
    seeds = exp.seeds if seeds is None else seeds
    path = HERE / (exp.base or name) / "base.toml"
    base = parse_scenario(path.read_text(), str(path))
    if scale != 1.0:
        base = scaled(base, scale)
    variants = [v for v in exp.variants if only is None or only(v.name)]
    runs: dict[str, list[Results]] = {}
    version = source_version()  # as the run starts: a tree changed while it runs is not what it imported
    started = time.perf_counter()
    for v in variants:
        sc = v.apply(base)
        runs[v.name] = [v.runner(sc, base.seed + k) for k in range(min(seeds, v.seeds) if v.seeds else seeds)]
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        jobs = sum(b.jobs for b in base.bags)
        took = time.perf_counter() - started
        figure = plot(exp.title, runs, out / f"{name}.png")
        text = (f"# {exp.title}\n\nGenerated by `python experiments/run.py {name} --scale {scale:g} --seeds "
                f"{seeds}` at {version} ({jobs:,} jobs in the base scenario, {took:.0f} s of "
                f"simulation).\n\n{exp.paper}\n\ngridbot's simulator:\n\n{exp.table(runs)}\n")
        if figure is not None:
            undrawn = [name for name, rs in runs.items() if not (rs and rs[0].incomplete and rs[0].times)]
            text += (f"\n![incomplete jobs over time]({figure.name})\n\nIncomplete jobs over time, "
                     "each variant's first seed." + (f" Not drawn, as they keep no samples over time: "
                                                     f"{', '.join(undrawn)}." if undrawn else "") + "\n")
        for v in variants:
            server = v.settings(base)
            if v.policy or v.per_bag or server:
                text += f"\n`{v.name}`: policies {v.policy or v.per_bag}" + (
                    f", server {server}" if server else "") + "\n"
        (out / f"{name}.md").write_text(text)
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help=f"experiments to run: {', '.join(EXPERIMENTS)} (default: all)")
    ap.add_argument("--scale", type=float, default=1.0, help="run at this fraction of the size (0 < s <= 1)")
    ap.add_argument("--seeds", type=int, help="seeds per variant, averaged (default: the experiment's own)")
    ap.add_argument("--out", type=Path, default=HERE / "results", help="folder for the markdown tables")
    args = ap.parse_args()
    unknown = [n for n in args.names if n not in EXPERIMENTS]
    if unknown:
        ap.error(f"unknown experiment {', '.join(unknown)}; there are {', '.join(EXPERIMENTS)}")
    for name in args.names or list(EXPERIMENTS):
        started = time.perf_counter()
        run(name, args.scale, args.seeds, args.out)
        print(f"{name}: {time.perf_counter() - started:.0f} s -> {args.out / (name + '.md')}", file=sys.stderr)


if __name__ == "__main__":
    main()
