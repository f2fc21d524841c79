"""The overlay's allocation of bags to pools: a maximum flow that prefers existing and cheap capacity."""

import itertools
import random
from types import SimpleNamespace

from gridbot.pools.base import PoolError
from gridbot.schedulers.overlay import BagDemand, PoolCapacity, bag_demands, max_flow, plan


def min_cut(demands, capacity):
    """Brute force: the cheapest cut separating bags' demand from pools' capacity (max-flow = min-cut)."""
    best = None
    bags = list(demands)
    for mask in range(1 << len(bags)):
        cut_bags = [d for i, d in enumerate(bags) if mask >> i & 1]  # bags on the sink side: pay their demand
        kept = [d for i, d in enumerate(bags) if not mask >> i & 1]
        reach = set().union(*(d.pools for d in kept)) if kept else set()
        cost = sum(d.slots for d in cut_bags) + sum(capacity[p] for p in reach)
        best = cost if best is None else min(best, cost)
    return best


def test_the_allocation_is_a_maximum_flow_on_random_instances():
    rng = random.Random(4)
    for _ in range(300):
        pools = [f"p{i}" for i in range(rng.randint(1, 4))]
        capacity = {p: rng.randint(0, 12) for p in pools}
        demands = [BagDemand(b, rng.randint(0, 15),
                             frozenset(p for p in pools if rng.random() < 0.6)) for b in range(rng.randint(1, 5))]
        taken, left = max_flow(demands, capacity, sorted(pools, key=lambda _: rng.random()))
        flow = sum(taken.values())
        assert flow == min_cut(demands, capacity)
        assert flow == sum(d.slots for d in demands) - sum(left)
        assert all(0 <= taken[p] <= capacity[p] for p in pools)


def test_a_bag_that_wants_slots_per_pool_gets_each_pool_its_own_slots():
    """A placement's per-pool wish is one demand per pool: each bounded by its own slots. (The flow once had one
    node per bag, so a bag wanting 1 slot on each of three pools, two of them full, got 3 pilots on the third:
    DBC's budget for one pilot-hour pilot then paid three, issue 16.)"""
    demands = [BagDemand(1, 1, frozenset({"fast"})), BagDemand(1, 1, frozenset({"mid"})),
               BagDemand(1, 1, frozenset({"mid2"}))]
    pools = [PoolCapacity("fast", 0, 0, 4, 1, (8.0, 0, "fast")), PoolCapacity("mid", 0, 0, 0, 1, (2.0, 0, "mid")),
             PoolCapacity("mid2", 0, 0, 0, 1, (4.0, 0, "mid2"))]
    p = plan(demands, pools)
    assert p.submit == {"fast": 1} and p.unmet == {1: 2}


def test_preferred_pools_fill_first_whatever_the_order_bags_come_in():
    demands = [BagDemand(1, 10, frozenset({"local", "cloud"})), BagDemand(2, 4, frozenset({"cloud"}))]
    pools = [PoolCapacity("cloud", 0, 0, 10, 1, (0.10, 0, "cloud")),
             PoolCapacity("local", 0, 0, 8, 1, (0.0, 0, "local"))]
    p = plan(demands, pools)
    assert p.submit == {"local": 8, "cloud": 6} and p.unmet == {}


def test_maximum_even_when_greedy_by_bag_would_block():
    """Bag 1 could go anywhere; a greedy that gives it the only pool bag 2 accepts would strand bag 2."""
    demands = [BagDemand(1, 4, frozenset({"a", "b"})), BagDemand(2, 4, frozenset({"a"}))]
    pools = [PoolCapacity("a", 0, 0, 4, 1, (0, 0, "a")), PoolCapacity("b", 0, 0, 4, 1, (1, 0, "b"))]
    p = plan(demands, pools)
    assert p.submit == {"a": 4, "b": 4} and p.unmet == {}


def test_pilots_already_there_absorb_a_burst_before_new_ones_are_asked():
    demands = [BagDemand(1, 6, frozenset({"a", "b"}))]
    pools = [PoolCapacity("a", spare_slots=4, queued_pilots=2, new_pilots=10, pilot_slots=2, preference=(0, 0, "a")),
             PoolCapacity("b", spare_slots=0, queued_pilots=0, new_pilots=10, pilot_slots=2, preference=(0, 1, "b"))]
    p = plan(demands, pools)
    assert p.submit == {"a": 1} and p.cancel == {}


def test_queued_pilots_are_cancelled_when_demand_drops():
    pools = [PoolCapacity("a", spare_slots=8, queued_pilots=4, new_pilots=0, pilot_slots=2)]
    assert plan([BagDemand(1, 2, frozenset({"a"}))], pools).cancel == {"a": 3}
    assert plan([], pools).cancel == {"a": 4}


def test_a_pool_the_grid_policy_excludes_is_never_used():
    demands = [BagDemand(1, 50, frozenset({"fast"}))]
    pools = [PoolCapacity("fast", 0, 0, 3, 2), PoolCapacity("big", 0, 0, 10, 2)]
    p = plan(demands, pools)
    assert p.submit == {"fast": 3} and p.unmet == {1: 44}


def test_limits_round_to_whole_pilots():
    pools = [PoolCapacity("a", 0, 0, new_pilots=5, pilot_slots=4)]
    assert plan([BagDemand(1, 9, frozenset({"a"}))], pools).submit == {"a": 3}
    assert plan([BagDemand(1, 9, frozenset({"a"})), BagDemand(2, 30, frozenset({"a"}))], pools).submit == {"a": 5}


def test_small_instances_exhaustively():
    for caps in itertools.product(range(3), repeat=2):
        for d1, d2 in itertools.product(range(3), repeat=2):
            demands = [BagDemand(1, d1, frozenset({"x"})), BagDemand(2, d2, frozenset({"x", "y"}))]
            capacity = dict(zip(("x", "y"), caps, strict=True))
            taken, _ = max_flow(demands, capacity)
            assert sum(taken.values()) == min_cut(demands, capacity)


def test_the_newest_queued_pilots_are_the_ones_cancelled():
    """Issue 14: one choice, shared by the server's overlay and the simulator."""
    from gridbot.schedulers.overlay import pilots_to_cancel

    assert pilots_to_cancel(["a", "b", "c", "d"], 2) == ["d", "c"]
    assert pilots_to_cancel(["a", "b"], 5) == ["b", "a"]
    assert pilots_to_cancel(["a", "b"], 0) == []


def test_the_servers_overlay_cancels_its_newest_queued_pilots(tmp_path):
    from types import SimpleNamespace

    from gridbot.model.pools import PoolSpec
    from gridbot.model.states import PilotState
    from gridbot.server.overlay import Overlay, _Pool
    from gridbot.store.base import PilotRow
    from gridbot.store.memory import MemoryStore

    class Adapter:
        def __init__(self):
            self.cancelled = []

        def cancel(self, ids):
            self.cancelled.extend(ids)

    service = SimpleNamespace(dispatcher=SimpleNamespace(pool_ads={}), store=MemoryStore())
    overlay = Overlay(service, [], "http://server", tmp_path)
    adapter = Adapter()
    pool = _Pool(PoolSpec("p", "slurm"), adapter)
    pool.pilots = {i: PilotRow("p", i, s, 0.0) for i, s in [("1", PilotState.QUEUED), ("2", PilotState.RUNNING),
                                                            ("3", PilotState.QUEUED), ("4", PilotState.QUEUED)]}
    overlay.pools["p"] = pool
    overlay._act({}, {"p": 2}, 0.0)
    assert adapter.cancelled == ["4", "3"]


def test_pilots_that_end_without_taking_work_hold_the_pools_next_back_and_say_why(tmp_path):
    """Found by the walkthrough of 2026-11-29: a local pool whose every pilot exits at once (no run_as for a root
    server) was sent two new ones every 3 s, forever, and `gridbot pools` showed no error. Only pilots whose
    pool had no host heard from since they began count (a review: preempted pilots, or pilots refused after a
    key rotation, once held a healthy pool back), and the wait doubles once a step, however many ended in it."""
    from gridbot.model.pools import PoolSpec
    from gridbot.model.states import PilotState
    from gridbot.server.overlay import BACKOFF_BASE, FAILED_PILOTS, Overlay, _Pool
    from gridbot.store.base import PilotRow
    from gridbot.store.memory import MemoryStore

    class Adapter:
        def why_failed(self, pilot):
            return f"exit code 2; {pilot} said: give --run-as USER"

    service = SimpleNamespace(dispatcher=SimpleNamespace(pool_ads={}), store=MemoryStore())
    overlay = Overlay(service, [], "http://server", tmp_path)
    pool = _Pool(PoolSpec("p", "local"), Adapter())
    pool.pilots = {str(i): PilotRow("p", str(i), PilotState.RUNNING, 0.0, 1.0) for i in range(12)}
    overlay.pools["p"] = pool

    def step(now, ended, seen=None, state=PilotState.FAILED):
        overlay._observe(pool, {i: state for i in ended}, now, seen)
        overlay._starting(pool, now, seen)

    step(10.0, ["0"], seen=5.0)  # its host was heard from after it began (at 1.0): it ran, then failed
    assert pool.failed_in_a_row == 0
    step(11.0, ["1", "2"])
    assert (pool.error, pool.backoff_until) == ("", 0.0), "a pilot or two may end so"
    step(20.0, ["3", "4", "5", "6"], state=PilotState.COMPLETED)  # an EC2 instance whose install failed ends well
    assert pool.backoff_until == 20.0 + BACKOFF_BASE, "once a step, however many ended in it"
    assert pool.error == (f"{FAILED_PILOTS + 3} pilots in a row ended without taking work: the last, exit code 2; 6 "
                          f"said: give --run-as USER (next pilot in {BACKOFF_BASE:.0f} s)")
    step(40.0, ["7"])
    assert pool.backoff_until == 40.0 + 2 * BACKOFF_BASE, "the wait doubles"
    step(41.0, [])
    assert pool.backoff_until == 40.0 + 2 * BACKOFF_BASE, "not in a step where none ended"
    step(50.0, [], seen=45.0)
    assert (pool.error, pool.failed_in_a_row, pool.failed_level) == ("", 0, 0), "a host heard from clears it"
    overlay._observe(pool, PoolError("squeue failed"), 51.0)
    assert (pool.error, pool.pilot_error) == ("squeue failed", False)


class _HeldView:
    """Just what `bag_demands` reads of a DispatchView: one bag of 4-slot jobs, two pools, one held back."""

    def __init__(self, held: dict[str, bool], wanted: dict[str, int] | None) -> None:
        self.held, self.wanted = held, wanted
        self.asked: list[str] = []

    def bags(self):
        return [SimpleNamespace(bag_id=1, spec=SimpleNamespace(cpus=4), queued=5, waiting_replicas=1)]

    def accepts_pool(self, bag_id: int, pool: str) -> bool:
        return True

    def pool_ad(self, name: str) -> dict[str, object]:
        return {"Cpus": 8}

    def held_back(self, bag_id: int, now: float) -> dict[str, bool]:
        return self.held

    def pilots_wanted(self, bag_id: int, pools, now: float):
        self.asked = list(pools)
        return self.wanted


def test_a_held_pool_gets_no_demand_then_one_jobs_slots_and_a_placement_is_not_offered_it():
    """A pool whose pilots the bag kept refusing: while its wait runs the bag asks nothing of it and its placement
    is not offered it (so it puts its demand elsewhere); once due, one job's slots (4 here), whatever the
    placement wanted there."""
    waiting = _HeldView({"grid": True}, None)
    assert bag_demands(waiting, ["grid", "cloud"], 0.0) == [BagDemand(1, 24, frozenset({"cloud"}), 4)]
    assert waiting.asked == ["cloud"]
    due = _HeldView({"grid": False}, None)
    assert sorted(bag_demands(due, ["grid", "cloud"], 0.0), key=lambda d: sorted(d.pools)) == [
        BagDemand(1, 24, frozenset({"cloud"}), 4), BagDemand(1, 4, frozenset({"grid"}), 4)]
    placed = _HeldView({"grid": False}, {"grid": 16, "cloud": 8})
    assert placed.asked == [] and sorted(bag_demands(placed, ["grid", "cloud"], 0.0), key=lambda d: sorted(d.pools)) \
        == [BagDemand(1, 8, frozenset({"cloud"}), 4), BagDemand(1, 4, frozenset({"grid"}), 4)]
    assert placed.asked == ["grid", "cloud"], "a pool whose next pilot is due is offered to the placement"
    held = _HeldView({"grid": True}, {"cloud": 8})
    assert bag_demands(held, ["grid", "cloud"], 0.0) == [BagDemand(1, 8, frozenset({"cloud"}), 4)]
    assert held.asked == ["cloud"]


def test_a_pilot_queued_past_the_pools_patience_is_not_capacity_but_still_counts_against_its_limits():
    from gridbot.model.pools import PoolSpec
    from gridbot.schedulers.overlay import pool_capacity, stale_count

    spec = PoolSpec("p", "slurm", max_running=10, max_queued=4, cpus=2, queue_patience=600.0)
    assert stale_count([0.0, 100.0, 500.0], 600.0, now=800.0) == 2
    assert stale_count([0.0, 100.0, 500.0], 0.0, now=1e9) == 0, "0: a queued pilot always counts"
    c = pool_capacity(spec, queued=3, running=0, hosts=(0, 0), can_submit=True, stale=2)
    assert (c.spare_slots, c.queued_pilots, c.stale_pilots, c.new_pilots) == (2, 3, 2, 1)


def test_demand_a_stale_pilot_was_holding_gets_a_new_pilot_and_the_stale_one_goes_first_once_in_surplus():
    """Issue 14's stale case, left over: a pilot stuck in a queue counted as the bag's capacity for 20 h."""
    stuck = PoolCapacity("a", spare_slots=0, queued_pilots=1, new_pilots=3, pilot_slots=1, stale_pilots=1)
    p = plan([BagDemand(1, 1, frozenset({"a"}))], [stuck])
    assert p.submit == {"a": 1} and p.cancel == {}, "the job gets a pilot; the stuck one keeps its place"
    fresh = PoolCapacity("a", spare_slots=1, queued_pilots=2, new_pilots=2, pilot_slots=1, stale_pilots=1)
    p = plan([BagDemand(1, 1, frozenset({"a"}))], [fresh])
    assert p.submit == p.cancel == {}, "the new pilot holds the demand: nothing more is sent, nothing cancelled"
    assert plan([], [fresh]).cancel == {"a": 2}, "no demand: the fresh and the stale pilot go"
    alone = PoolCapacity("a", spare_slots=0, queued_pilots=1, new_pilots=3, pilot_slots=1, stale_pilots=1)
    assert plan([], [alone]).cancel == {"a": 1}, "no bag wants the pool: the stale pilot goes, though nothing idles"
    assert plan([BagDemand(1, 1, frozenset({"b"}))], [alone]).cancel == {"a": 1}, "nor does a bag of another pool"
    running = PoolCapacity("a", spare_slots=1, queued_pilots=1, new_pilots=2, pilot_slots=1, stale_pilots=1)
    assert plan([], [running]).cancel == {"a": 1}, "a running pilot sits idle: the stale one is surplus"
    elsewhere = [PoolCapacity("a", 0, 1, 0, 1, (0.0, 0, "a"), stale_pilots=1),
                 PoolCapacity("b", 0, 0, 5, 1, (1.0, 0, "b"))]
    assert plan([BagDemand(1, 1, frozenset({"a", "b"}))], elsewhere).submit == {"b": 1}, \
        "a pool full of stuck pilots: another pool the bag accepts gets the job"


def test_the_stale_pilots_are_cancelled_first_then_the_newest():
    from gridbot.schedulers.overlay import pilots_to_cancel

    assert pilots_to_cancel(["a", "b", "c", "d"], 2, stale=1) == ["a", "d"]
    assert pilots_to_cancel(["a", "b", "c", "d"], 1, stale=2) == ["a"]
    assert pilots_to_cancel(["a", "b"], 3, stale=5) == ["a", "b"]


def test_the_servers_overlay_counts_pilots_queued_past_patience_as_stale_and_cancels_them_first(tmp_path):
    from rich.console import Console

    from gridbot.cli.render import pools_table
    from gridbot.model.pools import PoolSpec
    from gridbot.model.states import PilotState
    from gridbot.server.overlay import Overlay, _Pool
    from gridbot.store.base import PilotRow
    from gridbot.store.memory import MemoryStore

    class Adapter:
        def __init__(self):
            self.cancelled = []

        def cancel(self, ids):
            self.cancelled.extend(ids)

    view = SimpleNamespace(known_hosts=lambda: [], pools=lambda now: {})
    service = SimpleNamespace(dispatcher=SimpleNamespace(pool_ads={}, view=view), store=MemoryStore())
    overlay = Overlay(service, [], "http://server", tmp_path)
    adapter = Adapter()
    pool = _Pool(PoolSpec("p", "slurm", queue_patience=3600.0), adapter)
    # recorded out of their submission order, as a restarted server may hold them
    pool.pilots = {i: PilotRow("p", i, PilotState.QUEUED, t) for i, t in [("3", 5000.0), ("1", 100.0),
                                                                       ("2", 200.0), ("4", 6000.0)]}
    overlay.pools["p"] = pool
    [cap] = overlay._capacity(now=4000.0)
    assert (cap.queued_pilots, cap.stale_pilots, cap.spare_slots) == (4, 2, 2)
    [info] = overlay.info(now=4000.0)
    assert (info.pilots_queued, info.pilots_stale) == (4, 2)
    console = Console(width=200)
    with console.capture() as cap:
        console.print(pools_table([info]))
    assert "4 (2 stale)" in cap.get(), cap.get()
    overlay._act({}, {"p": 3}, 4000.0)
    assert adapter.cancelled == ["1", "2", "4"], "the stale ones, oldest first, then the newest fresh one"


def test_a_queued_pilot_a_wide_job_is_routed_to_is_not_cancelled_for_a_running_hosts_narrow_fragments():
    """Found by review: two running hosts with 2 idle slots each counted as a pilot's worth of spare capacity, so
    the plan cancelled the one queued pilot of 4 slots that the job of 4 slots had just been routed to, and the
    next step (no pilot queued) submitted it again."""
    pool = PoolCapacity("A", spare_slots=8, queued_pilots=1, new_pilots=5, pilot_slots=4, idle_hosts=(2, 2))
    p = plan([BagDemand(1, 4, frozenset({"A"}), cpus=4)], [pool])
    assert p.cancel == {} and p.submit == {} and p.unmet == {}
    stale = PoolCapacity("A", spare_slots=8, queued_pilots=2, new_pilots=5, pilot_slots=4, idle_hosts=(2, 2),
                         stale_pilots=1)
    assert plan([BagDemand(1, 4, frozenset({"A"}), cpus=4)], [stale]).cancel == {}, "the job still wants the pool"
    assert plan([], [stale]).cancel == {"A": 2}
    # the second review: hosts that left are still listed (until the host timeout), so the fragments (2, 2) are
    # more than the running pilots' 2 free slots; they were taken for a pilot's worth, and the queued pilot was
    # cancelled and submitted again at every step
    gone = PoolCapacity("A", spare_slots=6, queued_pilots=1, new_pilots=5, pilot_slots=4, idle_hosts=(2, 2))
    p = plan([BagDemand(1, 4, frozenset({"A"}), cpus=4)], [gone])
    assert p.cancel == {} and p.submit == {}, p


def test_for_one_slot_jobs_without_stale_pilots_the_cancellations_are_those_of_before():
    """The surplus counted as wide jobs use the slots is, for jobs of one slot, the old count: the idle pilots'
    worth of spare slots beyond the demand, at most the queued ones."""
    rng = random.Random(7)
    for _ in range(2000):
        slots = rng.randint(1, 4)
        queued = rng.randint(0, 5)
        spare = queued * slots + rng.randint(0, 10)
        pool = PoolCapacity("a", spare, queued, rng.randint(0, 5), slots)
        demands = [BagDemand(1, rng.randint(0, 30), frozenset({"a"}))] if rng.random() < 0.8 else []
        p = plan(demands, [pool])
        existing = min(spare, sum(d.slots for d in demands))
        old = min((spare - existing) // slots, queued)
        assert p.cancel.get("a", 0) == old, (slots, queued, spare, demands, p)
