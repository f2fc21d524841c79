"""Issue 15 end to end: a bag on an unreliable local pool whose workers lose a quarter of their instances without
a word (`gridbot worker --drop`), and a reliable local pool with a price; `tail = "expert"` with makespan x cost
chooses the tail strategy at T_tail, the tail finishes, `gridbot status` shows the strategy, and the measured
tail makespan and cost come out within the prediction's stated error.

The server runs with --let-replicas-finish, as the paper's model has it (an instance already sent runs on and
its result is paid for); by default gridbot cancels a job's other instances at its first result, which
makes the measured cost lower than the estimate's. Each instance sleeps 3 to 6 s, drawn anew (the model draws
every instance's turnaround independently; docs/expert.md says what a bag whose long tasks stay long does)."""

from __future__ import annotations

import time

import msgspec
import pytest

from gridbot.model.spec import parse_spec
from tests.integration.harness import Cluster, gridbot

POOLS = """\
[pools.grid]
kind = "static"            # the test's workers, which drop instances
reliability = "unreliable"
price_per_cpu_hour = 1.0     # the paper's prices: 1 and 34 cents an hour

[pools.cloud]
kind = "local"
reliability = "reliable"
max_running = 4
price_per_cpu_hour = 34.0
charging_period = 1
idle_timeout = 20
min_cpu = 0
allow_root = true          # the tests run as root
"""
WORKERS = 16
SPEC = """\
command = 'sleep $((3 + $(od -An -N1 -tu1 /dev/urandom) % 4))'
instance_deadline = 25
max_failures = 20
[parameters]
i = { from = 0, to = 119 }
[strategy]
tail = "expert"
utility = "product"
mr_max = 0.4
repetitions = 30
"""


@pytest.mark.slow
def test_expert_tail_on_a_lossy_pool_ends_as_predicted(tmp_path):
    (tmp_path / "pools.toml").write_text(POOLS)
    cluster = Cluster(tmp_path, server_args=("--pools", str(tmp_path / "pools.toml"), "--state-dir",
                                             str(tmp_path / "state"), "--let-replicas-finish"))
    cluster.start_server()
    try:
        for n in range(WORKERS):
            cluster.start_worker("--pool", "grid", "--slots", "1", "--idle-timeout", "120", "--drop", "0.25",
                                 name=f"g{n}")
        spec = msgspec.structs.replace(parse_spec(SPEC, "lossy", "lossy"),
                                       policy={"GridPolicy": 'Bag.Tail || Pool.Reliability != "reliable"'})
        with cluster.client() as c:
            c.submit(spec)
            start = time.monotonic()
            done = c.wait("lossy", poll=0.5, timeout=400)
            took = time.monotonic() - start
            status = gridbot("status", "--server", cluster.url)
            pools = {p.name: p for p in c.pools()}
    finally:
        cluster.stop()
    plan = done.tail_plan
    assert done.state == "completed" and plan is not None, status.stdout
    print(f"\nbag of {done.total} took {took:.0f} s; tail: predicted {plan.predicted_makespan:.1f} ± "
          f"{plan.makespan_error:.1f} s, measured {plan.actual_makespan:.1f} s; cost predicted "
          f"{plan.predicted_cost:.5f} ± {plan.cost_error:.5f}, measured {plan.actual_cost:.5f} per task; "
          f"{plan.tasks} tail tasks; {plan.strategy}; {plan.characterization}; cloud pilots "
          f"{pools['cloud'].pilots_submitted}; ranges {plan.makespan_range} {plan.cost_range} ({plan.range_share:.4f})")
    assert f"tail strategy {plan.strategy}" in status.stdout and "measured tail" in status.stdout
    assert plan.utility == "makespan x cost" and plan.done == plan.tasks and plan.plans >= 1
    assert plan.actual_makespan is not None and plan.actual_cost is not None
    assert plan.characterization.startswith("online")
    # one tail is one draw of what the estimate simulates, and a tail is the longest of its tasks: a task
    # whose instances are lost three times in a row (1.6% of them here) makes it long and pays a reliable run,
    # so the tails are bimodal and "predicted ± one standard deviation" says little of where one falls
    # (CI once measured 41.5 s against 21.4 ± 6.3 s). The stated range, of 6 x 500 simulated tails (three
    # gammas, the instances out at T_tail at their sets' gamma or the pooled one), holds at least 99.6% of
    # them on average (a correct estimate misses the makespan or the cost range about once in 125 runs). Its top
    # end is the model's near worst case, which the real system can only meet late: the estimate adds the
    # dispatch delays (docs/expert.md; CI measured 42.5 s against a range ending at 41.7 s without them, a task
    # lost three times and then run on a local pilot that had to start first).
    assert plan.makespan_range is not None and plan.cost_range is not None
    assert plan.makespan_range[0] <= plan.predicted_makespan <= plan.makespan_range[1]
    assert plan.makespan_range[0] <= plan.actual_makespan <= plan.makespan_range[1]
    assert plan.cost_range[0] <= plan.actual_cost <= plan.cost_range[1]
    assert plan.range_share == pytest.approx(499 / 501) and "99.6% of simulated tails" in status.stdout
