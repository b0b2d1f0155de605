"""Loading user code named by ``module:attribute`` references (actor templates,
providers), with errors that name the reference, the module and the exception.

One loader for every kind of reference, so an actor template and a provider fail
the same way. Where the import happens is the caller's choice: the fork server may
preload a reference (``preload_references``), an actor imports it at start
otherwise; both go through ``load``.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import types
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.core.errors import UserCodeError

if TYPE_CHECKING:
    from corral.actors.tools.declare import UserTool

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
REFERENCE = re.compile(rf"^{_NAME}(\.{_NAME})*:{_NAME}(\.{_NAME})*$")


def is_reference(text: str) -> bool:
    """A ``module:attribute`` reference, as opposed to a built-in name."""
    return ":" in text


def check_syntax(reference: str) -> None:
    if not REFERENCE.match(reference):
        raise UserCodeError(
            f"{reference!r} is not a reference of the form 'package.module:Name' (dotted module, a colon, a name)"
        )


def load(reference: str) -> Any:
    """Import the module of ``reference`` and return the named attribute."""
    check_syntax(reference)
    module_name, _, qualname = reference.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        where = "" if exc.name == module_name else f" (while importing it: {exc})"
        raise UserCodeError(
            f"cannot import module {module_name!r} for {reference!r}: no module named {exc.name!r}{where};"
            " is it installed, or on PYTHONPATH / next to the spec?"
        ) from exc
    except Exception as exc:
        raise UserCodeError(
            f"importing module {module_name!r} for {reference!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    for part in qualname.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UserCodeError(f"module {module_name!r} has no attribute {qualname!r} (for {reference!r})") from None
    return target


def add_import_path(directory: Path) -> None:
    """Make modules next to a spec importable here and in every process started
    from here (the fork server and exec-launched actors inherit PYTHONPATH)."""
    entry = str(directory.resolve())
    if entry not in sys.path:
        sys.path.insert(0, entry)
    current = [part for part in os.environ.get("PYTHONPATH", "").split(os.pathsep) if part]
    if entry not in current:
        os.environ["PYTHONPATH"] = os.pathsep.join([entry, *current])


def preload_references(references: Iterable[str]) -> list[str]:
    """Import each reference once (the fork server calls this before forking, so
    actors fork with user code loaded). Returns the errors instead of raising: a
    template that fails to import must fail in its actor, where it counts against
    the restart intensity, not take the fork server down."""
    errors = []
    for reference in references:
        try:
            load(reference)
        except UserCodeError as exc:
            errors.append(str(exc))
    return errors


class import_path:
    """Temporarily put ``directory`` first on ``sys.path`` (spec checks import user
    code next to the spec without changing the importing process for good)."""

    def __init__(self, directory: Path) -> None:
        self.entry = str(directory.resolve())
        self.added = False

    def __enter__(self) -> None:
        if self.entry not in sys.path:
            sys.path.insert(0, self.entry)
            self.added = True

    def __exit__(self, *exc: object) -> None:
        if self.added and self.entry in sys.path:
            sys.path.remove(self.entry)


#: The environment variable carrying the tool modules to import in every process
#: (the supervisor sets it from the spec; the fork server and actors read it).
TOOL_MODULES_ENV = "CORRAL_TOOL_MODULES"


def import_tool_module(entry: str) -> types.ModuleType:
    """Import one ``[tools] modules`` entry: a dotted module name, or a ``.py`` file
    path (absolute by now). Raises UserCodeError naming it and the exception."""
    import hashlib
    import importlib.util

    try:
        if entry.endswith(".py"):
            path = Path(entry)
            module_name = "corral_user_tools_" + hashlib.sha256(str(path).encode()).hexdigest()[:16]
            loaded = sys.modules.get(module_name)
            if loaded is not None:
                return loaded
            spec = importlib.util.spec_from_file_location(module_name, path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[module_name]
                raise
            return module
        return importlib.import_module(entry)
    except Exception as exc:
        raise UserCodeError(f"tools module {entry!r} failed to import: {type(exc).__name__}: {exc}") from None


def tool_catalog(entries: Iterable[str], reserved: Collection[str] = ()) -> dict[str, UserTool]:
    """Import the tool modules ``entries`` and return the catalog of the user's tools
    found in them, by name (the one place it is built: the supervisor from its spec,
    the fork server and each actor from ``TOOL_MODULES_ENV``). Raises UserCodeError
    for a module that fails to import, ToolDeclarationError for a name declared twice
    or one of ``reserved`` (the spec passes the built-ins' names; an actor need not
    import every built-in tool to repeat a check its spec already passed)."""
    modules = [import_tool_module(entry) for entry in entries]
    if not modules:
        return {}  # no tools module: nothing to import, not even the declarations
    from corral.actors.tools.declare import user_tools_of

    return user_tools_of(modules, reserved)


def tool_entry_points() -> list[str]:
    """Tool modules that pip-installed packages register in the ``corral.tools`` group."""
    from importlib.metadata import entry_points

    return [point.value for point in entry_points(group="corral.tools")]


def import_tool_modules_from_env() -> dict[str, UserTool]:
    """In the fork server and every actor: the same tool modules as the supervisor,
    and the catalog of the user's tools in them (importing is a no-op for a module
    the fork server preloaded; finding the tools again is a walk of its names)."""
    import json

    return tool_catalog(str(entry) for entry in json.loads(os.environ.get(TOOL_MODULES_ENV) or "[]"))
