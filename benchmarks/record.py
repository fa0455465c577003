"""What a benchmark run records about what it measured: the versions of the packages involved, and a hash
of dibs's sources (they can change under a running benchmark if someone edits them)."""

from __future__ import annotations

import hashlib
import platform
import sqlite3
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

import dibs

SOURCES = Path(__file__).parent.parent / "src" / "dibs"


def versions(packages: Iterable[str]) -> dict[str, str]:
    """Python's, SQLite's and each installed package's version, dibs's, and the hash of its sources."""
    found = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    for package in dict.fromkeys(packages):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    found["dibs"] = dibs.__version__
    digest = hashlib.sha256()
    for path in sorted(SOURCES.rglob("*.py")):
        digest.update(path.read_bytes())
    found["dibs_sources_sha256"] = digest.hexdigest()[:16]
    return found
