"""Issue 13: how `gridbot jobs BAG JOB --story` tells a job's life."""

import time

import pytest

from gridbot.cli.story import story_lines
from gridbot.core.changes import Decision, Event
from gridbot.protocol import JobInfo, JobStory, StoryInstance

T0 = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC


@pytest.fixture(autouse=True)
def _utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _instance(iid, host, state, sent, ended, sent_event, end_event, overdue_event=None, replica=False, **kw):
    fields = {"reason": None, "exit_code": None, "wall_s": None, "cpu_s": None} | kw
    return StoryInstance(iid, host, state, sent, ended, fields["reason"], fields["exit_code"], fields["wall_s"],
                         fields["cpu_s"], f"node-{host}", "ec2" if host == "b" else "slurm", sent + 600, replica,
                         sent_event, end_event, overdue_event)


def test_a_replicated_job_reads_as_a_log_in_time_order():
    story = JobStory("sweep", JobInfo(42, 41, "done", "run 41", 1, 3, "instance deadline passed"), 107, [
        _instance(101, "a", "wasted", T0, T0 + 900, 812, 1200, 1040, exit_code=0, wall_s=880.0, cpu_s=870.0),
        _instance(107, "b", "done", T0 + 602, T0 + 660, 1043, 1150, exit_code=0, wall_s=58.0, cpu_s=57.5),
        _instance(108, "a", "cancelled", T0 + 657, T0 + 660, 1101, 1150, replica=True,
                  reason="another instance has the result"),
    ], [Decision(1101, 1, 42, "tail=gridbot", "replicate", "ReplicationRequirements true")], [
        Event(812, T0, "request", "a"), Event(1040, T0 + 600, "tick"), Event(1043, T0 + 602, "request", "b"),
        Event(1101, T0 + 657, "request", "a"), Event(1150, T0 + 660, "report", "b"),
        Event(1200, T0 + 900, "request", "a")])
    assert story_lines(story, T0) == [
        "job 41 of bag sweep (id 42): done after 3 attempts, 1 failure",
        "command: run 41",
        "22:13:20  sent instance 101 to host node-a (pool slurm), due within 10m00s — request of node-a [event 812]",
        "22:23:20  instance 101 overdue — tick [event 1040]",
        "22:23:22  sent instance 107 to host node-b (pool ec2), due within 10m00s — request of node-b [event 1043]",
        "22:24:17  tail=gridbot: replicate — ReplicationRequirements true [event 1101]",
        "22:24:17  sent instance 108 to host node-a (pool slurm) as a replica, due within 10m00s — request of node-a "
        "[event 1101]",
        "22:24:20  instance 107 done: exit code 0; ran 58.0s (57.5s cpu); its result is the job's — report of node-b "
        "[event 1150]",
        "22:24:20  instance 108 cancelled: another instance has the result — report of node-b [event 1150]",
        "22:28:20  instance 101 wasted: exit code 0; ran 14m40s (14m30s cpu) — request of node-a [event 1200]",
    ]


def test_a_story_without_events_still_shows_its_instances_and_dates_another_day():
    """Instances stored before events were kept (or with an unknown cause) show without one; a line on
    another day than the one before it shows its date."""
    story = JobStory("old", JobInfo(7, 0, "running", "true", 0, 2, None), None, [
        _instance(1, "a", "interrupted", T0, T0 + 5, None, None, wall_s=5.0, cpu_s=0.0),
        _instance(2, "a", "running", T0 + 86_400, None, None, None)], [], [])
    assert story_lines(story, T0)[2:] == [
        "22:13:20  sent instance 1 to host node-a (pool slurm), due within 10m00s",
        "22:13:25  instance 1 interrupted: ran 5.0s (0.0s cpu)",
        "2023-11-15 22:13:20  sent instance 2 to host node-a (pool slurm), due within 10m00s",
        "still running: instance 2 on host node-a",
    ]
    assert story_lines(story, T0)[0] == "job 0 of bag old (id 7): running, 2 attempts, 0 failures so far"


def test_a_jobs_output_cannot_drive_the_terminal_it_is_shown_in():
    """The security review of 2026-11-29: `gridbot logs` wrote a host's stdout tail as it came, escape sequences
    included (a volunteer's host chooses what its jobs print)."""
    from gridbot.cli.render import terminal_safe

    assert terminal_safe("ok\tyes\n\x1b[2J\x07 bell \r over \x9b c1") == \
        "ok\tyes\n\\x1b[2J\\x07 bell \\x0d over \\x9b c1"
    assert terminal_safe("plain text, ünïcode ✓\n") == "plain text, ünïcode ✓\n"
