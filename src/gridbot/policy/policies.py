"""A bag's policies: ClassAd expressions that steer matching, priority, bundling, deadlines and replication.

Each policy has a documented default that behaves sensibly with nothing written. A policy is parsed
strictly (trailing input, a second assignment or a `//` comment swallowing the rest are refused), its
attribute references are checked against the attributes the composite ad really has (an unknown one
is almost always a typo, and the error says which and what was probably meant), and it is
evaluated once against a representative ad, so a policy that errors or runs away is refused at
submit time rather than found at run time.
"""

from __future__ import annotations

import difflib
import math
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gridbot.errors import GridbotError
from gridbot.policy.classad import ClassAd, ClassAdException, ExprTree, ParserType, Value, parseAds

MAX_POLICY_CHARS = 4096
MAX_DEADLINE_S = 1e9
"""The longest Deadline a policy may give, as a spec's durations (`model.spec.MAX_DURATION`): durations are
added to clock times, and 1e300 printed a 300-digit "due within" in a job's story."""
TRIAL_BUDGET_S = 0.002
"""A policy whose trial evaluation takes longer than this is refused (typical ones take 1-2 µs)."""


@dataclass(frozen=True)
class PolicyDef:
    name: str
    default: str
    kind: type
    doc: str


POLICIES: dict[str, PolicyDef] = {p.name: p for p in (
    PolicyDef("JobRequirements", "!Host.BlackHole", bool,
              "May this host run a job of the bag? Default: any host that is not a black hole. A pilot that "
              "every bag with work waiting refuses, and no other bag would take, leaves at once, so the overlay's "
              "next one may land where the bags accept it (GridBot's pilot suicide); after --refused-pilots such "
              "pilots of a pool in a row the bag gets that pool's pilots one at a time, further and further apart, "
              "until one is taken or the policy changes (docs/pools.md)."),
    PolicyDef("Rank", "0", float,
              "Priority of the bag on this host; the highest-ranked matching bag is served first. Default 0 "
              "(equal ranks: oldest bag first). Where it is not a finite number (UNDEFINED included), the default "
              "counts and the bag's diagnostics say so; such a constant is refused."),
    PolicyDef("Concurrency", "Host.Slots + (Host.Prefetch > Host.Slots ? Host.Prefetch : Host.Slots)", int,
              "Most slots a host's instances may hold at once (running and prefetched; a job of a bag with "
              "`cpus = 4` holds four, any other one); the value of the "
              "highest-ranked matching bag bounds every bag served in that request. Default: two per slot, or "
              "the slots and the worker's prefetch when it asks for more (it does for short jobs, from their "
              "run time: a bundle of many per round trip). Below 1 on a host, the bag is no match there (its "
              "diagnostics say so) and bounds no other bag; a constant below 1 is refused."),
    PolicyDef("Deadline", "", float,
              "Seconds an instance may take before it is counted as lost and its job re-queued. Default: the "
              "bag's instance_deadline. Where it is not a positive finite number (UNDEFINED included), the "
              "default counts and the bag's diagnostics say so; such a constant is refused."),
    PolicyDef("ReplicationRequirements",
              "Tail && NumberOfReplicas < 2 && Bag.MeanRunTime > 0 && Job.Replica1.RunTime > 2 * Bag.MeanRunTime",
              bool,
              "Evaluated for each running job when few of the bag's jobs are queued: true adds one more "
              "replica. Default: in the tail phase, one extra replica of a straggler, a job out for more than "
              "twice the bag's mean run time (a copy then has a chance to finish first; jobs running as long "
              "as the others, as on one machine, are not copied). GridBot's own default, replicating every job "
              "of the tail, is `Tail && NumberOfReplicas < 2`."),
    PolicyDef("GridPolicy", "true", bool,
              "Evaluated against each pool's ad by the overlay constructor: may pilots for this bag go there? "
              "Default: every pool."),
)}

HOST_ATTRS: dict[str, str] = {
    "Name": "host name as the worker reports it (machine/slot)",
    "HostId": "stable id of the host",
    "Pool": "pool the worker belongs to",
    "Platform": "operating system and machine, e.g. Linux-x86_64",
    "NumCpus": "CPU cores of the machine",
    "Slots": "instances the worker runs at once",
    "Prefetch": "instances the worker would hold beyond its slots (more for short jobs)",
    "Memory": "memory of the machine in MB",
    "RunningJobs": "instances of any bag the host holds now",
    "JobsDone": "instances the host completed well, ever",
    "JobsFailed": "instances that failed or were lost on the host, ever",
    "ErrorRate": "JobsFailed / (JobsDone + JobsFailed); 0 for a new host",
    "JobsToday": "instances completed well since the start of the current UTC day",
    "RecentGoodCpuTime": "CPU seconds of good results, decayed with a half-life of one day",
    "AvgTurnaround": "mean seconds from sending an instance to its good result (0 until one exists)",
    "BlackHole": "true when the host keeps failing jobs right after starting them",
    "InvalidRate": "share of its results a quorum judged invalid, of those judged (bags with `quorum`); 0 before",
    "ValidStreak": "its results a quorum accepted in a row since its last invalid one",
    "Speed": "GFLOPS of one of its CPUs where measured (a volunteer's BOINC benchmark); 0 where unknown",
    "Reliable": "the host's pool is marked reliable (server option --reliable-pool): the fail-over pool",
}
BAG_ATTRS: dict[str, str] = {
    "Name": "the bag's name",
    "Tail": "true in the tail phase: few of the bag's jobs are queued (see the server's --tail-threshold)",
    "JobsTotal": "jobs in the bag",
    "JobsLeft": "jobs without a result that have not failed for good",
    "JobsDone": "jobs with a result",
    "JobsFailed": "jobs failed for good",
    "JobsRunning": "jobs with an instance out",
    "JobsQueued": "jobs waiting for an instance",
    "Replicas": "instances created by replication so far",
    "ElapsedTime": "seconds since the bag was submitted",
    "MeanRunTime": "mean seconds from sending an instance to its good result, over the results seen since the "
                   "server started (0 before the first)",
}
QUEUE_ATTRS: dict[str, str] = {
    "BagsInQueue": "active bags on the server",
    "BOTsInQueue": "the same, under the paper's name",
}
JOB_ATTRS: dict[str, str] = {
    "Name": "bag name and job index, e.g. sweep.42",
    "Index": "the job's position in the bag",
    "NumberOfReplicas": "instances of the job out now",
    "Failures": "instances of the job that failed so far",
    "Cpus": "CPUs (slots) one job of the bag needs (the spec's `cpus`)",
    "Memory": "memory one job may use in MB, the spec's `memory` (0: unlimited)",
    "Replica1, Replica2, ...": "one ad per instance out now: Name, SentTime, RunTime, Host (that host's ad)",
}
REPLICA_ATTRS = {"Name", "SentTime", "RunTime", "Host"}
POOL_ATTRS: dict[str, str] = {
    "Name": "the pool's name in the pools file",
    "Kind": "local, slurm, pbs, lsf, cobalt, flux, ec2, static or volunteer; in the simulator grid, cluster, cloud "
            "or community",
    "Reliability": "unreliable, reliable or volunteer",
    "Level": "the pool's level in the grid execution hierarchy",
    "Cpus": "slots of each pilot",
    "Memory": "memory of each pilot in MB (0: unspecified)",
    "Walltime": "seconds a pilot may live (0: no limit of gridbot's; the batch queue's own, if any)",
    "PricePerCpuHour": "price of a CPU-hour",
    "PricePerPilotHour": "price of an hour of a pilot's life, billed per started ChargingPeriod",
    "ChargingPeriod": "seconds of a pilot's life billed at a time (the pools file's charging_period)",
    "MaxRunning": "most pilots running at once",
    "Trusted": "true when its hosts' results count as a quorum alone (the pools file's trusted)",
    "Startup": "seconds a pilot takes from being asked for to taking work (the pools file's startup, else the kind's)",
    "(any other)": "the pool's own attributes from its [pools.NAME.attributes] table",
}
"""The pool ad GridPolicy sees as `Pool` (the overlay constructor evaluates it for each pool)."""
TOP_ATTRS = {"Host", "Bag", "BOT", "Queue", "Job", "Pool", "NumberOfReplicas", *BAG_ATTRS, *POLICIES}
KEYWORDS = {"true", "false", "undefined", "error", "is", "isnt", "my", "target", "parent"}


class PolicyError(GridbotError, ValueError):
    """A policy that cannot be accepted, with its name, its text and what to do (still a ValueError, as
    callers caught it)."""

    def __init__(self, name: str, text: str, problem: str, hint: str = "") -> None:
        self.policy, self.text, self.problem, self.hint = name, text, problem, hint
        shown = repr(text) if len(text) <= 200 else repr(text[:200]) + f"... ({len(text):,} characters)"
        super().__init__(f"policy {name[:64]} = {shown}: {problem}" + (f"; {hint}" if hint else ""))


def parse(name: str, text: str) -> ExprTree:
    """Parse one policy strictly into an ExprTree, or raise PolicyError."""
    if name not in POLICIES:
        hint = difflib.get_close_matches(name, list(POLICIES), n=1)
        raise PolicyError(name, text, "is not a policy", f"did you mean {hint[0]}?" if hint else
                          f"the policies are {', '.join(POLICIES)}")
    if not text.strip():
        raise PolicyError(name, text, "is empty", "write an expression, or leave the policy out for its default")
    if len(text) > MAX_POLICY_CHARS:
        raise PolicyError(name, text[:60] + "...", f"is longer than {MAX_POLICY_CHARS} characters")
    bare = _QUOTED.sub("''", _bare(text))
    for m in _INT.finditer(bare):
        digits = m.group(1).lstrip("0")
        top = 2**63 if _negated(bare[:m.start()]) else 2**63 - 1  # -9223372036854775808 is one
        if len(digits) > 19 or (len(digits) == 19 and int(digits) > top):  # (no int() of 5,000 digits)
            shown = digits if len(digits) <= 30 else f"{digits[:12]}... ({len(digits):,} digits)"
            raise PolicyError(name, text, f"the integer {shown} is beyond what a ClassAd integer holds (64 bits, at "
                              "most 9223372036854775807): it would count as 0",
                              f"write it as a float ({digits[0]}.{digits[1:3] or '0'}e{len(digits) - 1})")
    key = "e" + secrets.token_hex(8)
    try:
        ads = list(parseAds(f"[{key} = ({text}\n)]", ParserType.New))
    except (ClassAdException, ValueError):
        ads = []
    if len(ads) != 1 or list(ads[0].keys()) != [key]:
        raise PolicyError(name, text, "is not a valid ClassAd expression",
                          "check parentheses and quotes; strings use double quotes, and && || ! ?: are the operators")
    expr: ExprTree = ads[0].lookup(key)
    return expr


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'")
"""An attribute name in single quotes, which may hold digits."""
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|//[^\n]*|/\*.*?(?:\*/|$)', re.DOTALL)
"""A string, an attribute name in single quotes or a comment, whichever starts first: a `//` inside a quoted name
is no comment, nor a `"` inside a comment a string (the review of 2026-11-29: `Pool.'Host//y' || ...` hid the
rest of a policy from the regexp cap and the attribute and integer checks)."""
_INT = re.compile(r"(?<![\w.])(\d+)(?![\w.])")
"""An integer literal: digits not part of a name, a float (`1.5`, `1e19`) or a hexadecimal number."""
_LOCAL = re.compile(r"[\[;]\s*([A-Za-z_]\w*)\s*=(?!=)")
_REF = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\s*\.\s*[A-Za-z_]\w*)*)(\s*\()?")


def _bare(text: str) -> str:
    """`text` without what the ClassAd parser reads as no expression: its strings' contents and its comments
    (a `// was 10000000000000000000` was taken for an integer, `// was` for an attribute)."""
    return _TOKEN.sub(lambda m: '""' if m[0][0] == '"' else m[0] if m[0][0] == "'" else " ", text)


def _negated(before: str) -> bool:
    """Whether the number after `before` has a unary minus: `-` with nothing, an operator or an opening bracket
    before it (`5 - 9223372036854775808` subtracts, and there the literal is read as 0)."""
    head = before.rstrip()
    if not head.endswith("-"):
        return False
    rest = head[:-1].rstrip()
    return not rest or rest[-1] in "([{,;?:!=<>&|+-*/%^~"


def check_references(name: str, text: str) -> None:
    """Refuse references to attributes that exist on no ad, naming the closest real one.

    Names defined inside a nested ad literal of the expression (`[x = 1; y = x + 1].y`) are its own.
    """
    bare = _bare(text)
    local = {m.group(1).lower() for m in _LOCAL.finditer(bare)}
    for m in _REF.finditer(bare):
        if m.group(2):  # a function call
            continue
        parts = [p.strip() for p in m.group(1).split(".")]
        if parts[0].lower() in local:
            continue
        problem = _unknown(parts)
        if problem is not None:
            bad, known, prefix = problem
            guess = difflib.get_close_matches(bad.lower(), [k.lower() for k in known], n=1)
            real = next((k for k in known if k.lower() == guess[0]), "") if guess else ""
            ref = ".".join(parts)
            hint = (f"did you mean {prefix}{real}?" if real else
                    "docs/policies.md lists every attribute")
            raise PolicyError(name, text, f"{ref} is not an attribute of any ad", hint)


def _unknown(parts: list[str]) -> tuple[str, set[str], str] | None:
    """The first unknown component of a reference, the names it could have been, and its prefix."""
    head = parts[0].lower()
    if head in KEYWORDS and len(parts) == 1:
        return None
    tops = {t.lower(): t for t in TOP_ATTRS}
    if head not in tops:
        return parts[0], TOP_ATTRS, ""
    top = tops[head]
    rest = parts[1:]
    if not rest:
        return None
    if top == "Host":
        return _in(rest, HOST_ATTRS, "Host.")
    if top in ("Bag", "BOT"):
        return _in(rest, set(BAG_ATTRS) | set(POLICIES), f"{top}.")
    if top == "Queue":
        return _in(rest, QUEUE_ATTRS, "Queue.")
    if top == "Pool":
        return None  # a pool's own attributes are free: any name may exist
    if top == "Job":
        if re.fullmatch(r"(?i)replica\d+", rest[0]):
            if len(rest) == 1:
                return None
            if rest[1].lower() == "host":
                return _in(rest[2:], HOST_ATTRS, f"Job.{rest[0]}.Host.") if len(rest) > 2 else None
            return _in(rest[1:], REPLICA_ATTRS, f"Job.{rest[0]}.")
        return _in(rest, {k for k in JOB_ATTRS if "," not in k} | {"Replica1"}, "Job.")
    return rest[0], set(), f"{top}."


def _in(rest: list[str], known: Mapping[str, str] | set[str], prefix: str) -> tuple[str, set[str], str] | None:
    if rest and rest[0].lower() not in {k.lower() for k in known}:
        return rest[0], set(known), prefix
    return None


REGEX_FUNCTIONS = frozenset({"regexp", "regexps", "regexpmember", "stringlistregexpmember", "replace", "replaceall"})
MAX_REGEX_CALLS = 4
"""Regular-expression calls one policy may make: each is bounded by PCRE's match limit (about 0.1 s of a
catastrophic pattern), but a policy of a hundred of them held the server's loop for seconds at every work
request (the security review of 2026-11-29)."""


def regex_calls(text: str) -> int:
    """How many regular-expression functions `text` calls."""
    bare = _bare(text)
    return sum(1 for m in _REF.finditer(bare) if m.group(2) and m.group(1).lower() in REGEX_FUNCTIONS)


def representative_context(bag_name: str = "sweep") -> ClassAd:
    """A composite ad with typical values of every attribute, for trial evaluations; the bag's own name where
    it is known (an expression over it, such as a regexp, is then tried on what it will meet)."""
    host = {"Name": "node01.example/worker", "HostId": "0123456789abcdef0123", "Pool": "local",
            "Platform": "Linux-x86_64", "NumCpus": 8, "Slots": 8, "Prefetch": 0, "Memory": 16384, "RunningJobs": 4,
            "JobsDone": 120, "JobsFailed": 3, "ErrorRate": 0.025, "JobsToday": 40, "RecentGoodCpuTime": 3600.0,
            "AvgTurnaround": 300.0, "BlackHole": False, "Reliable": False, "InvalidRate": 0.0, "ValidStreak": 0,
            "Speed": 0.0}
    bag = {"Name": bag_name, "Tail": False, "JobsTotal": 1000, "JobsLeft": 600, "JobsDone": 400, "JobsFailed": 0,
           "JobsRunning": 100, "JobsQueued": 500, "Replicas": 0, "ElapsedTime": 3600.0, "MeanRunTime": 600.0}
    replica = {"Name": f"{bag_name}.42.1", "SentTime": 0.0, "RunTime": 120.0, "Host": host}
    job = {"Name": f"{bag_name}.42", "Index": 42, "NumberOfReplicas": 1, "Failures": 0, "Cpus": 1, "Memory": 0,
           "Replica1": replica}
    pool = {"Name": "cluster", "Kind": "slurm", "Reliability": "reliable", "Level": 1, "Cpus": 4, "Memory": 8192,
            "Walltime": 14400.0, "PricePerCpuHour": 0.0, "MaxRunning": 20}
    ctx = ClassAd({"Host": host, "Bag": bag, "BOT": bag, "Queue": {"BagsInQueue": 3, "BOTsInQueue": 3},
                   "Job": job, "Pool": pool, "NumberOfReplicas": 1, **bag})
    return ctx


@dataclass(frozen=True)
class PolicySet:
    """A bag's compiled policies (`texts` are what the owner wrote or the defaults)."""

    texts: dict[str, str]
    exprs: dict[str, ExprTree]


def compile_policies(written: Mapping[str, str], default_deadline: float,
                     timer: Callable[[], float] | None = None, bag_name: str = "sweep") -> PolicySet:
    """Validate and compile a bag's policies, filling in defaults; raise PolicyError on the first bad one.

    `timer` (seconds, monotonic) bounds each trial evaluation; the caller owns the clock.
    """
    texts = {}
    for name, p in POLICIES.items():
        texts[name] = written.get(name, p.default or f"{default_deadline:g}")
    for name in written:
        if name not in POLICIES:
            parse(name, written[name])
    exprs = {}
    ctx = representative_context(bag_name)
    for name, text in texts.items():
        expr = parse(name, text)
        check_references(name, text)
        exprs[name] = expr
        ctx[name] = expr
    for name, expr in exprs.items():
        trial(name, texts[name], expr, ctx, timer)
    return PolicySet(texts, exprs)


def validate_policies(written: Mapping[str, str], default_deadline: float,
                      timer: Callable[[], float] | None = None, bag_name: str = "sweep") -> PolicySet:
    """`compile_policies` for policies a person just wrote (a spec submitted, `gridbot policy`), which also
    refuses what is wrong whatever the host: a constant Concurrency below 1, under which no host may hold
    an instance of the bag (issue 12: `Concurrency = -5` was accepted, and stalled every bag of the server).
    Stored policies are compiled without this, so a bag stored before the check still loads."""
    for name, text in written.items():
        if regex_calls(text) > MAX_REGEX_CALLS:
            raise PolicyError(name, text, f"calls regular-expression functions {regex_calls(text)} times, over the "
                              f"limit of {MAX_REGEX_CALLS}", "join the patterns into one, or compare strings with ==")
    policies = compile_policies(written, default_deadline, timer, bag_name)
    text = policies.texts["Concurrency"]
    if not references(text):
        value = policies.exprs["Concurrency"].eval(representative_context())
        if is_number(value) and not (math.isfinite(value) and value >= 1):
            raise PolicyError("Concurrency", text, f"is {value:g} on every host, so no host may hold an instance of "
                              "the bag and it would never run", "write a number of at least 1, or an expression of "
                              "the host's attributes such as Host.Slots")
    for name, least, fix in (("Rank", -math.inf, "write a finite number, or an expression of the host's attributes"),
                             ("Deadline", 0.0, "write a number of seconds above 0, e.g. 3600, or leave it out for the "
                                              "bag's instance_deadline")):
        text = policies.texts[name]
        if references(text):
            continue
        try:
            value = policies.exprs[name].eval(representative_context())
        except ClassAdException:
            value = Value.Error
        number = is_number(value)
        if not number or not (math.isfinite(value) and value > least):
            shown = f"{value:g}" if number else "UNDEFINED" if value is Value.Undefined else "ERROR"
            raise PolicyError(name, text, f"is {shown} on every host, which the server would ignore (it counts "
                              "the default instead, and says so only in the bag's diagnostics)", fix)
        if name == "Deadline" and value > MAX_DEADLINE_S:
            raise PolicyError(name, text, f"is {value:g} s, over the longest deadline, {MAX_DEADLINE_S:g} s "
                              "(about 31 years)", fix)
    return policies


def is_number(value: object) -> bool:
    """Whether an expression's value is a number: not a boolean, nor UNDEFINED or ERROR (`Value` is an IntEnum,
    so they are ints to isinstance: an UNDEFINED Deadline was counted as 2 seconds)."""
    return isinstance(value, int | float) and not isinstance(value, bool | Value)


def references(text: str) -> list[str]:
    """The attribute references of an expression (`Host.Slots`, `Tail`), without keywords, function names and
    strings: none means that its value is the same on every host."""
    bare = _bare(text)
    return [m.group(1) for m in _REF.finditer(bare) if not m.group(2) and m.group(1).lower() not in KEYWORDS]


TRIAL_TRIES = 3
"""An evaluation over the budget is tried again up to this many times in all, and judged by its fastest: a costly
expression is slow every time, while a busy server's hiccup (another process on the CPU, the collector) is not,
and must not refuse a user's bag (the default Concurrency was refused so on a loaded test machine)."""


def trial(name: str, text: str, expr: ExprTree, ctx: ClassAd, timer: Callable[[], float] | None) -> None:
    """Evaluate against a representative ad: it must finish quickly (its fastest of `TRIAL_TRIES` tries, when
    the first is over the budget) and give the right type."""
    fastest = math.inf
    for _ in range(TRIAL_TRIES if timer is not None else 1):
        start = timer() if timer else 0.0
        try:
            value = expr.eval(ctx)
        except ClassAdException:
            raise PolicyError(name, text, "exceeds the evaluation limits (too deep or too many steps)",
                              "simplify the expression") from None
        fastest = min(fastest, timer() - start) if timer is not None else 0.0
        if fastest <= TRIAL_BUDGET_S:
            break
    if fastest > TRIAL_BUDGET_S:
        raise PolicyError(name, text, f"took over {TRIAL_BUDGET_S * 1e3:g} ms to evaluate, each of {TRIAL_TRIES} "
                          "times", "simplify the expression; a policy is evaluated on every work request")
    kind = POLICIES[name].kind
    if value is Value.Error:
        raise PolicyError(name, text, "evaluates to ERROR on a typical host",
                          "check the types: strings need quotes and arithmetic needs numbers")
    if value is Value.Undefined:
        return
    if kind is bool and not isinstance(value, bool):
        raise PolicyError(name, text, f"must be true or false, but gives {value!r}")
    if kind in (int, float) and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise PolicyError(name, text, f"must be a number, but gives {value!r}")
