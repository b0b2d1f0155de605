"""The project root never contains the Python environment corral runs from, nor
corral's own package directories (red team, HIGH). With uv's default layout
(``project/.venv``) one ``fs.write`` of ``project/.venv/lib/python3.X/site-packages/zz.pth``
would make every later corral process (the fork server's replacement, the CLI, the
supervisor) run that code on the host, and ``-P`` does not stop ``.pth`` files.

The real-process case builds such a project: a venv inside it whose python runs the
corral under test, and drives ``corral up`` through that python."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from corral.supervisor.home import home_dir as homes
from corral.supervisor.spec.runtime_dirs import check_runtime_outside, runtime_dirs
from corral.supervisor.spec.swarm_spec import SpecError
from tests.harness import cli

REPO = Path(__file__).resolve().parent.parent
SPEC = '[project]\nroot = "."\n[[agents]]\nid = "a"\nsteps = [{ final = "done" }]\n'


def test_a_root_that_contains_the_environment_is_refused_naming_it(tmp_path: Path) -> None:
    prefix = tmp_path / "p" / ".venv"
    prefix.mkdir(parents=True)
    dirs = [("the Python environment corral runs from (sys.prefix)", prefix)]
    with pytest.raises(SpecError) as refused:
        check_runtime_outside(tmp_path / "p", dirs)
    message = str(refused.value)
    assert "sys.prefix" in message and str(prefix) in message and "outside the project" in message
    # Equal to it is containing it too.
    with pytest.raises(SpecError):
        check_runtime_outside(prefix, dirs)
    # A sibling, and a root inside the environment's own tree, do not contain it.
    (tmp_path / "q").mkdir()
    (prefix / "lib").mkdir()
    check_runtime_outside(tmp_path / "q", dirs)
    check_runtime_outside(prefix / "lib", dirs)


def test_paths_are_judged_after_resolution(tmp_path: Path) -> None:
    """A root given through a symlink, and an environment reached through one, are
    compared where they really are: not by string prefix."""
    (tmp_path / "real" / "env").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "envlink").symlink_to(tmp_path / "real" / "env")
    with pytest.raises(SpecError):
        check_runtime_outside(tmp_path / "link", [("sys.prefix", tmp_path / "real" / "env")])
    with pytest.raises(SpecError):
        check_runtime_outside(tmp_path / "real", [("sys.prefix", tmp_path / "other" / "envlink")])
    # The symlink's own directory does not contain where it points.
    check_runtime_outside(tmp_path / "other", [("sys.prefix", tmp_path / "other" / "envlink")])


def test_the_runtime_dirs_cover_the_prefixes_and_every_mapped_package_directory() -> None:
    dirs = [path for _, path in runtime_dirs()]
    assert Path(sys.prefix).resolve() in dirs and Path(sys.exec_prefix).resolve() in dirs
    if Path(sys.modules["corral"].__file__ or "").resolve().parent.parent != REPO:
        pytest.skip("corral is not imported from this tree: its package-dir mapping does not apply")
    mapped = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for name, folder in mapped.items():
        where = (REPO / folder).resolve()
        assert any(where == d or d in where.parents for d in dirs), f"{name} ({where}) not covered by {dirs}"


def _venv_inside(project: Path) -> Path:
    """A venv in the project whose python imports the corral under test and its
    dependencies: uv's default layout, ``project/.venv``."""
    venv = project / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    ours = Path(site.getsitepackages()[0])
    theirs = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert theirs.is_dir(), theirs
    # One .pth: the path line first, so the editable finder's import line below finds its module.
    lines = [str(ours)]
    for pth in sorted(ours.glob("__editable__*.pth")):
        lines += pth.read_text().splitlines()
    (theirs / "corral-under-test.pth").write_text("\n".join(lines) + "\n")
    return venv


def test_corral_up_from_a_venv_inside_the_project_is_refused(short_tmp: Path) -> None:
    project = short_tmp / "project"
    project.mkdir()
    venv = _venv_inside(project)
    (project / "swarm.toml").write_text(SPEC)
    home = short_tmp / "h"
    up = subprocess.run(
        [str(venv / "bin" / "python"), "-P", "-m", "corral", "--home", str(home), "up", "--spec",
         str(project / "swarm.toml")],
        cwd=short_tmp, capture_output=True, text=True, timeout=180, check=False, env={**os.environ},
    )
    if up.returncode == 0:  # the defect: reap the supervisor before failing
        cli(home, "down")
    assert up.returncode != 0, up.stdout + up.stderr
    assert "sys.prefix" in up.stderr and str(venv.resolve()) in up.stderr, up.stderr
    assert "outside the project" in up.stderr, up.stderr
    assert "Traceback" not in up.stderr
    # Refused before anything was made: no home, no supervisor.
    assert not home.exists() and not homes.is_locked(home)


def test_a_supervisor_booted_from_a_venv_inside_the_project_refuses_too(short_tmp: Path) -> None:
    """Not only the CLI: a supervisor started another way (``Client.start``, a restart
    from the remembered spec) checks the interpreter it runs on itself."""
    project = short_tmp / "project"
    project.mkdir()
    venv = _venv_inside(project)
    (project / "swarm.toml").write_text(SPEC)
    home = short_tmp / "h"
    boot = subprocess.run(
        [str(venv / "bin" / "python"), "-P", "-m", "corral.supervisor", "--home", str(home), "--spec",
         str(project / "swarm.toml")],
        cwd=short_tmp, capture_output=True, text=True, timeout=180, check=False, env={**os.environ},
    )
    assert boot.returncode == 2, boot.stdout + boot.stderr
    assert "sys.prefix" in boot.stderr and str(venv.resolve()) in boot.stderr, boot.stderr
    assert "Traceback" not in boot.stderr and not homes.is_locked(home)
