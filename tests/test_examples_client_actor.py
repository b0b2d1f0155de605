"""Every example runs for real: python_api.py, custom_actor/ and custom_tools/."""

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


def test_custom_tools_example_validates_and_orders_once(short_tmp: Path) -> None:
    result = _example("custom_tools/run.py", short_tmp / "tools")
    assert result.returncode == 0, result.stderr
    assert ": completed" in result.stdout.splitlines()[0]
    assert "invalid argument quantity" in result.stdout
    orders = (short_tmp / "tools" / "project" / "orders.jsonl").read_text().splitlines()
    assert len(orders) == 1 and '"quantity": 12' in orders[0]
