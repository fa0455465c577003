"""The pytest plugin, as a project that installs dibs uses it: its fixtures, drain, assertions and eager mode, run
by pytest itself in a fresh test directory."""

from __future__ import annotations

import pytest

TASKS = """
import dibs

app = dibs.App("sqlite:///production.sqlite")
ran = []


@app.task
def add(a: int, b: int) -> int:
    ran.append((a, b))
    return a + b


@app.task(max_attempts=1)
def fail() -> None:
    raise RuntimeError("no")


@app.task
def fan_out(n: int) -> None:
    for i in range(n):
        add.enqueue({"a": i, "b": i})
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(tasks=TASKS)
    pytester.makeini("[pytest]\nfilterwarnings = error\ndibs_app = tasks:app\n")
    return pytester


def test_drain_runs_every_waiting_job_and_those_they_enqueue(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_drain="""
        from dibs.testing import drain
        import tasks

        def test_it(dibs_app):
            tasks.fan_out.enqueue({"n": 2})
            tasks.fail.enqueue()
            outcomes = drain(dibs_app)
            assert [job.task.rsplit(".", 1)[1] for job in outcomes] == ["fan_out", "fail", "add", "add"]
            assert [job.status for job in outcomes] == ["succeeded", "dead", "succeeded", "succeeded"]
            assert drain(dibs_app) == []
        """
    )
    project.runpytest_subprocess("-q").assert_outcomes(passed=1)


def test_assert_enqueued_matches_named_arguments_and_explains_a_miss(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_assert="""
        import pytest
        from dibs.testing import assert_enqueued
        import tasks

        def test_found(dibs_app):
            tasks.add.enqueue({"a": 1, "b": 2})
            assert assert_enqueued(dibs_app, tasks.add, a=1).args == {"a": 1, "b": 2}

        def test_missed(dibs_app):
            tasks.add.enqueue({"a": 1, "b": 2})
            with pytest.raises(AssertionError, match="waiting:\\n  1: {'a': 1, 'b': 2}"):
                assert_enqueued(dibs_app, tasks.add, a=5)

        def test_each_test_starts_empty(dibs_app):
            with pytest.raises(AssertionError, match="none"):
                assert_enqueued(dibs_app, "add")
        """
    )
    project.runpytest_subprocess("-q").assert_outcomes(passed=3)


def test_eager_runs_a_job_as_it_is_enqueued(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_eager="""
        from dibs.testing import eager
        import tasks

        def test_it(dibs_app):
            with eager(dibs_app) as ran:
                job = tasks.add.enqueue({"a": 2, "b": 3})
                assert job.status == "succeeded"
                assert tasks.ran == [(2, 3)]
            assert [job.status for job in ran] == ["succeeded"]
            assert tasks.add.enqueue({"a": 0, "b": 0}).status == "queued"
        """
    )
    project.runpytest_subprocess("-q").assert_outcomes(passed=1)


def test_eager_runs_batches_chains_and_groups_too(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_eager_all="""
        import dibs
        from dibs.testing import eager
        import tasks

        def test_it(dibs_app):
            with eager(dibs_app) as ran:
                batch = dibs_app.enqueue_many(tasks.add, [{"a": 1, "b": 1}, {"a": 2, "b": 2}])
                assert [job.status for job in batch] == ["succeeded", "succeeded"]
                chained = dibs_app.chain(dibs.Step(tasks.add, {"a": 3, "b": 3}), dibs.Step(tasks.add, {"a": 4, "b": 4}))
                assert [job.result(timeout=5) for job in chained] == [6, 8]
                then = dibs.Step(tasks.add, {"a": 6, "b": 6})
                grouped = dibs_app.group([dibs.Step(tasks.add, {"a": 5, "b": 5})], then=then)
                assert [job.status for job in grouped] == ["succeeded", "succeeded"]
            assert tasks.ran == [(1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 6)]
            assert len(ran) == 6
        """
    )
    project.runpytest_subprocess("-q").assert_outcomes(passed=1)


def test_assert_enqueued_finds_a_job_waiting_for_another(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_waiting="""
        from dibs.testing import assert_enqueued
        import tasks

        def test_it(dibs_app):
            first = tasks.add.enqueue({"a": 1, "b": 1})
            tasks.add.enqueue({"a": 2, "b": 2}, after=[first])
            assert assert_enqueued(dibs_app, tasks.add, a=2).status == "waiting"
        """
    )
    project.runpytest_subprocess("-q").assert_outcomes(passed=1)


def test_the_database_option_points_the_fixtures_elsewhere(project: pytest.Pytester) -> None:
    url = f"sqlite:///{project.path / 'chosen.sqlite'}"
    project.makepyfile(
        test_url=f"""
        import tasks

        def test_it(dibs_url, dibs_app):
            assert dibs_url == {url!r}
            assert dibs_app is tasks.app and dibs_app.url == dibs_url

        def test_the_app_gets_its_own_database_back_after(dibs_app):
            pass

        def test_after():
            assert tasks.app.url == "sqlite:///production.sqlite"
        """
    )
    project.runpytest_subprocess("-q", f"--dibs-db={url}").assert_outcomes(passed=3)
    assert (project.path / "chosen.sqlite").exists()
