"""Fenced leases: a claim that later writes must prove they still hold.

A leased row carries a status, an owner, an expiry on the database clock, a token that goes up by one
at every claim, and an attempt count. Claiming takes ready rows and rows whose lease has expired.
Every later write (renew, complete, fail, release) is guarded by ``pk = :pk AND token = :token AND
status = 'running'``, so a worker whose lease was taken over changes nothing, is told so by
:class:`~dibs.LeaseLost` (or in the list a batched write returns), and stops.

The package by concern: ``value`` (the Lease and the columns), ``table`` (the leased table),
``claiming`` and ``claimer`` (taking leases), ``writes`` (the guarded writes), ``recover`` (expired
leases), ``aio`` (the asyncio forms), ``leases`` (the assembled :class:`Leases`).
"""

from dibs._checks import OWNER_LIMIT
from dibs.lease.claimer import Claimer
from dibs.lease.leases import Leases
from dibs.lease.value import Duration, Lease, lease_columns
from dibs.lease.value import _seconds as _seconds  # due.py checks its durations with it
from dibs.lease.writes import WRITE_CHUNK

__all__ = ["OWNER_LIMIT", "WRITE_CHUNK", "Claimer", "Duration", "Lease", "Leases", "lease_columns"]
