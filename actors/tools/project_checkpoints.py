"""Checkpoints of the files a change touches (seed 004 V1.3), kept in the corral home.

Before a changeset or a restore writes anything, the prior content of every file
it touches (or the fact that the file is absent) is stored under
``<home>/checkpoints``:

* ``blobs/<sha256>``: each content once, named by its SHA-256 (the same bytes in a
  hundred checkpoints are stored once);
* ``runs/<run>/<checkpoint id>.json``: the manifest (id, run, action, tool,
  workspace, time, and ``files``: path -> sha256, or null for an absent file).

A checkpoint's id is derived from the run, the action and its input, never drawn
at random: an idempotent action run again after a crash finds the checkpoint its
first attempt took (one manifest per action) and compares with that prior content,
not with the half-done state it may have left. Every file is written to a
temporary name, fsync'd and renamed, the manifest last: a crash leaves either no
manifest or a whole one whose blobs are all there.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.actors.tools.base import ToolError

_ID = re.compile(r"^cp-[0-9a-f]{20}$")
_SHA = re.compile(r"^[0-9a-f]{64}$")
_SAFE_RUN = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


@dataclass(frozen=True)
class Checkpoint:
    id: str
    run_id: str
    action_id: str
    tool: str
    #: The resolved workspace the paths are relative to.
    workspace: str
    created_ns: int
    #: Path (as the tool was given it) -> SHA-256 of its prior content, None: absent.
    files: dict[str, str | None]

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "run_id": self.run_id, "action_id": self.action_id, "tool": self.tool,
                "workspace": self.workspace, "created_ns": self.created_ns, "files": self.files}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def checkpoint_id(run_id: str, action_id: str, tool: str, tool_input: dict[str, Any]) -> str:
    """The checkpoint of one action with one input: the same on every attempt."""
    canonical = json.dumps([run_id, action_id, tool, tool_input], sort_keys=True, separators=(",", ":"))
    return "cp-" + sha256(canonical.encode())[:20]


def _root(home: Path) -> Path:
    return home / "checkpoints"


def _run_dir(home: Path, run_id: str) -> Path:
    name = run_id if _SAFE_RUN.match(run_id) and run_id not in (".", "..") else "run-" + sha256(run_id.encode())[:16]
    return _root(home) / "runs" / name


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _parse(data: bytes, where: Path) -> Checkpoint:
    try:
        raw = json.loads(data)
        files = raw["files"]
        if not isinstance(files, dict) or not all(
            isinstance(k, str) and (v is None or (isinstance(v, str) and _SHA.match(v))) for k, v in files.items()
        ):
            raise ValueError("bad files")
        checkpoint = Checkpoint(str(raw["id"]), str(raw["run_id"]), str(raw["action_id"]), str(raw["tool"]),
                                str(raw["workspace"]), int(raw["created_ns"]), dict(files))
    except (ValueError, KeyError, TypeError) as exc:
        raise ToolError(f"checkpoint manifest {where.name} is damaged ({exc})", "bad-checkpoint") from None
    if not _ID.match(checkpoint.id):
        raise ToolError(f"checkpoint manifest {where.name} is damaged (bad id)", "bad-checkpoint")
    return checkpoint


def find(home: Path, cp_id: str) -> Checkpoint | None:
    """The checkpoint ``cp_id`` of any run kept in this home, or None."""
    if not _ID.match(cp_id):
        raise ToolError(f"{cp_id!r} is not a checkpoint id (cp- and 20 hex digits)", "bad-input")
    for path in (_root(home) / "runs").glob(f"*/{cp_id}.json"):
        return _parse(path.read_bytes(), path)
    return None


def of_run(home: Path, run_id: str) -> list[Checkpoint]:
    """The run's checkpoints, oldest first."""
    found = [_parse(path.read_bytes(), path) for path in _run_dir(home, run_id).glob("cp-*.json")]
    return sorted(found, key=lambda c: (c.created_ns, c.id))


def blob(home: Path, digest: str) -> bytes:
    """The stored content named ``digest``, checked against it."""
    if not _SHA.match(digest):
        raise ToolError(f"{digest!r} is not a sha256", "bad-checkpoint")
    path = _root(home) / "blobs" / digest
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ToolError(f"checkpoint content {digest[:12]} is missing from the home", "bad-checkpoint") from None
    if sha256(data) != digest:
        raise ToolError(f"checkpoint content {digest[:12]} is damaged", "bad-checkpoint")
    return data


def take(
    home: Path, cp_id: str, *, run_id: str, action_id: str, tool: str, workspace: Path,
    prior: dict[str, bytes | None],
) -> Checkpoint:
    """Store ``prior`` (path -> content, None: absent) as checkpoint ``cp_id``; an
    existing checkpoint of that id is kept as it is and returned (a second attempt of
    the same action stores nothing twice)."""
    existing = find(home, cp_id)
    if existing is not None:
        return existing
    files: dict[str, str | None] = {}
    for path, data in prior.items():
        if data is None:
            files[path] = None
            continue
        digest = sha256(data)
        target = _root(home) / "blobs" / digest
        if not target.exists():
            _write_atomically(target, data)
        files[path] = digest
    checkpoint = Checkpoint(cp_id, run_id, action_id, tool, str(workspace.resolve()), time.time_ns(), files)
    manifest = json.dumps(checkpoint.as_dict(), sort_keys=True, indent=1).encode()
    _write_atomically(_run_dir(home, run_id) / f"{cp_id}.json", manifest)
    return checkpoint


def prior_content(home: Path, checkpoint: Checkpoint, path: str) -> bytes | None:
    digest = checkpoint.files[path]
    return None if digest is None else blob(home, digest)
