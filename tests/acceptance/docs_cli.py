"""Parse a dibs command line exactly as the dibs command does, without doing any of its work.

``python docs_cli.py ARG...`` exits as ``dibs ARG...`` would on a usage error (status 2 and click's
message: an unknown command or option, a value that does not convert, a missing argument). Otherwise its
last line of output is a JSON object: ``command``, the command reached (``dibs jobs retry``), and ``why``,
set when the line runs until it is stopped (a worker or relay without ``--burst``), so that a test only
parses it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from dibs.cli.group import command

reached: dict[str, Any] = {}


def why_only_parsed(chosen: click.Command, params: dict[str, Any]) -> str | None:
    """Why a command line cannot run to its end in a test, or None when it can."""
    names = {param.name for param in chosen.params}
    if "burst" in names and not params["burst"]:
        return "it runs until stopped (no --burst)"
    if chosen.name == "dashboard":
        return "it serves until stopped"
    return None


def recorder(chosen: click.Command) -> Any:
    def record(*_args: Any, **params: Any) -> None:
        # Groups record too; the command at the end of the line records last.
        reached.update(command=click.get_current_context().command_path, why=why_only_parsed(chosen, params))

    return record


def stub(group: click.Command) -> None:
    group.callback = recorder(group)
    if isinstance(group, click.Group):
        for sub in group.commands.values():
            stub(sub)


def main(args: list[str]) -> int:
    stub(command)
    try:
        command.main(args, prog_name="dibs", standalone_mode=False)
    except click.exceptions.Exit as done:  # --help or --version: nothing left to run
        return done.exit_code
    except click.ClickException as error:
        error.show()
        return error.exit_code
    print(json.dumps(reached))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
