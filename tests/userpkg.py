"""Write a user package (actors, providers) into a directory outside the repository,
as a user's own code would be: tests import it only through corral's references."""

from __future__ import annotations

import textwrap
from pathlib import Path

ACTORS = '''
import os

import corral


class Counter(corral.Actor):
    """Counts what it is told to add; the count lives as long as the process."""

    async def start(self) -> None:
        self.count = int(self.params.get("start", 0))

    async def handle_ask(self, message):
        if message.get("op") == "add":
            self.count += int(message["n"])
        if message.get("op") == "crash":
            raise ValueError("asked to crash")
        return {"count": self.count, "pid": os.getpid(), "incarnation": self.ctx.incarnation}

    async def handle_tell(self, message):
        self.count += int(message.get("n", 0))


class FailsAtStart(corral.Actor):
    async def start(self) -> None:
        raise RuntimeError("no database at start")


async def plain(ctx) -> int:
    """The function form: owns its inbox like the built-in templates."""
    async for envelope in ctx.channel.inbox:
        if envelope.body.get("op") == "shutdown":
            ctx.shutdown.set()
            return 0
        if envelope.kind.value == "request":
            await ctx.channel.reply(envelope, {"plain": True, "got": envelope.body})
    return 0


NOT_A_TEMPLATE = 42
'''

BROKEN = """
raise RuntimeError("boom at import")
"""

PROVIDERS = '''
import json
import os
from pathlib import Path

import corral


class EchoLLM:
    """Answers with a final reply naming the task; fails transiently first when
    told to (a counter file outside the ledger proves how often it was called)."""

    name = "echo-llm"

    def __init__(self, config):
        self.prefix = config.get("prefix", "echo")
        self.fail_first = int(config.get("fail_first", 0))
        self.calls_file = Path(config["calls_file"]) if "calls_file" in config else None
        self.context_file = Path(config["context_file"]) if "context_file" in config else None

    async def complete(self, request):
        if self.context_file is not None:  # what the agent gave its provider of the repository
            self.context_file.write_text(request.project_context)
        calls = 0
        if self.calls_file is not None:
            calls = int(self.calls_file.read_text()) if self.calls_file.exists() else 0
            self.calls_file.write_text(str(calls + 1))
        if calls < self.fail_first:
            raise corral.ProviderError(corral.ErrorKind.TRANSIENT, f"connection reset (call {calls + 1})")
        return corral.ProviderResponse(json.dumps({"final": f"{self.prefix}: {request.task}"}))

    def parse(self, response, tools):
        return corral.Plan(final_reply=json.loads(response.text)["final"])


class NotAProvider:
    pass
'''


def write_package(root: Path, name: str = "userpkg") -> Path:
    """``root/name/{actors,broken,llm}.py``; returns ``root`` (the import path)."""
    package = root / name
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "actors.py").write_text(textwrap.dedent(ACTORS))
    (package / "broken.py").write_text(textwrap.dedent(BROKEN))
    (package / "llm.py").write_text(textwrap.dedent(PROVIDERS))
    return root


def write_entry_point(root: Path, group: str, name: str, value: str, dist: str = "userpkg_plugin") -> None:
    """A minimal installed distribution on ``root`` registering one entry point."""
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {value}\n")
