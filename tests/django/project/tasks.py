"""The project's tasks, as Django's task framework declares them."""

from django_tasks import task
from project.models_log import record


@task()
def add(a: int, b: int) -> int:
    record(f"add {a} {b}")
    return a + b


@task()
def pair(label: str) -> tuple[str, tuple[str, int]]:
    return label, (label, 1)


@task(queue_name="mail", priority=5)
def send(to: str) -> None:
    record(f"send {to}")


@task()
def boom() -> None:
    raise ValueError("boom")


@task(takes_context=True)
def which(context, label: str) -> None:
    record(f"which {label} attempt {context.attempt}")
