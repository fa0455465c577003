"""The Django backend in a real Django project (tests/django/project), on PostgreSQL, MariaDB and SQLite: Django's
migrate creates the dibs tables, @task functions enqueue in the request's transaction, manage.py dibs_worker
runs them, results read back as the task framework has them, and the admin lists, retries and cancels jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from dibs.schema import LATEST, current_version
from tests.helpers.targets import MARIADB_URL, POSTGRES_URL, with_driver

PROJECT = Path(__file__).with_name("manage.py").parent


#: Per server: the SQLAlchemy driver that creates the test's database, and Django's engine for it.
SERVERS = {
    "postgresql": (POSTGRES_URL, "postgresql+psycopg", "django.db.backends.postgresql"),
    "mariadb": (MARIADB_URL, "mysql+pymysql", "django.db.backends.mysql"),
}


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def django_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A DATABASES entry for an empty database of the test's own."""
    if request.param == "sqlite":
        yield {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "site.sqlite")}
        return
    server, driver, engine = SERVERS[request.param]
    name = f"dibs_django_{os.getpid()}"
    quoted = f'"{name}"' if request.param == "postgresql" else f"`{name}`"
    admin = sa.create_engine(with_driver(server, driver), isolation_level="AUTOCOMMIT")
    drop = f"DROP DATABASE IF EXISTS {quoted}" + (" WITH (FORCE)" if request.param == "postgresql" else "")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(drop)
            conn.exec_driver_sql(f"CREATE DATABASE {quoted}")
    except sa.exc.OperationalError as exc:
        admin.dispose()
        pytest.fail(f"{request.param} is not reachable at {server}: {exc}")
    url = sa.make_url(server)
    yield {
        "ENGINE": engine,
        "NAME": name,
        "USER": url.username or "",
        "PASSWORD": url.password or "",
        "HOST": url.host or "",
        "PORT": str(url.port or ""),
    }
    with admin.connect() as conn:
        conn.exec_driver_sql(drop)
    admin.dispose()


class Project:
    """The test project, run with manage.py as its developers run it."""

    def __init__(self, database: dict[str, Any], tmp_path: Path) -> None:
        self.log = tmp_path / "tasks.log"
        self.env = {**os.environ, "DIBS_DJANGO_DATABASE": json.dumps(database), "DIBS_DJANGO_LOG": str(self.log)}
        self.env.pop("DIBS_DATABASE_URL", None)

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=PROJECT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"manage.py {args[0]} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def shell(self, code: str) -> Any:
        """Run ``code`` in manage.py shell; what it assigns to ``out`` comes back (as JSON)."""
        script = textwrap.dedent(code) + "\nimport json\nprint('OUT=' + json.dumps(out))\n"
        printed = self.manage("shell", "-c", script)
        return json.loads(printed.split("OUT=", 1)[1])

    def tasks_ran(self) -> list[str]:
        return self.log.read_text(encoding="utf-8").splitlines() if self.log.exists() else []


@pytest.fixture
def project(django_database: dict[str, Any], tmp_path: Path) -> Project:
    project = Project(django_database, tmp_path)
    project.manage("migrate", "--verbosity", "0")
    return project


def dibs_url(project: Project) -> str:
    return project.shell(
        """
        from django.db import connection
        from dibs.django.database import url_of
        out = url_of(connection.settings_dict).render_as_string(hide_password=False)
        """
    )


def test_django_migrate_creates_the_dibs_tables(project: Project) -> None:
    engine = sa.create_engine(dibs_url(project))
    try:
        assert current_version(engine) == LATEST
        assert dibs.migrate(engine) == []
    finally:
        engine.dispose()


def test_a_task_enqueued_in_a_rolled_back_transaction_leaves_no_job(project: Project) -> None:
    ids = project.shell(
        """
        from django.db import transaction
        from project.tasks import add
        try:
            with transaction.atomic():
                add.enqueue(1, 1)
                raise RuntimeError("the request failed")
        except RuntimeError:
            pass
        import sqlalchemy as sa
        from django.db import connection
        from dibs.django.database import url_of

        elsewhere = sa.create_engine(url_of(connection.settings_dict))
        with transaction.atomic():
            kept = add.enqueue(2, 3)
            with elsewhere.connect() as other:  # another connection sees no job before the commit
                seen_before_commit = other.exec_driver_sql("SELECT count(*) FROM dibs_jobs").scalar()
        elsewhere.dispose()
        out = [kept.id, kept.status, seen_before_commit]
        """
    )
    assert ids[1:] == ["READY", 0]
    app = dibs.App(dibs_url(project))
    try:
        assert [job.id for job in app.jobs()] == [int(ids[0])]
    finally:
        app.engine.dispose()


def test_the_worker_command_runs_the_tasks_and_results_read_back(project: Project) -> None:
    ids = project.shell(
        """
        from project.tasks import add, boom, send, which
        out = [add.enqueue(2, 3).id, boom.enqueue().id, send.enqueue("ada@example.com").id, which.enqueue("w").id]
        """
    )
    project.manage("dibs_worker", "--burst")
    assert sorted(project.tasks_ran()) == ["add 2 3", "send ada@example.com", "which w attempt 1"]
    results = project.shell(
        f"""
        from project.tasks import add, boom
        good, bad = add.get_result({ids[0]!r}), boom.get_result({ids[1]!r})
        out = [good.status, good.return_value, good.args, bad.status, bad.errors[0].exception_class_path,
               "boom" in bad.errors[0].traceback, good.finished_at is not None]
        """
    )
    assert results == ["SUCCESSFUL", 5, [2, 3], "FAILED", "builtins.ValueError", True, True]


def test_a_result_refreshes_to_the_return_value_the_worker_kept(project: Project) -> None:
    shown = project.shell(
        """
        from project.tasks import add, boom, pair
        from dibs.django.framework import TaskResultDoesNotExist, task_backends

        backend = task_backends["default"]
        total, failed, both = add.enqueue(20, 22), boom.enqueue(), pair.enqueue("a")
        before = [total.status, total.is_finished]
        try:
            total.return_value
        except ValueError as exc:
            before.append(str(exc))
        backend.app.worker(burst=True, queues=["default"], handle_signals=False).run()
        total.refresh()
        failed.refresh()
        try:
            failed.return_value
        except ValueError as exc:
            failure = str(exc)
        import dibs

        plain = dibs.App(backend.app.engine)
        plain.task(name="shop.plain")(lambda: None)
        missing = []
        for result_id in [str(plain.enqueue("shop.plain").id), "not-a-number", "999999"]:
            try:
                backend.get_result(result_id)
            except TaskResultDoesNotExist:
                missing.append(result_id)
        missing = len(missing)
        out = [*before, total.status, total.return_value, total.errors, pair.get_result(both.id).return_value,
               failed.status, failure, failed.errors[0].traceback.strip().splitlines()[-1], missing,
               [backend.supports_get_result, backend.supports_defer, backend.supports_async_task,
                backend.supports_priority]]
        """
    )
    assert shown == [
        "READY", False, "Task has not finished yet", "SUCCESSFUL", 42, [], ["a", ["a", 1]],
        "FAILED", "Task failed", "ValueError: boom", 3, [True, True, True, True],
    ]  # fmt: skip


def test_the_admin_lists_jobs_and_retries_and_cancels_them(project: Project) -> None:
    shown = project.shell(
        """
        from django.contrib.auth.models import User
        from django.test import Client
        from project.tasks import add, boom
        from dibs.django.framework import task_backends

        User.objects.create_superuser("admin", "admin@example.com", "pw")
        waiting, failed = add.enqueue(1, 2), boom.enqueue()
        task_backends["default"].app.worker(burst=True, queues=["default"], handle_signals=False).run()
        later = add.enqueue(5, 5)
        client = Client()
        client.login(username="admin", password="pw")
        listing = client.get("/admin/dibs/job/")
        page = listing.content.decode()
        retried = client.post("/admin/dibs/job/", {"action": "retry", "_selected_action": [failed.id]})
        cancelled = client.post("/admin/dibs/job/", {"action": "cancel", "_selected_action": [later.id]})
        detail = client.get(f"/admin/dibs/job/{later.id}/change/")
        out = [listing.status_code, "django.task" in page, retried.status_code,
               cancelled.status_code, add.get_result(later.id).status, boom.get_result(failed.id).status,
               detail.status_code]
        """
    )
    assert shown == [200, True, 302, 302, "FAILED", "READY", 200]
