"""The /metrics exposition (issue 20): the text format written by hand, read back with Prometheus' own parser."""

import json
import math
import re
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gridbot.model.records import HostInfo, InstanceReport, Outcome
from gridbot.model.spec import parse_spec
from gridbot.protocol import ExchangeRequest, PoolInfo
from gridbot.server.metrics import (
    OTHER,
    Family,
    Histogram,
    Metrics,
    escape_help,
    escape_label,
    format_value,
    render,
)
from gridbot.server.service import Service, ServiceConfig
from gridbot.store.memory import MemoryStore

NASTY = ['say "hi"', "back\\slash", "two\nlines", '\\"\n\\n', "trailing\\", "ünïcode ✓", ""]
"""Label values a user could put in a bag or pool name if nothing checked them: each must come back whole."""


def parse(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(families, name):
    return [(s.labels, s.value) for f in families.values() for s in f.samples if s.name == name]


@pytest.mark.parametrize("value", NASTY)
def test_a_label_value_comes_back_from_the_parser_as_it_was(value):
    text = render([Family("gridbot_jobs", "gauge", "help").add(3, (("bag", value), ("state", "done")))])
    [(labels, n)] = samples(parse(text), "gridbot_jobs")
    assert labels == {"bag": value, "state": "done"} and n == 3


def test_escaping_follows_the_text_format():
    assert escape_label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    assert escape_help('say "x"\\\nnext') == 'say "x"\\\\\\nnext'  # quotes stay as they are in HELP
    assert "\n" not in escape_label("x\ny") and "\n" not in escape_help("x\ny")


def test_a_help_text_with_a_backslash_and_a_line_feed_parses():
    text = render([Family("gridbot_x", "gauge", "one\\two\nthree").add(1)])
    assert text.count("\n") == 3
    assert parse(text)["gridbot_x"].documentation == "one\\two\nthree"


def test_values():
    assert [format_value(v) for v in (0, 7, 0.5, 1e-05, math.inf, -math.inf)] == ["0", "7", "0.5", "1e-05", "+Inf",
                                                                                   "-Inf"]
    assert format_value(math.nan) == "NaN"


def test_a_histogram_is_cumulative_and_its_bounds_are_inclusive():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 1.0, 3.0):
        h.observe(v)
    f = parse(render([h.family("gridbot_t_seconds", "latency")]))["gridbot_t_seconds"]
    assert f.type == "histogram"
    buckets = {s.labels["le"]: s.value for s in f.samples if s.name.endswith("_bucket")}
    assert buckets == {"0.1": 2, "1.0": 4, "+Inf": 5}
    rest = {s.name: s.value for s in f.samples if not s.name.endswith("_bucket")}
    assert rest == {"gridbot_t_seconds_count": 5, "gridbot_t_seconds_sum": pytest.approx(4.65)}


# -- a service in memory ---------------------------------------------------------------------------------

def submit(service, name, n=4, now=1000.0):
    spec = parse_spec(f'command = "x {{i}}"\n[parameters]\ni = {{ from = 1, to = {n} }}\n', "s.toml", name)
    return service.submit(spec, None, {}, now)


def pools(now):
    return [PoolInfo('p"1', "local", 1, 2, 3, 1, 6, 2, 10, 0.5, "sbatch: refused", 4, 4)]


def host(name="h1", pool="local"):
    return HostInfo(name, name, "Linux", 2, 0, 2, pool)


def test_the_exposition_of_a_live_service_parses_and_follows_the_conventions():
    service = Service(MemoryStore(), ServiceConfig())
    metrics = Metrics(service, pools)
    submit(service, "sweep", 4)
    now = time.time()
    first = service.exchange(ExchangeRequest(host(), 2, []), now)
    assert len(first.assignments) == 2
    reports = [InstanceReport(first.assignments[0].instance_id, Outcome.SUCCESS, 0, 1.0, 1.0),
               InstanceReport(first.assignments[1].instance_id, Outcome.FAILURE, 1, 1.0, 1.0)]
    service.exchange(ExchangeRequest(host(), 0, [], reports), now + 1)
    text = metrics.render(now + 1)
    families = parse(text)
    helped = set(re.findall(r"^# HELP (\S+) ", text, re.M))
    typed = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    assert helped == set(typed) and len(typed) >= 30
    for name, kind in typed.items():
        assert re.fullmatch(r"gridbot_[a-z_]+", name), name
        assert name.endswith("_total") == (kind == "counter"), name
        if kind == "histogram":
            assert name.endswith("_seconds"), name
    jobs = {s.labels["state"]: s.value for s in families["gridbot_jobs"].samples if s.labels["bag"] == "sweep"}
    assert jobs == {"queued": 3, "running": 0, "done": 1, "failed": 0, "cancelled": 0}  # one failure: queued again
    assert samples(families, "gridbot_instances_sent_total") == [({}, 2)]
    finished = {s[0]["outcome"]: s[1] for s in samples(families, "gridbot_instances_finished_total")}
    assert finished["done"] == 1 and finished["failed"] == 1 and sum(finished.values()) == 2
    assert samples(families, "gridbot_store_commit_duration_seconds_count")[0][1] == service.batches
    assert samples(families, "gridbot_hosts_alive") == [({"pool": "local"}, 1)]
    assert ({"pool": 'p"1', "state": "running"}, 2) in samples(families, "gridbot_pilots")
    assert samples(families, "gridbot_pool_error") == [({"pool": 'p"1'}, 1)]
    assert 0 < samples(families, "gridbot_dispatcher_buffer_jobs")[0][1] <= 3  # (the job to retry may wait apart)
    assert samples(families, "gridbot_commit_backlog") == [({}, 0)]


def test_bags_beyond_the_cap_are_summed_under_other_and_ended_bags_linger_then_go():
    service = Service(MemoryStore(), ServiceConfig())
    metrics = Metrics(service, lambda now: [], max_bags=3, linger=60.0)
    for k in range(5):
        submit(service, f"b{k}", k + 1)
    families = parse(metrics.render(time.time()))
    queued = {s.labels["bag"]: s.value for s in families["gridbot_jobs"].samples if s.labels["state"] == "queued"}
    assert queued == {"b4": 5, "b3": 4, "b2": 3, OTHER: 1 + 2}, "the newest three, the two oldest summed"
    assert samples(families, "gridbot_bags_other") == [({}, 2)]
    assert samples(families, "gridbot_bags_active") == [({}, 5)]

    ended_at = time.time()
    service.cancel(service.bag("b4"), ended_at)
    families = parse(metrics.render(ended_at + 1))
    cancelled = {s.labels["bag"]: s.value for s in families["gridbot_jobs"].samples if s.labels["state"] == "cancelled"}
    assert cancelled == {"b4": 5, "b3": 0, "b2": 0, OTHER: 0}, "an ended bag keeps its final counts for a while"
    assert ({"state": "cancelled"}, 1) in samples(families, "gridbot_bags_ended_total")
    families = parse(metrics.render(ended_at + 61))
    bags = {s.labels["bag"] for s in families["gridbot_jobs"].samples}
    assert bags == {"b3", "b2", "b1", OTHER}, "then it goes, and the cap lets an older bag in"


def test_an_ended_bag_the_exposition_never_saw_active_is_named_from_the_store():
    service = Service(MemoryStore(), ServiceConfig())
    submit(service, "quick", 2)
    metrics = Metrics(service, lambda now: [])
    service.cancel(service.bag("quick"), time.time())
    families = parse(metrics.render(time.time()))
    assert {s.labels["bag"] for s in families["gridbot_jobs"].samples} == {"quick"}


def test_a_commit_hook_that_fails_does_not_stop_the_commits():
    service = Service(MemoryStore(), ServiceConfig())

    def broken(batch, seconds):
        raise RuntimeError("observer bug")

    service.commit_hooks.append(broken)
    submit(service, "s", 2)
    assert len(service.exchange(ExchangeRequest(host(), 2, []), time.time()).assignments) == 2


# -- the docs and the dashboard name the metrics as they are --------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs"


def exposed_families():
    service = Service(MemoryStore(), ServiceConfig())
    submit(service, "sweep", 2)
    return set(re.findall(r"^# TYPE (\S+) (\S+)$", Metrics(service, pools).render(time.time()), re.M))


def test_docs_list_every_metric_with_its_type():
    text = (DOCS / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `(gridbot_[a-z_]+)` \| (counter|gauge|histogram) \|", text, re.M))
    documented |= {(name, "gauge") for name in re.findall(r"^\| `(gridbot_dispatcher_[a-z_]+)` \| gauge \|", text,
                                                          re.M)}
    assert documented == exposed_families()


def test_the_grafana_dashboard_queries_only_metrics_that_exist():
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    assert dashboard["schemaVersion"] >= 36
    assert any(v["type"] == "datasource" and v["query"] == "prometheus" for v in dashboard["templating"]["list"])
    names = {name for name, _ in exposed_families()}
    histograms = {name for name, kind in exposed_families() if kind == "histogram"}
    series = names | {f"{h}_{s}" for h in histograms for s in ("bucket", "sum", "count")}
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 15 and len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    used = {m for e in exprs for m in re.findall(r"\b(gridbot_[a-z_]+)", e)}
    assert used <= series, used - series
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for wanted in ("incomplete jobs per bag", "results per second", "exchange latency", "pilots per pool",
                   "hosts alive per pool", "failures"):
        assert wanted in titles, wanted
