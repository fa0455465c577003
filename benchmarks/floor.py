"""The raw floor of the drain: one claim statement of a batch (the shape dibs uses) and, on a second
connection and thread, one batched, token-fenced completion of the batch before, on the bare driver."""

from __future__ import annotations

import json
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import sqlalchemy as sa

from benchmarks.connect import psycopg_connect

# -- the raw floor: one claim statement and one batched completion, in a loop, on the bare driver ---

PG_CLAIM = """
WITH picked AS MATERIALIZED (
    SELECT id FROM dibs_jobs
    WHERE status = 'queued' AND queue = 'default'
    ORDER BY priority DESC, run_at, id
    LIMIT %(batch)s FOR UPDATE SKIP LOCKED)
UPDATE dibs_jobs AS j SET status = 'running', lease_owner = %(owner)s,
    lease_expires_at = statement_timestamp() + interval '30 seconds', lease_token = j.lease_token + 1,
    attempts = j.attempts + 1, started_at = statement_timestamp()
WHERE j.id = ANY(ARRAY(SELECT id FROM picked))
RETURNING j.*
"""
# The held tokens as one JSON object from id to token, read per row by key (as dibs does).
PG_COMPLETE = """
UPDATE dibs_jobs SET status = 'succeeded', lease_expires_at = NULL, dedupe_key = NULL,
    finished_at = statement_timestamp()
WHERE id = ANY(%(ids)s::bigint[])
    AND lease_token = ((SELECT %(tokens)s::jsonb) ->> id::text)::bigint
    AND status = 'running'
RETURNING id
"""
SQLITE_COMPLETE = """
UPDATE dibs_jobs SET status = 'succeeded', lease_expires_at = NULL, dedupe_key = NULL, finished_at = ?
FROM json_each(?) AS held
WHERE dibs_jobs.id = CAST(held.key AS INTEGER) AND dibs_jobs.lease_token = held.value AND dibs_jobs.status = 'running'
RETURNING id
"""


def held_tokens(ids: list[int], tokens: list[int]) -> str:
    """The tokens of a fenced completion: a JSON object from each id to its token."""
    return json.dumps(dict(zip(ids, tokens, strict=True)))


#: The ids of a claimed batch and their lease tokens.
Held = tuple[list[int], list[int]]


def overlapped(claim: Callable[[], Held], complete: Callable[[list[int], list[int]], int]) -> int:
    """Claim batches on this thread while a second thread completes the previous one on a connection of its
    own, as dibs's worker overlaps them; returns the jobs completed. ``claim`` returns the ids and tokens it
    got, none once the queue is empty."""
    handoff: queue.Queue[Held | None] = queue.Queue(maxsize=1)
    done = 0

    def completer() -> None:
        nonlocal done
        while (held := handoff.get()) is not None:
            done += complete(*held)

    thread = threading.Thread(target=completer, name="raw-completer")
    thread.start()
    try:
        while (held := claim())[0]:
            handoff.put(held)
    finally:
        handoff.put(None)
        thread.join()
    return done


def raw_postgresql(url: str, batch: int, owner: str, start: Any) -> int:
    # Autocommit: each statement is atomic on its own, no BEGIN/COMMIT round trips.
    with psycopg_connect(url, autocommit=True) as claimer, psycopg_connect(url, autocommit=True) as completer:

        def claim() -> tuple[list[int], list[int]]:
            cursor = claimer.execute(PG_CLAIM, {"batch": batch, "owner": owner})
            rows = cursor.fetchall()
            token = [column.name for column in cursor.description or ()].index("lease_token")
            return [row[0] for row in rows], [row[token] for row in rows]

        def complete(ids: list[int], tokens: list[int]) -> int:
            return len(completer.execute(PG_COMPLETE, {"ids": ids, "tokens": held_tokens(ids, tokens)}).fetchall())

        start.wait()
        return overlapped(claim, complete)


SQLITE_CLAIM = """
UPDATE dibs_jobs SET status = 'running', lease_owner = ?, lease_expires_at = ?,
    lease_token = lease_token + 1, attempts = attempts + 1, started_at = ?
WHERE id IN (
    SELECT id FROM dibs_jobs WHERE status = 'queued' AND queue = 'default'
    ORDER BY priority DESC, run_at, id LIMIT ?)
RETURNING *
"""


def _sqlite_now(offset: float = 0.0) -> str:
    """UTC as dibs stores it in SQLite."""
    return str(datetime.now(timezone.utc).replace(tzinfo=None) + timedelta(seconds=offset))


def _sqlite_connect(url: str) -> sqlite3.Connection:
    conn = sqlite3.connect(sa.make_url(url).database or "", isolation_level=None, timeout=10, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def raw_sqlite(url: str, batch: int, owner: str, start: Any) -> int:
    claimer, completer = _sqlite_connect(url), _sqlite_connect(url)

    def claim() -> tuple[list[int], list[int]]:
        claimer.execute("BEGIN IMMEDIATE")
        cursor = claimer.execute(SQLITE_CLAIM, (owner, _sqlite_now(30.0), _sqlite_now(), batch))
        rows = cursor.fetchall()
        claimer.execute("COMMIT")
        token = [column[0] for column in cursor.description].index("lease_token")
        return [row[0] for row in rows], [row[token] for row in rows]

    def complete(ids: list[int], tokens: list[int]) -> int:
        completer.execute("BEGIN IMMEDIATE")
        finished = completer.execute(SQLITE_COMPLETE, (_sqlite_now(), held_tokens(ids, tokens))).fetchall()
        completer.execute("COMMIT")
        return len(finished)

    start.wait()
    done = overlapped(claim, complete)
    claimer.close()
    completer.close()
    return done


def _mariadb_connect(url: str) -> Any:
    import pymysql

    address = sa.make_url(url)
    conn = pymysql.connect(
        host=address.host,
        port=address.port or 3306,
        user=address.username,
        password=address.password or "",
        database=address.database,
    )
    conn.cursor().execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    return conn


def raw_mariadb(url: str, batch: int, owner: str, start: Any) -> int:
    claimer, completer = _mariadb_connect(url), _mariadb_connect(url)

    def claim() -> tuple[list[int], list[int]]:
        cursor = claimer.cursor()
        cursor.execute(
            "SELECT id FROM dibs_jobs WHERE status = 'queued' AND queue = 'default' "
            "ORDER BY priority DESC, run_at, id LIMIT %s FOR UPDATE SKIP LOCKED",
            (batch,),
        )
        ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            claimer.commit()
            return [], []
        marks = ", ".join(["%s"] * len(ids))
        cursor.execute(
            "UPDATE dibs_jobs SET status = 'running', lease_owner = %s, "
            "lease_expires_at = TIMESTAMPADD(MICROSECOND, 30000000, UTC_TIMESTAMP(6)), "
            "lease_token = lease_token + 1, attempts = attempts + 1, started_at = UTC_TIMESTAMP(6) "
            f"WHERE id IN ({marks})",
            (owner, *ids),
        )
        cursor.execute(f"SELECT * FROM dibs_jobs WHERE id IN ({marks})", ids)
        rows = cursor.fetchall()
        claimer.commit()
        token = [column[0] for column in cursor.description].index("lease_token")
        return [row[0] for row in rows], [row[token] for row in rows]

    def complete(ids: list[int], tokens: list[int]) -> int:
        marks = ", ".join(["%s"] * len(ids))
        pairs = ", ".join(["(%s, %s)"] * len(ids))
        finished = completer.cursor().execute(
            "UPDATE dibs_jobs SET status = 'succeeded', lease_expires_at = NULL, dedupe_key = NULL, "
            f"finished_at = UTC_TIMESTAMP(6) WHERE id IN ({marks}) AND (id, lease_token) IN ({pairs}) "
            "AND status = 'running'",
            [*ids, *(value for pair in zip(ids, tokens, strict=True) for value in pair)],
        )
        completer.commit()
        return int(finished)

    start.wait()
    done = overlapped(claim, complete)
    claimer.close()
    completer.close()
    return done


RAW = {"postgresql": raw_postgresql, "sqlite": raw_sqlite, "mariadb": raw_mariadb}


def raw_drain(
    backend: str, url: str, setting: dict[str, Any], owner: str, start: Any
) -> tuple[int, float, dict[str, Any]]:
    done = RAW[backend](url, setting["batch"], owner, start)
    return done, time.monotonic(), {}
