"""What happened during a chaos run, written down by every process, and checked afterwards.

Recording
---------
Every process (each worker incarnation, the test itself) owns one :class:`Recorder`::

    recorder = Recorder(directory, actor="w2.3")          # -> directory/w2.3.jsonl
    recorder.record("claimed", 17, token=4, expires_at=1718000000.25)
    recorder.fault("killed", "w2.3", point="mid-handler")  # a fault event about actor w2.3

``record(kind, subject, **fields)`` appends one JSON line ``{"kind", "subject", "actor", "at", ...fields}``
with a single ``os.write`` on an ``O_APPEND`` descriptor: a SIGKILL loses at most the line in flight,
never the lines before it, and lines of concurrent threads never interleave. ``at`` is the wall clock
(``time.time()``); on one machine it is the database servers' clock too. ``subject`` is a string (a job
id for job events, the affected actor for faults). :func:`load` reads every ``*.jsonl`` of a directory
back as :class:`Event` s, ordered by time.

Job events (subject: the job id; ``token`` is the lease token of the claim the event belongs to, which
goes up by one at every claim, so (job, token) names one execution):

* ``claimed``   token, expires_at (epoch seconds, from the database), attempt
* ``renewed``   token, expires_at (a lower bound: the renewal's start + the lease)
* ``started``   token, attempt (recorded by the task function as it begins)
* ``finished``  token, outcome ``returned`` | ``raised`` (recorded by the task function as it ends)
* ``completed`` token, status (succeeded | scheduled | dead | cancelled), changed: True (the fenced write
  changed the row), False (the lease was lost: nothing changed), None (the write raised: unknown)
* ``released``  token, changed
* ``fault``     subject = the actor hit; fault = ``killed`` | ``stopped`` | ``resumed`` | ``terminated`` |
  ``connections-killed`` | anything else; the kinds in :data:`CRASHES` end the actor's executions.

Checking
--------
``check_jobs(events, final_rows, committed=..., expect=...) -> Report`` checks, per job:

* every committed job is in the table and terminal, with the status expected (``expect`` maps job id to
  status; the rest must have ``default_status``), else it counts as lost;
* no two executions of one job overlap while the earlier one's lease was valid (a double run);
* every claim after the first is explained: the previous holder released the job, or retried it, or
  its lease had expired (by a crash of its actor, or else by expiry) when the new claim came; no job
  is claimed again after a successful completion;
* stale completions (changed=False) changed nothing: the row's final state and token come from the
  winning completion (or from recovery of an expired lease, or from a completion whose actor was killed
  after its job finished, before the event was written: counted as ``unrecorded``), and a completion
  reported lost really lost its lease (someone claimed the job after it, or recovery took it);
* per ordering key (the rows' ``ordering_key``): executions of different jobs never overlap while
  valid, and the jobs first started in enqueue (id) order.

``Report.summary`` reads ``jobs 600, executions 640, faults 25, duplicates 40 (all explained), reclaims:
crash 30, release 10, stale 3, lost 0, unrecorded 1, problems 0``; ``Report.problems`` lists what is
wrong; ``Report.assert_ok()`` raises with all of them.
:func:`read_jobs` reads the final rows of the jobs table.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

#: Fault kinds after which the actor runs nothing more (its executions end at the fault's time).
CRASHES = frozenset({"killed", "stopped"})
#: Job states a job may end in.
TERMINAL = frozenset({"succeeded", "dead", "cancelled"})
#: Clock slack for comparing times recorded by different processes (and a database clock of µs).
TOLERANCE = 0.1


def epoch(moment: datetime | float) -> float:
    """Epoch seconds of an aware datetime (what a Lease's expires_at is), or the number itself."""
    return moment.timestamp() if isinstance(moment, datetime) else float(moment)


class Recorder:
    """Appends the events of one actor (one process) to ``<directory>/<actor>.jsonl``; thread-safe."""

    def __init__(self, directory: Path, actor: str) -> None:
        self.directory = Path(directory)
        self.actor = actor
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / f"{actor}.jsonl"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def record(self, kind: str, subject: object, **fields: Any) -> None:
        """Append one event, in one write."""
        event = {"kind": kind, "subject": str(subject), "actor": self.actor, "at": time.time(), **fields}
        line = (json.dumps(event, default=str, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def fault(self, fault: str, target: str, **fields: Any) -> None:
        """Record a fault injected into actor ``target`` (this actor may be the target itself)."""
        self.record("fault", target, fault=fault, **fields)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


@dataclass(frozen=True)
class Event:
    """One recorded line. ``line`` is its position in its actor's file (ties in ``at`` keep file order)."""

    kind: str
    subject: str
    actor: str
    at: float
    fields: Mapping[str, Any] = field(default_factory=dict)
    line: int = 0

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)

    @property
    def token(self) -> int | None:
        token = self.fields.get("token")
        return None if token is None else int(token)


def load(directory: Path) -> list[Event]:
    """Every event recorded in ``directory``, ordered by time. A torn last line (a kill mid-write, which
    one O_APPEND write makes all but impossible) is skipped."""
    events: list[Event] = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        for number, text in enumerate(path.read_text().splitlines()):
            try:
                raw = json.loads(text)
            except json.JSONDecodeError:
                continue
            kind, subject, actor, at = raw.pop("kind"), raw.pop("subject"), raw.pop("actor"), raw.pop("at")
            events.append(Event(kind, str(subject), actor, float(at), raw, number))
    events.sort(key=lambda event: (event.at, event.actor, event.line))
    return events


def read_jobs(engine: Engine) -> list[dict[str, Any]]:
    """The final rows of the jobs table, as plain dicts (what :func:`check_jobs` takes)."""
    from dibs.schema import jobs

    with engine.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(sa.select(jobs).order_by(jobs.c.id))]


@dataclass
class Report:
    """The outcome of a check: counts, how duplicates were explained, and every problem found."""

    jobs: int = 0
    executions: int = 0
    faults: int = 0
    duplicates: int = 0
    stale: int = 0
    lost: int = 0
    #: Final states written by a completion whose event was lost: its actor was killed between the
    #: database's commit and the recording (the one line a SIGKILL may take).
    unrecorded: int = 0
    #: Why each claim after a job's first happened: release, retry, crash, expiry.
    explained: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def summary(self) -> str:
        unexplained = sum(1 for problem in self.problems if "unexplained" in problem)
        how = "all explained" if not unexplained else f"{unexplained} unexplained"
        reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(self.explained.items()))
        return (
            f"jobs {self.jobs}, executions {self.executions}, faults {self.faults}, "
            f"duplicates {self.duplicates} ({how}), reclaims: {reasons or 'none'}, stale {self.stale}, "
            f"lost {self.lost}, unrecorded {self.unrecorded}, problems {len(self.problems)}"
        )

    def assert_ok(self) -> None:
        if self.problems:
            listed = "\n  ".join(self.problems)
            raise AssertionError(f"{self.summary}\n  {listed}")


@dataclass
class _Execution:
    """Everything recorded under one (job, token)."""

    token: int
    claimed: Event | None = None
    renewed: list[Event] = field(default_factory=list)
    started: Event | None = None
    finished: Event | None = None
    completions: list[Event] = field(default_factory=list)
    releases: list[Event] = field(default_factory=list)

    @property
    def actor(self) -> str | None:
        for event in (self.claimed, self.started, *self.completions, *self.releases):
            if event is not None:
                return event.actor
        return None

    def valid_until(self) -> float:
        """A lower bound of the lease's expiry: the claim's expiry, pushed on by every renewal."""
        moments = [float(event.get("expires_at")) for event in [self.claimed, *self.renewed] if event is not None]
        return max(moments, default=float("-inf"))

    def gave_back(self, status: str) -> bool:
        if status == "released":
            return any(event.get("changed") is True for event in self.releases)
        return any(event.get("changed") is True and event.get("status") == status for event in self.completions)


def check_jobs(
    events: Sequence[Event],
    final_rows: Iterable[Mapping[str, Any]],
    *,
    committed: Iterable[int] | None = None,
    expect: Mapping[int, str] | None = None,
    default_status: str = "succeeded",
    tolerance: float = TOLERANCE,
) -> Report:
    """Check a job history against the jobs table as it ended (see the module docstring).

    ``committed``: the ids of every job the test enqueued (default: every row). ``expect``: a status per
    job id for those that should not end ``default_status`` (a poison job: ``dead``)."""
    rows = {int(row["id"]): row for row in final_rows}
    wanted = sorted(set(committed) if committed is not None else set(rows))
    expected = dict(expect or {})
    report = Report(jobs=len(wanted))
    crashes: dict[str, list[float]] = defaultdict(list)
    for event in events:
        if event.kind == "fault":
            report.faults += 1
            if event.get("fault") in CRASHES:
                crashes[event.subject].append(event.at)
    executions: dict[int, dict[int, _Execution]] = defaultdict(dict)
    for event in events:
        if event.kind == "fault" or event.token is None:
            continue
        job = int(event.subject)
        execution = executions[job].setdefault(event.token, _Execution(event.token))
        if event.kind == "claimed":
            execution.claimed = event
        elif event.kind == "renewed":
            execution.renewed.append(event)
        elif event.kind == "started":
            execution.started = execution.started or event
        elif event.kind == "finished":
            execution.finished = event
        elif event.kind == "completed":
            execution.completions.append(event)
        elif event.kind == "released":
            execution.releases.append(event)

    def end_of(execution: _Execution) -> float:
        """When an execution stopped running: its finish, else its actor's crash, else never."""
        if execution.finished is not None:
            return execution.finished.at
        began = execution.started.at if execution.started is not None else float("-inf")
        after = [moment for moment in crashes.get(execution.actor or "", []) if moment >= began - tolerance]
        return min(after, default=float("inf"))

    for job in wanted:
        row = rows.get(job)
        runs = executions.get(job, {})
        started = [execution for execution in runs.values() if execution.started is not None]
        report.executions += len(started)
        report.duplicates += max(0, len(started) - 1)
        want = expected.get(job, default_status)
        if row is None:
            report.lost += 1
            report.problems.append(f"job {job}: lost, it is not in the table")
            continue
        if row["status"] not in TERMINAL:
            report.lost += 1
            report.problems.append(f"job {job}: lost, it ended {row['status']}, not terminal")
            continue
        if row["status"] != want:
            report.problems.append(f"job {job}: ended {row['status']}, expected {want}")
        _check_executions(job, row, runs, report, crashes, end_of, tolerance)
    _check_ordering(rows, wanted, executions, report, end_of, tolerance)
    return report


def _check_executions(
    job: int,
    row: Mapping[str, Any],
    runs: Mapping[int, _Execution],
    report: Report,
    crashes: Mapping[str, list[float]],
    end_of: Any,
    tolerance: float,
) -> None:
    chain = [runs[token] for token in sorted(runs)]
    for execution in chain:
        if execution.started is not None and execution.claimed is None:
            report.problems.append(f"job {job}: token {execution.token} started without a recorded claim")
    claims = [execution for execution in chain if execution.claimed is not None]
    for earlier, later in itertools.pairwise(claims):
        assert later.claimed is not None
        claimed_at = later.claimed.at
        if earlier.gave_back("succeeded"):
            report.problems.append(
                f"job {job}: unexplained claim (token {later.token}) after token {earlier.token} succeeded"
            )
            continue
        if earlier.gave_back("released"):
            report.explained["release"] += 1
        elif earlier.gave_back("scheduled"):
            report.explained["retry"] += 1
        elif claimed_at >= earlier.valid_until() - tolerance:
            began = earlier.claimed.at if earlier.claimed is not None else float("-inf")
            crashed = any(began - tolerance <= moment <= claimed_at for moment in crashes.get(earlier.actor or "", []))
            report.explained["crash" if crashed else "expiry"] += 1
        else:
            report.problems.append(
                f"job {job}: unexplained claim (token {later.token} by {later.actor} at {claimed_at:.3f}) while "
                f"token {earlier.token} of {earlier.actor} was valid until {earlier.valid_until():.3f}, "
                "neither released nor retried"
            )
    # Overlapping runs while the earlier lease was valid: a double run.
    ran = [execution for execution in chain if execution.started is not None]
    for index, earlier in enumerate(ran):
        for later in ran[index + 1 :]:
            assert earlier.started is not None
            assert later.started is not None
            running_until = min(end_of(earlier), earlier.valid_until())
            if later.started.at < running_until - tolerance and not earlier.gave_back("released"):
                report.problems.append(
                    f"job {job}: double run, token {later.token} ({later.actor}) started at "
                    f"{later.started.at:.3f} while token {earlier.token} ({earlier.actor}) ran with a valid lease "
                    f"until {running_until:.3f}"
                )
    # The final state came from the winning write, never from a stale one.
    final_token = int(row["lease_token"])
    winners = [
        (execution.token, event)
        for execution in chain
        for event in execution.completions
        if event.get("changed") is True and event.get("status") in TERMINAL
    ]
    report.stale += sum(1 for execution in chain for event in execution.completions if event.get("changed") is False)
    if len(winners) > 1:
        report.problems.append(f"job {job}: {len(winners)} completions changed it to a final state: {winners}")
    if winners:
        token, event = winners[-1]
        if token != final_token or event.get("status") != row["status"]:
            report.problems.append(
                f"job {job}: the row ended {row['status']} with token {final_token}, but the winning completion "
                f"was {event.get('status')} by token {token}"
            )
    else:
        unknown = any(
            event.get("changed") is None and event.get("status") == row["status"]
            for event in runs.get(final_token, _Execution(final_token)).completions
        )
        recovered = row["status"] == "dead" and "stopped renewing its lease" in str(row.get("last_error") or "")
        last = runs.get(final_token)
        killed_in_flight = (
            last is not None
            and last.finished is not None
            and any(moment >= last.finished.at - tolerance for moment in crashes.get(last.actor or "", []))
        )
        if killed_in_flight and not (unknown or recovered):
            report.unrecorded += 1
        elif not (unknown or recovered or row["status"] == "cancelled" or not runs):
            report.problems.append(
                f"job {job}: ended {row['status']} with token {final_token}, but no recorded completion or "
                "recovery explains it"
            )
    for execution in chain:
        for event in execution.completions + execution.releases:
            if event.get("changed") is not False:
                continue
            taken_over = any(token > execution.token for token in runs) or final_token > execution.token
            recovered = row["status"] == "dead" and "stopped renewing" in str(row.get("last_error") or "")
            tried = any(other.get("changed") is None for other in execution.completions)
            expired = event.at >= execution.valid_until() - tolerance
            if not (taken_over or recovered or tried or expired):
                report.problems.append(
                    f"job {job}: a {event.kind} by token {execution.token} was reported lost, yet its lease was "
                    "valid and nobody took the job over"
                )


def _check_ordering(
    rows: Mapping[int, Mapping[str, Any]],
    wanted: Sequence[int],
    executions: Mapping[int, Mapping[int, _Execution]],
    report: Report,
    end_of: Any,
    tolerance: float,
) -> None:
    keyed: dict[str, list[int]] = defaultdict(list)
    for job in wanted:
        row = rows.get(job)
        if row is not None and row.get("ordering_key") is not None:
            keyed[str(row["ordering_key"])].append(job)
    for key, members in keyed.items():
        spans: list[tuple[float, float, int, int]] = []
        first_start: list[tuple[int, float]] = []
        for job in sorted(members):
            ran = [run for run in executions.get(job, {}).values() if run.started is not None]
            for run in ran:
                assert run.started is not None
                spans.append((run.started.at, min(end_of(run), run.valid_until()), job, run.token))
            if ran:
                first_start.append((job, min(run.started.at for run in ran if run.started is not None)))
        spans.sort()
        for index, (_begin, end, job, token) in enumerate(spans):
            for other_begin, _other_end, other_job, other_token in spans[index + 1 :]:
                if other_begin >= end - tolerance:
                    break
                if other_job != job:
                    report.problems.append(
                        f"ordering key {key}: job {other_job} (token {other_token}) started at {other_begin:.3f} "
                        f"while job {job} (token {token}) ran until {end:.3f}"
                    )
        for (job, began), (next_job, next_began) in itertools.pairwise(first_start):
            if next_began < began - tolerance:
                report.problems.append(
                    f"ordering key {key}: job {next_job} first started at {next_began:.3f}, before job {job} "
                    f"(enqueued earlier) at {began:.3f}"
                )


def job_events(events: Iterable[Event], job: int) -> list[Event]:
    """The events of one job, in order (handy in an assertion message)."""
    return [event for event in events if event.kind != "fault" and event.subject == str(job)]
