"""A throwaway PostgreSQL server a test starts, restarts and stops itself (the shared server is left alone).

The data directory is made fresh with ``initdb`` on a free loopback port; the server runs as an unprivileged
user (PostgreSQL refuses to run as root: as root, the ``postgres`` user runs it, as scripts/lib/servers.sh
does). :meth:`ThrowawayPostgres.destroy` stops it at once and removes its files; call it from a finalizer.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

#: How long a start or a restart may take before the test fails saying so (the machine is shared and noisy).
START_TIMEOUT = 60


class ServerUnavailable(RuntimeError):
    """No throwaway server could be made on this machine; the message says why."""


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for directory in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        candidate = os.path.join(directory, name)
        if os.access(candidate, os.X_OK):
            return candidate
    raise ServerUnavailable(
        f"{name} is not on PATH nor in /usr/lib/postgresql/*/bin: install the PostgreSQL server "
        "(Debian: apt-get install postgresql) to run the database-restart scenarios"
    )


class ThrowawayPostgres:
    """A PostgreSQL server of one test's own: ``initdb`` into a fresh directory, ``pg_ctl`` to run it."""

    def __init__(self) -> None:
        self.initdb = _binary("initdb")
        self.pg_ctl = _binary("pg_ctl")
        self.as_user: list[str] = []
        owner: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise ServerUnavailable(
                    "running as root, and there is no 'postgres' user to run a throwaway PostgreSQL server as "
                    "(initdb refuses to run as root)"
                ) from None
            runuser = shutil.which("runuser")
            if runuser is None:
                raise ServerUnavailable("running as root without runuser: cannot start PostgreSQL as 'postgres'")
            self.as_user = [runuser, "-u", "postgres", "--"]
        # Outside pytest's per-user temporary tree, which the server's user may not be allowed to enter.
        self.root = Path(tempfile.mkdtemp(prefix="dibs-chaos-pg-"))
        self.root.chmod(0o755)
        if owner is not None:
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self.restarts = 0

    @property
    def url(self) -> sa.URL:
        return sa.make_url(f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres")

    def _run(self, *command: str, timeout: float = START_TIMEOUT) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.as_user, *command], capture_output=True, text=True, timeout=timeout, check=False)

    def _options(self) -> str:
        return (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=100 -c shared_buffers=32MB"
        )

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    def _check(self, done: subprocess.CompletedProcess[str], what: str) -> None:
        if done.returncode != 0:
            raise ServerUnavailable(
                f"could not {what} a throwaway PostgreSQL server in {self.root} on port {self.port} "
                f"(exit {done.returncode}): {done.stderr.strip() or done.stdout.strip()}\n"
                f"server log:\n{self.log_tail()}"
            )

    def start(self) -> ThrowawayPostgres:
        """initdb, then start the server and wait until it answers."""
        done = self._run(self.initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust", "-N", "-E", "UTF8")
        self._check(done, "initdb")
        self._start(first=True)
        return self

    def _start(self, *, first: bool = False) -> None:
        for attempt in range(3):
            done = self._run(
                self.pg_ctl,
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-w",
                "-t",
                str(START_TIMEOUT),
                "-o",
                self._options(),
                "start",
            )
            if done.returncode == 0:
                break
            if first and attempt < 2 and "could not bind" in self.log_tail():
                self.port = free_port()  # someone took the port meanwhile
                continue
            self._check(done, "start")
        self.wait_answering()

    def wait_answering(self, timeout: float = START_TIMEOUT) -> None:
        """Until a connection gets an answer (pg_ctl -w returns when the server accepts connections)."""
        engine = sa.create_engine(self.url, poolclass=sa.pool.NullPool)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    with engine.connect() as conn:
                        conn.execute(sa.text("SELECT 1"))
                    return
                except sa.exc.OperationalError as error:
                    if time.monotonic() > deadline:
                        raise ServerUnavailable(
                            f"the throwaway PostgreSQL server on port {self.port} did not answer within "
                            f"{timeout} s: {error}\nserver log:\n{self.log_tail()}"
                        ) from error
                    time.sleep(0.1)
        finally:
            engine.dispose()

    def restart(self, mode: str = "fast") -> None:
        """``pg_ctl restart -m MODE``: every session is cut; ``immediate`` skips the shutdown checkpoint, so
        the server comes back through crash recovery."""
        done = self._run(
            self.pg_ctl,
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-w",
            "-t",
            str(START_TIMEOUT),
            "-m",
            mode,
            "-o",
            self._options(),
            "restart",
        )
        self._check(done, f"restart (-m {mode})")
        self.restarts += 1
        self.wait_answering()

    def outage(self, seconds: float, mode: str = "fast") -> None:
        """Stop the server, leave it down ``seconds``, and start it again on the same port and data."""
        done = self._run(self.pg_ctl, "-D", str(self.data), "-w", "-m", mode, "stop")
        self._check(done, f"stop (-m {mode})")
        time.sleep(seconds)
        self._start()
        self.restarts += 1

    def running(self) -> bool:
        return self._run(self.pg_ctl, "-D", str(self.data), "status", timeout=30).returncode == 0

    def destroy(self) -> None:
        """Stop the server at once if it runs, and remove its files; never raises."""
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(self.pg_ctl, "-D", str(self.data), "-w", "-m", "immediate", "stop", timeout=60)
        except Exception:  # best effort: the files go regardless
            pass
        shutil.rmtree(self.root, ignore_errors=True)
