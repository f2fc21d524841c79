"""`GET /metrics` (issue 20) on a real server running real bags on a real worker and a real pilot: the exposition
parses with Prometheus' own parser and its numbers agree with the API; only an admin key may read it."""

import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from gridbot.security.access import read_access
from tests.integration.harness import Cluster, gridbot_json

POOLS = """\
[pools.pilots]
kind = "local"
max_running = 1
max_queued = 0
idle_timeout = 300
allow_root = true          # the tests run as root
"""
HOST_TIMEOUT = 600.0
"""The server's default --host-timeout: a host heard from within it is alive."""


def write(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


def get(cluster, key, path="/metrics"):
    """(status, content type, body) of a GET with `key` (None: no Authorization header)."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    req = urllib.request.Request(cluster.url + path, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def scrape(cluster):
    """The exposition as {sample name: {frozenset of labels: value}}, parsed by prometheus_client."""
    status, ctype, text = get(cluster, read_access(cluster.access).admin)
    assert status == 200 and ctype.startswith("text/plain") and "version=0.0.4" in ctype, (status, ctype, text)
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return out


def one(metrics, name, **labels):
    return metrics[name][frozenset(labels.items())]


def stable(cluster, read, timeout=30):
    """Call `read` until it returns the same thing before and after a scrape: what the scrape saw is then what
    the API says (pilots and hosts change state while the test reads them)."""
    deadline = time.monotonic() + timeout
    while True:
        before = read()
        metrics = scrape(cluster)
        if read() == before or time.monotonic() > deadline:
            return before, metrics
        time.sleep(0.3)


def wait(cond, timeout=60, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_metrics_parse_and_agree_with_the_api_and_need_an_admin_key(tmp_path):
    pools_file = write(tmp_path, "pools.toml", POOLS)
    cluster = Cluster(tmp_path, server_args=("--pools", pools_file, "--state-dir", str(tmp_path / "state"),
                                             "--heartbeat", "1"))
    try:
        cluster.start_server()
        _keys(cluster)
        _a_bag_run_by_a_worker_and_a_pilot(cluster, tmp_path)
    finally:
        cluster.stop()


def _keys(cluster):
    access = read_access(cluster.access)
    status, _, body = get(cluster, None)
    assert status == 401 and "a valid key is needed" in body
    assert get(cluster, "not-a-key")[0] == 401
    status, _, body = get(cluster, access.submitter)
    assert status == 403 and "may not GET /metrics" in body, "a submitter would see other owners' bag names"
    assert get(cluster, access.workers["local"])[0] == 403
    metrics = scrape(cluster)
    assert one(metrics, "gridbot_bags_active") == 0 and "gridbot_jobs" not in metrics


def _a_bag_run_by_a_worker_and_a_pilot(cluster, tmp_path):
    url = ["--server", cluster.url]
    spec = write(tmp_path, "sq.toml", 'name = "sq"\ncommand = "sleep 0.3; echo $(({n} * {n}))"\n'
                                      '[parameters]\nn = { from = 1, to = 30 }\n')
    gridbot_json("submit", spec, *url)
    cluster.start_worker("--slots", "1")
    with cluster.client(admin=True) as c:
        wait(lambda: c.bag("sq").state == "completed", 120, "bag sq to complete")
        wait(lambda: any(p.pilots_running for p in c.pools()), 60, "the pool's pilot to run")

        # a bag that ended: its final counts, as GET /v1/bags/sq gives them
        info = c.bag("sq")
        metrics = scrape(cluster)
        for state in ("queued", "running", "done", "failed", "cancelled"):
            assert one(metrics, "gridbot_jobs", bag="sq", state=state) == getattr(info.counts, state), state
        assert info.counts.done == 30
        assert one(metrics, "gridbot_bag_instances_sent", bag="sq") == info.counts.instances
        assert one(metrics, "gridbot_bag_replicas_sent", bag="sq") == info.counts.replicas
        assert one(metrics, "gridbot_bag_instances_wasted", bag="sq") == info.counts.wasted
        assert one(metrics, "gridbot_bags_ended_total", state="completed") == 1
        assert one(metrics, "gridbot_bags_active") == 0
        # the server's own counters: this bag is all it ever ran
        assert one(metrics, "gridbot_instances_sent_total") == info.counts.instances
        assert one(metrics, "gridbot_replicas_sent_total") == info.counts.replicas
        assert one(metrics, "gridbot_instances_finished_total", outcome="done") == info.counts.done
        assert one(metrics, "gridbot_instances_finished_total", outcome="wasted") == info.counts.wasted
        exchanges = one(metrics, "gridbot_exchanges_total")
        assert exchanges > 0 and one(metrics, "gridbot_exchange_duration_seconds_count") == exchanges
        _check_histogram(metrics, "gridbot_exchange_duration_seconds")
        _check_histogram(metrics, "gridbot_store_commit_duration_seconds")
        assert one(metrics, "gridbot_store_commit_duration_seconds_count") > 0
        assert one(metrics, "gridbot_store_commit_failures_total") == 0
        # the backlog is what waits for a commit at the scrape (a heartbeat may be in flight): it drains
        wait(lambda: one(scrape(cluster), "gridbot_commit_backlog") == 0, 10, "the commit backlog to drain")

        # hosts alive per pool, as GET /v1/hosts shows them (the worker in pool local, the pilot in pool pilots)
        def alive():
            now = time.time()
            counts = {}
            for h in c.hosts():
                if h.last_seen >= now - HOST_TIMEOUT:
                    counts[h.pool] = counts.get(h.pool, 0) + 1
            return counts

        hosts, metrics = stable(cluster, alive)
        assert hosts == {"local": 1, "pilots": 1}
        assert {dict(k)["pool"]: v for k, v in metrics["gridbot_hosts_alive"].items()} == hosts

        # pilots per pool and state, as GET /v1/pools shows them
        def pilots():
            return [(p.name, p.pilots_queued, p.pilots_running, p.pilots_submitted, p.pilots_ended, p.pilots_failed,
                     bool(p.error)) for p in c.pools()]

        pools, metrics = stable(cluster, pilots)
        assert [p[0] for p in pools] == ["pilots"] and pools[0][2] == 1
        for name, queued, running, submitted, ended, failed, error in pools:
            assert one(metrics, "gridbot_pilots", pool=name, state="queued") == queued
            assert one(metrics, "gridbot_pilots", pool=name, state="running") == running
            assert one(metrics, "gridbot_pilots_submitted_total", pool=name) == submitted
            assert one(metrics, "gridbot_pilots_ended_total", pool=name) == ended
            assert one(metrics, "gridbot_pilots_failed", pool=name) == failed
            assert one(metrics, "gridbot_pool_error", pool=name) == int(error)

        # a running bag: the dispatcher's counts, as the API gives them while nothing moves
        slow = write(tmp_path, "slow.toml", 'name = "slow"\ncommand = "sleep 60"\n[parameters]\ni = [1, 2, 3, 4, 5]\n')
        gridbot_json("submit", slow, *url)
        wait(lambda: c.bag("slow").counts.running >= 2, 60, "both hosts to run a job of bag slow")
        counts, metrics = stable(cluster, lambda: c.bag("slow").counts)
        for state in ("queued", "running", "done", "failed", "cancelled"):
            assert one(metrics, "gridbot_jobs", bag="slow", state=state) == getattr(counts, state), state
        assert one(metrics, "gridbot_jobs", bag="sq", state="done") == 30, "the ended bag is still shown"
        assert one(metrics, "gridbot_bags_active") == 1
        assert one(metrics, "gridbot_dispatcher_buffer_jobs") <= counts.queued
        c.cancel("slow")


def _check_histogram(metrics, name):
    """Buckets that never decrease, the last (+Inf) equal to the count."""
    buckets = sorted(((float(dict(k)["le"]), v) for k, v in metrics[f"{name}_bucket"].items()))
    values = [v for _, v in buckets]
    assert values == sorted(values) and buckets[-1][0] == float("inf")
    assert values[-1] == one(metrics, f"{name}_count")
