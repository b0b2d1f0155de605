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
import types
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.core.errors import UserCodeError

if TYPE_CHECKING:
    from corral.actors.tools.declare import UserTool
    from corral.actors.user_code_pins import UserCodeFinder

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


def _finder() -> UserCodeFinder:
    """This process's user-code finder: the one installed (enforcing in the fork
    server and actors), else a new one that records (``corral up``, a spec check)."""
    from corral.actors.user_code_pins import install

    return install(recording=True)


def add_search_roots(spec_dir: Path) -> None:
    """Where a spec's dotted user modules are found, by file: the spec's directory,
    then each ``PYTHONPATH`` directory given to ``corral up`` (their pins record
    what ran; none of them goes on ``sys.path``)."""
    from corral.actors.user_code_pins import pythonpath_roots

    _finder().add_roots([spec_dir])
    _finder().add_roots(pythonpath_roots(), plugins=True)


def import_user_module(module_name: str) -> types.ModuleType:
    """User module ``module_name``: the file of that name in a root pinned at ``corral up``
    (the spec's directory, then ``PYTHONPATH``'s), else an installed module. Never a
    lookup through the project on ``sys.path`` (actors/user_code_pins.py says why)."""
    return importlib.import_module(_finder().private_name(module_name) or module_name)


def load(reference: str) -> Any:
    """Import the module of ``reference`` and return the named attribute."""
    check_syntax(reference)
    module_name, _, qualname = reference.partition(":")
    try:
        target: Any = import_user_module(module_name)
    except UserCodeError as exc:
        raise UserCodeError(f"cannot load {reference!r}: {exc}") from exc
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[2] if (exc.name or "").startswith("corral_user_") else exc.name
        where = "" if missing == module_name else f" (while importing it: {exc})"
        raise UserCodeError(
            f"cannot import module {module_name!r} for {reference!r}: no module named {missing!r}{where};"
            " is it installed, next to the spec, or in a PYTHONPATH directory given to `corral up`?"
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


def pin_reference(reference: str) -> None:
    """Load ``reference`` now, while ``corral up`` records what user code it runs, so
    that its actor may load it later. A failure is its actor's to report (there it
    counts against the restart intensity), not the spec's."""
    try:
        load(reference)
    except UserCodeError:
        pass


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


#: The environment variable carrying the tool modules to import in every process
#: (the supervisor sets it from the spec; the fork server and actors read it): the
#: names they import by, private names for user files (user_code_pins.py).
TOOL_MODULES_ENV = "CORRAL_TOOL_MODULES"


def tool_module_name(entry: str, base: Path | None = None) -> str:
    """The name one ``[tools] modules`` entry is imported by: a ``.py`` file path
    (absolute, or relative to ``base``) or a dotted name, resolved in the pinned
    roots first. Raises UserCodeError for a file that lies in no pinned root."""
    if entry.endswith(".py"):
        return _finder().file_module(Path(entry) if base is None else base / entry)
    return _finder().private_name(entry) or entry


def import_tool_module(entry: str) -> types.ModuleType:
    """Import one tool module by the name ``tool_module_name`` gave it. Raises
    UserCodeError naming it and the exception."""
    try:
        return importlib.import_module(entry)
    except UserCodeError as exc:
        raise UserCodeError(f"tools module {_public(entry)!r}: {exc}") from None
    except Exception as exc:
        raise UserCodeError(f"tools module {_public(entry)!r} failed to import: {type(exc).__name__}: {exc}") from None


def _public(name: str) -> str:
    return name.partition(".")[2] if name.startswith("corral_user_") else name


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


def entry_points_of(group: str) -> dict[str, str]:
    """Entry points of ``group``, name -> ``module:attribute``: installed packages',
    then those of distributions in ``PYTHONPATH``'s roots (a plugin package given
    there; its modules load by file like any user module, through ``load``). A
    ``*.dist-info`` in the spec's directory (the project) registers nothing."""
    from importlib.metadata import distributions, entry_points

    found = {point.name: point.value for point in entry_points(group=group)}
    roots = list(_finder().record.plugin_roots)  # PYTHONPATH's, never the spec's directory
    for distribution in distributions(path=roots) if roots else ():
        for point in distribution.entry_points.select(group=group):
            found.setdefault(point.name, point.value)
    return found


def tool_entry_points() -> list[str]:
    """Tool modules that plugin packages register in the ``corral.tools`` group."""
    return [value.partition(":")[0] for value in entry_points_of("corral.tools").values()]


def import_tool_modules_from_env() -> dict[str, UserTool]:
    """In the fork server and every actor: the same tool modules as the supervisor,
    and the catalog of the user's tools in them (importing is a no-op for a module
    the fork server preloaded; finding the tools again is a walk of its names)."""
    import json

    from corral.actors.user_code_pins import install_from_env

    install_from_env()
    return tool_catalog(str(entry) for entry in json.loads(os.environ.get(TOOL_MODULES_ENV) or "[]"))
