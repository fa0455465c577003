"""``dibs outbox``: relay outbox events to a broker; list, requeue, discard and purge them."""

from __future__ import annotations

import logging
from datetime import timedelta

import click
from rich.table import Table

from dibs.cli.shared import console, fail, open_outbox, run
from dibs.schema import EVENT_STATES


@click.group(help="Relay outbox events to a broker; list, requeue, discard and purge them.")
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
    events = open_outbox(ctx, on_failed_head=on_failed_head, max_retries=max_retries)
    runner = run(
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
    stats = run(runner.run)
    click.echo(
        f"relay stopped: {stats.published} published, {stats.retried} to retry, {stats.abandoned} abandoned, "
        f"{stats.released} given back"
    )


@outbox.command("status", help="Outbox events per target and state, the oldest pending wait, and throughput.")
@click.pass_context
def outbox_status(ctx: click.Context) -> None:
    statuses = run(open_outbox(ctx).status)
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
    console().print(table if statuses else "no outbox events yet")


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
    found = run(
        lambda: open_outbox(ctx).events(
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
    console().print(table)


@outbox.command(help="Make failed or abandoned events pending again (IDS, or --all of them).")
@click.argument("ids", nargs=-1, type=int)
@click.option("--all", "everything", is_flag=True, help="Every failed or abandoned event.")
@click.option("--target", default=None, help="With --all: only this target's.")
@click.pass_context
def requeue(ctx: click.Context, ids: tuple[int, ...], everything: bool, target: str | None) -> None:
    if bool(ids) == everything:
        fail("name the events to requeue by id, or pass --all (not both)")
    count = run(lambda: open_outbox(ctx).requeue(None if everything else list(ids), target=target))
    click.echo(f"requeued {count:,} events")


@outbox.command(help="Delete abandoned events for good, so that their aggregates go on.")
@click.argument("ids", nargs=-1, type=int, required=True)
@click.pass_context
def discard(ctx: click.Context, ids: tuple[int, ...]) -> None:
    count = run(lambda: open_outbox(ctx).discard(list(ids)))
    click.echo(f"discarded {count:,} abandoned events")


@outbox.command("purge", help="Delete published events older than --older-than hours.")
@click.option("--older-than", default=0.0, show_default=True, help="Hours since they were published.")
@click.pass_context
def purge_events(ctx: click.Context, older_than: float) -> None:
    removed = run(lambda: open_outbox(ctx).purge(older_than=timedelta(hours=older_than)))
    click.echo(f"purged {removed:,} published events")
