"""`gridbot jobs BAG JOB --story`: a job's life as a log a person reads, oldest line first.

Each instance sent (to which host, of which pool, caused by which event), found overdue and ended, and
each strategy's decision about the job with why, every line with the event that caused it.
"""

from __future__ import annotations

import math
import time

from gridbot.cli.render import console, cut, duration
from gridbot.core.changes import Event
from gridbot.model.states import JOB_TERMINAL, InstanceState, JobState
from gridbot.protocol import JobStory, StoryInstance

_ENDS, _DECIDES, _SENDS = 0, 1, 2
"""Of lines at the same time and event, the ends come first, then the decisions, then the sends they made."""


def job_story(story: JobStory) -> None:
    for line in story_lines(story, time.time()):
        console.print(line, markup=False, soft_wrap=True)


def story_lines(story: JobStory, now: float) -> list[str]:
    """The story's lines: a summary of the job, then one line per step, at local times (with the date when
    it is not the day of the line before, or for the first line, today)."""
    events = {e.event_id: e for e in story.events}
    names = {i.host_id: i.host_name for i in story.instances if i.host_name}
    steps: list[tuple[float, int, int, str]] = []
    for i in story.instances:
        for at, order, text, event_id in _instance_steps(i, story.result_instance, events):
            steps.append((at, event_id or 0, order, text + _cause(event_id, events, names, story.bag)))
    for d in story.decisions:
        event = events.get(d.event_id)
        steps.append((event.at if event else math.inf, d.event_id, _DECIDES,
                      f"{d.strategy}: {d.action} — {cut(d.why)} [event {d.event_id}]"))
    lines = _summary(story)
    day = time.strftime("%Y-%m-%d", time.localtime(now))
    for at, _, _, text in sorted(steps, key=lambda s: s[:3]):
        stamp, day = _stamp(at, day)
        lines.append(f"{stamp}  {text}")
    if not story.instances:
        lines.append("no instance of it has been sent yet")
    lines.extend(f"still running: instance {i.instance_id} on host {i.host_name or i.host_id}"
                 for i in story.instances if i.state == InstanceState.RUNNING)
    return lines


def _summary(story: JobStory) -> list[str]:
    j = story.job
    counts = f"{_count(j.attempts, 'attempt')}, {_count(j.failures, 'failure')}"
    how = f"{j.state} after {counts}" if j.state in JOB_TERMINAL else f"{j.state}, {counts} so far"
    revision = f", revision {j.revision}" if j.revision > 1 else ""
    reason = f"; last failure: {cut(j.reason)}" if j.reason and j.state != JobState.DONE else ""
    return [f"job {j.index} of bag {story.bag} (id {j.job_id}): {how}{revision}{reason}",
            f"command: {cut(j.command)}"]


def _instance_steps(i: StoryInstance, result: int | None,
                    events: dict[int, Event]) -> list[tuple[float, int, str, int | None]]:
    """An instance's lines: (time, order, text, event id)."""
    where = f"host {i.host_name or i.host_id}" + (f" (pool {i.pool})" if i.pool else "")
    replica = " as a replica" if i.replica else ""
    steps = [(i.sent_at, _SENDS, f"sent instance {i.instance_id} to {where}{replica}, due within "
                                 f"{duration(i.instance_deadline - i.sent_at)}", i.sent_event)]
    if i.overdue_event is not None or i.state == InstanceState.OVERDUE:  # (the reason is its end's, if it ended)
        found = events.get(i.overdue_event) if i.overdue_event is not None else None
        why = f": {cut(i.reason or 'no report')}" if i.state == InstanceState.OVERDUE else ""
        steps.append((found.at if found else i.ended_at or i.sent_at, _ENDS, f"instance {i.instance_id} overdue{why}",
                      i.overdue_event))
    if i.state not in (InstanceState.RUNNING, InstanceState.OVERDUE):
        reason = cut(i.reason or "")
        code = f"exit code {i.exit_code}" if i.exit_code is not None and "exit code" not in reason else ""
        ran = f"ran {duration(i.wall_s)} ({duration(i.cpu_s or 0.0)} cpu)" if i.wall_s is not None else ""
        details = "; ".join(h for h in (code, reason, ran) if h)
        kept = "; its result is the job's" if i.instance_id == result else ""
        ended = events.get(i.end_event) if i.end_event is not None else None
        steps.append((i.ended_at or (ended.at if ended else i.sent_at), _ENDS,
                      f"instance {i.instance_id} {i.state}{f': {details}' if details else ''}{kept}", i.end_event))
    return steps


def _cause(event_id: int | None, events: dict[int, Event], names: dict[str, str], bag: str) -> str:
    """` — request of n1 [event 812]`: what caused a line (nothing when it is not known). The source of an
    event is a host (shown by its name) or, for an owner's act, the bag (by its id: the story's own)."""
    event = events.get(event_id) if event_id is not None else None
    if event is None:
        return f" [event {event_id}]" if event_id is not None else ""
    source = names.get(event.source) or (f"bag {bag}" if event.source.isdigit() else event.source)
    return f" — {event.kind}{f' of {source}' if source else ''} [event {event.event_id}]"


def _stamp(at: float, day: str) -> tuple[str, str]:
    """The time of a line, with its date when it is not on `day`; and the line's day."""
    if math.isinf(at):
        return "--:--:--", day
    t = time.localtime(at)
    today = time.strftime("%Y-%m-%d", t)
    return (time.strftime("%H:%M:%S", t) if today == day else f"{today} {time.strftime('%H:%M:%S', t)}"), today


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
