"""effect.record: a test tool whose only side effect is one appended line.

The line lands in a file outside the ledger, so tests and chaos count real
executions independently of what the ledger claims.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, NotRequired

from typing_extensions import TypedDict

from corral.actors.tools.base import ToolContext, ToolError, ToolResult, schema


class RecordArgs(TypedDict):
    label: str


class BarrierArgs(TypedDict):
    name: str
    parties: int
    timeout_ms: NotRequired[int]


class EffectRecord:
    schema = schema(
        "effect.record",
        "Record one externally visible side effect (for tests and chaos).",
        RecordArgs,
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        path = ctx.effects_file or ctx.home / "effects.log"
        line = json.dumps(
            {
                "action_id": ctx.action_id,
                "run_id": ctx.run_id,
                "agent": ctx.agent_id,
                "label": tool_input["label"][:200],
                "at": time.time(),
                "pid": os.getpid(),
            }
        )
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ToolError(f"cannot open the effects file: {exc.strerror}") from None
        try:
            os.write(fd, (line + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return ToolResult(True, {"recorded": tool_input["label"][:200]}, f"recorded {tool_input['label'][:60]}")


def read_effects(path: os.PathLike[str] | str) -> list[dict[str, Any]]:
    try:
        with open(path) as handle:
            return [json.loads(line) for line in handle if line.strip()]
    except FileNotFoundError:
        return []


class EffectBarrier:
    """Wait until ``parties`` actions reached the barrier ``name``; a test tool that
    proves actors run in parallel (serialized ones could never all arrive)."""

    schema = schema(
        "effect.barrier",
        "Wait until N parties reach a named barrier (for tests).",
        BarrierArgs,
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        import trio

        base = (ctx.effects_file or ctx.home / "effects.log").parent
        name = "".join(ch for ch in tool_input["name"] if ch.isalnum() or ch in "-_")[:40] or "barrier"
        directory = base / f"barrier-{name}"
        directory.mkdir(exist_ok=True)
        (directory / ctx.action_id).write_text(str(time.time()))
        parties = int(tool_input["parties"])
        deadline = trio.current_time() + tool_input.get("timeout_ms", 30_000) / 1000
        while len(list(directory.iterdir())) < parties:
            if trio.current_time() > deadline:
                arrived = len(list(directory.iterdir()))
                raise ToolError(f"barrier {name}: {arrived} of {parties} arrived before the timeout")
            await trio.sleep(0.01)
        return ToolResult(True, {"barrier": name, "parties": parties}, f"barrier {name} passed by {parties}")
