"""An MCP server that starts once: the lab server the first time, and from then
on a start that fails, printing a distinctive line (and a secret-looking token, to
prove it is masked) on stderr and exiting 3. ``START_ONCE_MARKER`` names the file
that remembers the first start."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

FAILURE_LINE = "start-once: the weather station is unreachable, giving up"
SECRET = "sk-proj-StartOnce0123456789abcdefghijklmnopqrstuv"

if __name__ == "__main__":
    marker = Path(os.environ["START_ONCE_MARKER"])
    if marker.exists():
        print("start-once: starting again", file=sys.stderr)
        print(f"start-once: using api key {SECRET}", file=sys.stderr)
        print(FAILURE_LINE, file=sys.stderr)
        sys.exit(3)
    marker.write_text("started\n")
    runpy.run_path(str(Path(__file__).with_name("lab_server.py")), run_name="__main__")
