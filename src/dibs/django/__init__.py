"""dibs for Django: a backend for Django's task framework, its migration, a worker command and admin pages.

``INSTALLED_APPS += ["dibs.django"]`` and ``TASKS = {"default": {"BACKEND": "dibs.django.DibsBackend"}}``. The
framework is ``django.tasks`` from Django 6 on and the ``django-tasks`` package before (the ``django`` extra).
"""

from __future__ import annotations

from typing import Any

__all__ = ["DibsBackend"]


def __getattr__(name: str) -> Any:
    # The backend imports Django's settings: loading it waits until Django asks for it.
    if name == "DibsBackend":
        from dibs.django.backend import DibsBackend

        return DibsBackend
    raise AttributeError(name)
