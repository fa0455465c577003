"""The history checker itself: it passes a clean history and catches each kind of violation in hand-made ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.chaos.history import Event, Recorder, Report, check_jobs, load

LEASE = 1.5


class Story:
    """A hand-written history: events at given times, and the final rows."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.rows: dict[int, dict[str, Any]] = {}

    def add(self, at: float, kind: str, subject: object, actor: str, **fields: Any) -> Story:
        self.events.append(Event(kind, str(subject), actor, at, fields, len(self.events)))
        return self

    def run(
        self,
        job: int,
        token: int,
        actor: str,
        at: float,
        length: float = 0.2,
        *,
        status: str = "succeeded",
        changed: bool | None = True,
    ) -> Story:
        """A whole execution: claim, start, finish, completion."""
        self.add(at, "claimed", job, actor, token=token, expires_at=at + LEASE, attempt=token)
        self.add(at + 0.01, "started", job, actor, token=token, attempt=token)
        self.add(at + length, "finished", job, actor, token=token, outcome="returned")
        self.add(at + length + 0.01, "completed", job, actor, token=token, status=status, changed=changed)
        return self

    def row(self, job: int, status: str = "succeeded", token: int = 1, key: str | None = None) -> Story:
        self.rows[job] = {"id": job, "status": status, "lease_token": token, "ordering_key": key, "last_error": None}
        return self

    def check(self, **options: Any) -> Report:
        self.events.sort(key=lambda event: event.at)
        return check_jobs(self.events, self.rows.values(), **options)


def problems_with(report: Report, text: str) -> list[str]:
    return [problem for problem in report.problems if text in problem]


def test_a_clean_history_with_a_crash_a_release_and_a_zombie_passes() -> None:
    story = Story().run(1, 1, "w1", 10.0).row(1)
    # Job 2: its first holder is killed mid-handler; after the lease expires w2 runs it.
    story.add(10.0, "claimed", 2, "w1", token=1, expires_at=11.5).add(10.1, "started", 2, "w1", token=1)
    story.add(10.2, "fault", "w1", "harness", fault="killed")
    story.run(2, 2, "w2", 11.6).row(2, token=2)
    # Job 3: released unstarted, then run.
    story.add(10.0, "claimed", 3, "w3", token=1, expires_at=11.5).add(10.1, "released", 3, "w3", token=1, changed=True)
    story.run(3, 2, "w2", 10.3).row(3, token=2)
    # Job 4: a zombie (stopped past its lease) completes late and changes nothing.
    story.add(10.0, "claimed", 4, "z", token=1, expires_at=11.5).add(10.1, "started", 4, "z", token=1)
    story.add(10.2, "fault", "z", "harness", fault="stopped")
    story.run(4, 2, "w2", 11.7)
    story.add(13.0, "fault", "z", "harness", fault="resumed")
    story.add(13.1, "finished", 4, "z", token=1, outcome="returned")
    story.add(13.2, "completed", 4, "z", token=1, status="succeeded", changed=False).row(4, token=2)
    # Job 5: retried once after raising, then dead on purpose.
    story.add(10.0, "claimed", 5, "w1", token=1, expires_at=11.5).add(10.1, "started", 5, "w1", token=1)
    story.add(10.2, "finished", 5, "w1", token=1, outcome="raised")
    story.add(10.3, "completed", 5, "w1", token=1, status="scheduled", changed=True)
    story.run(5, 2, "w2", 10.5, status="dead").row(5, "dead", token=2)
    report = story.check(expect={5: "dead"})
    report.assert_ok()
    assert (report.jobs, report.executions, report.duplicates, report.stale, report.lost) == (5, 8, 3, 1, 0)
    assert report.explained == {"crash": 2, "release": 1, "retry": 1}
    assert "duplicates 3 (all explained)" in report.summary


def test_it_catches_a_double_run() -> None:
    story = Story().run(1, 1, "w1", 10.0, length=1.0).run(1, 2, "w2", 10.3, changed=False).row(1)
    report = story.check()
    assert problems_with(report, "double run"), report.problems
    assert problems_with(report, "unexplained claim")
    with pytest.raises(AssertionError, match="double run"):
        report.assert_ok()


def test_it_catches_lost_jobs() -> None:
    story = Story().run(1, 1, "w1", 10.0).row(1).row(2, "queued", token=0).row(3, "running")
    report = story.check(committed=[1, 2, 3, 4])
    assert report.lost == 3
    assert len(problems_with(report, "lost")) == 3
    assert "lost 3" in report.summary


def test_it_catches_an_unexplained_duplicate() -> None:
    # Claimed again after it had succeeded, with no crash, release or retry in between.
    story = Story().run(1, 1, "w1", 10.0).run(1, 2, "w2", 12.0, changed=False).row(1)
    report = story.check()
    assert problems_with(report, "unexplained claim"), report.problems
    assert "1 unexplained" in report.summary
    # Claimed by another while the first lease was valid, though the first holder never ran it.
    story = Story().add(10.0, "claimed", 1, "w1", token=1, expires_at=11.5).run(1, 2, "w2", 10.5).row(1, token=2)
    assert problems_with(story.check(), "unexplained claim")


def test_it_catches_a_stale_completion_that_changed_the_row() -> None:
    # The row carries the stale token's outcome: the fenced write let a lost lease through.
    story = Story().add(10.0, "claimed", 1, "z", token=1, expires_at=11.5).add(10.1, "started", 1, "z", token=1)
    story.add(10.2, "fault", "z", "harness", fault="stopped")
    story.run(1, 2, "w2", 11.7, status="succeeded")
    story.add(13.0, "completed", 1, "z", token=1, status="dead", changed=False)
    story.row(1, "dead", token=1)
    report = story.check(expect={1: "dead"})
    assert problems_with(report, "winning completion"), report.problems
    # And a completion reported lost although nobody took its lease.
    story = Story().run(1, 1, "w1", 10.0, changed=False).row(1, "succeeded", token=1)
    assert problems_with(story.check(), "reported lost")


def test_a_final_state_without_a_completion_is_explained_only_by_a_kill_in_flight() -> None:
    story = Story().add(10.0, "claimed", 1, "w1", token=1, expires_at=11.5).add(10.1, "started", 1, "w1", token=1)
    story.add(10.2, "finished", 1, "w1", token=1, outcome="returned").row(1)
    assert problems_with(story.check(), "no recorded completion")
    story.add(10.3, "fault", "w1", "harness", fault="killed")
    report = story.check()
    report.assert_ok()
    assert report.unrecorded == 1


def test_it_catches_ordering_violations() -> None:
    # Job 2 (same key, enqueued later) started before job 1, and while it ran.
    story = Story().run(1, 1, "w1", 10.5).run(2, 1, "w2", 10.0, length=1.0)
    report = story.row(1, key="a").row(2, key="a").check()
    assert problems_with(report, "ordering key a"), report.problems
    assert problems_with(report, "before job 1")
    # Different keys may run at once.
    story = Story().run(1, 1, "w1", 10.5).run(2, 1, "w2", 10.0, length=1.0)
    story.row(1, key="a").row(2, key="b").check().assert_ok()


def test_a_recorder_appends_whole_lines_that_load_reads_back(tmp_path: Path) -> None:
    first, second = Recorder(tmp_path, "one"), Recorder(tmp_path, "two")
    first.record("claimed", 7, token=1, expires_at=5.0)
    second.fault("killed", "one", point="mid-handler")
    first.record("started", 7, token=1)
    first.close()
    second.close()
    (tmp_path / "three.jsonl").write_text('{"kind": "claimed", "subj')  # a torn line is skipped
    events = load(tmp_path)
    assert [(event.kind, event.subject, event.actor) for event in events] == [
        ("claimed", "7", "one"),
        ("fault", "one", "two"),
        ("started", "7", "one"),
    ]
    assert events[0].token == 1
    assert events[1].get("point") == "mid-handler"
    assert events[0].at <= events[1].at <= events[2].at
