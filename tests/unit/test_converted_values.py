"""Values read on the driver's cursor go through their type's result processor, row by row; a conversion is
reused for the next row only when the result cannot be changed in place."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from typing import Any

import pytest

from dibs.dialects.driver import _converted, _converted_column


def _counting(convert: Any) -> tuple[list[Any], Any]:
    calls: list[Any] = []

    def counted(value: Any) -> Any:
        calls.append(value)
        return convert(value)

    return calls, counted


@pytest.mark.parametrize("single", [True, False], ids=["one column", "several columns"])
def test_an_immutable_conversion_is_reused_for_equal_values_in_a_row(single: bool) -> None:
    fetched = [(1, "2026-11-25 12:00:00"), (2, "2026-11-25 12:00:00"), (3, "2026-11-25 13:00:00")]
    calls, convert = _counting(datetime.fromisoformat)
    rows = _converted_column(fetched, 1, convert) if single else _converted(fetched, [(1, convert)])
    assert [list(row) for row in rows] == [
        [1, datetime(2026, 11, 25, 12)],
        [2, datetime(2026, 11, 25, 12)],
        [3, datetime(2026, 11, 25, 13)],
    ]
    assert calls == ["2026-11-25 12:00:00", "2026-11-25 13:00:00"]


@pytest.mark.parametrize("single", [True, False], ids=["one column", "several columns"])
def test_a_mutable_conversion_is_never_shared_between_rows(single: bool) -> None:
    fetched = [(1, '{"a": 1}'), (2, '{"a": 1}')]
    calls, convert = _counting(json.loads)
    rows = _converted_column(fetched, 1, convert) if single else _converted(fetched, [(1, convert)])
    assert rows[0][1] == rows[1][1] == {"a": 1}
    assert rows[0][1] is not rows[1][1]
    assert len(calls) == 2


@pytest.mark.parametrize("single", [True, False], ids=["one column", "several columns"])
def test_equal_values_of_different_types_are_converted_apart(single: bool) -> None:
    # 1 == True == 1.0 in Python, but a driver's 1 and True may convert differently.
    fetched = [(1,), (True,), (1.0,)]
    rows = _converted_column(fetched, 0, repr) if single else _converted(fetched, [(0, repr)])
    assert [row[0] for row in rows] == ["1", "True", "1.0"]


@pytest.mark.parametrize("single", [True, False], ids=["one column", "several columns"])
def test_equal_raw_values_that_may_convert_differently_are_converted_apart(single: bool) -> None:
    # 0.0 == -0.0 and Decimal("1.0") == Decimal("1.00"), yet their conversions differ.
    fetched = [(0.0,), (-0.0,), (Decimal("1.0"),), (Decimal("1.00"),)]
    rows = _converted_column(fetched, 0, str) if single else _converted(fetched, [(0, str)])
    assert [row[0] for row in rows] == ["0.0", "-0.0", "1.0", "1.00"]
