"""`corral demo` end to end through the CLI, as `make demo` runs it."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path


def test_the_demo_swarm_runs_to_one_final_reply(short_tmp: Path) -> None:
    # A space in the directory: the inspect line it prints is quoted for the shell.
    result = subprocess.run([sys.executable, "-m", "corral", "demo", "--dir", str(short_tmp / "my d")],
                            capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "status completed" in out or ": completed" in out
    assert "delegations (repairs)  3 (1)" in out
    assert "isolated children      3" in out
    assert "claims observed        2" in out
    assert "final reply: Launch plan ready" in out
    # The live view says what each run was asked, and each tool call with its arguments.
    assert "task: Prepare the launch plan: research, review, drafts and checks." in out
    assert 'fs.write(content="# Checklist' in out and 'path="review/checklist.md")' in out
    # The inspect command it prints works as printed, after the demo's supervisor is gone.
    (printed,) = [line.split("(inspect: ", 1)[1].rstrip(")") for line in out.splitlines() if "(inspect: " in line]
    words = shlex.split(printed)
    assert words[0] == "corral" and words[3] == "show", printed
    shown = subprocess.run([sys.executable, "-m", "corral", *words[1:]], capture_output=True, text=True, timeout=60,
                           check=False)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"run {words[4]}  agent project-supervisor  root  status completed"), shown.stdout
    assert "read from the ledger" in shown.stderr
    project = short_tmp / "my d" / "project"
    for artifact in ("research/survey.md", "review/notes.md", "review/checklist.md", "draft/intro/intro.md",
                     "draft/body/body.md", "checks/checks.md", "summary/launch.md"):
        assert (project / artifact).is_file(), artifact
