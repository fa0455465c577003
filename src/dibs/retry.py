"""When a failed job or publish runs again: exponential backoff with jitter, for the exceptions the policy names."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import timedelta

from dibs._checks import checked_number, checked_seconds
from dibs._errors import InvalidArgument


@dataclass(frozen=True, kw_only=True)
class Retry:
    """Retry after ``base * factor ** (attempt - 1)`` seconds, at most ``cap``, spread by +/- ``jitter``.

    Only exceptions that are instances of ``on`` are retried; any other goes straight to the dead
    letters.

    Attributes:
        base: Seconds before the first retry.
        factor: What each further delay is multiplied by (1 for a constant delay).
        cap: The longest delay, in seconds.
        jitter: The fraction (0 to 1) by which each delay is spread at random, so that jobs that failed
            together do not all retry at the same moment.
        on: The exception classes to retry.

    Raises:
        InvalidArgument: A negative or too long delay, a factor below 0, a jitter outside 0 to 1, or an
            ``on`` that is not a tuple of exception classes.

    Example:
        >>> dibs.Retry(base=2, cap=600, on=(TimeoutError, ConnectionError))  # network trouble only
    """

    base: float = 1.0
    factor: float = 2.0
    cap: float = 3600.0
    jitter: float = 0.1
    on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        for name in ("base", "cap"):
            checked_seconds(getattr(self, name), f"Retry({name}=)", zero=True)
        checked_number(self.factor, "Retry(factor=)", 0, math.inf, high_included=False)
        checked_number(self.jitter, "Retry(jitter=) (a fraction)", 0, 1)
        if not isinstance(self.on, tuple) or not all(
            isinstance(kind, type) and issubclass(kind, BaseException) for kind in self.on
        ):
            raise InvalidArgument(f"Retry(on=) must be a tuple of exception classes, got {self.on!r}")

    def retries(self, error: BaseException) -> bool:
        """Whether this error is one to retry.

        Args:
            error: What the run raised.

        Returns:
            True when it is an instance of one of ``on``.
        """
        return isinstance(error, self.on)

    def delay(self, attempt: int) -> timedelta:
        """How long to wait before attempt ``attempt + 1``, after ``attempt`` attempts failed.

        Args:
            attempt: How many attempts have failed.

        Returns:
            The delay, jitter applied.
        """
        try:
            seconds = min(self.cap, self.base * self.factor ** max(attempt - 1, 0))
        except OverflowError:  # the backoff outgrew a float long before: it is the cap
            seconds = self.cap
        spread = seconds * self.jitter
        return timedelta(seconds=max(0.0, seconds + random.uniform(-spread, spread)))


#: Five attempts in all, one second apart at first, doubling.
DEFAULT_RETRY = Retry()
