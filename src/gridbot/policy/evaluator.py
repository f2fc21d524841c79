"""Evaluating a bag's policies against the composite ad of one host, the bag, the queue and a job.

One long-lived context ad per bag holds the bag's attributes (also at the top level, so `Tail` and
`JobsLeft` work bare, as in the paper's Figure 3) and the policies themselves (so `Deadline =
Concurrency * 2000` works). Each decision copies the host's ad in and evaluates pre-parsed trees:
about a microsecond per policy. UNDEFINED or ERROR never raises: it counts as no match (or as the
policy's default), and the bag keeps a diagnostic its owner can read.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from gridbot.policy.classad import ClassAd, ClassAdException, ExprTree, Value
from gridbot.policy.policies import MAX_DEADLINE_S, PolicySet

HostAd: TypeAlias = ClassAd
EMPTY_JOB: dict[str, Any] = {"Name": "", "Index": -1, "NumberOfReplicas": 0, "Failures": 0}
SLOW_EVAL_S = 0.01
"""An evaluation of one policy that takes longer than this counts against the bag's `SLOW_BUDGET_S`."""
SLOW_BUDGET_S = 1.0
"""Seconds of slow evaluations a bag's policies may cost the dispatcher before they are set aside. A policy is
tried once on a typical host when it is submitted (`policies.trial`), but a host's own attributes can make it
slow there alone (a regular expression that backtracks on a long host name took 0.22 s a host, and five such
bags stalled every exchange of that host for seconds): each bag pays for its own, at most this much."""


@dataclass(frozen=True)
class Decision:
    """What a bag's policies say about one host (for jobs with no replica out)."""

    matches: bool
    rank: float
    concurrency: int
    deadline: float


@dataclass
class Diagnostic:
    """A policy that evaluated to UNDEFINED or ERROR: how often, and the last time on which host."""

    count: int = 0
    value: str = ""
    host: str = ""


@dataclass
class BagPolicies:
    """A bag's compiled policies with its evaluation context."""

    policies: PolicySet
    default_deadline: float
    job: dict[str, Any] = field(default_factory=lambda: dict(EMPTY_JOB))
    """The ad `Job` is when the policies look at no job in particular: what all the bag's jobs share (Cpus,
    Memory); a job's own ad is laid over it."""
    ctx: ClassAd = field(default_factory=ClassAd)
    diagnostics: dict[str, Diagnostic] = field(default_factory=dict)
    timer: Callable[[], float] | None = None
    """A monotonic clock (the server's; None: evaluations are not timed, as in the simulator, which must not
    read one): with it, slow evaluations are summed and the policies set aside past SLOW_BUDGET_S."""
    slow_s: float = 0.0
    """Seconds spent in evaluations over SLOW_EVAL_S each."""
    set_aside: str = ""
    """Why the policies no longer run ("": they do): every evaluation is then ERROR, so the bag matches no host
    and no pool, until its owner sets a policy again (a new BagPolicies) or cancels it."""

    def __post_init__(self) -> None:
        self.uses_time = any("elapsedtime" in t.lower() for t in self.policies.texts.values())
        names = set().union(*(top_names(t) for t in self.policies.texts.values()))
        self.names = names
        """Top-level names the policies use (lower case): only these of the bag's attributes are written."""
        self.grid_policy_static = top_names(self.policies.texts["GridPolicy"]) <= {"pool"}
        """GridPolicy looks at the pool alone: its answer per pool holds while the bag changes."""
        rank = self.policies.texts["Rank"].lower()
        self.rank_static = not any(word in rank for word in ("host", "job", "replica", "target"))
        """Rank sees only the bag and the queue: one value serves every host until the bag changes."""
        for name, expr in self.policies.exprs.items():
            self.ctx[name] = expr
        self.ctx["Job"] = self.job
        self.ctx["NumberOfReplicas"] = 0
        self._bag: dict[str, Any] = {}
        self._queue: dict[str, Any] = {}

    def set_bag(self, attrs: Mapping[str, Any], queue: Mapping[str, Any]) -> None:
        """Refresh the bag's and the queue's attributes (call when they changed); only values that changed
        are written, since this runs on most work requests of a busy bag."""
        if attrs != self._bag:
            if "bag" in self.names or "bot" in self.names:
                bag = ClassAd(dict(attrs))
                self.ctx["Bag"] = bag
                self.ctx["BOT"] = bag
            for k, v in attrs.items():
                if k.lower() in self.names and self._bag.get(k, self) != v:
                    self.ctx[k] = v
            self._bag = dict(attrs)
        if queue != self._queue:
            self.ctx["Queue"] = dict(queue)
            self._queue = dict(queue)

    def decide(self, host: HostAd) -> Decision:
        """Algorithm 1's evaluation for a job with no replica out, on this host."""
        if not self.matches(host):
            return Decision(False, 0.0, 0, 0.0)
        concurrency, deadline = self.bundle(host)
        return Decision(concurrency > 0, self.rank(host), concurrency, deadline)

    def matches(self, host: HostAd) -> bool:
        """JobRequirements on this host (UNDEFINED or ERROR: no)."""
        self.ctx["Host"] = host
        return self._eval("JobRequirements", host) is True

    def rank(self, host: HostAd | None) -> float:
        """Rank on this host (None: a static Rank, which does not look at the host)."""
        if host is not None:
            self.ctx["Host"] = host
        return self._number("Rank", host, 0.0)

    def bundle(self, host: HostAd) -> tuple[int, float]:
        """Concurrency and Deadline on this host, for the host set by the last `matches`."""
        deadline = self._number("Deadline", host, self.default_deadline)
        if deadline <= 0:
            self._note("Deadline", f"not a positive number of seconds: {deadline:g}", host)
            deadline = self.default_deadline
        elif deadline > MAX_DEADLINE_S:
            self._note("Deadline", f"over the longest deadline ({MAX_DEADLINE_S:g} s): {deadline:g}", host)
            deadline = self.default_deadline
        concurrency = self._number("Concurrency", host, 1.0)
        if concurrency < 1:
            # the bag is no match on this host: as the highest-ranked bag it used to bound every other bag's
            # concurrency to 0 as well, stalling the whole server without a word (issue 12)
            self._note("Concurrency", f"{concurrency:g} (less than one instance)", host)
            return 0, deadline
        return int(concurrency), deadline

    def job_matches(self, host: HostAd, job: Mapping[str, Any]) -> tuple[bool, Decision]:
        """The same decision for one job with replicas out (its ad differs from the bag's generic one)."""
        self.ctx["Job"] = {**self.job, **job}
        self.ctx["NumberOfReplicas"] = job["NumberOfReplicas"]
        try:
            d = self.decide(host)
        finally:
            self.ctx["Job"] = self.job
            self.ctx["NumberOfReplicas"] = 0
        return d.matches, d

    def should_replicate(self, job: Mapping[str, Any], host_of_first: HostAd | None) -> bool:
        """ReplicationRequirements for one running job (Algorithm 2)."""
        self.ctx["Job"] = {**self.job, **job}
        self.ctx["NumberOfReplicas"] = job["NumberOfReplicas"]
        if host_of_first is not None:
            self.ctx["Host"] = host_of_first
        try:
            return self._eval("ReplicationRequirements", host_of_first) is True
        finally:
            self.ctx["Job"] = self.job
            self.ctx["NumberOfReplicas"] = 0

    def accepts_pool(self, pool: Mapping[str, Any]) -> bool:
        """GridPolicy against one pool's ad (seen as `Pool`): may pilots for this bag go there?"""
        self.ctx["Pool"] = dict(pool)
        value = self._eval("GridPolicy", None)
        noted = self.diagnostics.get("GridPolicy")
        if noted is not None and (value is Value.Undefined or value is Value.Error):
            noted.host = f"pool {pool.get('Name', '?')}"
        return value is True

    def _eval(self, name: str, host: HostAd | None) -> Any:
        if self.set_aside:
            return Value.Error
        start = self.timer() if self.timer is not None else 0.0
        try:
            value = self.policies.exprs[name].eval(self.ctx)
        except ClassAdException:
            value = Value.Error
        if self.timer is not None and (took := self.timer() - start) > SLOW_EVAL_S:
            # once more, and the faster counts: the process's own pause (a garbage collection, another thread
            # holding the GIL) rarely comes twice in a row, a slow policy is slow every time
            again = self.timer()
            try:
                value = self.policies.exprs[name].eval(self.ctx)
            except ClassAdException:
                value = Value.Error
            if (took := min(took, self.timer() - again)) > SLOW_EVAL_S:
                self._slow(name, took, host)
        if value is Value.Undefined or value is Value.Error:
            self._note(name, "UNDEFINED" if value is Value.Undefined else "ERROR", host)
        return value

    def _number(self, name: str, host: HostAd | None, default: float) -> float:
        value = self._eval(name, host)
        if isinstance(value, bool | Value) or not isinstance(value, int | float):  # (Value is an IntEnum)
            if not isinstance(value, Value):
                self._note(name, f"not a number: {value!r}", host)
            return default
        if not math.isfinite(value):
            self._note(name, f"not a finite number: {value!r}", host)
            return default
        return float(value)

    def _slow(self, name: str, took: float, host: HostAd | None) -> None:
        """One slow evaluation: counted, and past the budget the policies are set aside."""
        self.slow_s += took
        if self.slow_s > SLOW_BUDGET_S:
            on = "a pool"
            if host is not None:
                try:
                    on = f"host {host['Name']}"
                except KeyError:
                    on = "a host"
            self.set_aside = (f"the bag's policies were set aside after {self.slow_s:.1f} s of evaluations over "
                              f"{SLOW_EVAL_S * 1e3:g} ms each ({name} took {took * 1e3:.0f} ms on {on}): it runs on "
                              f"no host until its owner sets a faster policy (`gridbot policy BAG {name} EXPR`; a "
                              "regular expression that backtracks is the usual cause) or cancels it")

    def _note(self, name: str, value: str, host: HostAd | None) -> None:
        d = self.diagnostics.setdefault(name, Diagnostic())
        d.count += 1
        d.value = value
        if host is not None:
            try:
                d.host = str(host["Name"])
            except KeyError:
                d.host = ""

    def failing_clause(self, name: str, host: HostAd) -> str:
        """The first of the top-level `&&` clauses of policy `name` that is not true on `host` ("" when all
        are): what a person needs to see to know why a host is not used. Nothing of policies set aside: they
        are what was too slow to evaluate (`set_aside` says why)."""
        if self.set_aside:
            return "(set aside)"
        self.ctx["Host"] = host
        for clause in split_and(self.policies.texts[name]):
            try:
                value = ExprTree(clause).eval(self.ctx)
            except ClassAdException:
                value = Value.Error
            if value is not True:
                return clause
        return ""

    def messages(self) -> list[str]:
        """Diagnostics as sentences for the bag's owner."""
        notes = [f"{name} evaluated to {d.value} {d.count} time(s) (last on host {d.host or '?'}); "
                 f"{self._fallback(name, d.value)}: policy {name} = {self.policies.texts[name]!r}"
                 for name, d in self.diagnostics.items()]
        return [self.set_aside, *notes] if self.set_aside else notes

    def _fallback(self, name: str, value: str) -> str:
        """What counted instead of a policy's unusable value (`value`, as noted)."""
        if name == "Concurrency" and not value.endswith("(less than one instance)"):
            return "one instance at a time counted instead"
        if name == "Deadline":
            return f"the bag's instance_deadline ({self.default_deadline:g} s) counted instead"
        if name == "Rank":
            return "a Rank of 0 counted instead"
        return "it counts as no match"


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NAME = re.compile(r"(?<![.\w])([A-Za-z_][A-Za-z0-9_]*)")
_KEYWORDS = {"true", "false", "undefined", "error", "is", "isnt", "my", "target", "parent"}


def split_and(text: str) -> list[str]:
    """The top-level clauses of `a && (b || c) && d`: ["a", "(b || c)", "d"] (strings and brackets kept)."""
    clauses, depth, start, i = [], 0, 0, 0
    quoted = False
    while i < len(text):
        ch = text[i]
        if quoted:
            if ch == "\\":
                i += 1
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith("&&", i):
            clauses.append(text[start:i].strip())
            start = i + 2
            i += 1
        i += 1
    clauses.append(text[start:].strip())
    return [c for c in clauses if c]


def top_names(text: str) -> set[str]:
    """Names an expression looks up at the top level (`Tail`, `Host` in `Host.Pool`), in lower case;
    function calls count too, which only makes the set larger (safe for its use: deciding what to skip)."""
    bare = _STRING.sub('""', text)
    return {m.lower() for m in _NAME.findall(bare)} - _KEYWORDS


def host_ad(attrs: Mapping[str, Any]) -> HostAd:
    """A host's ad from its attributes (see policies.HOST_ATTRS)."""
    ad: HostAd = ClassAd(dict(attrs))
    return ad
