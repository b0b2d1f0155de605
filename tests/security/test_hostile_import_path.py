"""Workspace content never reaches a host process's import path (issue 48 A.1).

Each case is a real repository with planted files, driven through the installed
``corral`` command from where a user would run it: inside the project, with the spec
next to the code. The planted modules write a marker when imported; a marker means
project code ran in a host-side corral process, outside the sandbox.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.supervisor.home import home_dir as homes
from tests.harness import unattended, with_transport

#: The console script a user runs (`pip install` puts it next to the interpreter).
CORRAL = str(Path(sys.executable).with_name("corral"))


def _planted(marker: Path, then: str = "") -> str:
    """A module that records which process imported it, then does ``then``."""
    return (
        "import os\n"
        f"with open({str(marker)!r}, 'a') as out:\n"
        "    out.write(str(os.getpid()) + ' ' + open('/proc/self/cmdline', 'rb').read().replace(b'\\0', b' ')"
        ".decode() + '\\n')\n"
        f"{then}"
    )


_HAND_OVER = """
import importlib, os, sys
here = os.path.dirname(os.path.abspath(__file__))
del sys.modules["yaml"]
saved = sys.path[:]
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
try:
    real = importlib.import_module("yaml")
finally:
    sys.path[:] = saved
sys.modules["yaml"] = real
globals().update({k: v for k, v in vars(real).items() if not k.startswith("__")})
"""


def _cloned_repository(root: Path, marker: Path) -> Path:
    """A repository as it might be cloned: a module that shadows one the host
    imports lazily (yaml, for a skill's front matter), a skill (so the prompt build
    parses front matter), and the spec inside it. (A planted ``corral`` package is
    the next test's case: today it stops `up` before yaml is ever reached.)"""
    repo = root / "repo"
    (repo / ".agents" / "skills" / "x").mkdir(parents=True)
    (repo / ".agents" / "skills" / "x" / "SKILL.md").write_text("---\nname: x\ndescription: Planted\n---\nbody\n")
    # It then hands over to the real yaml, so the run goes on as if nothing happened.
    (repo / "yaml.py").write_text(_planted(marker, _HAND_OVER))
    return repo


def _corral(home: Path, *args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CORRAL, "--home", str(home), *args], cwd=cwd, capture_output=True, text=True, timeout=180, check=False,
        env={**os.environ, **(env or {})},
    )


def _down(home: Path, cwd: Path) -> None:
    done = _corral(home, "down", cwd=cwd)
    assert done.returncode == 0, done.stderr
    assert not homes.is_locked(home)


def _run_completes(home: Path, cwd: Path, task: str) -> None:
    ran = _corral(home, "run", "--agent", "a", "--task", task, "--wait", "--timeout", "120", "--json", cwd=cwd)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert json.loads(ran.stdout)["run"]["status"] == "completed"


ONE_FINAL = '[project]\nroot = "."\n[[agents]]\nid = "a"\nsteps = [{ final = "done" }]\n'


def _spec(text: str) -> str:
    return unattended(with_transport(text))


def test_a_cloned_repository_runs_no_code_in_the_host(short_tmp: Path) -> None:
    marker = short_tmp / "imported-by"
    repo = _cloned_repository(short_tmp, marker)
    (repo / "swarm.toml").write_text(_spec(ONE_FINAL))
    home = short_tmp / "h"
    up = _corral(home, "up", "--spec", "swarm.toml", cwd=repo)
    try:
        assert up.returncode == 0, up.stderr
        _run_completes(home, repo, "read the skills")
    finally:
        _down(home, repo)
    assert not marker.exists(), f"project code ran in a host process:\n{marker.read_text()}"


def test_user_code_edited_after_up_is_refused_never_run(short_tmp: Path) -> None:
    """A tools module next to the spec is pinned at `corral up`. The model (or anyone)
    edits it afterwards: a boot from the remembered spec refuses it by name, and the
    edited code never runs in a host process."""
    marker = short_tmp / "imported-by"
    repo = short_tmp / "repo"
    repo.mkdir()
    tools = repo / "tools.py"
    tools.write_text(
        "import corral\n\n@corral.tool(effect='read', name='probe.ping')\n"
        "def ping(ctx: corral.ToolContext) -> str:\n    return 'v1'\n"
    )
    (repo / "swarm.toml").write_text(_spec(
        '[project]\nroot = "."\n[tools]\nmodules = ["./tools.py"]\n[[agents]]\nid = "a"\ntools = ["probe.*"]\n'
        'steps = [{ actions = [{ tool = "probe.ping", input = {} }] }, { final = "done" }]\n'
    ))
    home = short_tmp / "h"
    up = _corral(home, "up", "--spec", "swarm.toml", cwd=repo)
    try:
        assert up.returncode == 0, up.stderr
        _run_completes(home, repo, "ping")
    finally:
        _down(home, repo)
    tools.write_text(tools.read_text() + "\n" + _planted(marker))
    again = _corral(home, "up", cwd=repo)  # no --spec: the remembered one, and its pins
    if again.returncode == 0:
        _down(home, repo)
    assert again.returncode != 0
    assert "changed after `corral up`" in again.stderr and "tools.py" in again.stderr, again.stderr
    assert "Traceback" not in again.stderr
    assert not marker.exists(), f"edited user code ran:\n{marker.read_text()}"


def test_a_user_module_not_loaded_at_up_is_refused_later(short_tmp: Path) -> None:
    """A module the tools import lazily, created after `up` (by the model, say), is
    not loaded: only what `up` pinned runs."""
    from corral.actors import user_code_pins

    repo = short_tmp / "repo"
    repo.mkdir()
    (repo / "tools.py").write_text("X = 1\n")
    finder = user_code_pins.UserCodeFinder(user_code_pins.UserCodeRecord(), recording=True)
    finder.add_roots([repo])
    name = finder.private_name("tools")
    assert name is not None and name.startswith(user_code_pins.PRIVATE_PREFIX)
    spec = finder.find_spec(name, None)
    assert spec is not None and spec.origin == str(repo / "tools.py")
    (repo / "later.py").write_text("raise SystemExit('must not run')\n")
    finder.recording = False
    late = name.rpartition(".")[0] + ".later"
    with pytest.raises(user_code_pins.UserCodeNotPinned, match="was not loaded at `corral up`"):
        finder.find_spec(late, None)
    # And a pinned file whose bytes changed is refused when it is executed.
    (repo / "tools.py").write_text("X = 2\n")
    enforcing = user_code_pins.UserCodeFinder(finder.export(), recording=False)
    spec = enforcing.find_spec(name, None)
    assert spec is not None and spec.loader is not None
    module = type(sys)("probe")
    with pytest.raises(user_code_pins.UserCodeChanged, match="changed after `corral up`"):
        spec.loader.exec_module(module)
    assert not hasattr(module, "X")


@pytest.mark.parametrize("where", ["checkout", "corral-folder"])
def test_demo_starts_from_a_directory_that_holds_a_corral_folder(short_tmp: Path, where: str) -> None:
    """`pip install .` leaves a user in the checkout's root (its `corral/` folder is the
    package's source, without the mapped subpackages); any directory may hold a folder
    named `corral`. The supervisor corral starts must not import either."""
    marker = short_tmp / "imported-by"
    cwd = short_tmp / "cwd"
    cwd.mkdir()
    if where == "checkout":
        (cwd / "corral").symlink_to(Path(__file__).resolve().parents[2] / "corral")
    else:
        (cwd / "corral").mkdir()
        (cwd / "corral" / "__init__.py").write_text(_planted(marker, "raise ImportError('the planted corral')\n"))
    spec = short_tmp / "swarm.toml"
    (short_tmp / "ws").mkdir()
    spec.write_text(_spec('[project]\nroot = "ws"\n[[agents]]\nid = "a"\nsteps = [{ final = "done" }]\n'))
    home = short_tmp / "h"
    up = _corral(home, "up", "--spec", str(spec), cwd=cwd)
    try:
        assert up.returncode == 0, up.stderr
        _run_completes(home, cwd, "t")
    finally:
        _down(home, cwd)
    assert not marker.exists()


def test_a_child_environment_carries_no_import_path() -> None:
    """PYTHONPATH reaches a corral child only as directories to find user modules in
    by file (merged with what its parent was given), never as an import path."""
    from corral.core.child_python import USER_PATH_ENV, python_argv, python_env, user_path

    env = python_env({"PYTHONPATH": "/a:/b", USER_PATH_ENV: "/c:/a", "PYTHONHOME": "/h", "X": "1"})
    assert env == {USER_PATH_ENV: "/a:/b:/c", "X": "1"}
    assert user_path({"PYTHONPATH": "/p", USER_PATH_ENV: "/c"}) == ["/p", "/c"]
    assert python_argv("-m", "corral")[1] == "-P"


# -- the red team's round (issue 48 A.1, tried as an outsider) --------------------------------

SIBLING_TOOLS = (
    "import os, sys\nsys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))\nimport helpers\nimport corral\n\n"
    "@corral.tool(effect='read', name='probe.greet')\n"
    "def greet(ctx: corral.ToolContext, name: str) -> str:\n    return helpers.greet(name)\n"
)
GREET_SPEC = (
    '[project]\nroot = "."\n[tools]\nmodules = ["./tools.py"]\n[[agents]]\nid = "a"\ntools = ["probe.*"]\n'
    'steps = [{ actions = [{ tool = "probe.greet", input = { name = "x" } }] }, { final = "done" }]\n'
)


def _edited_after_up_is_refused(home: Path, repo: Path, marker: Path, needle: str) -> None:
    again = _corral(home, "up", cwd=repo)  # the remembered spec, and its pins
    if again.returncode == 0:
        _down(home, repo)
    assert again.returncode != 0 and needle in again.stderr, again.stderr
    assert "Traceback" not in again.stderr
    assert not marker.exists(), f"edited user code ran:\n{marker.read_text()}"


def test_a_sibling_a_tools_module_imports_through_sys_path_is_pinned_too(short_tmp: Path) -> None:
    """The idiom `sys.path.insert(0, here); import helpers`: the helper is user code
    like the tools module that imports it, pinned at up; edited afterwards, refused."""
    marker = short_tmp / "imported-by"
    repo = short_tmp / "repo"
    repo.mkdir()
    (repo / "tools.py").write_text(SIBLING_TOOLS)
    (repo / "helpers.py").write_text("def greet(n):\n    return 'hi ' + n\n")
    (repo / "swarm.toml").write_text(_spec(GREET_SPEC))
    home = short_tmp / "h"
    up = _corral(home, "up", "--spec", "swarm.toml", cwd=repo)
    try:
        assert up.returncode == 0, up.stderr
        _run_completes(home, repo, "greet")
    finally:
        _down(home, repo)
    pins = json.loads((home / "user-code.json").read_text())["pins"]
    assert pins["helpers"][0] == str((repo / "helpers.py").resolve())
    (repo / "helpers.py").write_text(_planted(marker, "def greet(n):\n    return 'pwned ' + n\n"))
    _edited_after_up_is_refused(home, repo, marker, "helpers.py")


def test_a_dist_info_in_the_project_registers_no_entry_point(short_tmp: Path) -> None:
    """Entry points come from installed packages and PYTHONPATH's plugins only: a
    `*.dist-info` beside the spec makes `corral up` import nothing of the project."""
    marker = short_tmp / "imported-by"
    repo = short_tmp / "repo"
    info = repo / "evil-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[corral.tools]\nx = evilmod\n[corral.providers]\nevil = evilmod:P\n")
    (repo / "evilmod.py").write_text(_planted(marker))
    (repo / "swarm.toml").write_text(_spec(ONE_FINAL))
    home = short_tmp / "h"
    up = _corral(home, "up", "--spec", "swarm.toml", cwd=repo)
    try:
        assert up.returncode == 0, up.stderr
        _run_completes(home, repo, "t")
    finally:
        _down(home, repo)
    assert not marker.exists(), f"project code ran in a host process:\n{marker.read_text()}"


def test_an_installed_package_wins_over_a_planted_one_of_the_same_name(short_tmp: Path) -> None:
    """A dotted name that an installed package answers is that package: a project
    folder of the same name (a shadow) is never imported."""
    marker = short_tmp / "imported-by"
    repo = short_tmp / "repo"
    (repo / "mcp_server_time").mkdir(parents=True)
    (repo / "mcp_server_time" / "__init__.py").write_text(_planted(marker))
    (repo / "mcp_server_time" / "server.py").write_text(_planted(marker))
    installed = '[tools]\nmodules = ["mcp_server_time.server"]\n[[agents]]'
    (repo / "swarm.toml").write_text(_spec(ONE_FINAL.replace("[[agents]]", installed)))
    home = short_tmp / "h"
    up = _corral(home, "up", "--spec", "swarm.toml", cwd=repo)
    try:
        assert up.returncode == 0, up.stderr
    finally:
        _down(home, repo)
    assert not marker.exists(), f"the planted package ran:\n{marker.read_text()}"


def test_an_init_written_beside_the_spec_moves_nothing(short_tmp: Path) -> None:
    """A `__init__.py` the model writes into the spec's directory after up neither
    runs nor makes the pinned tools module 'lie in no pinned directory'."""
    marker = short_tmp / "imported-by"
    repo = short_tmp / "repo"
    repo.mkdir()
    (repo / "tools.py").write_text(SIBLING_TOOLS.replace("import helpers\n", "").replace("helpers.greet(name)", "name"))
    (repo / "swarm.toml").write_text(_spec(GREET_SPEC))
    home = short_tmp / "h"
    up = _corral(home, "up", "--spec", "swarm.toml", cwd=repo)
    assert up.returncode == 0, up.stderr
    _down(home, repo)
    (repo / "__init__.py").write_text(_planted(marker))
    for argv in (("up",), ("up", "--spec", "swarm.toml")):
        again = _corral(home, *argv, cwd=repo)
        assert again.returncode == 0, again.stderr
        try:
            _run_completes(home, repo, "greet")
        finally:
            _down(home, repo)
    assert not marker.exists(), f"the planted __init__.py ran:\n{marker.read_text()}"


def test_a_relative_pythonpath_means_the_directory_it_named(short_tmp: Path) -> None:
    """`PYTHONPATH=lib corral up` from the project: lib is the project's lib, in the
    supervisor as in the CLI (which work in different directories)."""
    repo = short_tmp / "repo"
    (repo / "lib").mkdir(parents=True)
    (repo / "lib" / "mytools.py").write_text(
        "import corral\n\n@corral.tool(effect='read', name='probe.greet')\n"
        "def greet(ctx: corral.ToolContext, name: str) -> str:\n    return name\n"
    )
    (repo / "swarm.toml").write_text(_spec(GREET_SPEC.replace('"./tools.py"', '"mytools"')))
    home = short_tmp / "h"
    up = _corral(home, "up", "--spec", "swarm.toml", cwd=repo, env={"PYTHONPATH": "lib"})
    try:
        assert up.returncode == 0, up.stderr
        _run_completes(home, repo, "greet")
    finally:
        _down(home, repo)


def test_a_python_m_mcp_server_imports_nothing_from_the_project(short_tmp: Path) -> None:
    """`python -m mcp_server_time` runs in the spec's directory by default: a planted
    module there (tzlocal, which the server imports) must not shadow the real one."""
    from tests.harness import running

    marker = short_tmp / "imported-by"
    (short_tmp / "ws").mkdir()
    (short_tmp / "tzlocal.py").write_text(_planted(marker))
    spec = '[project]\nroot = "ws"\n[[mcp_servers]]\nid = "time"\ncommand = ["python", "-m", "mcp_server_time"]\n'
    with running(short_tmp / "home", spec) as daemon:

        def ready(_: dict[str, object]) -> bool:
            return any(server["id"] == "time" and server["status"] == "ready"
                       for server in daemon.call("mcp.list")["servers"])

        daemon.wait_until(ready, timeout=60, what="mcp server time ready")
    assert not marker.exists(), f"project code ran in the MCP server:\n{marker.read_text()}"
