"""Bad input gets a clear error that says what to do, and nothing is written."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import dibs
from tests.conformance.tables import work_columns


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[sa.Engine]:
    engine = dibs.create_engine(f"sqlite:///{tmp_path / 'errors.sqlite'}")
    yield engine
    engine.dispose()


@pytest.fixture
def work(engine: sa.Engine) -> sa.Table:
    table = sa.Table("work", sa.MetaData(), *work_columns())
    table.create(engine)
    with engine.begin() as conn:
        conn.execute(table.insert(), [{"id": i} for i in range(1, 4)])
    return table


def ready_count(engine: sa.Engine, work: sa.Table) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).where(work.c.status == "ready")).scalar_one()


def test_a_table_without_a_primary_key(engine: sa.Engine) -> None:
    keyless = sa.Table("keyless", sa.MetaData(), sa.Column("status", sa.String(10)))
    with pytest.raises(dibs.InvalidArgument, match=r"has no primary key.*Declare one"):
        dibs.claim(engine, keyless, set={"status": "x"})


def test_an_unknown_column_in_set(engine: sa.Engine, work: sa.Table) -> None:
    with pytest.raises(dibs.InvalidArgument, match=r"'stauts'.*not a column of table 'work'.*status"):
        dibs.claim(engine, work, where=work.c.status == "ready", set={"stauts": "running"}, limit=3)
    assert ready_count(engine, work) == 3


def test_a_column_of_another_table_in_set(engine: sa.Engine, work: sa.Table) -> None:
    other = sa.Table("other", sa.MetaData(), sa.Column("status", sa.String(10)))
    with pytest.raises(dibs.InvalidArgument, match="not a column of table 'work'"):
        dibs.claim(engine, work, set={other.c.status: "running"})
    assert ready_count(engine, work) == 3


@pytest.mark.parametrize("limit", [1.5, "3", True, None, [1]])
def test_a_limit_that_is_not_a_whole_number(engine: sa.Engine, work: sa.Table, limit: Any) -> None:
    with pytest.raises(dibs.InvalidArgument, match="limit must be a whole number"):
        dibs.claim(engine, work, set={"status": "running"}, limit=limit)
    assert ready_count(engine, work) == 3


def test_set_and_delete_together_or_neither(engine: sa.Engine, work: sa.Table) -> None:
    with pytest.raises(dibs.InvalidArgument, match=r"either set= .* or delete=True, not both"):
        dibs.claim(engine, work, set={"status": "running"}, delete=True)
    with pytest.raises(dibs.InvalidArgument, match="needs set= with the change that marks rows as claimed"):
        dibs.claim(engine, work, where=work.c.status == "ready")
    assert ready_count(engine, work) == 3


def test_where_as_a_string_or_a_non_expression(engine: sa.Engine, work: sa.Table) -> None:
    with pytest.raises(dibs.InvalidArgument, match=r"SQL expression.*sqlalchemy.text"):
        dibs.claim(engine, work, where="status = 'ready'", set={"status": "running"})  # type: ignore[arg-type]
    with pytest.raises(dibs.InvalidArgument, match="where must hold SQL expressions"):
        dibs.claim(engine, work, where=[True], set={"status": "running"})  # type: ignore[list-item]
    assert ready_count(engine, work) == 3


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"where": True}, "where must be a SQL expression or a list of them, got True"),
        ({"order_by": 5}, "order_by must be a column name, a SQL expression or a list of them, got 5"),
        ({"order_by": None}, "order_by must be a column name, a SQL expression or a list of them, got None"),
        ({"set": [("status", "running")]}, "set must be a mapping of column"),
        ({"set": {"id": 99}}, r"set changes the primary key \(id\), by which the claimed rows are read back"),
    ],
    ids=["where-bool", "order-by-int", "order-by-none", "set-a-list", "set-the-key"],
)
def test_arguments_of_the_wrong_kind_are_invalid_and_claim_nothing(
    engine: sa.Engine, work: sa.Table, options: dict[str, Any], message: str
) -> None:
    arguments = {"set": {"status": "running"}, **options}
    with pytest.raises(dibs.InvalidArgument, match=message):
        dibs.claim(engine, work, **arguments)
    assert ready_count(engine, work) == 3


def test_an_unknown_order_by_column(engine: sa.Engine, work: sa.Table) -> None:
    with pytest.raises(dibs.InvalidArgument, match="order_by names 'priorty'"):
        dibs.claim(engine, work, set={"status": "running"}, order_by="priorty")


def test_an_unknown_or_mismatched_strategy(engine: sa.Engine, work: sa.Table) -> None:
    with pytest.raises(dibs.InvalidArgument, match=r"unknown claim strategy 'fast'.*portable"):
        dibs.claim(engine, work, set={"status": "running"}, strategy="fast")
    with pytest.raises(dibs.InvalidArgument, match="needs a postgresql database, but this engine is sqlite"):
        dibs.claim(engine, work, set={"status": "running"}, strategy="postgresql")
    assert ready_count(engine, work) == 3


def test_a_bind_that_is_not_an_engine_or_connection(work: sa.Table) -> None:
    with pytest.raises(dibs.InvalidArgument, match="needs a SQLAlchemy Engine or Connection, got str"):
        dibs.claim("sqlite://", work, set={"status": "running"})  # type: ignore[arg-type]


def test_not_a_table() -> None:
    with pytest.raises(dibs.InvalidArgument, match="expected a SQLAlchemy Table or an ORM mapped class"):
        dibs.claim(sa.create_engine("sqlite://"), "work", set={"status": "running"})


def test_a_bad_database_url() -> None:
    with pytest.raises(dibs.InvalidArgument, match=r"is not a database URL.*sqlite:///"):
        dibs.create_engine("not a url")


def test_lease_arguments(engine: sa.Engine) -> None:
    leased = sa.Table("leased", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True), *dibs.lease_columns())
    leased.create(engine)
    leases = dibs.Leases(leased)
    with pytest.raises(dibs.InvalidArgument, match="duration must be a positive"):
        leases.claim(engine, owner="w", duration=0)
    with pytest.raises(dibs.InvalidArgument, match=r"owner .*must be a string of 1 to 200 characters"):
        leases.claim(engine, owner="", duration=5)
    with pytest.raises(dibs.InvalidArgument, match="Leases\\(token=\\) names 'fence'"):
        dibs.Leases(leased, token="fence")


def test_an_orm_mapped_class_is_a_table(engine: sa.Engine) -> None:
    class Base(DeclarativeBase):
        pass

    class Job(Base):
        __tablename__ = "orm_jobs"
        id: Mapped[int] = mapped_column(primary_key=True)
        status: Mapped[str] = mapped_column(sa.String(10))

    Base.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(sa.insert(Job), [{"id": 1, "status": "ready"}, {"id": 2, "status": "ready"}])
    rows = dibs.claim(engine, Job, where=Job.status == "ready", set={Job.status: "running"}, order_by=Job.id, limit=5)
    assert [(row.id, row.status) for row in rows] == [(1, "running"), (2, "running")]


def test_sqlite_busy_past_its_timeout_raises_busy_and_claims_nothing(tmp_path: Path) -> None:
    path = tmp_path / "busy.sqlite"
    engine = dibs.create_engine(f"sqlite:///{path}", connect_args={"timeout": 0.2})
    work = sa.Table("work", sa.MetaData(), *work_columns())
    work.create(engine)
    with engine.begin() as conn:
        conn.execute(work.insert(), [{"id": 1}])
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the write lock
    try:
        started = time.monotonic()
        with pytest.raises(dibs.Busy, match="past its busy timeout; nothing was claimed") as busy:
            dibs.claim(engine, work, where=work.c.status == "ready", set={"status": "running"})
        assert time.monotonic() - started >= 0.15  # it waited on the busy handler first
        assert isinstance(busy.value.__cause__, sa.exc.OperationalError)
    finally:
        holder.rollback()
        holder.close()
    assert ready_count(engine, work) == 1
    assert len(dibs.claim(engine, work, where=work.c.status == "ready", set={"status": "running"})) == 1
    engine.dispose()


def test_every_error_is_a_dibs_error() -> None:
    for error in (dibs.InvalidArgument, dibs.InTransaction, dibs.Busy, dibs.LeaseLost):
        assert issubclass(error, dibs.DibsError)
    assert issubclass(dibs.InvalidArgument, ValueError)
    assert issubclass(dibs.FallbackWarning, dibs.DibsWarning)
    assert issubclass(dibs.DibsWarning, UserWarning)


def test_lease_claims_take_any_order_form_and_keep_it(engine: sa.Engine) -> None:
    class Base(DeclarativeBase):
        pass

    class Task(Base):
        __tablename__ = "ordered_tasks"
        id: Mapped[int] = mapped_column(primary_key=True)
        prio: Mapped[int] = mapped_column()
        status: Mapped[str] = mapped_column(sa.String(32), server_default="ready")
        lease_owner: Mapped[str | None] = mapped_column(sa.String(200))
        lease_expires_at: Mapped[Any] = mapped_column(dibs.Timestamp, nullable=True)
        lease_token: Mapped[int] = mapped_column(server_default="0")
        attempts: Mapped[int] = mapped_column(server_default="0")

    Base.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(sa.insert(Task), [{"id": i, "prio": i % 3} for i in range(1, 13)])
    leases = dibs.Leases(Task)
    table = leases.table

    def prios(order_by: Any) -> list[int]:
        return [lease.row.prio for lease in leases.claim(engine, owner="w", duration=30, limit=3, order_by=order_by)]

    assert prios(name for name in ("prio", "id")) == [0, 0, 0]  # a generator
    assert prios(["prio", "id"]) == [0, 1, 1]  # the same order as a list still sorts
    assert prios(Task.prio.desc()) == [2, 2, 2]  # an ORM attribute expression
    assert prios(table.c.prio.desc()) == [2, 1, 1]  # a fresh expression each call
    # One template per distinct column ordering, however the order is written and however often it is built.
    assert len(leases._claim_templates) == 2
    # Found again by the argument itself where that is names and columns (a list once, not a generator's
    # or an expression's, which are made anew by each call).
    with engine.begin() as conn:
        conn.execute(sa.update(table).values(status="ready"))
    assert prios(["prio", "id"]) == [0, 0, 0]
    assert prios(table.c.prio) == [0, 1, 1]
    assert prios((table.c.prio, "id")) == [1, 1, 2]
    assert len(leases._claim_templates) == 3  # ordered by prio alone is another
    assert len(leases._templates_by_argument) == 3
    assert (
        leases._templates_by_argument["sqlite", ("prio", "id")]
        is leases._claim_templates["sqlite", (("prio",), ("id",))]
    )


def test_a_single_lease_given_where_a_list_is_expected_is_refused(engine: sa.Engine) -> None:
    table = sa.Table(
        "single_lease", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True), *dibs.lease_columns()
    )
    table.create(engine)
    with engine.begin() as conn:
        conn.execute(sa.insert(table), [{"id": 1}])
    leases = dibs.Leases(table)
    (lease,) = leases.claim(engine, owner="w", duration=30)
    with pytest.raises(dibs.InvalidArgument, match=r"take a list of leases, got one Lease; pass \[lease\]"):
        leases.complete_many(engine, lease)  # type: ignore[arg-type]
    with engine.connect() as conn:
        assert conn.scalar(sa.select(table.c.status)) == "running"  # nothing written
    leases.complete(engine, lease)
