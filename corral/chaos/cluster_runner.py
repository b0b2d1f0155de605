"""Chaos episodes on three nodes of a PostgreSQL ledger (``corral chaos --nodes N``).

Each episode gets a database of its own (episode_database.py), N node homes on it
with the same spec, and N root runs, all submitted to node 0: with room for one
run of an agent per node, the shared queue spreads the others to the other nodes
(the first run carries the decoy secret, so it stays on node 0: the queue takes
no submit that redaction would change).
The random kills pick among every node's supervisor, agents and children; the
invariants are read across every partition of the episode's database at once
(so a run in two partitions, or an effect whose action another node holds, is
seen), and every process any node started is checked for having exited.
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from corral import client
from corral.chaos import episode_database
from corral.chaos.invariants import Check, check_rows, no_secrets
from corral.chaos.reconciler import decide, pending_reconciliations
from corral.chaos.runner import (
    DECOYS,
    DYING_WAIT_S,
    EPISODE_TIMEOUT_S,
    UP_TIMEOUT_S,
    Episode,
    NodesDetail,
    Runner,
    Scenario,
    target_kind,
)
from corral.client_start import SupervisorStartError, start_supervisor
from corral.core.procs import is_alive, wait_exit
from corral.mailbox.control import SupervisorGone
from corral.supervisor.home import home_dir as homes
from corral.supervisor.ledger.ledger_pg import PostgresLedger
from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster

#: Root runs of one agent a node takes at once in a multi-node episode: one, so the
#: runs submitted to node 0 beyond the first wait in the shared queue for the others.
RUNS_PER_AGENT = 1
ENDED = ("completed", "failed", "cancelled")


class _Rows:
    def __init__(self, rows: list[Any]) -> None:
        self._rows = rows

    def fetchall(self) -> list[Any]:
        return self._rows


class AllPartitions:
    """Every partition of an episode's database read as one: a query's rows from
    each partition, one after another (the invariants count across them)."""

    def __init__(self, url: str) -> None:
        conn = connect_cluster(url)
        try:
            names = [
                str(row[0])
                for row in conn.execute("SELECT name FROM corral_cluster.partitions ORDER BY name").fetchall()
            ]
        finally:
            conn.close()
        self.ledgers = [PostgresLedger(url, name, readonly=True) for name in names]

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Rows:
        return _Rows([row for ledger in self.ledgers for row in ledger.db.execute(sql, params).fetchall()])

    def close(self) -> None:
        for ledger in self.ledgers:
            ledger.close()


def one_partition_per_run(db: AllPartitions) -> Check:
    """A run id is the cluster's: no run is in two partitions (a resubmit after a
    kill, or a queued run two nodes took, would make a second)."""
    check = Check("each run in one partition of the cluster", "runs")
    where: dict[str, list[str]] = {}
    for ledger in db.ledgers:
        for row in ledger.db.execute("SELECT run_id FROM runs").fetchall():
            where.setdefault(str(row[0]), []).append(ledger.partition)
    check.count = len(where)
    for run_id, partitions in where.items():
        if len(partitions) > 1:
            check.fail(f"run {run_id} is in partitions {', '.join(partitions)}")
    return check


class ClusterRunner(Runner):
    """Episodes of ``nodes`` nodes, each episode on a database of its own on the
    server of ``ledger_url`` (dropped after it unless ``keep_databases``)."""

    def __init__(
        self, scenario: Scenario, *, nodes: int, ledger_url: str, keep_databases: bool = False, **options: Any
    ) -> None:
        super().__init__(scenario, ledger_url=ledger_url, **options)
        self.nodes = nodes
        self.server_url = ledger_url
        self.keep_databases = keep_databases
        #: Names this campaign's databases apart from another's on the same server.
        self.campaign_id = f"{abs(hash((self.workdir, self.seed))) % 10**8:08d}"

    # -- the episode's homes -------------------------------------------------------------

    def _prepare(self, index: int) -> tuple[Path, Path]:
        base, spec = super()._prepare(index)
        data = tomllib.loads(spec.read_text())
        table = data.setdefault("ledger", {})
        table.setdefault("max_runs_per_agent", RUNS_PER_AGENT)
        from corral.client_spec import toml_text

        spec.write_text(toml_text(data))
        return base, spec

    def _start(self, home: Path, spec: Path | None, env: dict[str, str]) -> subprocess.Popen[bytes]:
        try:
            process = start_supervisor(home, spec, UP_TIMEOUT_S, env=env, node=home.parent.name)
        except SupervisorStartError as exc:
            raise SupervisorStartError(f"corral up failed: {str(exc)[:300]}") from None
        self._started.append(process)
        return process

    # -- an episode ------------------------------------------------------------------------

    def _run_episode(self, episode: Episode, failpoint_spec: str, target: str | None, random_kills: int) -> None:
        started = time.monotonic()
        base, spec = self._prepare(episode.index)
        name = episode_database.database_name(self.campaign_id, episode.index)
        episode.nodes = NodesDetail(name)
        try:
            self.ledger_url = episode_database.create(self.server_url, name)
        except episode_database.EpisodeDatabaseError as exc:
            episode.error = str(exc)
            self.stopped = str(exc)
            self.episodes.append(episode)
            return
        nodes = [base / f"node-{i}" / ".corral" for i in range(self.nodes)]
        sups: dict[Path, int] = {}
        seen: set[int] = set()
        try:
            try:
                self._episode(episode, spec, nodes, sups, seen, random_kills)
            except Exception as exc:  # the episode failed to run: report it, never hide it
                episode.error = f"{type(exc).__name__}: {exc}"
                for home in nodes:
                    self._kill_everything(home, seen)
                if not episode.kills:
                    self.stopped = f"episode {episode.index} failed before its first kill: {episode.error}"[:2000]
            except KeyboardInterrupt:
                self.interrupted = episode.index
                for home in nodes:
                    self._abandon(home, seen)
                raise
            self._finish(episode, base, nodes, seen, started)
        finally:
            if not self.keep_databases:
                episode_database.drop(self.server_url, name)

    def _episode(
        self, episode: Episode, spec: Path, nodes: list[Path], sups: dict[Path, int], seen: set[int], random_kills: int
    ) -> None:
        for home in nodes:
            sups[home] = self._up(home, spec, self._env())
            seen.add(sups[home])
        episode.boots = len(nodes)
        run_ids = [f"run-chaos-{episode.index:04d}-{episode.seed}-{k}" for k in range(len(nodes))]
        first = nodes[0]
        for k, run_id in enumerate(run_ids):
            # The first run carries the decoy secret (kept out of every log); a submit
            # with a secret in it stays on its node (the queue keeps submits as given),
            # so the others, plain, are the ones the shared queue spreads.
            task = f"{self.scenario.task} (keep api_key={DECOYS[1]} out of every log)" if k == 0 else self.scenario.task
            # Our own run ids make the submits idempotent across the cluster: one
            # retried after a kill finds the run, wherever it went.
            for attempt in range(3):
                try:
                    client.call(first, "run", agent_id=self.scenario.root_agent, task=task, run_id=run_id)
                    break
                except (SupervisorGone, homes.NotRunning):
                    if attempt == 2:
                        raise
                    wait_exit(sups[first], DYING_WAIT_S)
                    self._all_up(episode, nodes, sups, seen)
        rng = random.Random(episode.seed)
        pending_random = random_kills
        deadline = time.monotonic() + EPISODE_TIMEOUT_S
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"runs {', '.join(run_ids)} did not all end within {EPISODE_TIMEOUT_S}s")
            self._all_up(episode, nodes, sups, seen)
            for home in nodes:
                seen |= self._live_pids(home)
            if pending_random and rng.random() < 0.5:
                time.sleep(rng.uniform(0.0, 0.4))
                if self._kill_one(nodes, sups, rng, episode):
                    pending_random -= 1
                    continue
            if self._drive_all(nodes, run_ids, episode):
                break
        for attempt in range(3):
            # A kill that landed just as the runs ended: bring the node back and read again.
            try:
                statuses = {client.call(first, "show", run_id=run_id)["run"]["status"] for run_id in run_ids}
                episode.status = ",".join(sorted(statuses))
                episode.restarts = sum(a["restarts"] for home in nodes for a in client.call(home, "status")["actors"])
                break
            except Exception:
                if attempt == 2:
                    raise
                for home in nodes:
                    wait_exit(sups[home], DYING_WAIT_S)
                self._all_up(episode, nodes, sups, seen)
        for home in nodes:
            self._down(home)

    def _all_up(self, episode: Episode, nodes: list[Path], sups: dict[Path, int], seen: set[int]) -> None:
        for home in nodes:
            sups[home] = self._ensure_up(home, sups[home], episode, "", None, seen)

    def _kill_one(self, nodes: list[Path], sups: dict[Path, int], rng: random.Random, episode: Episode) -> bool:
        """SIGKILL one process, drawn among every node's supervisor and actors."""
        choices: list[tuple[str, str, int]] = []
        for home in nodes:
            node = home.parent.name
            try:
                actors = client.call(home, "status", timeout=5)["actors"]
            except Exception:
                continue
            if "supervisor" in self.targets and is_alive(sups[home]):
                choices.append(("supervisor", f"{node}:supervisor", sups[home]))
            for actor in actors:
                kind = target_kind(actor["id"])
                if actor["pid"] is not None and kind in self.targets:
                    choices.append((kind, f"{node}:{actor['id']}", actor["pid"]))
        return self._kill_drawn(choices, rng, episode)

    def _drive_all(self, nodes: list[Path], run_ids: list[str], episode: Episode) -> bool:
        """One step towards the end on every node: approve and reconcile what its
        partition holds, then wait for node 0's next event. True when every run ended."""
        first = nodes[0]
        try:
            cursor = client.call(first, "status")["cursor"]
            statuses = [client.call(first, "show", run_id=run_id)["run"]["status"] for run_id in run_ids]
        except Exception:
            return False
        if all(status in ENDED for status in statuses):
            return True
        for home in nodes:
            with contextlib.suppress(Exception):
                self._settle(home, episode)
        with contextlib.suppress(Exception):
            client.call(first, "events", timeout=10, since=cursor, wait_ms=300)
        return False

    def _settle(self, home: Path, episode: Episode) -> None:
        node = home.parent.name
        pending = client.call(home, "pending")
        for action in pending["actions"]:
            if action["phase"] == "waiting-confirmation" and action.get("partition", node) == node:
                client.call(
                    home,
                    "continue_action",
                    action_id=action["action_id"],
                    decision="approve",
                    fingerprint=action["fingerprint"],
                )
        with contextlib.closing(homes_ledger(home)) as ledger:
            unknown = pending_reconciliations(ledger)
        for action in unknown:
            outcome, note = decide(action, home.parent.parent / "effects.log")
            client.call(home, "reconcile", action_id=action["action_id"], outcome=outcome, note=note)
            episode.reconciliations += 1
        for request in pending["provider_requests"]:
            if request.get("partition", node) == node:
                client.call(home, "reconcile", action_id=request["slot"], outcome="failed", note="chaos")
                episode.reconciliations += 1
        for session in pending.get("sessions", []):
            if session.get("partition", node) == node:
                client.call(
                    home,
                    "reconcile",
                    action_id=session["process_id"],
                    outcome="failed",
                    note="process died with its actor",
                )
                episode.reconciliations += 1

    # -- after the episode ------------------------------------------------------------------

    def _finish(self, episode: Episode, base: Path, nodes: list[Path], seen: set[int], started: float) -> None:
        assert episode.nodes is not None and self.ledger_url is not None
        report_file = base / "episode.txt"
        db: AllPartitions | None = None
        try:
            db = AllPartitions(self.ledger_url)
            for row in db.execute("SELECT data FROM events WHERE kind IN ('actor-started', 'boot-started')").fetchall():
                pid = json.loads(row[0]).get("pid")
                if pid:
                    seen.add(int(pid))
            episode.leftovers = self._leftovers(seen)
            self._reap()
            episode.processes_checked = len(seen)
            report_file.write_text(f"{episode}\n")
            episode.nodes.partitions = [ledger.partition for ledger in db.ledgers]
            episode.nodes.ran_on = {
                str(row[0]): ledger.partition
                for ledger in db.ledgers
                for row in ledger.db.execute("SELECT run_id FROM runs WHERE kind = 'root'").fetchall()
            }
            dumps = []
            for ledger in db.ledgers:
                dump = base / f"ledger-rows-{ledger.partition}.txt"
                dump.write_text(ledger.rows_as_text())
                dumps.append(dump)
            episode.checks = [
                *check_rows(db, base / "effects.log"),
                one_partition_per_run(db),
                no_secrets(DECOYS, (*dumps, *(home / "logs" for home in nodes), report_file)),
            ]
        except Exception as exc:
            episode.error = episode.error or f"reading the partitions: {type(exc).__name__}: {exc}"
            episode.leftovers = self._leftovers(seen)
            self._reap()
        finally:
            if db is not None:
                db.close()
        episode.wall_s = time.monotonic() - started
        self.episodes.append(episode)
        if self.verbose:
            verdict = "PASS" if episode.passed else "FAIL"
            kills = ", ".join(f"{k.victim}@{k.point}" for k in episode.kills) or "no kill reached"
            spread = ",".join(sorted(set(episode.nodes.ran_on.values())))
            print(
                f"  episode {episode.index:3d} {verdict} {episode.status or episode.error}  ran on: {spread}"
                f"  kills: {kills}  ({episode.wall_s:.1f}s)",
                flush=True,
            )


def homes_ledger(home: Path) -> Any:
    """A node's own partition, read-only."""
    from corral.supervisor.ledger.ledger_spec import open_for_reading

    return open_for_reading(home)
