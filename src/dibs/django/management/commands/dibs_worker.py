"""``manage.py dibs_worker``: a dibs worker for the tasks of Django's task framework."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):  # type: ignore[misc]
    help = "Run a dibs worker for the Django tasks of a dibs backend until SIGTERM or SIGINT."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default", help="The alias of the dibs backend in TASKS.")
        parser.add_argument("--queue", action="append", dest="queues", help="A queue to serve (repeatable).")
        parser.add_argument("--concurrency", type=int, default=10, help="Jobs run at once.")
        parser.add_argument("--burst", action="store_true", help="Stop once no job is left.")

    def handle(self, *args: Any, **options: Any) -> None:
        from dibs.django.backend import DibsBackend
        from dibs.django.framework import task_backends

        backend = task_backends[options["backend"]]
        if not isinstance(backend, DibsBackend):
            raise SystemExit(f"the task backend {options['backend']!r} is not dibs.django.DibsBackend")
        stats = backend.app.worker(
            queues=options["queues"] or sorted(backend.queues) or None,
            concurrency=options["concurrency"],
            burst=options["burst"],
        ).run()
        self.stdout.write(f"dibs worker stopped: {stats}")
