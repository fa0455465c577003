"""The dibs jobs table as a Django model, read-only, for the admin (dibs, not Django, manages the table)."""

from __future__ import annotations

from django.db import models


class Job(models.Model):  # type: ignore[misc]
    """A row of ``dibs_jobs``; change jobs through the admin's actions (dibs's retry and cancel), not saves."""

    id = models.BigAutoField(primary_key=True)
    task = models.CharField(max_length=200)
    queue = models.CharField(max_length=100)
    args = models.TextField()
    priority = models.IntegerField()
    status = models.CharField(max_length=16)
    run_at = models.DateTimeField()
    attempts = models.IntegerField()
    max_attempts = models.IntegerField()
    lease_owner = models.CharField(max_length=200, null=True)
    dedupe_key = models.CharField(max_length=200, null=True)
    ordering_key = models.CharField(max_length=200, null=True)
    tag = models.CharField(max_length=100, null=True)
    enqueued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(null=True)
    last_error = models.TextField(null=True)

    class Meta:
        managed = False
        db_table = "dibs_jobs"
        ordering = ("-id",)

    def __str__(self) -> str:
        return f"{self.task} #{self.id} ({self.status})"
