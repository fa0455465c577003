"""Backoff: an idle loop waits a little at first, longer each time, never past its limit, and briefly again
once it finds work."""

from __future__ import annotations

from dibs.runtime import Backoff


def test_the_wait_doubles_up_to_the_limit() -> None:
    backoff = Backoff(first=0.01, most=0.05)
    assert [backoff.next() for _ in range(5)] == [0.01, 0.02, 0.04, 0.05, 0.05]


def test_a_reset_starts_again_from_the_first_wait() -> None:
    backoff = Backoff(first=0.01, most=1.0)
    backoff.next()
    backoff.next()
    backoff.reset()
    assert backoff.next() == 0.01


def test_a_floor_makes_the_next_wait_at_least_that_long() -> None:
    backoff = Backoff(first=0.01, most=2.0)
    assert backoff.next(floor=0.1) == 0.01
    assert backoff.next(floor=0.1) == 0.1
    assert backoff.next(floor=0.1) == 0.2


def test_a_first_wait_longer_than_the_limit_is_the_limit() -> None:
    backoff = Backoff(first=0.01, most=0.005, growth=1.5)
    assert [backoff.next() for _ in range(2)] == [0.005, 0.005]


def test_growth_is_by_the_factor_given() -> None:
    backoff = Backoff(first=0.01, most=0.4, growth=1.5)
    waits = [backoff.next() for _ in range(12)]
    assert waits[:3] == [0.01, 0.015, 0.0225]
    assert max(waits) == 0.4
