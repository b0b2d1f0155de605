"""The chaos runner: episodes of a scenario on fresh homes under a kill schedule.

An episode starts a supervisor, starts the scenario's root run, kills processes
with SIGKILL (at a named failpoint, or at seeded random instants), restarts what
the restart policies say (the supervisor itself as ``corral up`` does), drives the run
to its end (approving confirmations, reconciling by evidence), then checks the
invariants from the ledger and the effects file and that no process is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from corral import client
from corral.chaos.campaign_report import campaign_report
from corral.chaos.invariants import Check, check_all, no_secrets
from corral.chaos.reconciler import decide, pending_reconciliations
from corral.client import Client
from corral.client_start import SupervisorStartError, start_supervisor
from corral.core import failpoints
from corral.core.errors import CorralError
from corral.core.procs import is_alive, wait_exit
from corral.mailbox.control import SupervisorGone
from corral.supervisor.home import home_dir as homes
from corral.supervisor.ledger.ledger_pg import PostgresLedger
from corral.supervisor.ledger.ledger_spec import LEDGER_FILE, URL_ENV, open_for_reading
from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.spec.bounded_files import read_text_bounded
from corral.supervisor.spec.swarm_spec import load_spec

TARGETS = ("supervisor", "agents", "children", "sessions")


def target_kind(actor_id: str) -> str:
    """Which ``--targets`` class an actor belongs to, by its id's prefix."""
    if actor_id.startswith("child-"):
        return "children"
    if actor_id.startswith("proc-"):
        return "sessions"
    return "agents"
DECOYS = ("sk-decoyCHAOS0000000000000000secret", "decoy-token-5f1b7c0e9a")
EPISODE_TIMEOUT_S = 90.0
#: ``corral up``'s and ``corral down``'s default timeouts.
UP_TIMEOUT_S = 30.0
DOWN_TIMEOUT_S = 30.0
#: How long a supervisor that refused a connection gets to finish dying.
DYING_WAIT_S = 5.0


@dataclass
class Kill:
    episode: int
    target: str  # supervisor | agents | children
    point: str  # a failpoint name, or random@<ms>
    victim: str
    seed: int


@dataclass
class NodesDetail:
    """Where a multi-node episode ran (corral/chaos/cluster_runner.py)."""

    database: str
    partitions: list[str] = field(default_factory=list)
    #: Each of the episode's runs and the partition that holds it.
    ran_on: dict[str, str] = field(default_factory=dict)


@dataclass
class Episode:
    index: int
    seed: int
    mode: str
    failpoint: str | None
    kills: list[Kill] = field(default_factory=list)
    boots: int = 0
    restarts: int = 0
    reconciliations: int = 0
    status: str = ""
    checks: list[Check] = field(default_factory=list)
    leftovers: list[int] = field(default_factory=list)
    #: How many distinct processes of the episode were checked for having exited.
    processes_checked: int = 0
    wall_s: float = 0.0
    error: str | None = None
    #: The actors' lifetimes with kills and restarts (SVG), when the runner keeps them.
    timeline_svg: str = field(default="", repr=False)
    #: A multi-node episode's database, partitions and where each run ran (None: one node).
    nodes: NodesDetail | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and not self.leftovers and all(c.passed for c in self.checks)


@dataclass
class Scenario:
    name: str
    spec_text: str
    root_agent: str
    task: str
    spec_dir: Path | None = None
    #: What ``--scenario`` takes to run this scenario again (a reproduce line):
    #: "demo", or the spec file's absolute path (its stem names no file).
    argument: str = "demo"

    def episode_spec(self, base: Path) -> str:
        """The spec an episode in ``base`` runs: every file it names means what it
        meant when the scenario was loaded (made absolute against the scenario's
        folder, by the spec's one rule), but the project root and the effects file,
        which are each episode's own (relative to ``base``: a fresh project, a fresh
        effects file). A path outside the scenario's folder (``../lib/tools.py``)
        resolves as at load; the copy in the episode did not (issue 48, D.10)."""
        if self.spec_dir is None:
            return self.spec_text  # the demo: it names no file but those two
        from corral.client_spec import _absolute_paths, toml_text  # the spec's one rule for its paths
        from corral.supervisor.spec.spec_base import spec_path

        data = tomllib.loads(self.spec_text)
        project = data.setdefault("project", {})
        if isinstance(project, dict):
            project["root"] = str(spec_path(base, str(project.get("root", "."))))
        chaos = data.get("chaos")
        if isinstance(chaos, dict) and isinstance(chaos.get("effects_file"), str):
            chaos["effects_file"] = str(spec_path(base, chaos["effects_file"]))
        _absolute_paths(data, self.spec_dir.resolve())
        return toml_text(data)


def demo_scenario() -> Scenario:
    from corral.cli.swarm import DEMO_TASK, ROOT_AGENT, demo_spec_text

    return Scenario("demo", demo_spec_text(), ROOT_AGENT, DEMO_TASK)


def file_scenario(path: Path) -> Scenario:
    spec = load_spec(path)  # validates, with exact errors
    chaos = spec.raw.get("chaos", {})
    root = chaos.get("root_agent") or next((a.id for a in spec.agents if a.role == "root"), None)
    if root is None:
        raise ValueError(f"{path}: no root agent (set [chaos] root_agent)")
    # The folder as it is now: an episode's paths mean what they meant at this load.
    return Scenario(path.stem, read_text_bounded(path, "spec"), root, chaos.get("task", "chaos run"),
                    path.parent.resolve(), str(path.resolve()))


class Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, a cancelled CI job) taken as Ctrl-C is: every handler of
    an interrupt (an episode's processes killed and reaped, the report so far) runs."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While the block runs, SIGTERM raises ``Terminated`` in the main thread. A
    second SIGTERM is ignored, so that it cannot cut short the cleanup and the report
    the first one started (SIGKILL still ends it)."""

    def terminated(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _reading(home: Path) -> contextlib.closing[Ledger]:
    """The episode's ledger, whichever backend, closed when the block ends."""
    return contextlib.closing(open_for_reading(home))


class Runner:
    def __init__(
        self,
        scenario: Scenario,
        *,
        seed: int,
        targets: tuple[str, ...],
        workdir: Path | None = None,
        verbose: bool = True,
        timelines: bool = False,
        ledger_url: str | None = None,
    ) -> None:
        self.scenario = scenario
        #: A shared PostgreSQL ledger: each episode's home is a node with its own partition.
        self.ledger_url = ledger_url
        #: Keep each episode's timeline picture (for ``corral chaos --report``).
        self.timelines = timelines
        self.seed = seed
        self.targets = targets
        self.verbose = verbose
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="corral-chaos-"))
        self.episodes: list[Episode] = []
        #: Why the campaign must not go on (an episode that failed before its first
        #: kill: every next one would too), or None.
        self.stopped: str | None = None
        #: The episode a SIGINT (Ctrl-C) ended, its processes killed; None: none was.
        self.interrupted: int | None = None
        #: Supervisors started by this runner (its children), until reaped.
        self._started: list[subprocess.Popen[bytes]] = []

    # -- episodes ---------------------------------------------------------------------

    def _prepare(self, index: int) -> tuple[Path, Path]:
        base = self.workdir / f"e{index:03d}"
        if base.exists():
            shutil.rmtree(base)
        (base / "project").mkdir(parents=True)
        if self.scenario.spec_dir is not None:
            # Modules named (not pathed) in the spec are looked up beside it: copies
            # of the folder's own. Every path the spec writes means the original file.
            for item in self.scenario.spec_dir.iterdir():
                if item.suffix in (".toml", ".json", ".py") and item.is_file():
                    shutil.copy(item, base / item.name)
        spec = base / "swarm.toml"
        spec.write_text(self.scenario.episode_spec(base))
        # Decoy secrets in files the agents can see; they must never reach the ledger.
        (base / "project" / ".env").write_text(f"OPENAI_API_KEY={DECOYS[0]}\n")
        return base, spec

    def _env(self, failpoint_spec: str = "") -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != failpoints.ENV_VAR}
        failpoint_spec = failpoints.with_broken_builds(failpoint_spec)
        env["OPENAI_API_KEY"] = DECOYS[0]
        env["CORRAL_DECOY_TOKEN"] = DECOYS[1]
        if failpoint_spec:
            env[failpoints.ENV_VAR] = failpoint_spec
        if self.ledger_url:
            env[URL_ENV] = self.ledger_url
        return env

    def _up(self, home: Path, spec: Path | None, env: dict[str, str], episode: Episode | None = None) -> int:
        """What ``corral up`` does, from this process: the supervisor starts and
        reports ready the same way, without a CLI interpreter's start (~0.3 s of
        CPU) at every boot of every episode."""
        try:
            process = self._start(home, spec, env)
        except SupervisorStartError:
            fired = {path.name.removesuffix(".fired") for path in (home / "failpoints").glob("*.fired")}
            if not fired:
                raise
            # Killed at a failpoint while it started (building its ledger, or its first
            # group commit for an actor that was quicker than the ready line): the
            # failpoint fired once, so this start goes through, and recovers.
            if episode is not None and episode.failpoint in fired:
                episode.kills.append(Kill(episode.index, "supervisor", episode.failpoint, "supervisor", episode.seed))
            process = self._start(home, spec, env)
        # Killed at a failpoint right after it came up (its first group commit): the
        # dead pid lets the episode's loop notice, record and restart it.
        return process.pid

    def _start(self, home: Path, spec: Path | None, env: dict[str, str]) -> subprocess.Popen[bytes]:
        try:
            process = start_supervisor(home, spec, UP_TIMEOUT_S, env=env)
        except SupervisorStartError as exc:
            raise SupervisorStartError(f"corral up failed: {str(exc)[:300]}") from None
        self._started.append(process)
        return process

    def _reap(self) -> None:
        """The supervisors this runner started are its children: reap the ones that exited."""
        self._started = [process for process in self._started if process.poll() is None]

    def failpoint_episode(self, failpoint: str, target: str) -> Episode:
        index = len(self.episodes)
        episode = Episode(index, self.seed, "failpoints", failpoint)
        actor_side = failpoint in failpoints.ACTOR_SIDE
        if target == "supervisor":
            action = "kill-supervisor" if actor_side else "kill"
        else:
            action = "kill" if actor_side else "kill-caller"
        self._run_episode(episode, f"{failpoint}={action}@once", target, random_kills=0)
        return episode

    def random_episode(self, kills: int) -> Episode:
        index = len(self.episodes)
        episode = Episode(index, self.seed + index, "random", None)
        self._run_episode(episode, "", None, random_kills=kills)
        return episode

    def _run_episode(self, episode: Episode, failpoint_spec: str, target: str | None, random_kills: int) -> None:
        started = time.monotonic()
        base, spec = self._prepare(episode.index)
        home = base / ".corral"
        seen_pids: set[int] = set()
        try:
            sup = self._up(home, spec, self._env(failpoint_spec), episode if target == "supervisor" else None)
            episode.boots = 1
            seen_pids.add(sup)
            # Our own run id makes the request idempotent: a kill that lands before
            # the reply leaves a run we can still find, or none that we then create.
            run_id = f"run-chaos-{episode.index:04d}-{episode.seed}"
            task = f"{self.scenario.task} (keep api_key={DECOYS[1]} out of every log)"
            for attempt in range(3):
                try:
                    client.call(home, "run", agent_id=self.scenario.root_agent, task=task, run_id=run_id)
                    break
                except (SupervisorGone, homes.NotRunning):  # killed mid-call, or before it
                    if attempt == 2:
                        raise
                    wait_exit(sup, DYING_WAIT_S)  # see the reads after the run, below
                    sup = self._ensure_up(home, sup, episode, failpoint_spec, target, seen_pids)
            rng = random.Random(episode.seed)
            pending_random = random_kills
            deadline = time.monotonic() + EPISODE_TIMEOUT_S
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"run {run_id} did not end within {EPISODE_TIMEOUT_S}s")
                sup = self._ensure_up(home, sup, episode, failpoint_spec, target, seen_pids)
                seen_pids |= self._live_pids(home)
                if pending_random and rng.random() < 0.5:
                    time.sleep(rng.uniform(0.0, 0.4))
                    if self._random_kill(home, sup, rng, episode):
                        pending_random -= 1
                        continue
                if self._drive(home, run_id, episode):
                    break
            # A kill that landed just as the run ended: bring the supervisor back and read again.
            for attempt in range(3):
                try:
                    episode.status = client.call(home, "show", run_id=run_id)["run"]["status"]
                    episode.restarts = sum(a["restarts"] for a in client.call(home, "status")["actors"])
                    break
                except Exception:
                    if attempt == 2:
                        raise
                    # A supervisor SIGKILLed at a failpoint closes its sockets before its
                    # pidfd reports the exit (the kernel releases files first): wait for
                    # that exit, an explicit wake-up, before deciding it is still up.
                    wait_exit(sup, DYING_WAIT_S)
                    sup = self._ensure_up(home, sup, episode, failpoint_spec, target, seen_pids)
            self._down(home)
        except Exception as exc:  # the episode failed to run: report it, never hide it
            episode.error = f"{type(exc).__name__}: {exc}"
            self._kill_everything(home, seen_pids)
            if not episode.kills:
                # Nothing was killed yet, so the scenario itself cannot run here: every
                # next episode would fail the same way (random mode would go on forever).
                self.stopped = f"episode {episode.index} failed before its first kill: {episode.error}"[:2000]
        except KeyboardInterrupt:
            # Ctrl-C, or SIGTERM (``Terminated``): end this episode's processes (a supervisor still starting
            # included: it is a child of this process), then let the campaign report.
            self.interrupted = episode.index
            self._abandon(home, seen_pids)
            raise
        seen_pids |= self._pids_from_ledger(home)
        episode.leftovers = self._leftovers(seen_pids)
        self._reap()
        episode.processes_checked = len(seen_pids)
        report_file = base / "episode.txt"
        report_file.write_text(f"{episode}\n")
        episode.checks = self._checks(home, base, report_file)
        if self.timelines and self._has_ledger(home):
            with _reading(home) as ledger:
                episode.timeline_svg = episode_timeline(ledger, f"episode {episode.index}")
        episode.wall_s = time.monotonic() - started
        self.episodes.append(episode)
        if self.verbose:
            verdict = "PASS" if episode.passed else "FAIL"
            kills = ", ".join(f"{k.target}@{k.point}" for k in episode.kills) or "no kill reached"
            print(
                f"  episode {episode.index:3d} {verdict} {episode.status or episode.error}  kills: {kills}"
                f"  ({episode.wall_s:.1f}s)",
                flush=True,
            )

    def _ensure_up(
        self, home: Path, sup: int, episode: Episode, failpoint_spec: str, target: str | None, seen: set[int]
    ) -> int:
        if is_alive(sup):
            return sup
        name = failpoint_spec.split("=")[0] if failpoint_spec else ""
        if (
            name
            and (home / "failpoints" / f"{name}.fired").exists()
            and target == "supervisor"
            and not any(k.point == name for k in episode.kills)
        ):
            episode.kills.append(Kill(episode.index, "supervisor", name, "supervisor", episode.seed))
        new = self._up(home, None, self._env())
        episode.boots += 1
        seen.add(new)
        return new

    def _drive(self, home: Path, run_id: str, episode: Episode) -> bool:
        """One step towards the end: approve, reconcile, wait for events. True when done."""
        try:
            # The cursor before looking: anything that happens after it (the run's end
            # included) ends the wait below at once, never after its full timeout.
            cursor = client.call(home, "status")["cursor"]
            shown = client.call(home, "show", run_id=run_id)
            self._note_failpoint_kill(home, episode)
        except Exception:
            return False  # supervisor between boots, or killed while we asked
        if shown["run"]["status"] in ("completed", "failed", "cancelled"):
            return True
        try:
            pending = client.call(home, "pending")
            for action in pending["actions"]:
                if action["phase"] == "waiting-confirmation":
                    client.call(
                        home,
                        "continue_action",
                        action_id=action["action_id"],
                        decision="approve",
                        fingerprint=action["fingerprint"],
                    )
            with _reading(home) as ledger:
                unknown = pending_reconciliations(ledger)
            for action in unknown:
                outcome, note = decide(action, home.parent / "effects.log")
                client.call(home, "reconcile", action_id=action["action_id"], outcome=outcome, note=note)
                episode.reconciliations += 1
            for request in pending["provider_requests"]:
                client.call(home, "reconcile", action_id=request["slot"], outcome="failed", note="chaos")
                episode.reconciliations += 1
            for session in pending.get("sessions", []):
                # A session is reconciled only once its actor is gone, and the process
                # tree dies with its actor: there is nothing left that could finish.
                note = "process died with its actor"
                client.call(home, "reconcile", action_id=session["process_id"], outcome="failed", note=note)
                episode.reconciliations += 1
            client.call(home, "events", timeout=10, since=cursor, wait_ms=300)
        except Exception:
            return False
        return False

    def _note_failpoint_kill(self, home: Path, episode: Episode) -> None:
        if episode.failpoint is None or any(k.point == episode.failpoint for k in episode.kills):
            return
        if not (home / "failpoints" / f"{episode.failpoint}.fired").exists():
            return
        # A victim the supervisor was already stopping (its run had ended) is recorded
        # as stopped, not exited: killed all the same.
        exited = [
            e
            for e in client.all_events(home)
            if e["kind"] in ("actor-exited", "actor-stopped") and e["data"].get("exit_code") == -signal.SIGKILL
        ]
        if exited:
            victim = exited[0]["subject"]
            episode.kills.append(Kill(episode.index, target_kind(victim), episode.failpoint, victim, episode.seed))

    def _random_kill(self, home: Path, sup: int, rng: random.Random, episode: Episode) -> bool:
        try:
            actors = client.call(home, "status", timeout=5)["actors"]
        except Exception:
            return False
        choices: list[tuple[str, str, int]] = []
        if "supervisor" in self.targets:
            choices.append(("supervisor", "supervisor", sup))
        for actor in actors:
            if actor["pid"] is None:
                continue
            kind = target_kind(actor["id"])
            if kind in self.targets:
                choices.append((kind, actor["id"], actor["pid"]))
        return self._kill_drawn(choices, rng, episode)

    def _kill_drawn(self, choices: list[tuple[str, str, int]], rng: random.Random, episode: Episode) -> bool:
        """SIGKILL one of ``choices`` (kind, victim, pid), drawn by ``rng``, and record
        the kill; a supervisor is waited for. False: nothing to kill, or it was gone."""
        if not choices:
            return False
        kind, victim, pid = rng.choice(choices)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        point = f"random@{int((time.monotonic() % 1000) * 1000)}"
        episode.kills.append(Kill(episode.index, kind, point, victim, episode.seed))
        if kind == "supervisor":
            wait_exit(pid, 10)
        return True

    # -- processes ------------------------------------------------------------------

    def _live_pids(self, home: Path) -> set[int]:
        try:
            sup = psutil.Process(homes.read_endpoint(home).pid)
            return {sup.pid, *(p.pid for p in sup.children(recursive=True))}
        except Exception:
            return set()

    def _has_ledger(self, home: Path) -> bool:
        return (home / homes.LEDGER).exists() or (home / LEDGER_FILE).exists()

    def _checks(self, home: Path, base: Path, report_file: Path) -> list[Check]:
        """The invariants from the episode's ledger, whichever backend it is on; the
        secrets scan reads the ledger file, or the partition's every row."""
        if not self._has_ledger(home):
            return []
        if (home / homes.LEDGER).exists():
            return check_all(home / homes.LEDGER, base / "effects.log", secrets=DECOYS,
                             scan_paths=(home / "logs", report_file))
        dump = base / "ledger-rows.txt"
        with _reading(home) as ledger:
            assert isinstance(ledger, PostgresLedger)
            checks = check_all(ledger, base / "effects.log")
            dump.write_text(ledger.rows_as_text())
        checks.append(no_secrets(DECOYS, (dump, home / "logs", report_file)))
        return checks

    def _pids_from_ledger(self, home: Path) -> set[int]:
        if not self._has_ledger(home):
            return set()
        with _reading(home) as ledger:
            rows = ledger.all("SELECT data FROM events WHERE kind IN ('actor-started', 'boot-started')")
        return {json.loads(row[0]).get("pid") for row in rows if json.loads(row[0]).get("pid")}

    def _down(self, home: Path) -> None:
        """``corral down``, from this process: stop gracefully, wait for the exit. A
        failure is not raised (the leftover check reports a supervisor still up)."""
        with contextlib.suppress(CorralError, OSError), Client.connect(home) as connected:
            connected.down(DOWN_TIMEOUT_S)

    def _kill_everything(self, home: Path, pids: set[int]) -> None:
        pids |= self._live_pids(home)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _abandon(self, home: Path, pids: set[int]) -> None:
        """SIGKILL every process of the episode and reap this process's children:
        what the episode knew of, and every descendant of this process (a supervisor
        whose start was interrupted is one, before its pid was known)."""
        try:
            descendants = psutil.Process().children(recursive=True)
        except psutil.Error:
            descendants = []
        self._kill_everything(home, pids | {child.pid for child in descendants})
        for process in self._started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=DYING_WAIT_S)
        psutil.wait_procs(descendants, timeout=DYING_WAIT_S)  # reaps the children among them
        self._reap()

    def _leftovers(self, pids: set[int]) -> list[int]:
        # PDEATHSIG is asynchronous: a short grace, then anything still running is an orphan.
        return sorted(pid for pid in pids if not wait_exit(pid, 2))

    # -- the report -------------------------------------------------------------------

    def report(self, wall_s: float, interrupted: bool = False) -> dict[str, Any]:
        """The invariants over the episodes that ended; ``interrupted``: the campaign
        was cut short by Ctrl-C or SIGTERM (the report so far)."""
        report = campaign_report(self.episodes, scenario=self.scenario.name, seed=self.seed, targets=self.targets,
                                 wall_s=wall_s, workdir=self.workdir, stopped=self.stopped,
                                 interrupted_at=self.interrupted, interrupted=interrupted)
        report["scenario_argument"] = self.scenario.argument
        return report


def episode_timeline(ledger: Path | Ledger, title: str) -> str:
    """The episode's timeline picture, from its ledger's events (read-only)."""
    from corral.ui import timeline

    if isinstance(ledger, Ledger):
        rows = [tuple(row) for row in ledger.all("SELECT cursor, at, boot_id, kind, subject, data FROM events"
                                                 " ORDER BY cursor")]
    else:
        with contextlib.closing(SqliteLedger(ledger, readonly=True)) as opened:
            return episode_timeline(opened, title)
    events = [
        {"cursor": row[0], "at": row[1], "boot_id": row[2], "kind": row[3], "subject": row[4],
         "data": json.loads(row[5]) if row[5] else {}}
        for row in rows
    ]
    picture = timeline.lanes(events)
    counts = timeline.summary(picture)
    return timeline.svg(
        picture, title=f"{title}: {counts['kills']} kills, {counts['restarts']} restarts, {counts['boots']} boots"
    )
