"""The dibs tables, created and upgraded by dibs's own migrations (``dibs.migrate``) on the migrated database."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations


def create_tables(apps: Any, schema_editor: Any) -> None:
    import sqlalchemy as sa

    import dibs
    from dibs.django.database import url_of

    engine = sa.create_engine(url_of(schema_editor.connection.settings_dict))
    try:
        dibs.migrate(engine)
    finally:
        engine.dispose()


def drop_tables(apps: Any, schema_editor: Any) -> None:
    import sqlalchemy as sa

    from dibs.django.database import url_of
    from dibs.schema import metadata

    engine = sa.create_engine(url_of(schema_editor.connection.settings_dict))
    try:
        metadata.drop_all(engine)
    finally:
        engine.dispose()


class Migration(migrations.Migration):  # type: ignore[misc]
    # dibs.migrate commits each step on a connection of its own: not inside Django's migration transaction.
    atomic = False
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [migrations.RunPython(create_tables, drop_tables)]
