"""Fixtures of the acceptance tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from dibs.schema import metadata


@pytest.fixture(params=["postgresql", "sqlite", "mariadb"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database URL with no dibs tables in it; they are dropped afterwards."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'cli.sqlite'}"
    else:
        base: sa.URL = request.getfixturevalue(f"{'postgres' if request.param == 'postgresql' else 'mariadb'}_database")
        url = base.render_as_string(hide_password=False)
    engine = sa.create_engine(url)
    metadata.drop_all(engine)
    yield url
    metadata.drop_all(engine)
    engine.dispose()
