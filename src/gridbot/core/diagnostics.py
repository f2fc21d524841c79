"""Why an active bag is not moving: sentences for its owner (`gridbot status`)."""

from __future__ import annotations

from gridbot.core.records import BagRecord, State
from gridbot.core.view import accepts, host_ad_of
from gridbot.model.states import BagState
from gridbot.policy.policies import MAX_DEADLINE_S

STUCK_AFTER = 10.0
"""Seconds a bag with queued jobs waits with none running before it says why (`Dispatcher.diagnostics`)."""


def stuck(s: State, bag: BagRecord, now: float) -> list[str]:
    """What keeps a bag with queued jobs and none running from being served: no host, no host its policies
    accept (with the closest one and the clause that failed), or pools that fail."""
    if bag.state is not BagState.ACTIVE or not bag.counts.queued or bag.counts.running:
        return []
    if now - max(bag.created_at, bag.last_sent) < STUCK_AFTER:
        return []  # a bag just submitted, or served a moment ago, is not stuck yet
    failing = [f"pool {name} cannot start pilots: {error}" for name, error in sorted(s.pool_errors.items())
               if name in s.pool_ads and accepts(bag, name, s.pool_ads[name])]
    hosts = list(s.live_hosts.values())
    if not hosts:
        how = "the server's pools start none yet" if s.pool_ads else "start `gridbot worker` on a machine, " \
              "or give the server a pools file (--pools) to start pilots"
        return [f"no worker is connected: {how}", *failing]
    cpus = bag.spec.cpus
    widest = max(h.info.slots for h in hosts)
    if cpus > widest:
        pools = [n for n, ad in s.pool_ads.items() if isinstance(w := ad.get("Cpus"), int) and w >= cpus]
        where = f"pool(s) {', '.join(sorted(pools))} start such pilots" if pools else \
            f"set cpus = {cpus} (or more) on a pool of the pools file, or start `gridbot worker --slots {cpus}`"
        return [f"its jobs need {cpus} CPUs each and the widest connected host has {widest} slots: {where}",
                *failing]
    refused: list[tuple[int, str, str]] = []
    starved = 0
    texts = bag.policies.policies.texts
    for host in hosts[:1000]:
        ad = host_ad_of(s, host, now)
        pool_ad = s.pool_ads.get(host.info.pool)
        if pool_ad is not None and not accepts(bag, host.info.pool, pool_ad):
            refused.append((0, host.info.name, f"GridPolicy {texts['GridPolicy']!r} refuses its pool "
                                               f"{host.info.pool}"))
        elif not bag.policies.matches(ad):
            clause = bag.policies.failing_clause("JobRequirements", ad)
            refused.append((1, host.info.name, f"JobRequirements fails on `{clause}`"))
        elif bag.policies.bundle(ad)[0] < cpus:  # Concurrency counts slots: below `cpus`, not one job fits
            starved += 1
    if len(refused) == len(hosts):
        _, name, why = max(refused)
        return [f"none of the {len(hosts)} connected hosts matches the bag's policies; the closest, {name}: "
                f"{why}", *failing]
    if starved and starved + len(refused) == len(hosts):
        return [f"Concurrency evaluates to less than the {cpus} slot(s) one job holds on every host the bag matches "
                f"(policy Concurrency = {texts['Concurrency']!r}; it counts slots): no host may hold one of its jobs",
                *failing]
    q = bag.spec.quorum
    if q > 1:
        accounts = {h.info.account or h.info.host_id for h in hosts}
        if len(accounts) < q:
            return [f"its quorum of {q} needs hosts of {q} distinct accounts and {len(accounts)} is connected: a job "
                    "waits for results from other accounts", *failing]
    return failing


def held_back(s: State, bag: BagRecord, now: float) -> list[str]:
    """The pools whose pilots the bag kept refusing, so that the overlay sends it theirs one at a time
    (`records.Refusals`): which, what refused the last one, and when the next is due."""
    after = s.config.refused_pilots
    out = []
    for pool, r in sorted(bag.refusals.items()):
        if not r.held(after):
            continue
        due = f"its next pilot for this bag in {r.until - now:.0f} s" if now < r.until else \
            "one pilot at a time for this bag"
        out.append(f"pool {pool}: {len(r.pilots)} of its pilots in a row left refused by this bag (the last, on "
                   f"{r.host}: {r.why}), so the server sends {due}; change the bag's policies if they are wrong")
    return out


def deadline_before_timeout(bag: BagRecord) -> list[str]:
    """A `timeout` the server does not let fire: instances whose deadline is shorter are counted lost at their
    deadline and their jobs sent again while the worker still runs them (accepted, as a spec may mean it, but
    said). Known before anything is sent when the deadline is a constant (instance_deadline, or a constant
    Deadline policy); else counted as instances go (`BagRecord.short_deadline`). Not of a tail strategy that
    sets deadlines (ExPERT's): shorter ones are its plan."""
    timeout = bag.spec.timeout
    if timeout is None or bag.tail_strategy.sets_deadline:
        return []
    try:
        constant: float | None = float(bag.policies.policies.texts.get("Deadline", ""))
    except ValueError:
        constant = None  # an expression: said once an instance goes with a shorter deadline
    if constant is not None and not 0 < constant <= MAX_DEADLINE_S:
        constant = None  # (one the policies replace by instance_deadline, as its own diagnostic says)
    if constant is not None and constant < timeout:
        given = (f"its Deadline policy ({constant:g} s)" if "Deadline" in bag.spec.policy
                 else f"its instance_deadline ({constant:g} s)")
    elif bag.short_deadline is not None:
        n, deadline, host = bag.short_deadline
        given = f"the deadline {n} of its instances were sent with (the last: {deadline:g} s, on host {host})"
    else:
        return []
    return [f"its timeout ({timeout:g} s) is longer than {given}: the server counts an instance lost at its "
            "deadline and sends its job again before the worker's timeout could end it; raise instance_deadline "
            "(or the Deadline policy) to at least the timeout, or lower the timeout"]
