"""The relay's decision for events a broker refused, without a database or a broker."""

from __future__ import annotations

import dibs
from dibs.outbox.failures import sorted_failures

RETRY_ALL = dibs.Retry()


def test_max_retries_counts_retries_after_the_first_failed_publish() -> None:
    failed = [(f"e{earlier}", earlier, RuntimeError("refused")) for earlier in range(4)]
    groups = sorted_failures(failed, max_retries=2, retry=RETRY_ALL)
    assert [(group.failures, group.abandoned) for group in groups] == [(1, False), (2, False), (3, True), (4, True)]
    assert groups[0].describe(2) == (
        "1 event failed to publish and will be retried (retry 1 of max_retries=2): RuntimeError: refused"
    )
    assert groups[2].describe(2) == (
        "1 event abandoned after 3 failed publishes (max_retries=2 allows the first publish and 2 retries): "
        "RuntimeError: refused"
    )


def test_zero_retries_abandons_at_the_first_failure() -> None:
    (group,) = sorted_failures([("e", 0, RuntimeError("refused"))], max_retries=0, retry=RETRY_ALL)
    assert group.describe(0) == (
        "1 event abandoned after 1 failed publish (max_retries=0 allows the first publish and 0 retries): "
        "RuntimeError: refused"
    )


def test_an_error_the_policy_does_not_retry_abandons_at_once() -> None:
    (group,) = sorted_failures([("e", 0, ValueError("bad"))], max_retries=5, retry=dibs.Retry(on=(ConnectionError,)))
    assert group.abandoned
    assert "the outbox's retry policy does not retry ValueError" in group.describe(5)


def test_a_batch_of_failures_is_one_line_per_outcome_whatever_its_size() -> None:
    failed = [(n, 0, RuntimeError(f"refused event {n}")) for n in range(500)]
    (group,) = sorted_failures(failed, max_retries=3, retry=RETRY_ALL)
    assert len(group.by_error) == 500  # each event's own error is written with it
    assert group.describe(3) == (
        "500 events failed to publish and will be retried (retry 1 of max_retries=3): RuntimeError: refused event 0 "
        "(and 499 other errors)"
    )
