"""The private spool: what a tool acts on, kept out of the ledger.

Two kinds of entries, one mechanism (0700 directory in the home, 0600 fsync'd
files, durable before the ledger row that names them commits, swept at boot once
their run is over):

- **Raw copies.** Redaction applies to what is stored and shown, never to what a
  tool acts on: ``token = get_token()`` must reach the disk as written. When
  redaction changes a provider response, a plan or an action input, the ledger
  keeps the redacted copy (for display) and the SHA-256 of the raw one, and the raw
  bytes wait here for the agent (``keep`` / ``load``, checked against the digest).
- **Sealed fields**, below: input that never reaches the ledger even redacted.

Sealed tool inputs: what an agent types into a process never reaches the ledger.

``process.stdin`` data may be a password or a token the model was handed. The plan
and the action row must still be durable and fingerprinted, so at plan commit the
supervisor moves each sealed field into a private spool file (0600, fsync'd, in
the 0700 home) named by the action id that the plan will produce, and keeps only
``{"sealed": sha256, "bytes": n}`` in the plan, the action input and the receipt.
The provider's raw response, which carried the same text, is withheld in the
same transaction that commits the plan.

The spool entry is read once, when the session writes it to the terminal, and
removed then: a stdin action is never re-run (after a crash it is reconciled by
a person), so nothing needs it again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from corral.actors.tools.base import Tool, is_sealed
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs.action_state import action_id

SPOOL_DIR = "sealed"
WITHHELD_RESPONSE = "[withheld: this response carried sealed tool input; the committed plan holds its digest]"


class SealedInputError(Exception):
    """A sealed value or raw copy that is missing or does not match its digest."""


def raw_name(run_id: str, kind: str, key: str) -> str:
    """``<run>.raw-<kind>.<key>``: run-scoped, so the boot sweep keeps it until the
    run is over (a re-runnable action may need its raw input after a crash)."""
    return f"{run_id}.raw-{kind}.{hashlib.sha256(key.encode()).hexdigest()[:24]}"


def keep(spool: Path, name: str, data: bytes) -> str:
    """Store a raw copy durably; returns its sha256 (what the ledger row records)."""
    _write_private(spool / name, data)
    return hashlib.sha256(data).hexdigest()


def load(spool: Path, name: str, digest: str) -> bytes:
    """A raw copy, checked against the digest its ledger row recorded."""
    try:
        data = (spool / name).read_bytes()
    except FileNotFoundError:
        raise SealedInputError(f"the private copy {name} is missing") from None
    if hashlib.sha256(data).hexdigest() != digest:
        raise SealedInputError(f"the private copy {name} does not match its digest")
    return data


def drop(spool: Path, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        (spool / name).unlink()


def spool_dir(home: Path) -> Path:
    path = home / SPOOL_DIR
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def sealed_fields(tools: Mapping[str, Tool], name: str) -> tuple[str, ...]:
    """The input fields tool ``name`` of the catalog ``tools`` declares sealed
    (``ToolSchema.sealed``); none for a tool it does not hold."""
    tool = tools.get(name)
    return tool.schema.sealed if tool is not None else ()


def seal_plan(
    spool: Path, run_id: str, loop_index: int, plan: dict[str, Any], tools: Mapping[str, Tool]
) -> tuple[dict[str, Any], bool]:
    """The plan with every sealed field (as the catalog ``tools`` declares them)
    replaced by its digest; True when any was. Spool files are durable before this
    returns, so the plan may then commit."""
    actions = plan.get("actions")
    if not isinstance(actions, list):
        return plan, False
    sealed_any = False
    out_actions: list[Any] = []
    for index, call in enumerate(actions):
        fields = sealed_fields(tools, str(call.get("tool"))) if isinstance(call, dict) else None
        tool_input = call.get("input") if isinstance(call, dict) else None
        if not fields or not isinstance(tool_input, dict):
            out_actions.append(call)
            continue
        sealed_input = dict(tool_input)
        for field in fields:
            value = tool_input.get(field)
            if isinstance(value, str) and value:
                data = value.encode()
                _write_private(spool / f"{run_id}.{action_id(run_id, loop_index, index)}.{field}", data)
                sealed_input[field] = {"sealed": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
                sealed_any = True
        out_actions.append({**call, "input": sealed_input})
    return {**plan, "actions": out_actions}, sealed_any


def unseal(spool: Path, run_id: str, the_action_id: str, field: str, marker: Any) -> str:
    """The value behind ``marker`` for this action, checked against its digest."""
    if not is_sealed(marker):
        raise SealedInputError(f"{field} of {the_action_id} is not a sealed value")
    path = spool / f"{run_id}.{the_action_id}.{field}"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SealedInputError(f"the sealed {field} of {the_action_id} was already used or never spooled") from None
    if hashlib.sha256(data).hexdigest() != marker["sealed"]:
        raise SealedInputError(f"the sealed {field} of {the_action_id} does not match its digest")
    return data.decode()


def discard(spool: Path, run_id: str, the_action_id: str) -> None:
    for path in spool.glob(f"{run_id}.{the_action_id}.*"):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def sweep(spool: Path, ledger: Ledger) -> int:
    """At boot: remove every entry that no action will read any more (its action
    has started or ended, or its run is over). Returns how many went."""
    removed = 0
    for path in spool.iterdir():
        run_id, _, rest = path.name.partition(".")
        the_action_id = rest.partition(".")[0]
        action = ledger.one("SELECT phase FROM actions WHERE action_id = ?", the_action_id)
        run = ledger.one("SELECT status FROM runs WHERE run_id = ?", run_id)
        waiting = action["phase"] in _NOT_STARTED if action is not None else run is not None
        if not waiting or run is None or run["status"] in _RUN_OVER:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += 1
    return removed


_NOT_STARTED = ("prepared", "waiting-confirmation", "approved")
_RUN_OVER = ("completed", "failed", "cancelled")


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
