"""The transient-retry flow (seed 004 V1.29, V1.42): a fault proxy in front of a real
OpenAI-compatible server drops the swarm's first planning call, and the supervisor's
first request after its claims (its final reply). Each drop is a transient provider
error with one retry and a ``retry_at`` in the ledger; the suite SIGKILLs the
supervisor inside each backoff, checks the attempt and ``retry_at`` survived, restarts
it, and expects exactly one retry per drop and exactly one final reply."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from corral.acceptance import specs
from corral.acceptance.fault_proxy import Fault, FaultProxy
from corral.acceptance.host import DONE, Host, HostError
from corral.acceptance.llama_server import ServerFailed, llama_server
from corral.acceptance.loopback_http import serve_in_thread
from corral.acceptance.provider import LocalModel, Provider, ServerModel, has_llama_server
from corral.acceptance.workspace import Workspace
from corral.core.errors import CorralError
from corral.supervisor.home import home_dir as homes
from corral.supervisor.ledger.ledger_spec import open_for_reading

RUN_TIMEOUT_S = 900.0
WAIT_S = 600.0


@dataclass
class Backoff:
    """One dropped request's failed attempt, before the kill and after the restart."""

    slot: str
    attempt: int
    retry_at: float
    survived: bool = False
    #: The SIGKILL landed before retry_at (the ledger's clock is the wall clock).
    killed_in_backoff: bool = False


@dataclass
class RetryFacts:
    home: Path
    blocked: str = ""
    run_id: str = ""
    error: str = ""
    final_status: str = ""
    plan: Backoff | None = None
    final: Backoff | None = None
    #: Whether the root ever claimed a delivery (the final-reply drop needs one).
    claimed: bool = False
    #: Failed transient attempts and their successors per base slot of the root run.
    retries: dict[str, int] = field(default_factory=dict)
    failed: int = 0
    replies: int = 0
    injected: int = 0


def missing(provider: Provider) -> str:
    if isinstance(provider, LocalModel) and not has_llama_server():
        return "no llama_cpp.server (pip install 'corral[local-server]'): the fault proxy needs an HTTP route"
    return ""


@contextlib.contextmanager
def _route(provider: Provider, log: Path) -> Iterator[ServerModel]:
    """The OpenAI-compatible server the proxy fronts: the user's, or llama_cpp.server
    on the local model's GGUF for as long as the flow lasts."""
    if isinstance(provider, ServerModel):
        yield provider
        return
    with llama_server(provider.file, log) as url:
        yield ServerModel(url, provider.name, structured="json_object")


class _AfterClaims:
    """The proxy's selector: drops the first request that arrives once the root run
    has claimed a delivery (its next turn: the final reply). It sees the sequence
    number only; what it decides from is the ledger."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.run_id = ""
        self._lock = threading.Lock()
        self.fired = False

    def __call__(self, seq: int) -> Fault | None:
        with self._lock:
            if self.fired or not self.run_id or seq == 1:
                return None
            with contextlib.suppress(Exception), contextlib.closing(open_for_reading(self.home)) as ledger:
                claimed = ledger.all("SELECT 1 FROM deliveries WHERE parent_run_id = ?"
                                     " AND status = 'claimed-by-parent'", self.run_id)
                if claimed:
                    self.fired = True
                    return Fault.drop()
            return None


def retry_flow(workspace: Workspace, host: Host, provider: Provider) -> RetryFacts:
    facts = RetryFacts(workspace.home("retry"), blocked=missing(provider))
    if facts.blocked:
        return facts
    project = workspace.project("retry-project")
    selector = _AfterClaims(facts.home)
    try:
        with _route(provider, workspace.log("llama-server.log")) as route:
            proxy = FaultProxy(route.url, faults={1: Fault.drop()}, selector=selector)
            with serve_in_thread(proxy) as proxy_url:
                spec = workspace.root / "retry.toml"
                spec.write_text(specs.retry_spec(route.through(proxy_url), str(project)))
                _drive(host, facts, spec, selector)
            facts.injected = sum(1 for record in proxy.requests if record.fault)
    except (HostError, CorralError, ServerFailed, OSError, ValueError, KeyError) as exc:
        facts.error = f"{type(exc).__name__}: {exc}"[:500]
    with contextlib.suppress(HostError):
        host.down(facts.home)
    return facts


def _drive(host: Host, facts: RetryFacts, spec: Path, selector: _AfterClaims) -> None:
    home = facts.home
    host.up(home, spec)
    ran = host.cli(home, "run", "--agent", "project-supervisor", "--task", specs.RETRY_TASK, "--json")
    if ran.returncode != 0:
        raise HostError(f"`corral run` exited {ran.returncode}: {ran.stderr.strip()[-300:]}")
    facts.run_id = selector.run_id = json.loads(ran.stdout)["run_id"]
    facts.plan = _kill_in_backoff(host, home, spec, facts.run_id, after=0.0)
    # The final-reply drop comes only if the root claimed something; else the run just ends.
    facts.final = _kill_in_backoff(host, home, spec, facts.run_id, after=facts.plan.retry_at if facts.plan else 0.0)
    facts.final_status = host.wait_run(home, facts.run_id, DONE, RUN_TIMEOUT_S)["run"]["status"]
    _gather(facts)


def _failed_attempt(home: Path, run_id: str, after: float) -> Backoff | None:
    with contextlib.closing(open_for_reading(home)) as ledger:
        rows = ledger.all("SELECT slot, attempt, retry_at FROM provider_requests WHERE run_id = ? AND status ="
                          " 'failed' AND retry_at IS NOT NULL AND retry_at > ? ORDER BY started_at", run_id, after)
    return Backoff(rows[0][0], int(rows[0][1]), float(rows[0][2])) if rows else None


def _kill_in_backoff(host: Host, home: Path, spec: Path, run_id: str, after: float) -> Backoff | None:
    """Wait (on the event stream) for a failed attempt with a retry_at, or for the run
    to end; on the attempt, SIGKILL the supervisor, restart it, and check the attempt
    and its retry_at are what they were."""
    from corral import client

    with client.Client.connect(home) as connected:
        cursor = 0
        for _ in range(int(WAIT_S / 5)):
            backoff = _failed_attempt(home, run_id, after)
            if backoff is not None:
                break
            if connected.call("show", run_id=run_id)["run"]["status"] in DONE:
                return None
            cursor = connected.call("events", timeout=15, since=cursor, wait_ms=5000)["cursor"]
        else:
            raise HostError(f"no provider retry was scheduled within {WAIT_S:.0f} s")
    pid = homes.read_endpoint(home).pid
    os.kill(pid, signal.SIGKILL)
    backoff.killed_in_backoff = time.time() < backoff.retry_at
    from corral.core.procs import wait_exit

    if not wait_exit(pid, 30):
        raise HostError("the supervisor outlived its SIGKILL")
    host.up(home, None)
    again = _failed_attempt(home, run_id, after)
    backoff.survived = again is not None and (again.slot, again.attempt, again.retry_at) == (
        backoff.slot, backoff.attempt, backoff.retry_at)
    return backoff


def _gather(facts: RetryFacts) -> None:
    with contextlib.closing(open_for_reading(facts.home)) as ledger:
        rows = ledger.all("SELECT slot, status, error_kind FROM provider_requests WHERE run_id = ?", facts.run_id)
        facts.replies = len(ledger.all("SELECT run_id FROM replies WHERE run_id = ?", facts.run_id))
        facts.claimed = bool(ledger.all("SELECT 1 FROM deliveries WHERE parent_run_id = ? AND status ="
                                        " 'claimed-by-parent'", facts.run_id))
    facts.failed = sum(1 for row in rows if row[1] == "failed")
    for row in rows:
        base = str(row[0]).split("-transient-")[0]
        if "-transient-" in str(row[0]):
            facts.retries[base] = facts.retries.get(base, 0) + 1
