"""The ``dibs`` command: create the tables, run workers, enqueue, inspect and manage jobs, relay and inspect
outbox events, run the demo.

The database comes from ``--db``, else ``$DIBS_DATABASE_URL``, else the SQLite file ``dibs.sqlite``.
``APP`` is where an app lives, as ``module:attribute`` (``myproject.tasks:app``); the current directory
is on the import path.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import shutil
import sys
from datetime import timedelta
from typing import Any

try:
    import click
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
except ImportError:  # pragma: no cover - exercised only without the extra
    click = None  # type: ignore[assignment]

import sqlalchemy as sa

import dibs
from dibs.outbox import Outbox
from dibs.queue.app import App, database_url
from dibs.schema import EVENT_STATES, FINISHED, STATES, missing_tables, require_current


def main() -> None:
    """The console script's entry point."""
    if click is None:
        sys.stderr.write("the dibs command needs click and rich; install them with: pip install 'dibs[cli]'\n")
        raise SystemExit(2)
    command(prog_name="dibs")


def _fail(message: str) -> None:
    raise click.ClickException(message)


def _load_app(spec: str) -> App:
    module_name, _, attribute = spec.partition(":")
    if not module_name:
        _fail(f"APP must look like module:attribute (for example myproject.tasks:app), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        _fail(f"cannot import {module_name!r} ({exc}); run dibs from your project's directory or fix APP")
    except dibs.DibsError as exc:  # an App made as the module loads, on a URL that can never work
        _fail(str(exc))
    if not attribute:
        found = [value for value in vars(module).values() if isinstance(value, App)]
        if len(found) != 1:
            _fail(f"{module_name!r} has {len(found)} dibs.App objects; name one as {module_name}:attribute")
        return found[0]
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        _fail(f"{spec!r} is not a dibs.App (it is {type(app).__name__})")
    return app  # type: ignore[return-value]


def _console() -> Console:
    """Tables stay readable when piped: at least 120 columns wide."""
    return Console(width=max(shutil.get_terminal_size().columns, 120))


def _app(ctx: click.Context) -> App:
    """The app on --db, for commands that read or change jobs: its tables must exist."""
    app: App = _run(lambda: App(ctx.obj["db"]))
    _run(lambda: require_current(app.engine))
    return app


def _outbox(ctx: click.Context, **options: Any) -> Outbox:
    """The outbox on --db, for commands that read or change events: its table must exist."""
    outbox: Outbox = _run(lambda: Outbox(ctx.obj["db"], **options))
    _run(lambda: require_current(outbox.engine))
    return outbox


def _run(action: Any) -> Any:
    """Run an action, turning dibs and database errors into a clear message and exit status 1."""
    try:
        return action()
    except dibs.DibsError as exc:
        raise click.ClickException(str(exc)) from exc
    except sa.exc.DBAPIError as exc:
        first = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc)
        raise click.ClickException(
            f"the database refused or could not be reached: {first}; check --db (or $DIBS_DATABASE_URL) "
            "and that the database server is running"
        ) from exc


if click is not None:

    @click.group(help=__doc__)
    @click.option(
        "--db", envvar="DIBS_DATABASE_URL", default=None, help="Database URL (default: sqlite:///dibs.sqlite)."
    )
    @click.pass_context
    def command(ctx: click.Context, db: str | None) -> None:
        ctx.ensure_object(dict)
        ctx.obj["db"] = database_url(db)
        # Apps the user's modules create without a URL use the same database.
        os.environ["DIBS_DATABASE_URL"] = ctx.obj["db"]

    @command.command(help="Create the dibs tables, or upgrade them to this version of dibs.")
    @click.pass_context
    def init(ctx: click.Context) -> None:
        app: App = _run(lambda: App(ctx.obj["db"]))
        gone = _run(lambda: missing_tables(app.engine))
        applied = _run(app.init)
        where = app.engine.url.render_as_string(hide_password=True)
        if applied:
            click.echo(f"applied migration(s) {', '.join(map(str, applied))} to {where}")
        if gone:
            click.echo(f"created the missing table{'s' if len(gone) > 1 else ''} {', '.join(gone)} in {where} again")
        if not applied and not gone:
            click.echo(f"{where} is up to date")

    @command.command(help="Run a worker for the tasks of APP (module:attribute) until SIGTERM or SIGINT.")
    @click.argument("app_spec", metavar="APP")
    @click.option("--queues", "-q", default=None, help="Comma-separated queues (default: all of the app's).")
    @click.option("--tags", default="", help="Comma-separated version/capability tags this worker has.")
    @click.option("--concurrency", "-c", default=10, show_default=True, help="Jobs run at once.")
    @click.option("--batch", default=None, type=int, help="Jobs claimed per round trip (default: 2 x concurrency).")
    @click.option("--lease", default=30.0, show_default=True, help="Seconds a claim is held (renewed by heartbeats).")
    @click.option("--grace", default=30.0, show_default=True, help="Seconds running jobs get to finish at shutdown.")
    @click.option("--retention", default=None, type=float, help="Purge finished jobs older than this many hours.")
    @click.option("--metrics-port", default=None, type=int, help="Serve Prometheus metrics on this port.")
    @click.option(
        "--connections",
        default=None,
        type=click.IntRange(1, 2),
        help="Database connections: 2 lets a claim run while successes are written, 1 has them take turns "
        "(spares a database short of CPU). Default: 2, 1 on SQLite.",
    )
    @click.option("--burst", is_flag=True, help="Exit when no job is queued, scheduled or running.")
    def worker(
        app_spec: str,
        queues: str | None,
        tags: str,
        concurrency: int,
        batch: int | None,
        lease: float,
        grace: float,
        retention: float | None,
        metrics_port: int | None,
        connections: int | None,
        burst: bool,
    ) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        app = _load_app(app_spec)
        runner = _run(
            lambda: app.worker(
                queues=None if queues is None else [q for q in queues.split(",") if q],
                tags=[t for t in tags.split(",") if t],
                concurrency=concurrency,
                batch=batch,
                lease=lease,
                grace=grace,
                retention=None if retention is None else timedelta(hours=retention),
                metrics_port=metrics_port,
                connections=connections,
                burst=burst,
                # This process runs the worker and nothing else.
                tune_gc=True,
            )
        )
        stats = _run(runner.run)
        click.echo(
            f"worker stopped: {stats.succeeded} succeeded, {stats.retried} retried, {stats.dead} dead, "
            f"{stats.cancelled} cancelled, {stats.released} released"
        )
        if runner.abandoned:
            # Their threads cannot be stopped and their leases are no longer renewed: ending the process
            # now stops them, as a crash would, so that they do not run on beside a second run elsewhere.
            click.echo(
                f"{runner.abandoned} sync job(s) were still running past the grace period; they stop with "
                "this process and run again once their leases expire",
                err=True,
            )
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)

    @command.command(help="Enqueue a job of TASK from APP, with ARGS as a JSON object.")
    @click.argument("app_spec", metavar="APP")
    @click.argument("task")
    @click.argument("args", default="{}")
    @click.option("--queue", default=None)
    @click.option("--priority", default=None, type=int)
    @click.option("--delay", default=None, type=float, help="Seconds from now.")
    @click.option("--max-attempts", default=None, type=int)
    @click.option("--dedupe-key", default=None)
    @click.option("--ordering-key", default=None)
    def enqueue(app_spec: str, task: str, args: str, **options: Any) -> None:
        app = _load_app(app_spec)
        try:
            values = json.loads(args)
        except json.JSONDecodeError as exc:
            _fail(f"ARGS must be a JSON object such as '{{\"order_id\": 7}}': {exc}")
        chosen = {name: value for name, value in options.items() if value is not None}
        job = _run(lambda: app.enqueue(task, values, **chosen))
        click.echo(f"enqueued job {job.id} ({job.task}) on queue {job.queue}: {job.status}")

    @command.command(help="Jobs per queue and state, the oldest runnable job's wait, throughput, periodic jobs.")
    @click.pass_context
    def status(ctx: click.Context) -> None:
        statuses = _run(_app(ctx).status)
        table = Table(title="dibs queues")
        table.add_column("queue")
        for state in STATES:
            table.add_column(state, justify="right")
        table.add_column("oldest ready", justify="right")
        table.add_column("finished/s (1 min)", justify="right")
        for row in statuses:
            oldest = "-" if row.oldest_ready_seconds is None else f"{row.oldest_ready_seconds:.1f}s"
            table.add_row(
                row.queue, *(f"{row.counts[state]:,}" for state in STATES), oldest, f"{row.finished_per_second:.1f}"
            )
        console = _console()
        console.print(table if statuses else "no jobs yet")
        _print_workers(console, _app(ctx))
        schedules = _run(_app(ctx).periodic_status)
        if schedules:
            periodic = Table(title="periodic jobs")
            for column in ("name", "task", "schedule", "next slot (UTC)", "last slot (UTC)", "last job"):
                periodic.add_column(column)
            for row in schedules:
                periodic.add_row(
                    row.name,
                    row.task,
                    row.schedule,
                    row.next_slot_at.strftime("%Y-%m-%d %H:%M:%S"),
                    "-" if row.last_slot_at is None else row.last_slot_at.strftime("%Y-%m-%d %H:%M:%S"),
                    "-" if row.last_job_id is None else str(row.last_job_id),
                )
            console.print(periodic)

    def _print_workers(console: Console, app: App) -> None:
        """The live workers, and a warning for the queued jobs none of them can take."""
        workers = _run(app.workers)
        if workers:
            table = Table(title="live workers")
            for column in ("name", "host", "pid", "queues", "concurrency", "last heartbeat"):
                table.add_column(column, justify="right" if column in ("pid", "concurrency") else "left")
            for worker in workers:
                table.add_row(
                    escape(worker.name),
                    escape(worker.host),
                    str(worker.pid),
                    escape(",".join(worker.queues)),
                    str(worker.concurrency),
                    f"{worker.heartbeat_age_seconds:.1f}s ago",
                )
            console.print(table)
        else:
            console.print("no live workers")
        stranded = _run(app.stranded_jobs)
        if stranded:
            warning = Table(title="[bold yellow]warning: queued jobs no live worker can take[/]")
            for column in ("queue", "task", "tag", "jobs", "oldest", "why"):
                warning.add_column(column, justify="right" if column in ("jobs", "oldest") else "left")
            for group in stranded:
                warning.add_row(
                    escape(group.queue),
                    escape(group.task),
                    escape(group.tag or "-"),
                    f"{group.count:,}",
                    f"{group.oldest_seconds:.1f}s",
                    escape(group.reason),
                )
            console.print(warning)

    @command.group(help="List, retry, cancel and purge jobs.")
    def jobs() -> None:
        pass

    @jobs.command("list", help="Jobs, newest first.")
    @click.option("--status", "states", multiple=True, type=click.Choice(STATES), help="Only jobs in this state.")
    @click.option("--queue", default=None)
    @click.option("--task", default=None)
    @click.option("--limit", default=50, show_default=True)
    @click.pass_context
    def list_jobs(ctx: click.Context, states: tuple[str, ...], queue: str | None, task: str | None, limit: int) -> None:
        found = _run(lambda: _app(ctx).jobs(status=list(states) or None, queue=queue, task=task, limit=limit))
        table = Table()
        for column in ("id", "task", "queue", "status", "attempts", "run at", "last error"):
            table.add_column(column)
        for job in found:
            error = (job.last_error or "").splitlines()[0] if job.last_error else ""
            table.add_row(
                str(job.id),
                job.task,
                job.queue,
                job.status,
                f"{job.attempts}/{job.max_attempts}",
                job.run_at.strftime("%Y-%m-%d %H:%M:%S"),
                error[:80],
            )
        _console().print(table)

    @jobs.command(help="Queue dead or cancelled jobs again.")
    @click.argument("ids", nargs=-1, type=int, required=True)
    @click.pass_context
    def retry(ctx: click.Context, ids: tuple[int, ...]) -> None:
        app = _app(ctx)
        for job_id in ids:
            job = _run(lambda job_id=job_id: app.retry(job_id))
            click.echo(f"job {job.id}: {job.status}")

    @jobs.command(help="Cancel jobs: waiting ones at once, running ones are asked to stop.")
    @click.argument("ids", nargs=-1, type=int, required=True)
    @click.pass_context
    def cancel(ctx: click.Context, ids: tuple[int, ...]) -> None:
        app = _app(ctx)
        for job_id in ids:
            job = _run(lambda job_id=job_id: app.cancel(job_id))
            asked = " (asked to stop)" if job.cancel_requested and job.status == "running" else ""
            click.echo(f"job {job.id}: {job.status}{asked}")

    @jobs.command(help="Delete finished jobs older than --older-than hours.")
    @click.option("--older-than", default=0.0, show_default=True, help="Hours since they finished.")
    @click.option("--status", "states", multiple=True, type=click.Choice(FINISHED), help="Default: all finished.")
    @click.pass_context
    def purge(ctx: click.Context, older_than: float, states: tuple[str, ...]) -> None:
        removed = _run(
            lambda: _app(ctx).purge(older_than=timedelta(hours=older_than), statuses=list(states) or FINISHED)
        )
        click.echo(f"purged {removed:,} finished jobs")

    @command.group(help="Relay outbox events to a broker; list, requeue, discard and purge them.")
    def outbox() -> None:
        pass

    @outbox.command(help="Publish outbox events to the broker at --publisher until SIGTERM or SIGINT.")
    @click.option(
        "--publisher",
        "-p",
        required=True,
        help="Broker URL: redis://, nats://, amqp://, http(s)://, log:// or stdout://.",
    )
    @click.option("--target", default="default", show_default=True, help="Relay the events meant for this target.")
    @click.option("--batch", default=200, show_default=True, help="Events claimed per round trip.")
    @click.option("--concurrency", "-c", default=1, show_default=True, help="Batches in flight at once.")
    @click.option("--lease", default=30.0, show_default=True, help="Seconds a claim is held (renewed by heartbeats).")
    @click.option("--grace", default=10.0, show_default=True, help="Seconds batches in flight get at shutdown.")
    @click.option("--max-retries", default=10, show_default=True, help="Failed publishes before an event is abandoned.")
    @click.option(
        "--on-failed-head",
        type=click.Choice(["block", "skip"]),
        default="block",
        show_default=True,
        help="Whether a failing event holds back the later events of its aggregate.",
    )
    @click.option("--retention", default=None, type=float, help="Purge published events older than this many hours.")
    @click.option("--burst", is_flag=True, help="Exit when no event is left to publish.")
    @click.pass_context
    def relay(
        ctx: click.Context,
        publisher: str,
        target: str,
        batch: int,
        concurrency: int,
        lease: float,
        grace: float,
        max_retries: int,
        on_failed_head: str,
        retention: float | None,
        burst: bool,
    ) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        events = _outbox(ctx, on_failed_head=on_failed_head, max_retries=max_retries)
        runner = _run(
            lambda: events.relay(
                publisher,
                target=target,
                batch=batch,
                concurrency=concurrency,
                lease=lease,
                grace=grace,
                retention=None if retention is None else timedelta(hours=retention),
                burst=burst,
            )
        )
        stats = _run(runner.run)
        click.echo(
            f"relay stopped: {stats.published} published, {stats.retried} to retry, {stats.abandoned} abandoned, "
            f"{stats.released} given back"
        )

    @outbox.command("status", help="Outbox events per target and state, the oldest pending wait, and throughput.")
    @click.pass_context
    def outbox_status(ctx: click.Context) -> None:
        statuses = _run(_outbox(ctx).status)
        table = Table(title="dibs outbox")
        table.add_column("target")
        for state in EVENT_STATES:
            table.add_column(state, justify="right")
        table.add_column("oldest pending", justify="right")
        table.add_column("published/s (1 min)", justify="right")
        for row in statuses:
            oldest = "-" if row.oldest_pending_seconds is None else f"{row.oldest_pending_seconds:.1f}s"
            table.add_row(
                row.target,
                *(f"{row.counts[state]:,}" for state in EVENT_STATES),
                oldest,
                f"{row.published_per_second:.1f}",
            )
        _console().print(table if statuses else "no outbox events yet")

    @outbox.command("list", help="Outbox events, oldest first.")
    @click.option("--status", "states", multiple=True, type=click.Choice(EVENT_STATES), help="Only this state.")
    @click.option("--target", default=None)
    @click.option("--aggregate-type", default=None)
    @click.option("--aggregate-id", default=None)
    @click.option("--limit", default=50, show_default=True)
    @click.option("--newest-first", is_flag=True)
    @click.pass_context
    def list_events(
        ctx: click.Context,
        states: tuple[str, ...],
        target: str | None,
        aggregate_type: str | None,
        aggregate_id: str | None,
        limit: int,
        newest_first: bool,
    ) -> None:
        found = _run(
            lambda: _outbox(ctx).events(
                status=list(states) or None,
                target=target,
                aggregate_type=aggregate_type,
                aggregate_id=aggregate_id,
                limit=limit,
                newest_first=newest_first,
            )
        )
        table = Table()
        for column in ("id", "target", "aggregate", "event type", "status", "retries", "created at", "last error"):
            table.add_column(column)
        for event in found:
            error = (event.last_error or "").splitlines()[0] if event.last_error else ""
            table.add_row(
                str(event.id),
                event.target,
                f"{event.aggregate_type}/{event.aggregate_id}",
                event.event_type,
                event.status,
                str(event.retry_count),
                event.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                error[:80],
            )
        _console().print(table)

    @outbox.command(help="Make failed or abandoned events pending again (IDS, or --all of them).")
    @click.argument("ids", nargs=-1, type=int)
    @click.option("--all", "everything", is_flag=True, help="Every failed or abandoned event.")
    @click.option("--target", default=None, help="With --all: only this target's.")
    @click.pass_context
    def requeue(ctx: click.Context, ids: tuple[int, ...], everything: bool, target: str | None) -> None:
        if bool(ids) == everything:
            _fail("name the events to requeue by id, or pass --all (not both)")
        count = _run(lambda: _outbox(ctx).requeue(None if everything else list(ids), target=target))
        click.echo(f"requeued {count:,} events")

    @outbox.command(help="Delete abandoned events for good, so that their aggregates go on.")
    @click.argument("ids", nargs=-1, type=int, required=True)
    @click.pass_context
    def discard(ctx: click.Context, ids: tuple[int, ...]) -> None:
        count = _run(lambda: _outbox(ctx).discard(list(ids)))
        click.echo(f"discarded {count:,} abandoned events")

    @outbox.command("purge", help="Delete published events older than --older-than hours.")
    @click.option("--older-than", default=0.0, show_default=True, help="Hours since they were published.")
    @click.pass_context
    def purge_events(ctx: click.Context, older_than: float) -> None:
        removed = _run(lambda: _outbox(ctx).purge(older_than=timedelta(hours=older_than)))
        click.echo(f"purged {removed:,} published events")

    @command.command(help="Drain a realistic mixed workload with worker processes on SQLite, live.")
    @click.option("--jobs", "count", default=2000, show_default=True, help="About how many jobs.")
    @click.option("--workers", default=3, show_default=True, help="Worker processes.")
    @click.option("--file", "path", default=None, help="SQLite file (default: dibs-demo.sqlite, recreated).")
    @click.option("--no-kill", is_flag=True, help="Do not kill a worker mid-run.")
    def demo(count: int, workers: int, path: str | None, no_kill: bool) -> None:
        from dibs.demo import run_demo

        if not run_demo(path, count, workers, not no_kill):
            raise SystemExit(1)


if __name__ == "__main__":
    main()
