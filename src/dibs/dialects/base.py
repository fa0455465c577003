"""The names every dialect module builds on, gathered from the modules that hold them by concern.

``request`` (a claim request, its strategy, statements cached per shape), ``backend`` (the Backend
protocol and its defaults), ``values`` (exact names, values written inline, times), ``keys`` (key lists and the fenced
guard), ``ordering`` (claim order in Python), ``transactions`` (dibs's own transactions) and ``versions``
(server versions, fallback warnings).
"""

from __future__ import annotations

from dibs.dialects.backend import Backend, BackendDefaults, Listener, from_now
from dibs.dialects.keys import (
    PICKED,
    fenced_in_list,
    fenced_in_list_values,
    in_key_order,
    key_equals,
    key_of,
    key_parameters,
    key_values,
    keys_in,
    positions_of,
)
from dibs.dialects.ordering import SortKey, in_order, python_order, split_order
from dibs.dialects.request import LIMIT, ClaimRequest, ClaimStrategy, StatementCache, Then, run_then
from dibs.dialects.transactions import driver_autocommit, explicit_transaction
from dibs.dialects.values import FromNow, Inline, Name, app_now, inline, resolve_times
from dibs.dialects.versions import server_version, warn_fallback

__all__ = [
    "LIMIT",
    "PICKED",
    "Backend",
    "BackendDefaults",
    "ClaimRequest",
    "ClaimStrategy",
    "FromNow",
    "Inline",
    "Listener",
    "Name",
    "SortKey",
    "StatementCache",
    "Then",
    "app_now",
    "driver_autocommit",
    "explicit_transaction",
    "fenced_in_list",
    "fenced_in_list_values",
    "from_now",
    "in_key_order",
    "in_order",
    "inline",
    "key_equals",
    "key_of",
    "key_parameters",
    "key_values",
    "keys_in",
    "positions_of",
    "python_order",
    "resolve_times",
    "run_then",
    "server_version",
    "split_order",
    "warn_fallback",
]
