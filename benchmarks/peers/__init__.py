"""The peers the drain benchmark measures dibs against, one module each, all with the same shape.

A peer module defines:

* ``NAME``: the kind's name in the results (``"pgqueuer"``).
* ``BACKENDS``: the backends it runs on (``("postgresql",)``).
* ``PACKAGES``: the distributions whose versions the run records.
* ``SETTINGS``: its best documented configurations, each a dict with at least ``"batch"`` (the number of
  jobs it takes per fetch, 1 where it fetches one at a time) and anything else the peer needs.
* ``parse(text) -> list[dict]``: settings from the command line (``--<name> TEXT``).
* ``label(setting) -> str``: a short name for a setting in tables (``"apg/b500"``).
* ``class Database(backend, server_url)``: made once per backend in the parent process. It creates a
  database (or file) of its own, never the caller's, and installs the peer's schema. Methods:
  ``refill(jobs)`` empties the queue and enqueues exactly ``jobs`` no-op jobs before a trial (not timed),
  each with the arguments ``benchmarks.payload.args(n)`` gives every system;
  ``verify(jobs) -> float`` checks after a trial that every job ran exactly once and the queue is empty
  (raises ``RuntimeError`` saying what was found otherwise) and returns the seconds from the first job
  taken to the last finished, from the peer's own records (``float("nan")`` when it keeps none);
  ``address() -> str`` what a worker process needs to connect; ``close()`` drops what it created.
* ``drain(address, setting, start) -> (done, end, stats)``: runs in a fresh (spawned) worker process,
  with imports done and connections open before it waits on the ``start`` barrier; then it runs the
  peer's own worker until the queue is empty and returns the number of jobs its handler ran, the
  ``time.monotonic()`` when the worker returned, and a dict of anything worth keeping.
"""
