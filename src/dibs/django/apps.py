"""The Django app ``dibs.django``: its migration creates the dibs tables, its admin shows the jobs."""

from __future__ import annotations

from django.apps import AppConfig


class DibsConfig(AppConfig):  # type: ignore[misc]
    """The ``dibs.django`` app."""

    name = "dibs.django"
    label = "dibs"
    verbose_name = "dibs"
    default_auto_field = "django.db.models.BigAutoField"
