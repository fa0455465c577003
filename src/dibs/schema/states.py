"""The states of a job and of an outbox event."""

from __future__ import annotations

#: Job states. ``scheduled`` jobs wait for their time and are moved to ``queued`` when it comes, so that
#: the claim's index holds runnable jobs only.
SCHEDULED, QUEUED, RUNNING = "scheduled", "queued", "running"
SUCCEEDED, DEAD, CANCELLED = "succeeded", "dead", "cancelled"
LIVE = (SCHEDULED, QUEUED, RUNNING)
FINISHED = (SUCCEEDED, DEAD, CANCELLED)
STATES = (*LIVE, *FINISHED)

#: Outbox event states. A ``failed`` event waits for its next attempt and is moved back to ``pending``
#: when that time comes; after its last retry it is ``abandoned``, with the error kept.
PENDING, PROCESSING, PUBLISHED = "pending", "processing", "published"
FAILED, ABANDONED = "failed", "abandoned"
EVENT_STATES = (PENDING, PROCESSING, FAILED, ABANDONED, PUBLISHED)
#: The target an event goes to when none is named.
DEFAULT_TARGET = "default"
