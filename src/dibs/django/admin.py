"""Read-only admin pages for dibs jobs, with dibs's retry and cancel as actions."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages

from dibs.django.models import Job


def _app() -> Any:
    from dibs.django.backend import DibsBackend
    from dibs.django.framework import task_backends

    for alias in task_backends:
        backend = task_backends[alias]
        if isinstance(backend, DibsBackend):
            return backend.app
    raise LookupError("no dibs.django.DibsBackend in settings.TASKS")


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):  # type: ignore[misc]
    """Jobs by state, queue and task; a dead or cancelled job can be retried, a live one cancelled."""

    list_display = ("id", "task", "queue", "status", "attempts", "run_at", "finished_at")
    list_filter = ("status", "queue", "task")
    search_fields = ("task", "args")
    actions = ("retry", "cancel")

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    @admin.action(description="Retry the selected jobs", permissions=["view"])  # type: ignore[untyped-decorator]
    def retry(self, request: Any, queryset: Any) -> None:
        self._each(request, queryset, "retried", lambda app, job_id: app.retry(job_id))

    @admin.action(description="Cancel the selected jobs", permissions=["view"])  # type: ignore[untyped-decorator]
    def cancel(self, request: Any, queryset: Any) -> None:
        self._each(request, queryset, "cancelled", lambda app, job_id: app.cancel(job_id))

    def _each(self, request: Any, queryset: Any, done: str, act: Any) -> None:
        import dibs

        app, count = _app(), 0
        # Oldest first: a job's parents are older than it, so a workflow retried whole runs in its order.
        for job_id in queryset.order_by("id").values_list("id", flat=True):
            try:
                act(app, job_id)
                count += 1
            except dibs.DibsError as exc:
                self.message_user(request, f"job {job_id}: {exc}", messages.WARNING)
        self.message_user(request, f"{count} job(s) {done}", messages.SUCCESS)
