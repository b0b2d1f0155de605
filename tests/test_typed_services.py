"""The supervisor's services are typed attributes: ``mypy --strict`` checks every call.

Each service was once looked up by name in a ``dict[str, Any]``, where a renamed or
deleted method still type-checked. This test asks mypy itself: a call to a method a
service does not have must fail the type check, naming the service's class, and the
same calls to methods it has must pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The typed parts of a Supervisor: attribute -> (its class, one method it has).
SERVICES = {
    "runs": ("RunService", "run_of"),
    "views": ("RunViews", "show"),
    "swarm": ("SwarmService", "spawn"),
    "sessions": ("SessionService", "poll"),
    "mcp": ("McpService", "run_catalog"),
    "models": ("ModelService", "generate"),
    "interactive": ("InteractiveService", "steer"),
    "intent": ("IntentService", "bind"),
    "bridge": ("BridgeService", "job_open"),
    "collaboration": ("CollaborationService", "policy_for"),
}
HEADER = "from corral.supervisor.daemon import Supervisor\n\n\ndef probe(sup: Supervisor) -> None:\n"


def _view() -> Path:
    """The package as it is imported, for mypy: scripts/typecheck.sh makes the same
    view at the same path, so its cache serves this run (seconds, not a minute)."""
    base = ROOT / "build" / "typecheck"
    view = base / "corral"
    if not view.is_dir():
        view.mkdir(parents=True)
        for entry in (ROOT / "corral").iterdir():
            (view / entry.name).symlink_to(entry)
        for name in ("actors", "mailbox", "sandbox", "supervisor"):
            (view / name).symlink_to(ROOT / name)
    return base


def _mypy(body: str, tmp_path: Path) -> str:
    probe = tmp_path / "probe.py"
    probe.write_text(HEADER + body)
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / "build" / "mypy-cache"), str(probe)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "MYPYPATH": str(_view())},
    )
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def probes(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """mypy's verdicts on one call per service: to a method it has, and to one it lacks."""
    real = "".join(f"    print(sup.{name}.{method})\n" for name, (_, method) in SERVICES.items())
    missing = "".join(f"    print(sup.{name}.no_such_method_{name})\n" for name in SERVICES)
    return (_mypy(real, tmp_path_factory.mktemp("real")), _mypy(missing, tmp_path_factory.mktemp("missing")))


def test_calls_to_methods_the_services_have_type_check(probes: tuple[str, str]) -> None:
    real, _ = probes
    assert "Success: no issues found" in real, real


def test_a_call_to_a_method_a_service_lacks_fails_the_type_check(probes: tuple[str, str]) -> None:
    _, missing = probes
    for name, (cls, _) in SERVICES.items():
        assert f'"{cls}" has no attribute "no_such_method_{name}"' in missing, (name, missing)
    assert f"Found {len(SERVICES)} errors" in missing, missing
