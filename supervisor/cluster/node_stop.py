"""Why a node stopped itself, kept in its home for the operator.

A node stops on its own in three cases, and nothing restarts it:

- **its database lost commits it had made** (``pg_ctl stop -m immediate``, a
  crash of the server or of its host, with commits not yet flushed): its memory is
  ahead of its ledger, so it must start again from what the ledger holds;
- **it was fenced**: another node took its partition over while it was paused or
  cut off;
- **it gave its lease up** because it could not make progress (a supervision
  group gave up with runs unfinished), so that another node adopts its runs.

The supervisor is gone by then, so ``corral status`` cannot ask it: the reason,
and what to do, go to a small file in the home (``node-stopped.json``, 0600),
which ``corral status`` and ``corral doctor`` read. In every case the answer is
the same: ``corral up --node NODE`` on the same home. It takes its partition
back (through the recovery of any restart), or a new one while an adopter still
finishes runs of it. A node that boots removes the file.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

NOTE = "node-stopped.json"


def advice(home: Path, node: str, spec_path: str | None) -> str:
    """The command that resumes the node on this home."""
    command = ["corral", "--home", str(home), "up", "--node", node]
    if spec_path:
        command[4:4] = ["--spec", spec_path]
    return f"run `{shlex.join(command)}`: it starts again from what the ledger holds (nothing restarts it by itself)"


def write(home: Path, node: str, spec_path: str | None, why: str) -> None:
    """Best effort, from a process about to exit: a failure here must not keep it up."""
    record = {"node": node, "at": time.time(), "why": why, "advice": advice(home, node, spec_path)}
    try:
        staging = home / (NOTE + ".new")
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(record))
        os.replace(staging, home / NOTE)
    except OSError:
        pass


def read(home: Path) -> dict[str, Any] | None:
    """The note of a node that stopped itself (None: it did not, or it booted since)."""
    try:
        fd = os.open(home / NOTE, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as source:
            record = json.loads(source.read(64 * 1024))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("node", "why", "advice")):
        return None
    return record


def clear(home: Path) -> None:
    try:
        (home / NOTE).unlink()
    except FileNotFoundError:
        pass


def describe(record: dict[str, Any]) -> str:
    """One line for ``status`` and ``doctor``."""
    at = record.get("at")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if isinstance(at, (int, float)) else "?"
    return f"node {record['node']} stopped itself at {when}: {record['why']}"
