"""The public surface: one sorted, complete __all__."""

from __future__ import annotations

import dibs


def test_all_is_sorted_and_complete() -> None:
    assert dibs.__all__ == sorted(dibs.__all__)
    public = {name for name in vars(dibs) if not name.startswith("_")} - {"annotations"}
    modules = {name for name in public if type(getattr(dibs, name)).__name__ == "module"}
    assert set(dibs.__all__) == public - modules
    for name in dibs.__all__:
        assert getattr(dibs, name).__doc__, f"{name} has no docstring"
