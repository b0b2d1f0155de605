"""Shared fixtures. Every test is checked for leftover processes.

Every local model a test runs (llama.cpp) generates on ONE thread:
``CORRAL_MODEL_THREADS=1`` is set for the whole run, and every process a test starts
inherits it (corral/core/model_threads.py). With two threads per model, llama.cpp's
threads meet at a spinning barrier after every operation; on two cores shared with
the other test worker (and anything else on the machine) one of them is often not
scheduled, and the other spins: measured on the real-model tests, about twice
the CPU for the same generations, and a generation beside another one slowed
twofold (32 s alone, 68 s beside the kill-mid-reply test). With one thread a model
test is an ordinary CPU-bound test, and ``--dist loadgroup`` spreads them over both
workers like any other; only the tests that share one ``llama_cpp.server`` (a module
fixture) carry ``@pytest.mark.xdist_group("llama-server")``, so that it starts once."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import prctl
import psutil
import pytest
from trio.testing import MockClock

from corral.acceptance.loopback_http import DEFAULT_WAIT_S
from corral.core.model_threads import THREADS_ENV
from tests.processes import SERVICE_PIDS, live_descendants

# Detached supervisors re-parent to the nearest subreaper. Making the test process
# one keeps every process a test starts among its descendants (so leftovers are
# visible) and lets it reap them (PID 1 in a container often does not).
prctl.set_child_subreaper(1)

# Before any process starts (see the module's docstring); a value already set wins.
os.environ.setdefault(THREADS_ENV, "1")


def _reap_zombies() -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _name(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        return "(gone)"


class OrphanCheck:
    def __init__(self) -> None:
        self.before = {p.pid for p in live_descendants()}

    def check(self) -> None:
        strays = [p for p in live_descendants() if p.pid not in self.before]
        if strays:
            # PDEATHSIG is asynchronous (milliseconds, longer on a loaded machine):
            # a grace (it ends as soon as they are gone), then anything still
            # running is an orphan of this test.
            _gone, alive = psutil.wait_procs(strays, timeout=3)
            alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
            names = [f"{p.pid} {_name(p)}" for p in alive]  # before they are killed and reaped
            for proc in alive:
                proc.kill()
            psutil.wait_procs(alive, timeout=3)
            _reap_zombies()
            if alive:
                pytest.fail(f"test left processes behind: {', '.join(names)}")
        _reap_zombies()


@pytest.fixture(autouse=True)
def no_orphans() -> Iterator[OrphanCheck]:
    checker = OrphanCheck()
    yield checker
    checker.check()


@pytest.fixture
def deadline_clock() -> MockClock:
    """The trio test's clock, moved only by the test (``clock.jump``): a short timeout
    under test fires when the test says, after what must happen first has happened,
    never early because the machine is loaded. Only once every task has been blocked
    for ``DEFAULT_WAIT_S`` of real time (a hung test) does it jump to the next
    deadline, so such a test fails instead of hanging."""
    return MockClock(autojump_threshold=DEFAULT_WAIT_S)


@pytest.fixture
def short_tmp(no_orphans: OrphanCheck) -> Iterator[Path]:
    """A short temporary directory: ipc:// socket paths must stay under 107 bytes.
    Leftover processes are checked before it is removed (removing a live home
    would make its supervisor crash, hiding the leak)."""
    path = Path(tempfile.mkdtemp(prefix="crl-", dir="/tmp"))
    try:
        yield path
    finally:
        try:
            no_orphans.check()
        finally:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def private_tempdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Default command transcripts go to a per-test directory, not /tmp."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


@pytest.fixture
def bridge(short_tmp: Path) -> Iterator[Any]:
    """A running task bridge (tests/bridge_harness.py), stopped after the test."""
    from tests.bridge_harness import Bridge

    daemon = Bridge(short_tmp)
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """One PostgreSQL server per test worker (corral/core/pg_local.py), on a Unix
    socket; every test that uses it gets its own database (``pg_url``)."""
    from corral.core.pg_local import LocalPostgres

    root = Path(tempfile.mkdtemp(prefix="crl-pg-", dir="/tmp"))
    server = LocalPostgres(root)
    server.start()
    assert server.pid is not None
    SERVICE_PIDS.add(server.pid)
    try:
        yield server
    finally:
        server.stop()
        SERVICE_PIDS.discard(server.pid or -1)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(postgres_server: Any, request: pytest.FixtureRequest) -> str:
    """A fresh, empty database on the worker's PostgreSQL server."""
    import re
    import secrets

    name = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:40] + "_" + secrets.token_hex(3)
    url: str = postgres_server.create_database(name)
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_backend(request: pytest.FixtureRequest) -> str:
    """Parametrises a test over both ledger backends (the same suite for each)."""
    backend: str = request.param
    return backend


@pytest.fixture
def open_ledger(ledger_backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """``open_ledger()`` opens a fresh ledger on the backend under test; every
    ledger it opened is closed after the test."""
    from corral.supervisor.ledger.ledger_sqlite import SqliteLedger

    opened: list[Any] = []
    url = request.getfixturevalue("pg_url") if ledger_backend == "postgresql" else ""

    def make(partition: str = "node-a", **options: Any) -> Any:
        if ledger_backend == "sqlite":
            ledger = SqliteLedger(tmp_path / f"{partition}.db", **options)
        else:
            # As a node opens it: the partition held under a lease, so every write
            # is fenced, single-table reads are cached and writes deferred.
            from corral.supervisor.cluster import cluster_tables as cluster
            from corral.supervisor.ledger.ledger_pg import PostgresLedger
            from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster

            conn = connect_cluster(url)
            try:
                hold = cluster.acquire_own(conn, partition, None, 300.0, None)
            finally:
                conn.close()
            ledger = PostgresLedger(url, hold.partition, epoch=hold.epoch, **options)
        opened.append(ledger)
        return ledger

    yield make
    for ledger in opened:
        ledger.close()
