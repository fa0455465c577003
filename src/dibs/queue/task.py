"""Tasks: the functions a worker runs, with the defaults their jobs are enqueued with."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from dibs._errors import InvalidArgument
from dibs.queue.retry import DEFAULT_RETRY, Retry

if TYPE_CHECKING:
    from dibs.queue.app import App
    from dibs.queue.job import Job

#: Names of tasks, queues and tags: letters, digits and ``_ . : -``, so that they read well in logs,
#: URLs and shells and can never be mistaken for SQL.
NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,100}$")
TASK_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,200}$")

OrderingKey = str | Callable[[Mapping[str, Any]], object] | None


def checked_name(value: object, what: str, pattern: re.Pattern[str] = NAME) -> str:
    """``value`` if it is a valid name, else InvalidArgument saying what a name may hold."""
    if not isinstance(value, str) or not pattern.match(value):
        limit = 200 if pattern is TASK_NAME else 100
        raise InvalidArgument(f"{what} must be 1 to {limit} letters, digits or _ . : - characters, got {value!r}")
    return value


def positive_seconds(value: timedelta | float | int | None, what: str) -> float | None:
    """A duration in seconds > 0, or None; InvalidArgument for anything else."""
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        raise InvalidArgument(f"{what} must be a positive number of seconds or timedelta, got {value!r}")
    return float(seconds)


def checked_attempts(value: object, what: str = "max_attempts") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{what} must be a whole number >= 1, got {value!r}")
    return value


def checked_priority(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -1_000_000 <= value <= 1_000_000:
        raise InvalidArgument(f"priority must be a whole number between -1000000 and 1000000, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class Task:
    """A registered function and the defaults of its jobs. Higher ``priority`` runs first.

    ``ordering_key`` names an argument (or is a function of the arguments) whose value puts jobs in a
    line: jobs with the same key run one at a time, in enqueue order.
    """

    app: App
    function: Callable[..., Any]
    name: str
    queue: str = "default"
    priority: int = 0
    max_attempts: int = 5
    retry: Retry = DEFAULT_RETRY
    timeout: float | None = None
    ordering_key: OrderingKey = None
    tag: str | None = None
    is_async: bool = field(init=False)
    wants_context: bool = field(init=False)
    signature: inspect.Signature = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        checked_name(self.name, "a task name", TASK_NAME)
        checked_name(self.queue, "a queue name")
        checked_priority(self.priority)
        checked_attempts(self.max_attempts)
        if not isinstance(self.retry, Retry):
            raise InvalidArgument(f"retry must be a dibs.Retry, got {self.retry!r}")
        object.__setattr__(self, "timeout", positive_seconds(self.timeout, "timeout"))
        if self.tag is not None:
            checked_name(self.tag, "a tag")
        if self.ordering_key is not None and not (isinstance(self.ordering_key, str) or callable(self.ordering_key)):
            raise InvalidArgument(
                f"ordering_key must name an argument or be a function of the arguments, got {self.ordering_key!r}"
            )
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.function))
        object.__setattr__(self, "signature", inspect.signature(self.function))
        object.__setattr__(self, "wants_context", "context" in self.signature.parameters)

    @property
    def parameters(self) -> str:
        """The function's parameters as a reader wants them, without annotations: ``(n, *, unit='s')``."""
        plain = [
            parameter.replace(annotation=inspect.Parameter.empty) for parameter in self.signature.parameters.values()
        ]
        return str(self.signature.replace(parameters=plain, return_annotation=inspect.Signature.empty))

    def misfit(self, kwargs: Mapping[str, Any]) -> str | None:
        """Why the function cannot be called with these keyword arguments; None if it can."""
        try:
            self.signature.bind(**kwargs)
        except TypeError as exc:
            return str(exc)
        return None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function directly, in this process, without a job."""
        return self.function(*args, **kwargs)

    def key_for(self, args: Mapping[str, Any]) -> str | None:
        """The ordering key of a job with these arguments, if the task has one."""
        if self.ordering_key is None:
            return None
        if isinstance(self.ordering_key, str):
            if self.ordering_key not in args:
                raise InvalidArgument(
                    f"task {self.name!r} orders its jobs by the argument {self.ordering_key!r}, "
                    "but this job does not have it; pass it, or give ordering_key= when enqueueing"
                )
            value = args[self.ordering_key]
        else:
            value = self.ordering_key(args)
        return None if value is None else str(value)

    def enqueue(self, args: Mapping[str, Any] | None = None, /, **options: Any) -> Job:
        """Enqueue one job of this task; ``options`` as for :meth:`App.enqueue`."""
        return self.app.enqueue(self, args, **options)

    async def aenqueue(self, args: Mapping[str, Any] | None = None, /, **options: Any) -> Job:
        """enqueue() for asyncio."""
        return await self.app.aenqueue(self, args, **options)
