"""A supervisor daemon under test: started through the real CLI, always reaped.

Waiting is condition-based: ``wait_until`` re-reads status each time the event
stream moves (a long-poll on the cursor), with a deadline only as a safety net.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from corral import client
from corral.client_start import SupervisorStartError, start_supervisor
from corral.core.procs import wait_exit
from corral.mailbox.control import SupervisorGone
from corral.supervisor.home import home_dir as homes
from corral.supervisor.spec.swarm_spec import SpecError

CORRAL = [sys.executable, "-m", "corral"]


def cli(
    home: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [*CORRAL, "--home", str(home), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        check=False,
    )


class Daemon:
    def __init__(self, home: Path, spec: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.home = home
        self.spec = spec
        self.env = env or {}
        self.pids_seen: set[int] = set()

    # -- lifecycle -----------------------------------------------------------------

    def up(self, env: dict[str, str] | None = None, spec: bool = True) -> homes.Endpoint:
        """Start the supervisor the way ``corral up`` does (``start_supervisor``, which
        the CLI calls), without a CLI process around it: that process cost about
        0.5 s of CPU per boot, hundreds of boots per suite. The supervisor checks the
        spec itself (``checked``: it is not imported into the test process, where
        user tool modules of different tests would share ``sys.modules``), and
        reports a bad one on its ready pipe. It is this process's child; the
        conftest reaps it once it exits. The CLI's own ``up`` is tested through
        ``cli`` (tests/test_spec_and_ledger.py, tests/security/)."""
        environment = {**os.environ, **self.env, **(env or {})}
        if spec and self.spec is not None and self.spec.is_file():
            text = self.spec.read_text()
            # The tests' swarms run alone (see unattended()), on the transport asked for.
            if unattended(with_transport(text)) != text:
                self.spec.write_text(unattended(with_transport(text)))
        try:
            start_supervisor(self.home, self.spec if spec else None, 30.0, env=environment, checked=True)
        except (SupervisorStartError, SpecError, homes.HomeError) as exc:
            raise AssertionError(f"corral up failed: {exc}") from None
        endpoint = homes.read_endpoint(self.home)
        self.pids_seen.add(endpoint.pid)
        return endpoint

    @property
    def endpoint(self) -> homes.Endpoint:
        return homes.read_endpoint(self.home)

    def call(self, method: str, timeout: float = 15, **params: Any) -> Any:
        if method == "run" and "run_id" not in params:
            # Our own id: if a failpoint kills the supervisor before its reply
            # arrives, the run is still known (creation commits before any step).
            params["run_id"] = "run-t" + uuid.uuid4().hex[:12]
            try:
                return client.call(self.home, method, timeout=timeout, **params)
            except SupervisorGone:
                return {"run_id": params["run_id"]}
        return client.call(self.home, method, timeout=timeout, **params)

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self.call("status")
        return result

    def actor(self, actor_id: str) -> dict[str, Any]:
        for actor in self.status()["actors"]:
            if actor["id"] == actor_id:
                return dict(actor)
        raise KeyError(actor_id)

    def tree_pids(self) -> set[int]:
        """The supervisor and every process below it."""
        try:
            sup = psutil.Process(homes.read_endpoint(self.home).pid)
        except (homes.HomeError, psutil.NoSuchProcess):
            return set()
        return {sup.pid, *(p.pid for p in sup.children(recursive=True))}

    def kill_supervisor(self) -> int:
        pid = self.endpoint.pid
        os.kill(pid, signal.SIGKILL)
        assert wait_exit(pid, 10)
        return pid

    def wait_until(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 30, what: str = "condition"
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        cursor = 0
        while True:
            status = self.status()
            if predicate(status):
                return status
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out waiting for {what}; last status: {json.dumps(status)[:2000]}")
            reply = self.call(
                "events",
                timeout=remaining + 5,
                since=max(cursor, status["cursor"]),
                wait_ms=int(min(remaining, 5) * 1000),
            )
            cursor = reply["cursor"]

    def events(self, since: int = 0) -> list[dict[str, Any]]:
        """Every event after ``since``, page by page."""
        return client.all_events(self.home, since)

    def shutdown(self) -> None:
        """Teardown: graceful down if alive, then SIGKILL anything left."""
        pids = self.tree_pids()
        try:
            endpoint = homes.read_endpoint(self.home)
            client.call(self.home, "down", timeout=5)
            wait_exit(endpoint.pid, 20)
        except Exception:
            pass
        procs = []
        for pid in pids | self.pids_seen:
            try:
                procs.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                continue
        for proc in procs:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        for proc in procs:
            wait_exit(proc.pid, 5)


UNATTENDED = 'default = "auto"'


def unattended(spec_text: str) -> str:
    """``spec_text`` as an unattended swarm: ``[policy] default = "auto"`` unless the
    spec sets a default itself. corral asks a person before a write or a command
    (seed 004's default); the tests' swarms run alone, and a test about approvals
    names the tool it wants a person for (a named tool wins over the default, and
    project.git_commit and project.restore are never lowered)."""
    lines = spec_text.splitlines()
    if any(line.strip().replace(" ", "").startswith("default=") for line in lines):
        return spec_text
    for index, line in enumerate(lines):
        if line.strip() == "[policy]":
            return "\n".join([*lines[: index + 1], UNATTENDED, *lines[index + 1:]]) + "\n"
    return f"{spec_text.rstrip()}\n\n[policy]\n{UNATTENDED}\n"


#: ``CORRAL_TRANSPORT=unix`` (or ``nng``) runs the tests' supervisors on that link
#: transport; unset, a spec's own (nng by default).
TRANSPORT_ENV = "CORRAL_TRANSPORT"


def with_transport(spec_text: str) -> str:
    """``spec_text`` on the transport ``CORRAL_TRANSPORT`` names, unless it names its
    own (a test about loopback tcp keeps it)."""
    transport = os.environ.get(TRANSPORT_ENV)
    if not transport:
        return spec_text
    table = ""
    for line in spec_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            table = stripped
        elif table == "[supervisor]" and stripped.replace(" ", "").startswith("transport="):
            return spec_text
    lines = spec_text.splitlines()
    for index, line in enumerate(lines):
        if line.strip() == "[supervisor]":
            return "\n".join([*lines[: index + 1], f'transport = "{transport}"', *lines[index + 1:]]) + "\n"
    # Appended: a table put first would take in the spec's top-level keys.
    return f'{spec_text.rstrip()}\n\n[supervisor]\ntransport = "{transport}"\n'


def as_a_terminal_job() -> None:
    """``preexec_fn`` for a child a test interrupts with SIGINT: Ctrl-C reaches it as
    it reaches a terminal's foreground job. A test run started in the background by
    a script inherits SIGINT ignored (POSIX does that to asynchronous commands), and
    Python then never turns SIGINT into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def running(home: Path, spec_text: str | None = None, env: dict[str, str] | None = None) -> Iterator[Daemon]:
    spec_path = None
    if spec_text is not None:
        home.parent.mkdir(parents=True, exist_ok=True)
        spec_path = home.parent / f"{home.name}-spec.toml"
        spec_path.write_text(spec_text)
    daemon = Daemon(home, spec_path, env)
    try:
        daemon.up()
        yield daemon
    finally:
        daemon.shutdown()


@contextmanager
def module_daemon(
    spec_text: str, *, home: str = "home", prepare: Callable[[Path], None] | None = None
) -> Iterator[Daemon]:
    """One supervisor a test module shares (starting one is most of a test's time),
    in a short directory of its own (ipc:// paths stay under 107 bytes) holding the
    project root ``ws/``; ``prepare(top)`` adds files before it starts."""
    top = Path(tempfile.mkdtemp(prefix="crl-", dir="/tmp"))
    try:
        (top / "ws").mkdir()
        if prepare is not None:
            prepare(top)
        with running(top / home, spec_text) as daemon:
            yield daemon
    finally:
        shutil.rmtree(top, ignore_errors=True)


def actor_running(actor_id: str, incarnation: int | None = None) -> Callable[[dict[str, Any]], bool]:
    def check(status: dict[str, Any]) -> bool:
        for actor in status["actors"]:
            if actor["id"] == actor_id:
                return actor["status"] == "running" and (incarnation is None or actor["incarnation"] == incarnation)
        return False

    return check


def show(daemon: Daemon, run_id: str) -> dict[str, Any]:
    result: dict[str, Any] = daemon.call("show", run_id=run_id)
    return result


def wait_run(daemon: Daemon, run_id: str, statuses: set[str], timeout: float = 60) -> dict[str, Any]:
    """Wait (on event-stream changes) until the run reaches one of ``statuses``."""
    deadline = time.monotonic() + timeout
    cursor = 0
    while True:
        shown = show(daemon, run_id)
        if shown["run"]["status"] in statuses:
            return shown
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"run {run_id} stuck in {shown['run']['status']}: {json.dumps(shown)[:1500]}")
        cursor = daemon.call("events", timeout=remaining + 5, since=cursor, wait_ms=int(min(remaining, 5) * 1000))[
            "cursor"
        ]


def wait_supervisor_gone(daemon: Daemon, pid: int, timeout: float = 60) -> None:
    assert wait_exit(pid, timeout), f"supervisor {pid} still running after {timeout}s"


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60) -> Any:
    """Poll a condition that lives in another process (a file, a row, a lease) until
    it holds, and return its value; fail naming ``what`` past ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def adopted_daemon(adopter: Daemon, partition: str, env: dict[str, str]) -> Daemon:
    """The supervisor a cluster node started to adopt ``partition``, once it answers
    (its endpoint is written); the caller registers it for the clean-up."""
    home = adopter.home / "adopted" / partition

    def ready() -> bool:
        try:
            homes.read_endpoint(home)
        except homes.HomeError:
            return False
        return True

    wait_for(f"the adoption of {partition}", ready)
    daemon = Daemon(home, None, env)
    daemon.pids_seen.add(homes.read_endpoint(home).pid)
    return daemon


def effects(path: Path) -> list[dict[str, Any]]:
    from corral.actors.tools.effect import read_effects

    return read_effects(path)


def ledger_rows(home: Path, sql: str, *args: Any) -> list[dict[str, Any]]:
    """Rows of the ledger a home writes to: its SQLite file or its PostgreSQL partition."""
    from corral.supervisor.ledger.ledger_spec import open_for_reading

    with contextlib.closing(open_for_reading(home)) as ledger:
        return [dict(row) for row in ledger.all(sql, *args)]


def agent_spec(workspace: str = "ws", steps: str = "", extra: str = "", agent: str = "writer", policy: str = "") -> str:
    return f"""
[project]
root = "{workspace}"
[chaos]
effects_file = "effects.log"
{extra}
[[agents]]
id = "{agent}"
{policy}
{steps}
"""


#: One recorded effect, then the reply: the workload of the cluster and crash tests.
ONE_EFFECT_STEPS = """
[[agents.steps]]
actions = [{ tool = "effect.record", input = { label = "e1" } }]
[[agents.steps]]
final = "done"
"""


def one_effect_spec(ledger: str = "", extra: str = "") -> str:
    """An agent in ``project/`` that records one effect and replies, with ``ledger``
    as the body of its ``[ledger]`` table (a lease, say) and ``extra`` after it."""
    table = f"[ledger]\n{ledger}\n" if ledger else ""
    return agent_spec(workspace="project", steps=ONE_EFFECT_STEPS, extra=table + extra)


def drive_to_end(daemon: Daemon, run_id: str, effects_path: Path, timeout: float = 90) -> tuple[dict[str, Any], int]:
    """Wait for the run to end, reconciling unknown outcomes by evidence on the way.
    Returns the final view and how many reconciliations it took."""
    from corral.chaos.reconciler import decide, pending_reconciliations
    from corral.supervisor.ledger.ledger_spec import open_for_reading

    deadline = time.monotonic() + timeout
    reconciled = 0
    cursor = 0
    while True:
        shown = show(daemon, run_id)
        if shown["run"]["status"] in ("completed", "failed", "cancelled"):
            return shown, reconciled
        with contextlib.closing(open_for_reading(daemon.home)) as ledger:
            pending = pending_reconciliations(ledger)
        for action in pending:
            outcome, note = decide(action, effects_path)
            daemon.call("reconcile", action_id=action["action_id"], outcome=outcome, note=note)
            reconciled += 1
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"run {run_id} stuck in {shown['run']['status']}: {json.dumps(shown)[:1500]}")
        cursor = daemon.call("events", timeout=remaining + 5, since=cursor, wait_ms=int(min(remaining, 2) * 1000))[
            "cursor"
        ]


def retry_due_while_down(daemon: Daemon, run_id: str) -> None:
    """The clock passes the run's pending provider retry_at while its supervisor is
    down (killed here): the stored retry_at becomes a moment already past, and
    nothing else changes. A test of what happens once a retry falls due uses this
    rather than sleep out a real backoff; the next ``up`` finds the retry due."""
    import sqlite3

    daemon.kill_supervisor()
    with contextlib.closing(sqlite3.connect(daemon.home / "ledger.db")) as db, db:
        moved = db.execute(
            "UPDATE provider_requests SET retry_at = ? WHERE rowid = (SELECT MAX(rowid) FROM provider_requests"
            " WHERE run_id = ? AND status = 'failed' AND retry_at > ?)",
            (time.time() - 1, run_id, time.time()),
        ).rowcount
    assert moved == 1, f"run {run_id} has no pending provider retry"
