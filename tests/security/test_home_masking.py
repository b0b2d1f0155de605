"""Issue 32, case 9: the home (endpoint.json holds the control token) is never visible
inside the sandbox, wherever it lies; and ``corral up`` refuses a home inside the
project, equal to it, or around it, before creating anything. Real bubblewrap, the
real CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.actors.one_shot_command import run_command
from corral.sandbox.bwrap import LaunchMode, SandboxProfile
from corral.sandbox.trampoline import TRAMPOLINE_PATH
from corral.supervisor.home.home_dir import HomeError
from corral.supervisor.home.home_placement import check_placement
from tests.harness import CORRAL, cli
from tests.launch_modes import needs_bwrap

pytestmark = pytest.mark.usefixtures("private_tempdir")

TOKEN = "ctl-token-9f8e7d6c5b4a39281706"


@pytest.fixture(
    params=[
        pytest.param(lambda: Path(sys.prefix), id="in-the-virtualenv"),
        pytest.param(lambda: TRAMPOLINE_PATH.parent, id="in-the-corral-package"),
        pytest.param(lambda: Path("/usr/local/share"), id="under-usr-local-share"),
    ]
)
def outside_home(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A home with an endpoint file in a tree the sandbox binds (removed afterwards)."""
    parent = request.param()
    if not os.access(parent, os.W_OK):
        pytest.fail(f"{parent} is not writable here: the test cannot place a home in it")
    home = Path(tempfile.mkdtemp(prefix=".corral-test-home-", dir=parent))
    try:
        (home / "endpoint.json").write_text(json.dumps({"token": TOKEN}))
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


@needs_bwrap
async def test_the_home_is_masked_wherever_the_sandbox_would_see_it(short_tmp: Path, outside_home: Path) -> None:
    project = short_tmp / "proj"
    project.mkdir()
    profile = SandboxProfile(project_root=project, masked=(outside_home,))
    script = f"cat {outside_home}/endpoint.json; ls -a {outside_home}; echo listed; ls {outside_home.parent} | head -3"
    result = await run_command(["sh", "-c", script], project, 60, profile, launch_mode=LaunchMode.SANDBOXED)
    out = result.transcript_path.read_text()
    assert "listed" in out, out
    assert TOKEN not in out and "\nendpoint.json\n" not in out and "No such file" in out, out
    assert json.loads((outside_home / "endpoint.json").read_text()) == {"token": TOKEN}  # untouched on the host


# -- corral up: where a home may lie ---------------------------------------------------------


SPEC = """
[project]
root = "{root}"
[[agents]]
id = "writer"
[[agents.steps]]
final = "done"
"""


def _spec(where: Path, root: Path) -> Path:
    spec = where / "swarm.toml"
    spec.write_text(SPEC.format(root=root))
    return spec


def _refused(result: subprocess.CompletedProcess[str], home: Path, before: set[str]) -> None:
    try:
        assert result.returncode == 2, result.stdout + result.stderr
        assert "Traceback" not in result.stderr
        assert not (home / "endpoint.json").exists() and not (home / "ledger.db").exists()
        now = {str(p) for p in home.rglob("*")} if home.exists() else set()
        assert now == before, "nothing is created in a refused home"
    finally:
        if (home / "endpoint.json").exists():  # the old code started one: stop it
            cli(home, "down")


def test_up_refuses_a_home_inside_the_project(short_tmp: Path) -> None:
    project = short_tmp / "proj"
    project.mkdir()
    spec = _spec(short_tmp, project)
    home = project / "state"
    result = cli(home, "up", "--spec", str(spec))
    _refused(result, home, set())
    assert not home.exists()
    assert "lies inside the project" in result.stderr and "outside the project" in result.stderr


def test_up_refuses_the_project_itself_as_home(short_tmp: Path) -> None:
    """``corral up --home .`` in the project: the home would be the workspace."""
    project = short_tmp / "proj"
    project.mkdir()
    spec = _spec(short_tmp, project)
    before = {str(p) for p in project.rglob("*")}
    result = subprocess.run([*CORRAL, "--home", ".", "up", "--spec", str(spec)], cwd=project, capture_output=True,
                            text=True, timeout=60, check=False)
    _refused(result, project, before)
    assert "is the project" in result.stderr


def test_up_refuses_a_project_inside_the_home(short_tmp: Path) -> None:
    home = short_tmp / "h"
    project = home / "proj"
    project.mkdir(parents=True)
    spec = _spec(short_tmp, project)
    before = {str(p) for p in home.rglob("*")}
    result = cli(home, "up", "--spec", str(spec))
    _refused(result, home, before)
    assert "lies inside the home" in result.stderr


def test_up_refuses_the_layout_of_the_spec_the_home_last_ran(short_tmp: Path) -> None:
    """`corral up` without --spec runs the spec of the last boot: judged the same."""
    project = short_tmp / "proj"
    (project / "state").mkdir(parents=True)
    home = project / "state"
    (home / "spec.source").write_text(str(_spec(short_tmp, project)))
    before = {str(p) for p in home.rglob("*")}
    _refused(cli(home, "up"), home, before)


def test_a_home_in_the_projects_control_directory_is_accepted(short_tmp: Path) -> None:
    """The default home ``./.corral`` in the project: hidden from agents by its name."""
    project = short_tmp / "proj"
    check_placement(project / ".corral", project)
    check_placement(project / "sub" / ".Corral" / "h", project)
    check_placement(short_tmp / "elsewhere", project)
    check_placement(project / "state", None)  # nothing works in a project: no agents
    (short_tmp / "link").symlink_to(project)
    with pytest.raises(HomeError, match="lies inside the project"):
        check_placement(short_tmp / "link" / "state", project)  # judged after resolution
