"""A worker's settings as one checked, frozen value, made without a database."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

import dibs
from dibs.queue.settings import worker_settings


def test_the_defaults_follow_from_the_concurrency_and_the_lease() -> None:
    settings = worker_settings(frozenset({"emails", "default"}), concurrency=4, lease=12)
    assert (settings.queues, settings.concurrency, settings.batch) == (("default", "emails"), 4, 4)
    assert (settings.lease_seconds, settings.heartbeat_seconds) == (12.0, 4.0)
    assert (settings.metrics_address, settings.connections, settings.retention) == ("127.0.0.1", None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.batch = 8  # type: ignore[misc]


def test_durations_are_kept_as_seconds_whatever_they_were_given_as() -> None:
    settings = worker_settings(
        frozenset({"default"}), lease=timedelta(minutes=1), grace=0, retention=timedelta(hours=2), poll=0.5
    )
    assert (settings.lease_seconds, settings.grace_seconds, settings.poll_seconds) == (60.0, 0.0, 0.5)
    assert settings.retention == timedelta(hours=2)


def test_a_queue_the_app_does_not_serve_is_refused_before_anything_else() -> None:
    with pytest.raises(dibs.InvalidArgument, match=r"no task is on queue\(s\) mail; this app's queues: default"):
        worker_settings(frozenset({"default"}), queues=["mail"], concurrency=0)
