"""Every example runs for real: ``examples/python_api.py`` and ``examples/custom_actor``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _example(script: str, base: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), "--dir", str(base)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=base.parent,  # not the repository: the example must not rely on it
    )


def test_python_api_example_runs_and_prints_the_reply(short_tmp: Path) -> None:
    result = _example("python_api.py", short_tmp / "api")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("run run-") and lines[0].endswith(": completed")
    assert "final reply: Wrote notes/hello.md" in lines
    assert (short_tmp / "api" / "project" / "notes" / "hello.md").read_text() == "# Hello from corral\n"
    assert not (short_tmp / "api" / ".corral" / "endpoint.json").exists(), "the supervisor was stopped"


def test_custom_actor_example_survives_a_sigkill(short_tmp: Path) -> None:
    result = _example("custom_actor/drive.py", short_tmp / "actor")
    assert result.returncode == 0, result.stderr
    assert "(incarnation 1)" in result.stdout and "total 6 from pid" in result.stdout
    assert "restarts: 1" in result.stdout
    assert (short_tmp / "actor" / "total.txt").read_text() == "6"
