"""Issue 13: `gridbot jobs BAG JOB --story` through a real server and a real worker."""

import re

import pytest

from gridbot.client import ApiError, Client
from tests.integration.harness import gridbot, gridbot_json


def _write(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


def _run_bags(cluster, tmp_path):
    """A job that fails once and then succeeds ('flaky'), and one that outlives its instance deadline and is
    found overdue by a tick before its late report ('late'), both run by one worker."""
    cluster.start_server()
    marks = tmp_path / "marks"
    marks.mkdir()
    flaky = _write(tmp_path, "flaky.toml", 'name = "flaky"\ncommand = "if [ -e MARKS/m{i} ]; then exit 0; else '
                                           'touch MARKS/m{i}; exit 3; fi"\n[parameters]\ni = [0]\n'
                                           .replace("MARKS", str(marks)))
    late = _write(tmp_path, "late.toml", 'name = "late"\ncommand = "sleep 4"\ninstance_deadline = 1\n'
                                         '[parameters]\ni = [0]\n')
    gridbot("submit", flaky, "--server", cluster.url, check=True)
    gridbot("submit", late, "--server", cluster.url, check=True)
    cluster.start_worker("--slots", "2")
    assert cluster.wait_bag("flaky").state == "completed"
    assert cluster.wait_bag("late").state == "completed"


@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    """The two bags' stories, as text and as JSON, from one cluster for the module's tests."""
    from tests.integration.harness import Cluster

    tmp_path = tmp_path_factory.mktemp("story")
    cluster = Cluster(tmp_path, server_args=("--heartbeat", "1"))
    try:
        _run_bags(cluster, tmp_path)
        url = ("--server", cluster.url)
        yield {bag: (gridbot("jobs", bag, "0", "--story", *url, check=True).stdout,
                     gridbot_json("jobs", bag, "0", "--story", *url))
               for bag in ("flaky", "late")} | {"usage": gridbot("jobs", "flaky", "0", *url), "cluster": cluster}
    finally:
        cluster.stop()


def test_the_story_shows_each_instance_with_its_host_and_outcome(stories):
    text, story = stories["flaky"]
    lines = text.splitlines()
    assert re.fullmatch(r"job 0 of bag flaky \(id \d+\): done after 2 attempts, 1 failure", lines[0]), text
    first, second = story["instances"]
    assert [first["state"], second["state"]] == ["failed", "done"] and story["result_instance"] == second["instance_id"]
    assert first["host_name"].endswith("/w0") and first["pool"] == "local" and not first["replica"]
    sent = [ln for ln in lines if "sent instance" in ln]
    assert len(sent) == 2 and all(f"to host {first['host_name']} (pool local)" in ln for ln in sent), text
    assert f"instance {first['instance_id']} failed: exit code 3" in text
    assert f"instance {second['instance_id']} done: exit code 0" in text and "its result is the job's" in text
    steps = [re.match(r"\d\d:\d\d:\d\d  (sent instance \d+ to host .+ \(pool local\)|instance \d+ \w+)", ln)
             for ln in lines[2:]]
    assert [m.group(1) if m else None for m in steps] == [
        f"sent instance {first['instance_id']} to host {first['host_name']} (pool local)",
        f"instance {first['instance_id']} failed",
        f"sent instance {second['instance_id']} to host {first['host_name']} (pool local)",
        f"instance {second['instance_id']} done"], text


def test_the_story_of_a_late_job_shows_it_overdue_and_its_late_result(stories):
    text, story = stories["late"]
    first = story["instances"][0]
    assert story["job"]["state"] == "done" and story["job"]["failures"] >= 1
    assert f"instance {first['instance_id']} overdue" in text, text
    assert first["state"] in ("done", "wasted") and first["instance_deadline"] - first["sent_at"] == pytest.approx(1)


def test_jobs_without_story_is_a_usage_error(stories):
    proc = stories["usage"]
    assert proc.returncode == 2 and "JOB goes with --story" in proc.stderr


def test_only_the_bags_owner_and_the_admin_read_its_story(stories, tmp_path):
    cluster = stories["cluster"]
    bob = tmp_path / "bob.json"
    gridbot("access", "add-submitter", "bob", "--out", str(bob), "--access-file", str(cluster.access), check=True)
    with Client(cluster.url, access=bob) as other, cluster.client(admin=True) as admin:
        with pytest.raises(ApiError) as err:
            other.story("flaky", 0)
        assert err.value.status == 404 and "no bag 'flaky'" in str(err.value)
        assert admin.story("flaky", 0).job.state == "done"
        with pytest.raises(ApiError, match="has jobs 0 to 0; there is no job 1"):
            admin.story("flaky", 1)


def test_each_step_names_the_event_that_caused_it(stories):
    """Requests send instances, the host's exchanges report their ends, a tick finds one overdue."""
    for bag in ("flaky", "late"):
        text, story = stories[bag]
        events = {e["event_id"]: e for e in story["events"]}
        for i in story["instances"]:
            sent = events[i["sent_event"]]
            assert (sent["kind"], sent["source"], sent["at"]) == ("request", i["host_id"], i["sent_at"]), story
            if i["state"] in ("done", "failed", "wasted"):
                ended = events[i["end_event"]]
                assert ended["kind"] in ("request", "report") and ended["source"] == i["host_id"], story
            assert f"request of {i['host_name']} [event {i['sent_event']}]" in text, text
    text, story = stories["late"]
    overdue = events_of(story)[story["instances"][0]["overdue_event"]]
    assert overdue["kind"] == "tick" and f"overdue — tick [event {overdue['event_id']}]" in text, text


def events_of(story):
    return {e["event_id"]: e for e in story["events"]}
