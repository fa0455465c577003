"""``dibs outbox``: relay outbox events to a broker; list, show, requeue, discard and purge them."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta

import click
from rich.table import Table

from dibs.cli.logs import configure, log_format_option
from dibs.cli.shared import (
    ROW_ID,
    add_plain_row,
    all_in,
    confirmed,
    console,
    echo_json,
    echo_record,
    existing,
    fail,
    hours,
    open_outbox,
    purge_age,
    run,
)
from dibs.outbox import OutboxEvent
from dibs.schema import ABANDONED, EVENT_STATES, FAILED


@click.group(help="Relay outbox events to a broker; list, show, requeue, discard and purge them.")
def outbox() -> None:
    pass


@outbox.command(
    help="Publish outbox events to the broker at --publisher until SIGTERM or SIGINT. A signal stops claiming "
    "and lets the batches in flight finish for up to --grace seconds; the events of a batch still in flight "
    "then are given back and published again later (consumers drop duplicates by event id). A second signal "
    "changes nothing: the relay still stops within --grace seconds."
)
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
@click.option(
    "--max-retries",
    default=10,
    show_default=True,
    help="Retries of a failed publish before the event is abandoned: at most N+1 publishes per event.",
)
@click.option(
    "--on-failed-head",
    type=click.Choice(["block", "skip"]),
    default="block",
    show_default=True,
    help="Whether a failing event holds back the later events of its aggregate.",
)
@click.option(
    "--retention",
    default=None,
    type=float,
    help="Delete events published more than this many hours ago (default: kept).",
)
@click.option("--burst", is_flag=True, help="Exit when no event is left to publish.")
@log_format_option
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
    log_format: str,
) -> None:
    configure(log_format)
    events = open_outbox(ctx, on_failed_head=on_failed_head, max_retries=max_retries)
    runner = run(
        lambda: events.relay(
            publisher,
            target=target,
            batch=batch,
            concurrency=concurrency,
            lease=lease,
            grace=grace,
            retention=None if retention is None else hours(retention, "--retention"),
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
        add_plain_row(
            table,
            row.target,
            *(f"{row.counts[state]:,}" for state in EVENT_STATES),
            oldest,
            f"{row.published_per_second:.1f}",
        )
    console().print(table if statuses else "no outbox events yet")


@outbox.command("list", help="Outbox events, oldest first.")
@click.option(
    "--status",
    "states",
    multiple=True,
    type=click.Choice(EVENT_STATES),
    help="Only events in this state; repeat for more.",
)
@click.option("--target", default=None, help="Only the events meant for this target.")
@click.option("--aggregate-type", default=None, help="Only the events of this aggregate type.")
@click.option("--aggregate-id", default=None, help="Only the events of this aggregate id.")
@click.option("--limit", default=50, show_default=True, help="At most this many events.")
@click.option("--newest-first", is_flag=True, help="The newest events first.")
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
        add_plain_row(
            table,
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


@outbox.command(help="Everything about event ID: its aggregate, type, state, times, headers, payload and last error.")
@click.argument("event_id", metavar="ID", type=ROW_ID)
@click.option("--json", "as_json", is_flag=True, help="Print the event as one JSON object.")
@click.pass_context
def show(ctx: click.Context, event_id: int, as_json: bool) -> None:
    event: OutboxEvent = run(lambda: open_outbox(ctx).get(event_id))
    fields = dataclasses.asdict(event)
    fields["payload"] = event.payload
    del fields["payload_json"]
    if as_json:
        echo_json(fields)
        return
    names = ("target", "aggregate_type", "aggregate_id", "event_type", "status", "retry_count", "attempts")
    times = ("created_at", "next_attempt_at", "published_at")
    shown = [(name.replace("_", " "), fields[name]) for name in (*names, *times)]
    shown.append(("headers", json.dumps(event.headers)))
    echo_record(
        f"event {event.id}", shown, [("payload", json.dumps(event.payload, indent=2)), ("last error", event.last_error)]
    )


@outbox.command(help="Make the failed or abandoned events IDS (or --all of them) pending again.")
@click.argument("ids", metavar="[IDS]...", nargs=-1, type=ROW_ID)
@click.option("--all", "everything", is_flag=True, help="Every failed or abandoned event.")
@click.option("--target", default=None, help="With --all: only this target's.")
@click.pass_context
def requeue(ctx: click.Context, ids: tuple[int, ...], everything: bool, target: str | None) -> None:
    if bool(ids) == everything:
        fail("name the events to requeue by id, or pass --all (not both)")
    events = open_outbox(ctx)
    all_in(existing(ids, events.get), (FAILED, ABANDONED), "requeued", "event")
    count = run(lambda: events.requeue(None if everything else list(ids), target=target))
    click.echo(f"requeued {count:,} events")


@outbox.command(help="Delete the abandoned events IDS for good, so that their aggregates go on.")
@click.argument("ids", metavar="IDS...", nargs=-1, type=ROW_ID, required=True)
@click.pass_context
def discard(ctx: click.Context, ids: tuple[int, ...]) -> None:
    events = open_outbox(ctx)
    all_in(existing(ids, events.get), (ABANDONED,), "discarded", "event")
    count = run(lambda: events.discard(list(ids)))
    click.echo(f"discarded {count:,} abandoned events")


@outbox.command(
    "purge",
    help="Delete published events: those published more than --older-than hours ago, or --all of them. "
    "Events not yet published, abandoned ones included, are never purged (discard deletes abandoned events "
    "by id). It says how many it will delete and asks first (--yes does not ask).",
)
@click.option("--older-than", type=click.FloatRange(min=0), default=None, help="Hours since they were published.")
@click.option("--all", "everything", is_flag=True, help="Every published event, however recent.")
@click.option("--yes", "-y", is_flag=True, help="Delete without asking (for scripts).")
@click.pass_context
def purge_events(ctx: click.Context, older_than: float | None, everything: bool, yes: bool) -> None:
    age = purge_age(older_than, everything)
    events = open_outbox(ctx)
    count = run(lambda: events.purgeable(older_than=age))
    scope = "" if age == timedelta(0) else f" more than {older_than:g} hours ago"
    if not count:
        click.echo(f"no events published{scope}: nothing to delete")
        return
    if confirmed(f"this deletes {count:,} events published{scope}", yes):
        removed = run(lambda: events.purge(older_than=age))
        click.echo(f"deleted {removed:,} published events")
