"""The states of a job and of an outbox event."""

from __future__ import annotations

#: Job states. ``scheduled`` jobs wait for their time and are moved to ``queued`` when it comes, so that
#: the claim's index holds runnable jobs only.
SCHEDULED, QUEUED, RUNNING = "scheduled", "queued", "running"
SUCCEEDED, DEAD, CANCELLED = "succeeded", "dead", "cancelled"
#: A job enqueued ``after=`` other jobs waits in this state until they finished.
WAITING = "waiting"
LIVE = (SCHEDULED, QUEUED, RUNNING)
FINISHED = (SUCCEEDED, DEAD, CANCELLED)
STATES = (WAITING, *LIVE, *FINISHED)
#: What a job enqueued ``after=`` others does when one of them dies or is cancelled: it is cancelled too,
#: or it runs anyway.
CANCEL_ON_PARENT_FAILURE, RUN_ON_PARENT_FAILURE = "cancel", "run"

#: Outbox event states. A ``failed`` event waits for its next attempt and is moved back to ``pending``
#: when that time comes; after its last retry it is ``abandoned``, with the error kept.
PENDING, PROCESSING, PUBLISHED = "pending", "processing", "published"
FAILED, ABANDONED = "failed", "abandoned"
EVENT_STATES = (PENDING, PROCESSING, FAILED, ABANDONED, PUBLISHED)
#: The target an event goes to when none is named.
DEFAULT_TARGET = "default"
