"""The fate of a run that raised or was stopped, decided without a database."""

from __future__ import annotations

import pytest

from dibs.queue.outcome import Outcome, failed_outcome
from dibs.queue.stats import WorkerStats

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


def test_attempts_past_the_most_allowed_are_dead_not_retried() -> None:
    # A job recovered from a crashed worker may have run more often than its limit, counted at the claim.
    assert failed_outcome(None, 4, 3, True) is Outcome.DEAD


def test_a_timeout_its_policy_does_not_retry_is_dead_at_once() -> None:
    assert failed_outcome("timeout", 1, 5, False) is Outcome.DEAD


def test_a_lost_lease_wins_over_every_other_reason_to_write() -> None:
    # Whatever the run's error or attempts, the new owner decides: nothing is written here.
    for attempts in (1, 3, 9):
        for retryable in (True, False):
            assert failed_outcome("lease lost", attempts, 3, retryable) is Outcome.LOST


def test_a_stop_reason_it_does_not_know_is_a_plain_failure() -> None:
    assert failed_outcome("interrupted", 1, 3, True) is Outcome.RETRIED
    assert failed_outcome("interrupted", 3, 3, True) is Outcome.DEAD


def test_every_outcome_names_a_count_of_the_workers_stats() -> None:
    stats = WorkerStats()
    assert all(hasattr(stats, outcome.value) for outcome in Outcome)
