"""``corral doctor``: check a home and say what to do.

Pure checks over the files of a home (no supervisor needed, nothing written): the
directory and its permissions, the lock and who holds it, the endpoint file, stale
sockets, free space, and the ledger's header, integrity and schema.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from corral.cli.main import EXIT_FAILED, arguments, command, emit_json, home_of
from corral.core.errors import CorralError
from corral.supervisor.home import home_dir as homes
from corral.supervisor.ledger import high_water
from corral.supervisor.ledger.ledger_spec import LedgerSpecError, open_for_reading, remembered_placement
from corral.supervisor.ledger.ledger_sqlite import check_ledger_file, integrity_problems, newest_event
from corral.supervisor.ledger.port import LedgerError
from corral.supervisor.ledger.schema import MIGRATIONS

#: Below this much free space on the home's filesystem, writes are at risk.
LOW_SPACE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Finding:
    level: str  # ok | warn | error
    check: str
    detail: str
    advice: str = ""


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def check_home(home: Path) -> list[Finding]:
    if not home.exists():
        return [Finding("error", "home", f"{home} does not exist", "`corral up` creates it")]
    if home.is_symlink() or not home.is_dir():
        return [Finding("error", "home", f"{home} is not a directory", "point --home at a directory")]
    found = [_permissions(home)]
    running = homes.is_locked(home)
    found.append(_lock(home, running))
    found.append(_endpoint(home, running))
    found.append(_sockets(home, running))
    found.append(_space(home))
    remembered = remembered_placement(home)
    if remembered.get("shown_url"):
        found.append(_postgres_ledger(home, remembered))
        found.append(_node_stopped(home, running))
        found.extend(_adoptions(home))
    else:
        found.extend(_ledger(home / homes.LEDGER))
    return found


def _postgres_ledger(home: Path, remembered: dict[str, Any]) -> Finding:
    """The home's partition of a shared PostgreSQL ledger: reachable, its schema,
    and who holds its lease."""
    shown, partition = remembered.get("shown_url"), remembered.get("partition")
    try:
        ledger = open_for_reading(home)
    except LedgerSpecError as exc:
        return Finding("error", "ledger", str(exc), "pass --ledger URL to corral up, or set PGPASSWORD")
    except (CorralError, LedgerError) as exc:  # unreachable, refused, no such partition
        return Finding("error", "ledger", str(exc), "check that the database is up and the URL is right")
    try:
        version = ledger.schema_version
        hold = ledger.one(
            "SELECT holder, epoch, extract(epoch FROM lease_until - clock_timestamp()) AS left_s"
            " FROM corral_cluster.partitions WHERE name = ?",
            partition,
        )
    finally:
        ledger.close()
    if version > len(MIGRATIONS):
        return Finding("error", "ledger", f"schema {version} is newer than this corral ({len(MIGRATIONS)})",
                       "upgrade corral")
    held = (f"held by node {hold['holder']} at epoch {hold['epoch']}, lease {float(hold['left_s']):.1f}s"
            if hold else "not held")
    return Finding("ok", "ledger", f"{shown} partition {partition}: schema {version} of {len(MIGRATIONS)}, {held}")


def _node_stopped(home: Path, running: bool) -> Finding:
    """A cluster node that stopped itself (its database lost its commits, it was
    fenced, or it gave its lease up) and that nothing restarted."""
    from corral.supervisor.cluster import node_stop

    note = node_stop.read(home)
    if note is None or running:
        return Finding("ok", "node", "this home's node did not stop itself" if note is None
                       else "this home's node stopped itself, and runs again")
    return Finding("error", "node", node_stop.describe(note), str(note["advice"]))


def _adoptions(home: Path) -> list[Finding]:
    """Partitions of the cluster whose node is gone, with runs to finish, that this
    corral must not adopt: their schema is newer (a rolling upgrade half done)."""
    from corral.supervisor.cluster import cluster_tables as cluster

    try:
        ledger = open_for_reading(home)
    except (LedgerSpecError, CorralError, LedgerError):
        return []  # the ledger finding says why
    try:
        _free, refused = cluster.adoptable(ledger.raw)
    finally:
        ledger.close()
    if not refused:
        return [Finding("ok", "adoption", "every partition waiting for adoption has a schema this corral knows")]
    return [
        Finding("error", "adoption",
                f"partition {refusal.partition} (held by {refusal.holder}, lease expired) has runs to finish and"
                f" schema {refusal.schema}, newer than this corral's ({refusal.supported}): no node of this"
                " corral adopts it", refusal.advice)
        for refusal in refused
    ]


def _permissions(home: Path) -> Finding:
    problems = []
    if home.stat().st_uid != os.getuid():
        problems.append(f"{home} belongs to uid {home.stat().st_uid}")
    if _mode(home) != 0o700:
        problems.append(f"{home} is mode {_mode(home):o}, not 700")
    for name in (homes.ENDPOINT, homes.LEDGER):
        path = home / name
        if path.exists() and _mode(path) & 0o077:
            problems.append(f"{name} is mode {_mode(path):o}, readable by others")
    if problems:
        return Finding("error", "permissions", "; ".join(problems), f"chmod 700 {home} and chmod 600 its files")
    return Finding("ok", "permissions", "home 700, files 600, yours")


def _lock(home: Path, running: bool) -> Finding:
    holder = ""
    try:
        holder = (home / homes.LOCK).read_text().strip()[:16]
    except OSError:
        pass
    if running:
        return Finding("ok", "lock", f"held by a live supervisor (pid {holder or '?'})")
    return Finding("ok", "lock", "free: no supervisor runs on this home")


def _endpoint(home: Path, running: bool) -> Finding:
    path = home / homes.ENDPOINT
    if not path.exists():
        if running:
            return Finding("warn", "endpoint", "a supervisor holds the lock but has no endpoint file yet",
                           "wait for it to finish booting, or check logs/supervisor.log")
        return Finding("ok", "endpoint", "none (not running)")
    if not running:
        return Finding("warn", "endpoint", f"{path.name} is left from a supervisor that is gone",
                       "harmless: `corral up` replaces it")
    try:
        endpoint = homes.read_endpoint(home)
    except homes.HomeError as exc:
        return Finding("error", "endpoint", str(exc), "`corral down`, then `corral up`")
    return Finding("ok", "endpoint", f"supervisor pid {endpoint.pid}, boot {endpoint.boot_id}")


def _sockets(home: Path, running: bool) -> Finding:
    sockets = list((home / "s").glob("*.ipc")) if (home / "s").is_dir() else []
    if sockets and not running:
        return Finding("warn", "sockets", f"{len(sockets)} stale socket file(s) in {home / 's'}",
                       "harmless: `corral up` clears them")
    return Finding("ok", "sockets", f"{len(sockets)} socket file(s)")


def _space(home: Path) -> Finding:
    free = shutil.disk_usage(home).free
    if free < LOW_SPACE_BYTES:
        return Finding("warn", "disk", f"{free // (1024 * 1024)} MiB free on the home's filesystem",
                       "free space: with a full disk corral refuses new work until space returns")
    return Finding("ok", "disk", f"{free // (1024 * 1024)} MiB free")


def _ledger(path: Path) -> list[Finding]:
    if not path.exists():
        return [Finding("ok", "ledger", "none yet (a new home)")]
    try:
        check_ledger_file(path)
    except LedgerError as exc:
        return [Finding("error", "ledger", str(exc))]
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        return [Finding("error", "ledger", f"cannot open {path}: {exc}", "restore it from a backup")]
    try:
        problems = integrity_problems(db)
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        holds = newest_event(db)
    except sqlite3.DatabaseError as exc:
        return [Finding("error", "ledger", f"{path} is damaged: {exc}", "restore it from a backup")]
    finally:
        db.close()
    if problems:
        return [Finding("error", "ledger", f"{path} is damaged: {'; '.join(problems)[:300]}",
                        "restore it from a backup; corral refuses to start on it")]
    if version > len(MIGRATIONS):
        return [Finding("error", "ledger", f"schema {version} is newer than this corral ({len(MIGRATIONS)})",
                        "upgrade corral")]
    return [Finding("ok", "ledger", f"integrity ok, schema {version} of {len(MIGRATIONS)}"),
            _high_water(path, holds)]


def _high_water(path: Path, holds: int) -> Finding:
    """Whether the ledger holds every commit it made durable (its WAL may have
    lost a tail that SQLite's recovery drops without a word)."""
    try:
        mark = high_water.read_mark(path)
    except high_water.MarkDamaged as exc:
        return Finding("error", "high-water", f"the ledger's high-water mark is damaged ({exc})",
                       high_water.what_to_do(path))
    if high_water.behind(mark, holds):
        assert mark is not None
        return Finding("error", "high-water", high_water.lost_commits(path, mark, holds),
                       high_water.what_to_do(path))
    if mark is None:
        return Finding("ok", "high-water", f"no mark yet (the next `corral up` makes one); newest event {holds}")
    return Finding("ok", "high-water", f"the ledger holds every durable commit (newest event {holds}, mark {mark})")


def _doctor_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


@command("doctor", "check a home (ledger integrity, lock, endpoint, sockets, permissions, disk) and say what to do")
@arguments(_doctor_args)
def cmd_doctor(args: argparse.Namespace) -> int:
    home = home_of(args)
    findings = check_home(home)
    healthy = all(finding.level != "error" for finding in findings)
    if args.json:
        report: dict[str, Any] = {"home": str(home), "healthy": healthy,
                                  "findings": [asdict(finding) for finding in findings]}
        emit_json(report)
    else:
        print(f"home {home}")
        for finding in findings:
            print(f"  {finding.level:5}  {finding.check:11}  {finding.detail}")
            if finding.advice and finding.level != "ok":
                print(f"  {'':5}  {'':11}  -> {finding.advice}")
    return 0 if healthy else EXIT_FAILED
