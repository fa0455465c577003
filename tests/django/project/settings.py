"""A small Django project whose tasks run on dibs: the database is given as a DATABASES entry in JSON."""

import json
import os

SECRET_KEY = "tests-only"
DEBUG = True
ALLOWED_HOSTS = ["testserver", "localhost"]
USE_TZ = True
ROOT_URLCONF = "project.urls"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_tasks",
    "dibs.django",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES = {"default": json.loads(os.environ["DIBS_DJANGO_DATABASE"])}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
TASKS = {"default": {"BACKEND": "dibs.django.DibsBackend", "QUEUES": ["default", "mail"]}}
