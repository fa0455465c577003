"""dibs: many consumers share one SQL table without ever taking the same row twice."""

from __future__ import annotations

from dibs._errors import (
    Busy,
    DibsError,
    DibsWarning,
    FallbackWarning,
    InTransaction,
    InvalidArgument,
    LeaseLost,
)
from dibs.claim import aclaim, claim
from dibs.engine import create_async_engine, create_engine
from dibs.lease import Lease, Leases, lease_columns
from dibs.schema import Timestamp

__version__ = "0.1.0.dev0"

__all__ = [
    "Busy",
    "DibsError",
    "DibsWarning",
    "FallbackWarning",
    "InTransaction",
    "InvalidArgument",
    "Lease",
    "LeaseLost",
    "Leases",
    "Timestamp",
    "aclaim",
    "claim",
    "create_async_engine",
    "create_engine",
    "lease_columns",
]
