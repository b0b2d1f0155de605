"""A throwaway PostgreSQL server on a Unix socket, for tests, the bench and trying
the shared ledger on one machine: ``initdb`` into a directory, ``postgres`` as a
child process listening on no TCP port at all, stopped (and its directory left
for the caller to remove) by ``stop``.

PostgreSQL refuses to run as root; as root the server runs as the ``postgres``
user (Debian's package makes it).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from corral.core.errors import CorralError


class LocalPostgresError(CorralError, RuntimeError):
    pass


def find_bindir() -> Path:
    """Where ``initdb`` and ``postgres`` are: PATH first, then Debian's layout."""
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)
    if candidates:
        return candidates[0].parent
    raise LocalPostgresError(
        "PostgreSQL is not installed (no initdb): apt-get install -y postgresql (make test installs it)"
    )


def _world_traversable(directory: Path) -> bool:
    """Every directory down to ``directory`` lets other users pass (the server's
    user must reach its data directory)."""
    for part in [directory, *directory.parents]:
        try:
            if not part.stat().st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


class LocalPostgres:
    def __init__(self, root: Path | None = None, *, durable: bool = False) -> None:
        """``root``: where the cluster and its socket go; default (and whenever the
        server's user could not reach it): a new directory in /tmp, removed by
        ``stop``. ``durable``: fsync as a production server does (the bench);
        without it the tests' server skips fsync (it is never killed, only the
        nodes are)."""
        self.owned = root is None or (os.getuid() == 0 and not _world_traversable(root.parent))
        if self.owned:
            root = Path(tempfile.mkdtemp(prefix="corral-pg-", dir="/tmp"))
        assert root is not None
        self.root = root
        self.data = root / "data"
        self.durable = durable
        self.process: subprocess.Popen[bytes] | None = None
        self._user: str | None = None
        self._settings: list[str] = []

    @property
    def socket_dir(self) -> Path:
        return self.root

    def url(self, database: str = "postgres") -> str:
        return f"postgresql:///{database}?host={self.socket_dir}&user=postgres"

    def _as_server_user(self) -> dict[str, str]:
        if os.getuid() != 0:
            return {}
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise LocalPostgresError("running as root needs a 'postgres' user for the server") from None
        return {"user": "postgres", "group": "postgres"}

    def start(self, timeout: float = 60.0) -> None:
        bindir = find_bindir()
        self.root.mkdir(parents=True, exist_ok=True)
        who = self._as_server_user()
        if who:
            shutil.chown(self.root, who["user"], who["group"])
        log = self.root / "initdb.log"
        with open(log, "wb") as out:
            done = subprocess.run(
                [str(bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                 "--no-sync", "--no-instructions"],
                stdout=out, stderr=subprocess.STDOUT, check=False, **who,  # type: ignore[call-overload]
            )
        if done.returncode != 0:
            raise LocalPostgresError(f"initdb failed: {log.read_text()[-600:]}")
        self._settings = [
            "listen_addresses=", f"unix_socket_directories={self.socket_dir}", "max_connections=200",
            "shared_buffers=128MB", "autovacuum=off", "max_parallel_workers_per_gather=0",
        ]
        if not self.durable:
            self._settings += ["fsync=off", "full_page_writes=off", "synchronous_commit=off"]
        self.launch(timeout)

    def launch(self, timeout: float = 60.0) -> None:
        """Start the server on the cluster ``start`` made (again, after ``shut_down``)."""
        args = [str(find_bindir() / "postgres"), "-D", str(self.data)]
        for setting in self._settings:
            args += ["-c", setting]
        with open(self.root / "server.log", "ab") as log:
            self.process = subprocess.Popen(  # type: ignore[call-overload]
                args, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True, **self._as_server_user(),
            )
        self._wait_ready(timeout)

    def shut_down(self) -> None:
        """A fast shutdown (``pg_ctl stop -m fast``), keeping the cluster: every
        client is disconnected, and new connections are refused until ``launch``."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def restart(self, timeout: float = 60.0) -> None:
        """``pg_ctl restart -m fast``: down and up again at once."""
        self.shut_down()
        self.launch(timeout)

    def _wait_ready(self, timeout: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise LocalPostgresError(f"postgres exited: {(self.root / 'server.log').read_text()[-600:]}")
            try:
                psycopg.connect(self.url(), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise LocalPostgresError(f"postgres did not start in {timeout:.0f} s") from None
                time.sleep(0.05)

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def stop(self) -> None:
        """Fast shutdown (SIGINT), then SIGKILL of the whole group if it hangs."""
        self.shut_down()
        if self.owned:
            shutil.rmtree(self.root, ignore_errors=True)
