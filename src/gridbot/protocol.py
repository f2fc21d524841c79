"""Messages between workers, submitters and the server, as typed msgspec Structs.

Workers talk msgpack (results carry binary outputs); the submitter API answers JSON to anyone and
msgpack to clients that ask for it. Version 1 of the protocol lives under `/v1/`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gridbot.core.changes import BagCounts, Decision, Event
from gridbot.core.ledger import PoolBill
from gridbot.core.strategy import LevelReport, QosReport, TailPlan
from gridbot.model.pools import PoolMonitor
from gridbot.model.records import Assignment, HostInfo, InstanceReport, Int64, Label
from gridbot.model.spec import BagSpec, StrategyChoice
from gridbot.schedulers.expert.planner import Observed

MSGPACK = "application/msgpack"
DEFAULT_PORT = 8470


# The requests a client sends (registration, submission, changes) refuse a field the server does not know, where
# a misspelled one was dropped without a word; what the server sends keeps taking unknown fields, so that an older
# client still reads a newer server's answers.
def lean(message: msgspec.Struct) -> dict[str, Any]:
    """A request as the fields set away from their defaults, nested messages alike, for the wire: the server
    refuses a field it does not know, so a client that sent every field, defaults included, would be refused by
    every older server as soon as a field was added, though its user never set it. Sent lean, only a request
    that uses what the server lacks is refused (the review of 2026-11-29)."""
    out: dict[str, Any] = {}
    for f in msgspec.structs.fields(message):
        value = getattr(message, f.name)
        if f.default is not msgspec.NODEFAULT and _same(value, f.default):
            continue
        if f.default_factory is not msgspec.NODEFAULT and _same(value, f.default_factory()):
            continue
        out[f.encode_name] = _lean_value(value)
    return out


def _same(value: object, default: object) -> bool:
    return type(value) is type(default) and value == default


def _lean_value(value: object) -> object:
    if isinstance(value, msgspec.Struct):
        return lean(value)
    if isinstance(value, list) and value and isinstance(value[0], msgspec.Struct):
        return [_lean_value(v) for v in value]
    return value


class ExchangeRequest(msgspec.Struct, frozen=True):
    """A worker's single round trip: reports, the instances it still holds, and how many more it wants."""

    host: HostInfo
    want: Int64
    running: list[Int64]
    reports: list[InstanceReport] = msgspec.field(default_factory=list)
    fetched: tuple[Int64, float] = (0, 0.0)
    """Bytes of inputs the worker downloaded since its last exchange, and the seconds that took: the pool's
    measured bandwidth to the server, which stateful selection weighs (the RENCI report's NWS forecast)."""


class ExchangeResponse(msgspec.Struct, frozen=True):
    """Instances to run, instances to kill, when to ask again, and the limits the worker must respect."""

    assignments: list[Assignment]
    cancel: list[int]
    backoff: float
    heartbeat: float
    max_result_bytes: int
    refused: bool = False
    """The bags refused this host (`gridbot.core.records.HostRecord.refused`): a worker started with
    `--leave-when-refused` and an idle timeout leaves as soon as it holds nothing."""


class RegisterRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A host joining a pool with its pool's worker key: only its name for the log; the server picks its id."""

    name: Label = ""


class Registration(msgspec.Struct, frozen=True):
    """The host id the server gave, the credential that proves it, and the pool the key belongs to."""

    host_id: str
    credential: str
    pool: str


class SubmitRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A bag to store: its spec, its commands (each-line bags only) and its input files."""

    spec: BagSpec
    lines: list[str] | None = None
    inputs: dict[str, bytes] = msgspec.field(default_factory=dict)


class BagInfo(msgspec.Struct, frozen=True):
    """A bag as the submitter API shows it."""

    bag_id: int
    name: str
    state: str
    total: int
    counts: BagCounts
    created_at: float
    finished_at: float | None
    spec_hash: str
    description: str = ""
    diagnostics: list[str] = msgspec.field(default_factory=list)
    """Policies that evaluated to UNDEFINED or ERROR (they count as no match)."""
    revision: int = 1
    """1 as submitted, one more at each revision of its spec (`gridbot run --retry-failed`)."""
    tail_plan: TailPlan | None = None
    """What its tail strategy planned for its tail and how the tail went (ExPERT's), if it says."""
    budget: float | None = None
    deadline_at: float | None = None
    """Its QoS deadline on the server's clock (`bag_deadline`), if it has one."""
    spent: float = 0.0
    """What it has spent on priced pools so far (`gridbot cost` breaks it down)."""
    qos: QosReport | None = None
    """Its placement's plan for its deadline and budget (DBC's), while it runs."""
    level: LevelReport | None = None
    """Where the execution hierarchy holds it (its queue, level, complexity, migrations), while it runs."""


class QueueInfo(msgspec.Struct, frozen=True):
    """A queue of the execution hierarchy with its limits and load (`gridbot levels`)."""

    name: str
    level: int
    pools: list[str]
    queue_time_limit: float
    exec_time_limit: float
    max_cpus: int
    performance: float
    """P as used: given, or the pools' `Speed`, else as measured from the bags that ran there and elsewhere, else 1."""
    max_bags: int | None
    policies: list[str]
    at_lowest: str
    work: float
    """Q: the remaining work of the bags it holds, CPU-seconds of a speed-1 CPU, as of the last step."""
    queue_limit: float
    """C_q for a CPU-bound bag (beta 1)."""
    exec_limit: float
    """C_e for a CPU-bound bag."""
    bags: list[str]
    """Its bags, head first."""
    running: int
    """Instances its bags run on its pools."""


class QosChange(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A change of a bag's deadline or budget (`gridbot qos`); a field left out keeps its value."""

    budget: float | msgspec.UnsetType | None = msgspec.UNSET
    """The new budget (null: none)."""
    bag_deadline: str | float | msgspec.UnsetType | None = msgspec.UNSET
    """The new deadline: a duration after the bag's submission, an ISO 8601 time with its zone, or null: none."""


class CostInfo(msgspec.Struct, frozen=True):
    """What a bag spent, per pool, against its budget (`gridbot cost`)."""

    bag: str
    spent: float
    pools: list[PoolBill]
    budget: float | None = None
    deadline_at: float | None = None
    qos: QosReport | None = None
    idle_pilots: float = 0.0
    """What the server's pilots that ran no instance cost (nobody's share: the run's)."""


class PlanInput(msgspec.Struct, frozen=True):
    """A running bag as `gridbot plan` characterizes it (`GET /v1/bags/{bag}/history`): its instances so far,
    the tasks left and the pools with their prices, as the server saw them at `observed.now`."""

    bag: str
    strategy: StrategyChoice
    observed: Observed
    tail_plan: TailPlan | None = None


class BagHistory(msgspec.Struct, frozen=True):
    """Every instance of a bag as the server stored it (`GET /v1/bags/{bag}/instances`): what `gridbot plan
    --from-bag` characterizes the pools from, offline (`gridbot.history`)."""

    bag: str
    state: str
    instance_deadline: float
    """The bag's instance deadline (its throughput phase's D): an instance out longer without a word was lost."""
    reliable_pools: list[str]
    """The pools the server takes for reliable (ExPERT's reliable pools)."""
    instances: list[tuple[float, float | None, bool, str]]
    """(sent_at, ended_at, success, pool) per instance whose outcome the store knows or that is still out
    (ended_at None: lost, or out); those cancelled or given back are left out."""


class JobInfo(msgspec.Struct, frozen=True):
    """A job as listings show it: what it runs and how it went."""

    job_id: int
    index: int
    state: str
    command: str
    failures: int
    attempts: int
    reason: str | None
    revision: int = 1
    """The bag's revision whose command the job runs, or ran for its result."""


class InstanceInfo(msgspec.Struct, frozen=True):
    """One instance of a job, for a job's story."""

    instance_id: int
    host_id: str
    state: str
    sent_at: float
    ended_at: float | None
    reason: str | None
    exit_code: int | None
    wall_s: float | None
    cpu_s: float | None


class ResultInfo(msgspec.Struct, frozen=True):
    """An ended job's kept result, with its output files."""

    job: JobInfo
    params: dict[str, str]
    exit_code: int | None
    wall_s: float | None
    cpu_s: float | None
    host_id: str | None
    stdout_tail: str
    stderr_tail: str
    outputs: dict[str, bytes]


class HostInfoRow(msgspec.Struct, frozen=True):
    """A host with the server's statistics about it."""

    host_id: str
    name: str
    pool: str
    ncpus: int
    first_seen: float
    last_seen: float
    done: int
    failed: int
    error_rate: float = 0.0
    black_hole: bool = False
    """The host keeps failing jobs right after starting them: the default policy gives it no work."""
    refused: int = 0
    """Reports this host sent for instances it was not running (another host's, or forged): ignored."""
    valid: int = 0
    """Its results a quorum judged valid (bags with `quorum`)."""
    invalid: int = 0
    """Its results a quorum judged invalid: never returned to the bag's owner."""
    invalid_rate: float = 0.0
    speed: float = 0.0
    """GFLOPS of one of its CPUs where measured (a volunteer's BOINC benchmark); 0: unknown."""
    account: str = ""
    """Whose host it is, where its pool knows (a volunteer's account)."""


class PoolInfo(msgspec.Struct, frozen=True):
    """A pool as `gridbot pools` shows it."""

    name: str
    kind: str
    pilots_queued: int
    pilots_running: int
    pilots_ended: int
    pilots_failed: int
    """Pilots that ended abnormally (refused by the pool, or their worker crashed)."""
    pilots_submitted: int
    hosts: int
    jobs_done: int
    throughput: float
    """Jobs per second done by the pool's hosts, over the last few minutes."""
    error: str
    max_running: int
    max_queued: int
    monitor: PoolMonitor | None = None
    """The last reading of the pool's own monitoring (Slurm: free CPUs and jobs waiting in its partition)."""
    bandwidth: float = 0.0
    """MB/s its hosts measured downloading inputs from the server (0: nothing downloaded yet)."""
    pilots_stale: int = 0
    """Of the queued pilots, those queued longer than the pool's `queue_patience`: no longer counted as capacity."""


class PolicyChange(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Set one policy of a bag."""

    name: str
    text: str


class RetryRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Queue failed jobs of a bag again: those at `indices` (None: every failed job), and with `revision`,
    first make its spec, inputs (and lines) the bag's next revision."""

    indices: list[Int64] | None = None
    revision: SubmitRequest | None = None


class RetryAnswer(msgspec.Struct, frozen=True):
    """The bag after a retry, and how many of its jobs were queued again."""

    bag: BagInfo
    requeued: int


class InstanceLog(InstanceInfo, frozen=True):
    """One instance of a job with what its host reported; `kept` marks the one whose result the job keeps."""

    stdout_tail: str
    stderr_tail: str
    kept: bool = False


class JobLog(msgspec.Struct, frozen=True):
    """A job's story (`gridbot logs BAG JOB`): what it runs and every instance of it, oldest first."""

    bag: str
    job: JobInfo
    params: dict[str, str]
    instances: list[InstanceLog]


class StoryInstance(InstanceInfo, frozen=True):
    """One instance in a job's life: where it ran, whether it was a replica, and the events (ids into
    `JobStory.events`; None: not recorded, or not yet) that sent it, found it overdue and ended it."""

    host_name: str | None
    pool: str | None
    instance_deadline: float
    replica: bool
    sent_event: int | None
    end_event: int | None
    overdue_event: int | None


class JobStory(msgspec.Struct, frozen=True):
    """A job's life (`gridbot jobs BAG JOB --story`): its instances oldest first, the strategies' decisions
    about it in the order they were made, and the events these cite, by id."""

    bag: str
    job: JobInfo
    result_instance: int | None
    """The instance whose result the job keeps."""
    instances: list[StoryInstance]
    decisions: list[Decision]
    events: list[Event]


class Deleted(msgspec.Struct, frozen=True):
    """A bag removed from the server, with the state it had (active ones were cancelled first)."""

    bag_id: int
    name: str
    state: str
    total: int


class ErrorBody(msgspec.Struct, frozen=True):
    """What the server answers with any 4xx or 5xx: a message a person can act on."""

    error: str
    kind: str = "error"
