"""Upkeep scheduling: each chore runs at once, then every interval of its own from the end of its last run;
one that fails is reported and does not hold up the others."""

from __future__ import annotations

import asyncio

from dibs.runtime import Chore, Upkeep, until_done


async def nothing() -> None:
    return None


def test_a_chore_that_has_not_run_is_due_at_once() -> None:
    chore = Chore("sweep", 60.0, nothing)
    assert chore.is_due(now=0.0)
    assert chore.due_in(now=0.0) == 0.0


def test_a_chore_is_due_again_its_interval_after_its_last_run() -> None:
    chore = Chore("sweep", 60.0, nothing, last=100.0)
    assert not chore.is_due(now=159.9)
    assert chore.due_in(now=130.0) == 30.0
    assert chore.is_due(now=160.0)


def test_only_the_chores_due_run_and_the_wait_is_until_the_next_one() -> None:
    often = Chore("promote", 1.0, nothing, last=10.0)
    rarely = Chore("purge", 60.0, nothing, last=10.0)
    upkeep = Upkeep([often, rarely])
    assert upkeep.due(now=10.5) == []
    assert upkeep.wait(now=10.5) == 0.5
    assert upkeep.due(now=11.0) == [often]
    assert upkeep.due(now=70.0) == [often, rarely]


def test_a_failing_chore_is_reported_and_the_others_still_run() -> None:
    ran: list[str] = []
    failures: list[tuple[str, str]] = []

    async def broken() -> None:
        ran.append("broken")
        raise ConnectionError("away")

    async def fine() -> None:
        ran.append("fine")

    upkeep = Upkeep(
        [Chore("broken", 1.0, broken), Chore("fine", 1.0, fine)],
        failed=lambda chore, error: failures.append((chore.name, str(error))),
    )
    asyncio.run(upkeep.run_due())
    assert ran == ["broken", "fine"]
    assert failures == [("broken", "away")]
    assert all(chore.last is not None for chore in upkeep.chores)  # a failed run waits its interval too


def test_a_round_asked_to_stop_runs_no_further_chore() -> None:
    """A burst worker waits for its first round before claiming: a stop asked for meanwhile ends it there."""
    ran: list[str] = []
    stop = False

    async def slow() -> None:
        nonlocal stop
        ran.append("slow")
        stop = True  # a SIGTERM while it ran

    async def fine() -> None:
        ran.append("fine")

    upkeep = Upkeep([Chore("slow", 1.0, slow), Chore("fine", 1.0, fine)])
    asyncio.run(upkeep.run_due(lambda: stop))
    assert ran == ["slow"]
    assert [chore.last is None for chore in upkeep.chores] == [False, True]  # the other is still due


def test_running_repeats_each_chore_on_its_own_interval() -> None:
    counts = {"fast": 0, "slow": 0}

    def counting(name: str) -> Chore:
        async def work() -> None:
            counts[name] += 1

        return Chore(name, 0.05 if name == "fast" else 10.0, work)

    async def scenario() -> None:
        task = asyncio.create_task(Upkeep([counting("fast"), counting("slow")]).run())
        await asyncio.sleep(0.3)
        task.cancel()

    asyncio.run(scenario())
    assert counts["slow"] == 1
    assert 3 <= counts["fast"] <= 7


def test_a_chore_until_done_stops_asking_once_its_step_says_it_is_done() -> None:
    answers = [False, False, True, False]
    asked: list[bool] = []

    async def step() -> bool:
        asked.append(answers[len(asked)])
        return asked[-1]

    chore = until_done("statistics", 1.0, step)

    async def turns() -> None:
        for _ in range(4):
            await chore.work()

    asyncio.run(turns())
    assert asked == [False, False, True]


def test_a_chore_until_done_whose_step_failed_asks_again_at_its_next_turn() -> None:
    asked: list[int] = []

    async def step() -> bool:
        asked.append(len(asked))
        if len(asked) == 1:
            raise ConnectionError("the database went away")
        return True

    failures: list[str] = []
    upkeep = Upkeep([until_done("statistics", 0.0, step)], failed=lambda chore, error: failures.append(str(error)))
    asyncio.run(upkeep.run_due())
    asyncio.run(upkeep.run_due())
    asyncio.run(upkeep.run_due())
    assert failures == ["the database went away"]
    assert asked == [0, 1]
