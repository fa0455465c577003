"""The chaos suite's stores stand in for JobStore in its workers: each method they wrap takes what JobStore's
takes, so that a change to the store's signature fails here, not as a chaos run's hang (a worker whose
every completion raises TypeError retries it for good)."""

from __future__ import annotations

import inspect

import pytest

from dibs.queue.store import JobStore
from tests.chaos.recording import RecordingStore
from tests.chaos.worker_process import DyingStore


@pytest.mark.parametrize("store", [RecordingStore, DyingStore])
def test_a_chaos_store_wraps_each_method_with_the_stores_own_parameters(store: type[JobStore]) -> None:
    wrapped = [
        name
        for name, member in vars(store).items()
        if callable(member) and not name.startswith("__") and hasattr(JobStore, name)
    ]
    assert wrapped, f"{store.__name__} wraps nothing of JobStore"
    for name in wrapped:
        ours, theirs = (_shape(getattr(cls, name)) for cls in (store, JobStore))
        assert ours == theirs or ours == ("any", "any"), f"{store.__name__}.{name} takes {ours}, JobStore's {theirs}"


def _shape(method: object) -> tuple[object, object]:
    """How many positional parameters a method takes, and the names of its keyword-only ones; "any" for a
    method that passes on whatever it is given (``**options``)."""
    parameters = inspect.signature(method).parameters.values()
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return ("any", "any")
    positional = [p for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    keywords = sorted(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)
    return (len(positional), tuple(keywords))
