"""A user actor template: a counter that keeps its total in a file, so a restart
after a crash resumes from the last committed value.

Named in the spec as ``template = "counter:Counter"``: the directory of the spec is
on the import path of the supervisor and of every actor.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import corral


class Counter(corral.Actor):
    async def start(self) -> None:
        # params come from [actors.params] in the spec.
        self.state = Path(self.params["state_file"])
        self.total = int(self.state.read_text()) if self.state.exists() else 0

    async def handle_ask(self, message: dict[str, Any]) -> dict[str, Any]:
        if message.get("op") == "add":
            self.total += int(message.get("n", 1))
            # Write then rename: a SIGKILL leaves the old or the new total, never half.
            tmp = self.state.with_suffix(".tmp")
            tmp.write_text(str(self.total))
            os.replace(tmp, self.state)
        return {"total": self.total, "pid": os.getpid(), "incarnation": self.ctx.incarnation}

    async def handle_tell(self, message: dict[str, Any]) -> None:
        pass  # one-way messages are ignored by this example

    async def stop(self) -> None:
        pass  # nothing to flush: every change is already on disk
