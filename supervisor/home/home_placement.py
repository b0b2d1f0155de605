"""Where a home may lie: never inside the project its agents work in, nor around it.

The home holds the ledger, the logs, and ``endpoint.json`` with the control token.
Inside the project it is one path away from every agent's file tools and commands
(and the sandbox and the file tools then have to recognise it by its place, which
``--home .`` defeats: the home *is* the workspace). Around the project, the agents'
workspace is a part of the home. ``corral up`` refuses both before creating anything.
It refuses a project around the Python environment corral runs from in the same
place (a ``.pth`` file an agent writes there runs in every later corral process).

One place inside the project is accepted: a ``.corral`` directory (the default home,
``./.corral``, when ``corral up`` runs in the project). That name is a control path at
any depth: the file tools refuse it and the sandbox hides it, by name, wherever it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from corral.sandbox.git_shapes import fold_name
from corral.supervisor.home.home_dir import HomeError
from corral.supervisor.spec.runtime_dirs import check_runtime_outside
from corral.supervisor.spec.spec_base import SpecError

if TYPE_CHECKING:
    from corral.supervisor.spec.swarm_spec import SwarmSpec

#: The file in which a home remembers the spec its last boot ran (supervisor/__main__.py).
SPEC_SOURCE = "spec.source"
#: The user code `corral up` pinned (actors/user_code_pins.py): a boot from the
#: remembered spec, and a read of it, enforce it rather than load what the files hold now.
USER_CODE_PINS = "user-code.json"
#: The control directory's name: hidden from agents by name, wherever it lies.
CONTROL_DIR = ".corral"


def project_root_of(spec: Path | None, home: Path) -> Path | None:
    """The project root agents of ``spec`` (default: the spec the home's last boot
    ran) work in, or None when nothing works in one (no agents, no stdio MCP server,
    no explicit root) or the spec cannot be read (``corral up`` reports that itself)."""
    import contextlib

    from corral.actors.user_code_pins import UserCodeRecord, enforcing
    from corral.core.errors import UserCodeError
    from corral.supervisor.spec.swarm_spec import SpecError, load_spec

    pinned: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if spec is None:
        try:
            recorded = (home / SPEC_SOURCE).read_text().strip()
        except OSError:
            return None
        if not recorded:
            return None
        spec = Path(recorded)
        with contextlib.suppress(OSError, ValueError, KeyError):
            pinned = enforcing(UserCodeRecord.from_json((home / USER_CODE_PINS).read_text()))
    try:
        with pinned:
            loaded = load_spec(spec)
    except (SpecError, UserCodeError):
        return None
    return project_root_in(loaded)


def project_root_in(loaded: SwarmSpec) -> Path | None:
    """The project root the agents of the loaded spec work in, or None when nothing
    works in one (no agents, no stdio MCP server, no explicit root)."""
    project = loaded.raw.get("project")
    explicit = isinstance(project, dict) and "root" in project
    if explicit or loaded.agents or any(server.command for server in loaded.mcp_servers):
        return loaded.project_root.resolve()
    return None


def check_placement(home: Path, project_root: Path | None) -> None:
    """Raise HomeError for a home inside ``project_root`` (but not in a ``.corral``
    directory of it), equal to it, or around it, and for a project root around the
    Python environment or the package corral runs from (spec/runtime_dirs.py).
    Paths are compared resolved."""
    if project_root is None:
        return
    try:
        check_runtime_outside(project_root)
    except SpecError as exc:
        raise HomeError(str(exc)) from None
    real_home = home.resolve()
    root = project_root.resolve()
    if real_home == root or root in real_home.parents:
        inside = real_home.relative_to(root).parts
        if any(fold_name(part) == CONTROL_DIR for part in inside):
            return
        where = "is" if real_home == root else "lies inside"
        raise HomeError(
            f"home {home} {where} the project {root}: its agents could read the control token and the ledger"
            f" there. Put the home outside the project (--home DIR or $CORRAL_HOME), or in {root}/{CONTROL_DIR}"
        )
    if real_home in root.parents:
        raise HomeError(
            f"the project {root} lies inside the home {home}: the home would hold the agents' workspace. Put the"
            " home outside the project (--home DIR or $CORRAL_HOME)"
        )
