"""How long an idle or failing loop waits before it looks again: short at first, growing to a limit."""

from __future__ import annotations


class Backoff:
    """A wait that grows by ``growth`` at each :meth:`next`, from ``first`` up to ``most``, until :meth:`reset`.

    Args:
        first: The first wait, in seconds (and the wait after a reset).
        most: The longest wait.
        growth: What each wait is multiplied by for the next.

    Example:
        >>> backoff = Backoff(first=0.01, most=0.04)
        >>> [backoff.next() for _ in range(4)]
        [0.01, 0.02, 0.04, 0.04]
    """

    __slots__ = ("first", "growth", "most", "wait")

    def __init__(self, *, first: float, most: float, growth: float = 2.0) -> None:
        self.first = min(first, most)
        self.most = most
        self.growth = growth
        #: The wait :meth:`next` gives next.
        self.wait = self.first

    def next(self, *, floor: float = 0.0) -> float:
        """Return the wait to make now, and grow the next one (to at least ``floor``, at most ``most``)."""
        wait = self.wait
        self.wait = min(max(wait * self.growth, floor), self.most)
        return wait

    def reset(self) -> None:
        """Start again from the first wait: the loop found something to do."""
        self.wait = self.first
