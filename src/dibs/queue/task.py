"""Tasks: the functions a worker runs, with the defaults their jobs are enqueued with."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from dibs._checks import checked_attempts, checked_name, checked_priority, checked_seconds
from dibs._errors import InvalidArgument
from dibs.queue.typed_arguments import Mismatch, Shape, label, typed_parameters
from dibs.retry import DEFAULT_RETRY, Retry

if TYPE_CHECKING:
    from dibs.queue.job import Job

#: The longest task name (the column's size); queue names and tags take up to 100 characters.
TASK_NAME_LIMIT = 200

OrderingKey = str | Callable[[Mapping[str, Any]], object] | None


class TaskApp(Protocol):
    """What a task reads of the app it is registered with (a :class:`dibs.App`)."""

    @property
    def queues(self) -> frozenset[str]: ...
    @property
    def max_args_bytes(self) -> int: ...
    def enqueue(self, task: Task, args: Mapping[str, Any] | None = None, /, **options: Any) -> Job: ...
    async def aenqueue(self, task: Task, args: Mapping[str, Any] | None = None, /, **options: Any) -> Job: ...


@dataclass(frozen=True, kw_only=True)
class Task:
    """A registered function and the defaults of its jobs; made by :meth:`dibs.App.task`.

    Attributes:
        app: The app the task is registered with.
        function: The sync or async function a job runs, called with the job's arguments as keywords
            (and ``context``, a :class:`~dibs.JobContext`, if it takes one). Parameters annotated with
            dataclasses or pydantic models are checked and stored as JSON at enqueue, and rebuilt in the worker.
        name: The registered name, which jobs store.
        queue: The queue its jobs go to unless enqueued with another.
        priority: Higher runs first within a queue (-1,000,000 to 1,000,000).
        max_attempts: How many times a job runs before it is dead.
        retry: When and how soon a failed job runs again.
        timeout: Seconds a run may take before it is stopped and counted failed; None for no limit.
        ordering_key: An argument's name (or a function of the arguments) whose value puts jobs in a
            line: jobs with the same key run one at a time, in enqueue order.
        tag: Only workers serving this tag take its jobs.
        transactional: The function's writes through ``context.conn`` and the job's completion commit in
            one transaction, fenced by the job's lease: a run whose lease was taken over commits nothing.

    Example:
        >>> @app.task(queue="billing", ordering_key="customer")
        ... def charge(customer: str, cents: int) -> None: ...
        >>> charge.enqueue({"customer": "c-7", "cents": 1200})
    """

    app: TaskApp
    function: Callable[..., Any]
    name: str
    queue: str = "default"
    priority: int = 0
    max_attempts: int = 5
    retry: Retry = DEFAULT_RETRY
    timeout: float | None = None
    ordering_key: OrderingKey = None
    tag: str | None = None
    transactional: bool = False
    is_async: bool = field(init=False)
    wants_context: bool = field(init=False)
    signature: inspect.Signature = field(init=False, repr=False, compare=False)
    #: The parameters annotated with dataclasses or pydantic models, converted at enqueue and in the worker.
    typed: Mapping[str, Shape] = field(init=False, repr=False, compare=False)
    #: misfit() by the argument names a job has: binding reads the names only, and a bulk enqueue has
    #: thousands of jobs with the same names.
    _misfits: dict[frozenset[str], str | None] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        checked_name(self.name, "a task name", TASK_NAME_LIMIT)
        checked_name(self.queue, "a queue name")
        checked_priority(self.priority)
        checked_attempts(self.max_attempts)
        if not isinstance(self.retry, Retry):
            raise InvalidArgument(f"retry must be a dibs.Retry, got {self.retry!r}")
        if self.timeout is not None:
            object.__setattr__(self, "timeout", checked_seconds(self.timeout, "timeout"))
        if self.tag is not None:
            checked_name(self.tag, "a tag")
        if self.ordering_key is not None and not (isinstance(self.ordering_key, str) or callable(self.ordering_key)):
            raise InvalidArgument(
                f"ordering_key must name an argument or be a function of the arguments, got {self.ordering_key!r}"
            )
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.function))
        object.__setattr__(self, "signature", inspect.signature(self.function))
        object.__setattr__(self, "wants_context", "context" in self.signature.parameters)
        try:
            object.__setattr__(self, "typed", typed_parameters(self.function, self.signature))
        except TypeError as exc:
            raise InvalidArgument(f"task {self.name!r} has a parameter dibs cannot convert: {exc}") from exc
        if not isinstance(self.transactional, bool):
            raise InvalidArgument(f"transactional must be True or False, got {self.transactional!r}")
        if self.transactional and not self.wants_context:
            raise InvalidArgument(
                f"task {self.name!r} is transactional, but its function has no context parameter, through which "
                "it gets the transaction's connection (context.conn); add a parameter named context"
            )

    @property
    def parameters(self) -> str:
        """The function's parameters as a reader wants them, without annotations: ``(n, *, unit='s')``."""
        plain = [
            parameter.replace(annotation=inspect.Parameter.empty) for parameter in self.signature.parameters.values()
        ]
        return str(self.signature.replace(parameters=plain, return_annotation=inspect.Signature.empty))

    def misfit(self, kwargs: Mapping[str, Any]) -> str | None:
        """Why the function cannot be called with these keyword arguments.

        Args:
            kwargs: The keyword arguments.

        Returns:
            The reason, or None if they fit.
        """
        try:
            self.signature.bind(**kwargs)
        except TypeError as exc:
            return str(exc)
        return None

    def refusal(self, args: Mapping[str, Any]) -> str | None:
        """Why a job with these arguments can never run, as enqueue says it.

        Args:
            args: The job's arguments.

        Returns:
            The reason, or None if they fit the function.
        """
        names = frozenset(args)
        if names in self._misfits:
            return self._misfits[names]
        if self.wants_context and "context" in names:
            why: str | None = "context is not an argument a job can have: the worker passes it"
        else:
            misfit = self.misfit(dict.fromkeys(names | ({"context"} if self.wants_context else set())))
            why = None if misfit is None else f"{misfit}; task {self.name!r} takes {self.parameters}"
        if len(self._misfits) < 1000:
            self._misfits[names] = why
        return why

    def dumped(self, args: Mapping[str, Any]) -> Mapping[str, Any]:
        """A job's arguments with the typed ones checked and in their JSON form.

        Args:
            args: The job's arguments; a typed one may be an instance of its annotation or a dict of its fields.

        Returns:
            The arguments to store (``args`` itself when the task has no typed parameters).

        Raises:
            InvalidArgument: A typed argument does not fit its annotation; the message names the parameter.
        """
        if not self.typed:
            return args
        dumped = dict(args)
        for name, shape in self.typed.items():
            if name in args:
                try:
                    dumped[name] = shape.dump(args[name])
                except Mismatch as exc:
                    raise InvalidArgument(
                        f"argument {name!r} of a {self.name!r} job does not fit its annotation "
                        f"{self._annotation(name)}: {exc}"
                    ) from exc
        return dumped

    def loaded(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """A job's stored arguments with the typed ones rebuilt into their annotations, as the function takes them.

        Raises:
            Mismatch: A stored argument no longer fits its annotation (the task changed since the job was
                enqueued); the message names the parameter.
        """
        loaded = dict(args)
        for name, shape in self.typed.items():
            if name in args:
                try:
                    loaded[name] = shape.load(args[name])
                except Mismatch as exc:
                    raise Mismatch(
                        f"argument {name!r} does not fit its annotation {self._annotation(name)}: {exc}"
                    ) from exc
        return loaded

    def _annotation(self, name: str) -> str:
        annotation = self.signature.parameters[name].annotation
        return annotation if isinstance(annotation, str) else label(annotation)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function directly, in this process, without a job."""
        return self.function(*args, **kwargs)

    def key_for(self, args: Mapping[str, Any]) -> str | None:
        """The ordering key of a job with these arguments, if the task has one.

        Args:
            args: The job's arguments.

        Returns:
            The key as text, or None.

        Raises:
            InvalidArgument: The task orders by an argument the job does not have.
        """
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
        """Enqueue one job of this task.

        Args:
            args: The job's arguments, a JSON object.
            **options: As for :meth:`dibs.App.enqueue` (``conn``, ``delay``, ``queue``...).

        Returns:
            The job as stored.
        """
        return self.app.enqueue(self, args, **options)

    async def aenqueue(self, args: Mapping[str, Any] | None = None, /, **options: Any) -> Job:
        """:meth:`enqueue` for asyncio.

        Args:
            args: The job's arguments, a JSON object.
            **options: As for :meth:`dibs.App.aenqueue`.

        Returns:
            The job as stored.
        """
        return await self.app.aenqueue(self, args, **options)
