"""A relay's settings as one checked, frozen value, made without a database."""

from __future__ import annotations

import dataclasses
import re
from datetime import timedelta

import pytest

import dibs


def test_the_heartbeat_follows_from_the_lease_unless_given() -> None:
    settings = dibs.RelaySettings(lease=12)
    assert (settings.lease, settings.heartbeat, settings.heartbeat_seconds) == (12.0, 4.0, 4.0)
    assert dibs.RelaySettings(lease=12, heartbeat=1).heartbeat_seconds == 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.batch = 8  # type: ignore[misc]


def test_durations_are_kept_as_seconds_whatever_they_were_given_as() -> None:
    settings = dibs.RelaySettings(lease=timedelta(minutes=1), grace=0, retention=timedelta(hours=2), poll=0.5)  # type: ignore[arg-type]
    assert (settings.lease, settings.grace, settings.poll) == (60.0, 0.0, 0.5)
    assert settings.retention == timedelta(hours=2)


def test_each_relay_gets_a_name_of_its_own() -> None:
    assert dibs.RelaySettings().name != dibs.RelaySettings().name
    assert dibs.RelaySettings(name="relay-1").name == "relay-1"


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"batch": 0}, "batch must be a whole number >= 1"),
        ({"concurrency": True}, "concurrency"),
        ({"lease": 3, "heartbeat": 3}, "heartbeat must be shorter than the lease (3 s), got 3"),
        ({"poll": 0}, "poll"),
        ({"grace": -1}, "grace must not be negative"),
        ({"target": ""}, "target"),
        ({"name": "x" * 1000}, "name"),
    ],
)
def test_a_setting_out_of_range_is_refused_saying_what_fits(options: dict[str, object], says: str) -> None:
    with pytest.raises(dibs.InvalidArgument, match="^" + re.escape(says)):
        dibs.RelaySettings(**options)  # type: ignore[arg-type]


def test_a_relay_takes_settings_and_options_over_them() -> None:
    outbox = dibs.Outbox("sqlite:///never-opened.sqlite")
    settings = dibs.RelaySettings(batch=50, concurrency=2)
    relay = outbox.relay("log://", settings, batch=10)
    assert (relay.settings.batch, relay.settings.concurrency) == (10, 2)
    assert outbox.relay("log://", batch=7).settings.batch == 7
