"""Input checks that need no database: URLs, task names, the metrics extra, the CLI's one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa

import dibs
from dibs.engine import shown_url

DIBS = str(Path(sys.executable).with_name("dibs"))
ROOT = Path(__file__).resolve().parents[2]
BAD_PORT = "postgresql+psycopg://shop:s3cret-pw@db.example:abc/shop"


def test_a_url_with_a_port_that_is_not_a_number_is_an_invalid_argument_without_the_password() -> None:
    for make in (dibs.App, dibs.Outbox, dibs.create_engine):
        with pytest.raises(dibs.InvalidArgument, match="its port 'abc' is not a number") as caught:
            make(BAD_PORT)
        assert "s3cret-pw" not in str(caught.value)
        assert "shop:***@db.example:abc" in str(caught.value)


def test_a_password_given_as_a_query_option_is_not_shown_either() -> None:
    in_query = "postgresql+psycopg://shop@db.example:abc/shop?sslmode=require&password=s3cret-pw"
    with pytest.raises(dibs.InvalidArgument, match="its port 'abc' is not a number") as caught:
        dibs.create_engine(in_query)
    assert "s3cret-pw" not in str(caught.value)
    assert "?sslmode=require&password=***" in str(caught.value)
    shown = shown_url(sa.make_url("mysql+pymysql://shop:pw1@db/shop?charset=utf8mb4&ssl_password=pw2"))
    assert shown == "mysql+pymysql://shop:***@db/shop?charset=utf8mb4&ssl_password=***"


@pytest.mark.parametrize("where", ["--db", "env"])
@pytest.mark.parametrize(
    "command",
    [["status"], ["outbox", "status"], ["jobs", "list"], ["enqueue", "tests.acceptance.cli_app:app", "greet"]],
)
def test_every_command_given_a_bad_port_prints_one_line_and_no_password(
    tmp_path: Path, where: str, command: list[str]
) -> None:
    env = {**os.environ, "DIBS_CLI_TEST_OUT": str(tmp_path / "out.txt")}
    env.pop("DIBS_DATABASE_URL", None)
    if where == "env":
        env["DIBS_DATABASE_URL"] = BAD_PORT
        argv = [DIBS, *command]
    else:
        argv = [DIBS, "--db", BAD_PORT, *command]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "Error: the database URL 'postgresql+psycopg://shop:***@db.example:abc/shop' is not valid: its port 'abc' "
        "is not a number; write it as dialect+driver://user:password@host:port/database, with the port a number "
        "such as 5432"
    ]


def run_script(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)


def test_a_task_defined_in_a_script_without_a_name_warns_how_to_name_it(tmp_path: Path) -> None:
    done = run_script(
        tmp_path,
        """
        import dibs

        app = dibs.App("sqlite:///never-opened.sqlite")

        @app.task
        def send_receipt(order_id: int) -> None: ...

        @app.task(name="shop.ship")
        def ship() -> None: ...

        @app.task(queue="mail")
        def send_mail() -> None: ...

        print(sorted(app.tasks))
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['__main__.send_mail', '__main__.send_receipt', 'shop.ship']"
    warning = "script.py:6: DibsWarning: task '__main__.send_receipt' is defined in a script run as __main__"
    assert warning in done.stderr
    assert "@app.task(name='send_receipt')" in done.stderr
    assert "script.py:12: DibsWarning: task '__main__.send_mail'" in done.stderr
    assert done.stderr.count("DibsWarning") == 2


def test_a_worker_given_a_metrics_port_without_the_extra_says_which_extra_to_install(tmp_path: Path) -> None:
    done = run_script(
        tmp_path,
        """
        import sys

        sys.modules["prometheus_client"] = None  # as if the metrics extra were not installed
        import dibs

        app = dibs.App("sqlite:///never-opened.sqlite")

        @app.task(name="shop.ship")
        def ship() -> None: ...

        app.worker(handle_signals=False)  # no metrics: fine without the extra
        try:
            app.worker(metrics_port=0, handle_signals=False)
        except dibs.InvalidArgument as error:
            print(error)
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "serving metrics (metrics_port, --metrics-port) needs the prometheus-client package, which the metrics "
        'extra installs: pip install "dibs-sql[metrics]"'
    )


def test_a_task_is_found_by_its_full_name_or_by_its_function_when_that_is_unambiguous() -> None:
    app = dibs.App("sqlite:///never-opened.sqlite")

    @app.task(name="emails.send")
    def send(to: str) -> None: ...

    @app.task(name="shop.slow")
    def slow() -> None: ...

    @app.task(name="shop.slow_too")
    def slow_too() -> None: ...

    assert app.task_named("emails.send") is send
    assert app.task_named("send") is send
    assert app.task_named("slow_too") is slow_too
    assert app.task_named("slow") is slow
    app.task(name="other.slow")(slow.function)
    with pytest.raises(dibs.UnknownTask, match=r"'slow' is the function of several tasks \(other.slow, shop.slow\)"):
        app.task_named("slow")
    with pytest.raises(dibs.UnknownTask, match=r"no task named 'nope' is registered; registered tasks: emails\.send"):
        app.task_named("nope")
    # Code enqueues by the full name, which keeps resolving whatever other tasks are registered later.
    with pytest.raises(dibs.UnknownTask, match=r"no task named 'send' is registered; did you mean 'emails\.send'"):
        app.enqueue("send", {"to": "a@example.com"})


def test_dibs_enqueue_finds_a_task_of_the_app_it_was_given_by_its_function_name(tmp_path: Path) -> None:
    (tmp_path / "tasks_mod.py").write_text(
        textwrap.dedent(
            """
            import dibs

            app = dibs.App()

            @app.task
            def slow(seconds: float) -> None: ...

            @app.task
            def fast() -> None: ...
            """
        )
    )
    env = {**os.environ, "DIBS_DATABASE_URL": f"sqlite:///{tmp_path / 'jobs.sqlite'}"}

    def dibs_command(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([DIBS, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)

    assert dibs_command("init").returncode == 0
    done = dibs_command("enqueue", "tasks_mod:app", "slow", '{"seconds": 1}')
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("enqueued job 1 (tasks_mod.slow) on queue default")
    unknown = dibs_command("enqueue", "tasks_mod:app", "sloww")
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == (
        "Error: no task named 'sloww' is registered; registered tasks: tasks_mod.fast, tasks_mod.slow"
    )
    misfit = dibs_command("enqueue", "tasks_mod:app", "slow", '{"secs": 1}')
    assert misfit.returncode == 1
    assert "do not fit the task: missing a required argument: 'seconds'" in misfit.stderr
    assert "Traceback" not in unknown.stderr + misfit.stderr
