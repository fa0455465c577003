"""Throwaway PostgreSQL and MariaDB servers a test starts, restarts and stops itself (the shared servers are
left alone).

Each gets a fresh data directory (``initdb``, ``mariadb-install-db``) and a free loopback port, and runs as an
unprivileged user (PostgreSQL refuses to run as root: as root, the ``postgres`` or ``mysql`` user runs it, as
scripts/lib/servers.sh does). ``destroy()`` stops it at once and removes its files; call it from a finalizer.
Both have ``url``, ``restart(mode)`` (``fast``: a clean shutdown; ``immediate``: killed, crash recovery at the
next start), ``outage(seconds)`` and ``restarts``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
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


def _service_user(name: str) -> pwd.struct_passwd | None:
    """As root, the account the server must run as; None when not root (it runs as the caller)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise ServerUnavailable(
            f"running as root, and there is no {name!r} user to run a throwaway server as"
        ) from None


def _server_directory(prefix: str, owner: pwd.struct_passwd | None) -> Path:
    """A fresh directory outside pytest's per-user temporary tree, which the server's user may not enter."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)
    if owner is not None:
        os.chown(root, owner.pw_uid, owner.pw_gid)
    return root


def _wait_answering(url: sa.URL, timeout: float, describe: str, log_tail: str | None = None) -> None:
    """Until a connection to ``url`` gets an answer."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
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
                        f"{describe} did not answer within {timeout} s: {error}\nserver log:\n{log_tail}"
                    ) from error
                time.sleep(0.1)
    finally:
        engine.dispose()


class ThrowawayPostgres:
    """A PostgreSQL server of one test's own: ``initdb`` into a fresh directory, ``pg_ctl`` to run it."""

    def __init__(self) -> None:
        self.initdb = _binary("initdb")
        self.pg_ctl = _binary("pg_ctl")
        self.as_user: list[str] = []
        owner = _service_user("postgres")
        if owner is not None:
            runuser = shutil.which("runuser")
            if runuser is None:
                raise ServerUnavailable("running as root without runuser: cannot start PostgreSQL as 'postgres'")
            self.as_user = [runuser, "-u", "postgres", "--"]
        self.root = _server_directory("dibs-chaos-pg-", owner)
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
        _wait_answering(self.url, timeout, f"the throwaway PostgreSQL server on port {self.port}", self.log_tail())

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

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (its data stays; ``outage`` or ``restart`` starts it again)."""
        done = self._run(self.pg_ctl, "-D", str(self.data), "-w", "-m", mode, "stop")
        self._check(done, f"stop (-m {mode})")

    def outage(self, seconds: float, mode: str = "fast") -> None:
        """Stop the server, leave it down ``seconds``, and start it again on the same port and data."""
        self.stop(mode)
        time.sleep(seconds)
        self._start()
        self.restarts += 1

    def destroy(self) -> None:
        """Stop the server at once if it runs, and remove its files; never raises."""
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(self.pg_ctl, "-D", str(self.data), "-w", "-m", "immediate", "stop", timeout=60)
        except Exception:  # best effort: the files go regardless
            pass
        shutil.rmtree(self.root, ignore_errors=True)


class ThrowawayMariaDB:
    """A MariaDB server of one test's own: ``mariadb-install-db`` into a fresh directory, ``mariadbd`` run in
    the foreground as a child process (a fast restart is SIGTERM, an immediate one SIGKILL)."""

    def __init__(self) -> None:
        self.install_db = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
        self.mariadbd = shutil.which("mariadbd") or (
            "/usr/sbin/mariadbd" if os.access("/usr/sbin/mariadbd", os.X_OK) else None
        )
        if self.install_db is None or self.mariadbd is None:
            raise ServerUnavailable(
                "mariadb-install-db or mariadbd is missing: install the MariaDB server "
                "(Debian: apt-get install mariadb-server) to run the database-restart scenarios"
            )
        owner = _service_user("mysql")
        self.user = owner.pw_name if owner is not None else pwd.getpwuid(os.geteuid()).pw_name
        self.root = _server_directory("dibs-chaos-maria-", owner)
        self.data = self.root / "data"
        self.log = self.root / "error.log"
        self.port = free_port()
        self.restarts = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> sa.URL:
        return sa.make_url(f"mysql+pymysql://root@127.0.0.1:{self.port}/chaos")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    def start(self) -> ThrowawayMariaDB:
        done = subprocess.run(
            [self.install_db, "--no-defaults", f"--datadir={self.data}", f"--user={self.user}", "--skip-test-db"],
            capture_output=True, text=True, timeout=START_TIMEOUT, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise ServerUnavailable(
                f"could not make a throwaway MariaDB data directory in {self.data} (exit {done.returncode}): "
                f"{done.stderr.strip() or done.stdout.strip()}"
            )
        self._start()
        with sa.create_engine(self.url.set(database="mysql"), poolclass=sa.pool.NullPool).connect() as conn:
            conn.execute(sa.text("CREATE DATABASE chaos"))
        return self

    def _start(self) -> None:
        assert self.mariadbd is not None
        with self.log.open("ab") as output:
            self.process = subprocess.Popen(
                [
                    self.mariadbd, "--no-defaults", f"--datadir={self.data}", f"--user={self.user}",
                    f"--port={self.port}", "--bind-address=127.0.0.1", f"--socket={self.root / 'mariadb.sock'}",
                    f"--pid-file={self.root / 'mariadb.pid'}", "--skip-grant-tables", "--skip-log-bin",
                    "--innodb-flush-log-at-trx-commit=2", "--innodb-buffer-pool-size=64M", "--max-connections=200",
                    f"--log-error={self.log}",
                ],
                stdout=output, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            _wait_answering(
                self.url.set(database="mysql"), START_TIMEOUT, f"the throwaway MariaDB server on port {self.port}"
            )
        except ServerUnavailable as error:
            raise ServerUnavailable(f"{error}{self.log_tail()}") from None

    def _halt(self, mode: str) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM if mode == "fast" else signal.SIGKILL)
        try:
            self.process.wait(START_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise ServerUnavailable(f"the throwaway MariaDB server did not stop within {START_TIMEOUT} s") from None

    def restart(self, mode: str = "fast") -> None:
        """``fast``: SIGTERM, a clean shutdown; ``immediate``: SIGKILL, InnoDB crash recovery at the start."""
        self._halt(mode)
        self._start()
        self.restarts += 1

    def outage(self, seconds: float, mode: str = "fast") -> None:
        self._halt(mode)
        time.sleep(seconds)
        self._start()
        self.restarts += 1

    def destroy(self) -> None:
        """Kill the server if it runs, and remove its files; never raises."""
        try:
            if self.process is not None and self.process.poll() is None:
                self.process.kill()
                self.process.wait(30)
        except Exception:  # best effort: the files go regardless
            pass
        shutil.rmtree(self.root, ignore_errors=True)
