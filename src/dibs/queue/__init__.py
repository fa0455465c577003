"""The job queue: tasks, enqueue, the worker, retries and dead letters, on claim and fenced leases."""

from dibs.queue.app import App, QueueStatus
from dibs.queue.job import Job, JobContext
from dibs.queue.registry import StrandedJobs, WorkerStatus
from dibs.queue.task import Task
from dibs.queue.worker import Worker, WorkerStats
from dibs.queue.workflows import Step
from dibs.retry import Retry

__all__ = [
    "App",
    "Job",
    "JobContext",
    "QueueStatus",
    "Retry",
    "Step",
    "StrandedJobs",
    "Task",
    "Worker",
    "WorkerStats",
    "WorkerStatus",
]
