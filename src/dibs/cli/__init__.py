"""The ``dibs`` command (``pip install 'dibs-sql[cli]'``): the group and ``init`` in ``group``, one module per
command or group of commands, and what they share in ``shared``."""

from __future__ import annotations

import sys


def main() -> None:
    """The console script's entry point."""
    try:
        import click  # noqa: F401
        import rich  # noqa: F401
    except ImportError:  # pragma: no cover - exercised only without the extra
        sys.stderr.write("the dibs command needs click and rich; install them with: pip install 'dibs-sql[cli]'\n")
        raise SystemExit(2) from None
    from dibs.cli.group import command

    command(prog_name="dibs")
