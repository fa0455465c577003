"""The arguments every benchmarked job carries, whatever the system: a small object of a few ids and strings.

An empty object would flatter whoever skips decoding it; these are what an order-processing job might get.
"""

from __future__ import annotations

from typing import Any


def args(n: int) -> dict[str, Any]:
    """The arguments of the ``n``-th job: the same for every system, about 120 bytes of JSON."""
    return {
        "order_id": 1_000_000 + n,
        "customer_id": 50_000 + n % 977,
        "sku": f"SKU-{n % 5_000:05d}",
        "email": f"customer{n % 977}@example.com",
        "region": ("eu-west", "us-east", "ap-south")[n % 3],
    }


def many(jobs: int) -> list[dict[str, Any]]:
    """The arguments of the first ``jobs`` jobs."""
    return [args(n) for n in range(jobs)]
