"""A project root never contains the code corral itself runs from.

Agents write anywhere under the project root. If the Python environment corral runs
from lies there (uv's default layout, ``project/.venv``), one ``fs.write`` of
``.venv/lib/python3.X/site-packages/zz.pth``, or a sandboxed command, makes every later
corral process (a fork server's replacement, the CLI, the next supervisor) run that
code on the host: ``python -P`` keeps the working directory off the import path, but
``site`` still executes every ``.pth`` file. corral's own package directories (an
editable install maps each top-level folder: pyproject's ``package-dir``) are the same
hole by another name. So a root that contains any of them is refused: by ``corral up``
before anything is created (home/home_placement.py), and by the supervisor when it
boots (a ``Client.start``, a restart from the remembered spec). It is a fact about the
interpreter, not the spec file, so parsing a spec does not check it.

The check is pure (``check_runtime_outside`` takes the directories); ``runtime_dirs``
gathers this interpreter's. Both sides are resolved: symlinks never decide.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path

from corral.supervisor.spec.spec_base import SpecError

#: corral's package and the subpackages pyproject's ``package-dir`` maps to folders of
#: their own (tests/test_project_root_env.py checks this against pyproject.toml).
_PACKAGES = ("corral", "corral.actors", "corral.mailbox", "corral.sandbox", "corral.supervisor")


def runtime_dirs() -> list[tuple[str, Path]]:
    """The directories this interpreter runs corral's code from, each with what it is,
    resolved: the environment (``sys.prefix``, ``sys.exec_prefix``, and the base
    installation a venv's standard library comes from) and corral's package folders."""
    named = [
        ("sys.prefix", sys.prefix),
        ("sys.exec_prefix", sys.exec_prefix),
        ("sys.base_prefix", sys.base_prefix),
        ("sys.base_exec_prefix", sys.base_exec_prefix),
    ]
    dirs = [(f"the Python environment corral runs from ({what})", Path(path).resolve()) for what, path in named]
    for name in _PACKAGES:
        # Found, not imported: a subpackage's __init__ need not run for its folder to be known.
        spec = importlib.util.find_spec(name)
        for folder in (spec.submodule_search_locations or []) if spec is not None else []:
            dirs.append((f"corral's own package directory ({name})", Path(folder).resolve()))
    return dirs


def check_runtime_outside(root: Path | None, dirs: Iterable[tuple[str, Path]] | None = None) -> None:
    """Raise SpecError when ``root`` is, or contains, one of ``dirs`` (default:
    ``runtime_dirs()``), naming the first such directory and what to do. No root
    (nothing works in a project) passes."""
    if root is None:
        return
    real = root.resolve()
    for what, path in runtime_dirs() if dirs is None else dirs:
        inside = path.resolve()
        if inside == real or real in inside.parents:
            raise SpecError(
                f"project.root: {real} contains {what} {inside}: an agent's write there (a .pth file, a module)"
                " would run as corral's own code on the host. Put the Python environment outside the project"
                " (with uv: UV_PROJECT_ENVIRONMENT=DIR outside it), or run corral from an environment outside it"
            )
