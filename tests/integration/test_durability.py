"""kill -9 the server in the middle of a 5,000-job bag, start it again: nothing is lost.

Every job appends its index to a log as it runs, so executions are counted independently of the
server; workers log the instance ids whose reports the server acknowledged, so "no acknowledged
result is lost" is checked against the store itself.
"""

import collections
import re
import signal
import sqlite3
import time

import pytest

from tests.integration.harness import Cluster, gridbot_json

N = 5000


@pytest.mark.slow
def test_kill_9_in_the_middle_of_a_bag_loses_nothing(tmp_path):
    cluster = Cluster(tmp_path)
    ran = tmp_path / "ran.log"
    (tmp_path / "bag.toml").write_text(f'name = "big"\ncommand = "echo {{i}} >> {ran}"\n'
                                       f'[parameters]\ni = {{ from = 0, to = {N - 1} }}\n')
    try:
        cluster.start_server()
        gridbot_json("submit", str(tmp_path / "bag.toml"), "--server", cluster.url)
        cluster.start_worker("--slots", "2", "--prefetch", "4")
        cluster.start_worker("--slots", "2", "--prefetch", "4")
        with cluster.client() as c:
            deadline = time.monotonic() + 120
            while c.bag("big").counts.done < N // 4 and time.monotonic() < deadline:
                time.sleep(0.1)
            done_before = c.bag("big").counts.done
        assert N // 4 <= done_before < N, "the kill must land in the middle of the bag"
        cluster.server.signal(signal.SIGKILL)
        assert cluster.server.wait(10) == -signal.SIGKILL
        time.sleep(2)
        cluster.start_server()
        final = cluster.wait_bag("big", timeout=300)
    finally:
        cluster.stop()

    assert final.state == "completed" and (final.counts.done, final.counts.failed) == (N, 0)
    executions = collections.Counter(int(x) for x in ran.read_text().split())
    assert set(executions) == set(range(N)), "every job ran"
    acked = {int(i) for w in cluster.workers for ids in re.findall(r"acknowledged reports \[([\d, ]+)\]", w.log)
             for i in ids.split(", ")}
    assert len(acked) >= N
    with sqlite3.connect(tmp_path / "server.db") as db:
        states = dict(db.execute("SELECT id, state FROM instances").fetchall())
        reruns_in_store = db.execute("SELECT COUNT(*) FROM jobs WHERE attempts > 1").fetchone()[0]
        result_of = dict(db.execute("SELECT idx, result_instance FROM jobs").fetchall())
    lost = [i for i in acked if states.get(i) not in ("done", "wasted", "failed", "interrupted")]
    assert lost == [], f"acknowledged results lost: {lost[:10]}"
    assert all(result_of[i] in acked for i in range(N)), "each job's kept result is one a worker had acknowledged"
    ran_twice = sum(1 for n in executions.values() if n > 1)
    assert final.counts.reruns == reruns_in_store
    assert ran_twice <= final.counts.reruns, "every job that ran twice was counted as re-sent"
    print(f"\nkilled at {done_before} done; {final.counts.reruns} jobs re-sent, {ran_twice} ran twice, "
          f"{final.counts.wasted} results wasted")
