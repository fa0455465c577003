"""The fate of a run that raised or was stopped, decided without a database."""

from __future__ import annotations

import pytest

from dibs.queue.outcome import Outcome, failed_outcome

#: (why the worker stopped it, attempts so far, max attempts, retryable error) -> outcome
CASES = [
    (None, 1, 3, True, Outcome.RETRIED),
    (None, 2, 3, True, Outcome.RETRIED),
    (None, 3, 3, True, Outcome.DEAD),  # its last attempt
    (None, 1, 3, False, Outcome.DEAD),  # an error its policy does not retry
    ("timeout", 1, 3, True, Outcome.RETRIED),
    ("timeout", 3, 3, True, Outcome.DEAD),
    ("cancelled", 1, 3, True, Outcome.CANCELLED),  # never retried
    ("cancelled", 3, 3, False, Outcome.CANCELLED),
    ("shutdown", 1, 3, True, Outcome.RELEASED),  # given back, to run again elsewhere
    ("shutdown", 3, 3, True, Outcome.RELEASED),
    ("shutdown", 1, 3, False, Outcome.RELEASED),
    ("lease lost", 1, 3, True, Outcome.LOST),  # the new owner decides
    ("lease lost", 3, 3, False, Outcome.LOST),
]


@pytest.mark.parametrize(("reason", "attempts", "most", "retryable", "expected"), CASES)
def test_a_failed_run_meets_the_outcome_its_reason_attempts_and_policy_call_for(
    reason: str | None, attempts: int, most: int, retryable: bool, expected: Outcome
) -> None:
    assert failed_outcome(reason, attempts, most, retryable) is expected
