"""The due scheduler: rows of the user's own table that become due again after a per-row interval, each taken
by one worker at a time with a fenced lease (see :mod:`dibs.due.scheduler`).

The scheduler needs a few columns beyond the table's own; :func:`due_columns` makes them for a new table and
:func:`add_due_columns` adds them to an existing one.
"""

from dibs.due.columns import DUE_COLUMN_NAMES, IDLE, RUNNING, add_due_columns, due_columns
from dibs.due.runner import DueStats
from dibs.due.scheduler import ERROR_LIMIT, DueScheduler

__all__ = [
    "DUE_COLUMN_NAMES",
    "ERROR_LIMIT",
    "IDLE",
    "RUNNING",
    "DueScheduler",
    "DueStats",
    "add_due_columns",
    "due_columns",
]
