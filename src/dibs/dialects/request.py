"""A claim request, the strategy that serves it, and the cache of statements built per request shape.

Statements are built with bind parameters for everything that changes from call to call (the limit,
the picked keys, lease owners and durations) so that a strategy can build them once per claim
*shape* and reuse them: building SQLAlchemy constructs costs more than executing them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row
from sqlalchemy.sql import ColumnElement

from dibs.dialects.keys import positions_of
from dibs.dialects.values import resolve_times

Then = Callable[[Connection, list[Row[Any]]], object]
S = TypeVar("S")

LIMIT = "dibs_limit"


@dataclass(frozen=True, kw_only=True)
class ClaimRequest:
    """One validated claim: which rows, how many, what to do to them, and the values of its parameters.

    Requests with the same ``shape`` (any hashable, None for none) have the same table, criteria,
    values, order and mode, and differ only in ``limit`` and ``parameters``; strategies reuse the
    statements they built for the first of them.
    """

    table: sa.Table
    where: ColumnElement[bool] | None
    values: Mapping[str, Any]
    limit: int
    order_by: tuple[ColumnElement[Any], ...]
    delete: bool
    then: Then | None
    parameters: Mapping[str, Any] = field(default_factory=dict)
    shape: Hashable | None = None
    #: The columns the claimed rows come back with, the key among them; empty for all of the table's.
    columns: tuple[sa.Column[Any], ...] = ()

    #: Worked out from the fields when the request is made; copies made by for_call() share them.
    #: The table's key columns.
    key_columns: tuple[sa.Column[Any], ...] = field(init=False, repr=False, compare=False)
    #: The columns of each claimed row, in order.
    returned: tuple[sa.Column[Any], ...] = field(init=False, repr=False, compare=False)
    #: Where the key's columns stand in a claimed row.
    key_positions: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        derived = self.__dict__  # a frozen dataclass is set up through its __dict__
        derived["key_columns"] = key_columns = tuple(self.table.primary_key.columns)
        derived["returned"] = returned = self.columns or tuple(self.table.columns)
        derived["key_positions"] = positions_of(returned, key_columns)

    def for_call(self, limit: int, parameters: Mapping[str, Any], then: Then | None = None) -> ClaimRequest:
        """This request (a template of its shape) with one call's limit, parameters and ``then``:
        ``dataclasses.replace`` without its keyword handling, a fifth of its time, for a claim loop that
        makes one per call."""
        copied: ClaimRequest = object.__new__(ClaimRequest)
        values = copied.__dict__
        values.update(self.__dict__)
        values["limit"], values["parameters"], values["then"] = limit, parameters, then
        return copied

    def candidates(self, *columns: ColumnElement[Any]) -> sa.Select[Any]:
        """SELECT the given columns of the eligible rows, in claim order, at most ``limit`` of them."""
        query = sa.select(*columns)
        if self.where is not None:
            query = query.where(self.where)
        return query.order_by(*self.order_by).limit(sa.bindparam(LIMIT, type_=sa.Integer))

    def execution(self) -> dict[str, Any]:
        """The parameter values for this request's statements, with times from the application's clock
        taken now: strategies ask for them once their transaction holds its locks."""
        return resolve_times({LIMIT: self.limit, **self.parameters})


class ClaimStrategy(Protocol):
    """Claims the rows one request names, inside one transaction it opens and commits itself."""

    name: str
    #: The claim is one statement, atomic without an explicit transaction when there is no ``then``.
    single_statement: bool

    def claim(self, conn: Connection, request: ClaimRequest) -> list[Row[Any]]: ...


class StatementCache(Generic[S]):
    """Statements built once per request shape (at most ``size`` shapes, least recently used dropped)."""

    def __init__(self, build: Callable[[ClaimRequest], S], size: int = 256) -> None:
        self._build = build
        self._built: OrderedDict[Hashable, S] = OrderedDict()
        self._size = size

    def __call__(self, request: ClaimRequest) -> S:
        if request.shape is None:
            return self._build(request)
        try:
            self._built.move_to_end(request.shape)
            return self._built[request.shape]
        except KeyError:
            built = self._built[request.shape] = self._build(request)
            if len(self._built) > self._size:
                self._built.popitem(last=False)
            return built


def run_then(conn: Connection, request: ClaimRequest, rows: list[Row[Any]]) -> list[Row[Any]]:
    """Run the request's ``then`` callback, in the claim's transaction, when something was claimed."""
    if request.then is not None and rows:
        request.then(conn, rows)
    return rows
