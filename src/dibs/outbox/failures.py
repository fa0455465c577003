"""What becomes of events a broker refused: a pure decision, and the one log line per kind of failure.

``max_retries`` counts retries after the first failed publish: an event is published at most
``max_retries + 1`` times, then abandoned with its last error kept. An error the outbox's retry policy
does not retry abandons the event at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from dibs.retry import Retry

T = TypeVar("T")


@dataclass(kw_only=True)
class Failures(Generic[T]):
    """Events of one batch that failed alike: abandoned for the same reason, or retried for the same time."""

    #: Failed publishes of these events, this one included.
    failures: int
    #: Why they are abandoned; empty when they are retried.
    why: str
    #: The events, by the error each failed with (one write per error).
    by_error: dict[str, list[T]] = field(default_factory=dict)

    @property
    def abandoned(self) -> bool:
        return bool(self.why)

    def describe(self, max_retries: int) -> str:
        """One line for the log, however many events and errors the group holds."""
        count = sum(len(events) for events in self.by_error.values())
        events = "1 event" if count == 1 else f"{count} events"
        first = next(iter(self.by_error))
        others = f" (and {len(self.by_error) - 1} other errors)" if len(self.by_error) > 1 else ""
        if self.abandoned:
            publishes = "publish" if self.failures == 1 else "publishes"
            return f"{events} abandoned after {self.failures} failed {publishes} ({self.why}): {first}{others}"
        return (
            f"{events} failed to publish and will be retried (retry {self.failures} of max_retries={max_retries}): "
            f"{first}{others}"
        )


def sorted_failures(
    failed: Sequence[tuple[T, int, BaseException]], *, max_retries: int, retry: Retry
) -> list[Failures[T]]:
    """The failed events (each with its failed publishes before this one, and its error) in groups: one per
    outcome and count of failed publishes."""
    groups: dict[tuple[str, int], Failures[T]] = {}
    for event, earlier, error in failed:
        failures = earlier + 1
        if failures > max_retries:
            why = f"max_retries={max_retries} allows the first publish and {max_retries} retries"
        elif not retry.retries(error):
            why = f"the outbox's retry policy does not retry {type(error).__name__}"
        else:
            why = ""
        group = groups.setdefault((why, failures), Failures(failures=failures, why=why))
        group.by_error.setdefault(f"{type(error).__name__}: {error}", []).append(event)
    return list(groups.values())
