"""The batch writer: items that come while a write runs go together in the next; a full or aged batch is
written; a failed write is kept and tried again; stopping writes what is left."""

from __future__ import annotations

import asyncio

from dibs.runtime import BatchWriter
from dibs.runtime.batch_writer import is_due


def test_nothing_is_due_without_items() -> None:
    assert not is_due(0, 100.0, size=1, age=0.0)


def test_with_no_age_anything_collected_is_due_at_once() -> None:
    assert is_due(1, 0.0, size=None, age=0.0)


def test_with_an_age_a_batch_is_due_when_full_or_old_enough() -> None:
    assert not is_due(9, 0.5, size=10, age=1.0)
    assert is_due(10, 0.5, size=10, age=1.0)
    assert is_due(1, 1.0, size=10, age=1.0)
    assert not is_due(1_000, 0.5, size=None, age=1.0)


def test_items_that_come_while_a_write_runs_go_together_in_the_next() -> None:
    written: list[list[int]] = []

    async def scenario() -> None:
        release = asyncio.Event()

        async def write(batch: list[int]) -> None:
            written.append(batch)
            if len(written) == 1:
                await release.wait()

        writer: BatchWriter[int] = BatchWriter(write)
        writer.start()
        writer.add(1)
        await asyncio.sleep(0.01)  # the first write begins, and waits
        for item in (2, 3, 4):
            writer.add(item)
        assert writer.pending == 3
        assert writer.writing == 1
        release.set()
        await writer.stop()

    asyncio.run(scenario())
    assert written == [[1], [2, 3, 4]]


def test_a_batch_waits_for_its_age_unless_it_fills_first() -> None:
    written: list[list[int]] = []

    async def scenario() -> None:
        async def write(batch: list[int]) -> None:
            written.append(batch)

        writer: BatchWriter[int] = BatchWriter(write, size=3, age=0.2)
        writer.start()
        writer.add(1)
        await asyncio.sleep(0.05)
        assert written == []  # neither full nor old enough
        writer.add(2)
        writer.add(3)
        await asyncio.sleep(0.05)
        assert written == [[1, 2, 3]]  # full before its age
        writer.add(4)
        await asyncio.sleep(0.3)
        assert written == [[1, 2, 3], [4]]  # old enough
        await writer.stop()

    asyncio.run(scenario())


def test_a_failed_write_is_reported_kept_and_tried_again_with_what_came_meanwhile() -> None:
    attempts: list[list[int]] = []
    failures: list[tuple[str, list[int]]] = []

    async def scenario() -> None:
        async def write(batch: list[int]) -> None:
            attempts.append(list(batch))
            if len(attempts) == 1:
                raise ConnectionError("away")

        writer: BatchWriter[int] = BatchWriter(
            write, failed=lambda error, batch: failures.append((str(error), list(batch))), retry_after=0.05
        )
        writer.start()
        writer.add(1)
        await asyncio.sleep(0.01)
        writer.add(2)
        await asyncio.sleep(0.15)
        await writer.stop()

    asyncio.run(scenario())
    assert failures == [("away", [1])]
    assert attempts == [[1], [1, 2]]


def test_stopping_finishes_the_write_under_way_and_writes_what_is_left() -> None:
    written: list[list[int]] = []

    async def scenario() -> None:
        async def write(batch: list[int]) -> None:
            await asyncio.sleep(0.05)
            written.append(batch)

        writer: BatchWriter[int] = BatchWriter(write)
        writer.start()
        writer.add(1)
        await asyncio.sleep(0.01)
        writer.add(2)
        await writer.stop()
        assert writer.pending == 0
        assert writer.writing == 0

    asyncio.run(scenario())
    assert written == [[1], [2]]
