"""Money (issue 16): a pool's prices from its ad, what an instance and a pilot cost, and a bag's bill."""

from __future__ import annotations

import math

import pytest

from gridbot.core.ledger import FREE, Bill, HostTerm, Ledger, PoolBill, Prices, Usage

# -- Prices ---------------------------------------------------------------------------------------------


def test_prices_are_read_from_a_pools_ad():
    ad = {"Name": "cloud", "PricePerCpuHour": 2, "PricePerPilotHour": 0.5, "ChargingPeriod": 600.0}
    assert Prices.of(ad) == Prices(per_cpu_hour=2.0, per_pilot_hour=0.5, period=600.0)
    assert not Prices.of(ad).free
    assert Prices.of({"Name": "grid", "PricePerCpuHour": 1.5}) == Prices(1.5, 0.0, 3600.0), "an hour by default"


@pytest.mark.parametrize("ad", [None, {}, {"Name": "own"}, {"Name": "own", "PricePerCpuHour": 0.0}])
def test_a_pool_without_prices_is_free(ad):
    assert Prices.of(ad) == FREE
    assert Prices.of(ad).free
    assert Prices.of(ad).instance(3600.0) == 0.0
    assert Prices.of(ad).pilot(0.0, 7200.0) == 0.0


@pytest.mark.parametrize(("value", "expected"), [
    (True, 0.0), ("3", 0.0), (math.nan, 0.0), (math.inf, 0.0), (-2.0, 0.0), (None, 0.0),
])
def test_a_price_that_is_not_a_finite_number_at_least_zero_counts_as_free(value, expected):
    prices = Prices.of({"PricePerCpuHour": value, "PricePerPilotHour": value})
    assert (prices.per_cpu_hour, prices.per_pilot_hour) == (expected, expected)


@pytest.mark.parametrize("period", [0, -60, math.nan, "1h", True])
def test_a_charging_period_that_is_not_positive_is_an_hour(period):
    assert Prices.of({"PricePerPilotHour": 1.0, "ChargingPeriod": period}).period == 3600.0


# -- what an instance and a pilot cost ------------------------------------------------------------------


def test_an_instance_costs_its_wall_time_at_the_price_per_cpu_hour():
    prices = Prices(per_cpu_hour=2.0)
    assert prices.instance(3600.0) == pytest.approx(2.0)
    assert prices.instance(1800.0) == pytest.approx(1.0)
    assert prices.instance(90.0) == pytest.approx(0.05)
    assert prices.instance(0.0) == 0.0
    assert prices.instance(-10.0) == 0.0, "a negative wall time costs nothing"
    assert Prices(per_pilot_hour=5.0).instance(3600.0) == 0.0, "a pilot-priced pool charges nothing per instance"


@pytest.mark.parametrize(("first", "last", "periods"), [
    (0.0, 3600.0, 1),  # exactly one period
    (0.0, 3601.0, 2),  # one period and a second
    (0.0, 3599.0, 1),
    (0.0, 0.0, 1),  # called once: its first period is due all the same
    (100.0, 100.0, 1),
    (0.0, 7200.0, 2),
    (0.0, 7200.5, 3),
    (1.7e9, 1.7e9 + 3600.0, 1),  # epoch times: no rounding over the boundary
    (1.7e9 + 0.1, 1.7e9 + 0.1 + 10800.0, 3),
])
def test_a_pilot_costs_its_started_charging_periods(first, last, periods):
    prices = Prices(per_pilot_hour=3.0)
    assert prices.pilot(first, last) == pytest.approx(3.0 * periods)


@pytest.mark.parametrize(("seconds", "periods"), [(0.0, 1), (600.0, 1), (601.0, 2), (1200.0, 2), (1800.0, 3)])
def test_a_pilot_of_a_short_charging_period_pays_the_periods_share_of_the_hourly_price(seconds, periods):
    prices = Prices.of({"PricePerPilotHour": 6.0, "ChargingPeriod": 600})
    assert prices.pilot(50.0, 50.0 + seconds) == pytest.approx(1.0 * periods), "10 min at 6 an hour is 1"


def test_a_pool_priced_per_cpu_hour_only_charges_nothing_for_its_pilots():
    assert Prices(per_cpu_hour=4.0).pilot(0.0, 10_000.0) == 0.0


# -- the ledger: charge and bill ------------------------------------------------------------------------

HOSTS = {
    "c1": HostTerm("cloud", 0.0, 5400.0),  # two started hours
    "c2": HostTerm("cloud", 0.0, 100.0),  # one started hour, idle
    "g1": HostTerm("grid", 0.0, 9000.0),
    "f1": HostTerm("free", 0.0, 9000.0),
}
POOLS = {
    "cloud": Prices(per_pilot_hour=10.0),
    "grid": Prices(per_cpu_hour=2.0),
    "free": FREE,
}


def end(host_id: str) -> float:
    """Charged at the end of the host's life: its whole life is used (the idle tail has its own test)."""
    t = HOSTS.get(host_id)
    return t.last_seen if t is not None else 0.0


def term(host_id: str) -> HostTerm | None:
    return HOSTS.get(host_id)


def prices(pool: str) -> Prices:
    return POOLS.get(pool, FREE)


def test_two_bags_on_one_pilot_share_its_started_periods_in_proportion_to_their_use():
    ledger = Ledger()
    ledger.charge(1, "c1", 1000.0, end("c1"))
    ledger.charge(1, "c1", 2000.0, end("c1"))
    ledger.charge(2, "c1", 1000.0, end("c1"))
    one, two = ledger.bill(1, term, prices), ledger.bill(2, term, prices)
    assert one == Bill(1, [PoolBill("cloud", 2, 3000.0, 0.0, pytest.approx(15.0), 1)])
    assert two == Bill(2, [PoolBill("cloud", 1, 1000.0, 0.0, pytest.approx(5.0), 1)])
    assert one.total + two.total == pytest.approx(Prices(per_pilot_hour=10.0).pilot(0.0, 5400.0)) == 20.0


def test_a_bill_is_per_pool_with_cpu_time_and_pilot_shares_apart():
    ledger = Ledger()
    ledger.charge(1, "g1", 1800.0, end("g1"))
    ledger.charge(1, "g1", 900.0, end("g1"))
    ledger.charge(1, "c1", 60.0, end("c1"))
    ledger.charge(1, "f1", 5000.0, end("f1"))
    bill = ledger.bill(1, term, prices)
    assert [p.pool for p in bill.pools] == ["cloud", "free", "grid"], "sorted by pool"
    cloud, free, grid = bill.pools
    assert (grid.instances, grid.seconds, grid.cpu, grid.pilots, grid.hosts) == (2, 2700.0, 1.5, 0.0, 1)
    assert (cloud.instances, cloud.cpu, cloud.pilots) == (1, 0.0, 20.0), "the only bag on the pilot pays it all"
    assert (free.instances, free.seconds, free.total) == (1, 5000.0, 0.0)
    assert bill.total == pytest.approx(21.5)


def test_a_bags_share_counts_the_hosts_of_a_pool_it_used():
    ledger = Ledger()
    ledger.charge(3, "g1", 3600.0, end("g1"))
    ledger.charge(3, "c1", 10.0, end("c1"))
    ledger.charge(3, "c2", 10.0, end("c2"))
    [cloud, grid] = ledger.bill(3, term, prices).pools
    assert (cloud.hosts, cloud.instances, cloud.pilots) == (2, 2, 30.0), "two hours of c1 and one of c2"
    assert (grid.hosts, grid.cpu) == (1, 2.0)


def test_bags_with_no_wall_time_on_a_pilot_share_it_equally():
    ledger = Ledger()
    ledger.charge(1, "c1", 0.0, end("c1"))
    ledger.charge(2, "c1", 0.0, end("c1"))
    assert ledger.bill(1, term, prices).total == pytest.approx(10.0)
    assert ledger.bill(2, term, prices).total == pytest.approx(10.0)


def test_a_wall_time_that_is_not_a_finite_number_at_least_zero_is_charged_as_zero():
    ledger = Ledger()
    for seconds in (math.nan, math.inf, -5.0):
        ledger.charge(1, "g1", seconds, end("g1"))
    ledger.charge(1, "g1", 1800.0, end("g1"))
    [grid] = ledger.bill(1, term, prices).pools
    assert (grid.instances, grid.seconds, grid.cpu) == (4, 1800.0, 1.0)


def test_an_unknown_host_is_charged_nothing():
    ledger = Ledger()
    ledger.charge(1, "gone", 3600.0, end("gone"))
    ledger.charge(1, "g1", 3600.0, end("g1"))
    bill = ledger.bill(1, term, prices)
    assert [(p.pool, p.instances, p.seconds, p.total) for p in bill.pools] == [("", 1, 3600.0, 0.0),
                                                                               ("grid", 1, 3600.0, 2.0)]
    assert bill.total == pytest.approx(2.0)


def test_a_bag_that_ran_nothing_has_an_empty_bill():
    ledger = Ledger()
    ledger.charge(1, "g1", 60.0, end("g1"))
    assert ledger.bill(9, term, prices) == Bill(9, [])
    assert ledger.bill(9, term, prices).total == 0.0


def test_idle_pilots_are_the_pilot_priced_hosts_that_ran_nothing():
    ledger = Ledger()
    assert ledger.idle_pilots(HOSTS, prices) == pytest.approx(20.0 + 10.0), "c1 (2 h) and c2 (1 h); g1 and f1 free"
    ledger.charge(1, "c1", 100.0, end("c1"))
    assert ledger.idle_pilots(HOSTS, prices) == pytest.approx(10.0), "c2 alone"
    ledger.charge(2, "c2", 0.0, end("c2"))
    assert ledger.idle_pilots(HOSTS, prices) == 0.0, "a pilot that ran an instance (even of 0 s) is a bag's"


def test_every_pilot_is_paid_once_by_its_bags_or_as_idle():
    ledger = Ledger()
    ledger.charge(1, "c1", 300.0, end("c1"))
    ledger.charge(2, "c1", 100.0, end("c1"))
    ledger.charge(2, "g1", 3600.0, end("g1"))
    total = sum(ledger.bill(b, term, prices).total for b in (1, 2)) + ledger.idle_pilots(HOSTS, prices)
    pilots = sum(prices(t.pool).pilot(t.first_seen, t.last_seen) for t in HOSTS.values())
    assert total == pytest.approx(pilots + 2.0)


def test_restoring_usage_equals_charging_one_by_one():
    charges = [(1, "c1", 1000.0), (1, "c1", 500.0), (2, "c1", 250.0), (1, "g1", 1800.0), (2, "g1", 30.0),
               (2, "g1", 60.0), (3, "gone", 10.0)]
    one_by_one = Ledger()
    for bag, host, seconds in charges:
        one_by_one.charge(bag, host, seconds, end(host))
    usage: dict[tuple[int, str], list[float]] = {}
    for bag, host, seconds in charges:
        row = usage.setdefault((bag, host), [0, 0.0])
        row[0] += 1
        row[1] += seconds
    restored = Ledger()
    restored.restore(Usage(bag, host, int(n), s, end(host)) for (bag, host), (n, s) in usage.items())
    assert restored.by_bag == one_by_one.by_bag
    assert restored.by_host == one_by_one.by_host
    for bag in (1, 2, 3):
        assert restored.bill(bag, term, prices) == one_by_one.bill(bag, term, prices)
    assert restored.idle_pilots(HOSTS, prices) == one_by_one.idle_pilots(HOSTS, prices)


def test_the_periods_a_pilot_idles_after_its_last_instance_are_nobodys():
    """c1 lives 5,400 s (two started hours); its only instance ended at 1,000 s: the bag pays the first hour,
    the second is idle (a pilot left running after the work is the run's, not the bag's)."""
    ledger = Ledger()
    ledger.charge(1, "c1", 500.0, 1000.0)
    [cloud] = ledger.bill(1, term, prices).pools
    assert cloud.pilots == pytest.approx(10.0)
    assert ledger.idle_pilots({"c1": HOSTS["c1"]}, prices) == pytest.approx(10.0)
