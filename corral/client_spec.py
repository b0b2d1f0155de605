"""A spec and tools given as Python objects to ``Client.start``: a dict, a parsed
``SwarmSpec`` or a path, and functions or modules from the caller's code. The
supervisor is another process, so a tool travels by name (``module`` or
``module:function``) and the spec as a TOML file in the home that it reads (and
reads again when it restarts on this home).
"""

from __future__ import annotations

import ast
import copy
import os
import sys
import tomllib
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import tomli_w

from corral.client_start import SupervisorStartError
from corral.core.errors import UserCodeError
from corral.supervisor.home import home_dir as homes
from corral.supervisor.spec.swarm_spec import SpecError, SwarmSpec, parse_spec

#: A spec as ``Client.start`` takes it: a file, the TOML as a dict, or a parsed spec.
SpecSource: TypeAlias = "str | os.PathLike[str] | Mapping[str, Any] | SwarmSpec"
#: A tool as ``Client.start`` takes it: an ``@corral.tool`` function, or a module of them.
ToolSource: TypeAlias = "Callable[..., Any] | types.ModuleType"


#: Where ``Client.start`` writes a spec given as a dict or with tools: the supervisor
#: reads a spec file (and reads it again when it restarts on this home).
CLIENT_SPEC = "client-spec.toml"


@dataclass(frozen=True)
class StartSpec:
    """What the supervisor is started with: the spec file, and the directories its
    environment's PYTHONPATH gains so the caller's tool modules import there."""

    path: Path | None
    import_roots: tuple[str, ...] = ()
    #: The spec was parsed already (``start_supervisor`` need not parse it again).
    checked: bool = False

    def environment(self) -> dict[str, str] | None:
        """The supervisor's environment (None: this process's, unchanged)."""
        if not self.import_roots:
            return None
        env = dict(os.environ)
        current = [part for part in env.get("PYTHONPATH", "").split(os.pathsep) if part]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*self.import_roots, *current]))
        return env


def start_spec(home: Path, spec: SpecSource | None, tools: Sequence[ToolSource] = ()) -> StartSpec:
    """The spec file for ``home``: a path as it is; a dict or a ``SwarmSpec`` (or a path
    with ``tools``) written to ``CLIENT_SPEC`` in the home, its relative paths made
    absolute first (a dict's are relative to the current directory, a parsed spec's to
    its file), and ``tools`` added to its ``[tools] modules``: the one way tool modules
    reach the supervisor, which is another process and imports them by name."""
    entries, roots = tool_entries(tools)
    if spec is None and not entries:
        return StartSpec(None)
    if isinstance(spec, (str, os.PathLike)) and not entries:
        return StartSpec(Path(spec))
    data, base = _spec_data(spec)
    _absolute_paths(data, base)
    roots = [*roots, *_output_classes(data)]
    if entries:
        table = data.setdefault("tools", {})
        if not isinstance(table, dict):
            raise SpecError("tools: must be a table (with `modules`)")
        listed = table.get("modules", [])
        if not isinstance(listed, list):
            raise SpecError("tools.modules: must be a list of module names or .py files")
        table["modules"] = list(dict.fromkeys([*listed, *entries]))
    path = home / CLIENT_SPEC
    text = toml_text(data)
    parse_spec(tomllib.loads(text), str(path))  # before the home: a bad spec leaves nothing behind
    homes.ensure_home(home)
    if homes.is_locked(home):  # its supervisor may read its spec file again: leave it alone
        raise SupervisorStartError(f"a supervisor is already running on {home} (`corral status`)", busy=True)
    path.write_text(text)
    path.chmod(0o600)
    # Modules next to the spec (user providers, templates) import from its directory.
    return StartSpec(path, tuple(dict.fromkeys([*roots, str(base)])), checked=True)


def _spec_data(spec: SpecSource | None) -> tuple[dict[str, Any], Path]:
    """The spec's TOML as a dict (a copy) and the directory its relative paths mean."""
    if spec is None:
        return {}, Path.cwd()
    if isinstance(spec, SwarmSpec):
        base = Path(spec.source).parent if spec.source != "<embedded>" else Path.cwd()
        return copy.deepcopy(dict(spec.raw)), base
    if isinstance(spec, Mapping):
        return copy.deepcopy(dict(spec)), Path.cwd()
    path = Path(spec).absolute()
    try:
        return tomllib.loads(path.read_text()), path.parent
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SpecError(f"{path}: {exc}") from None


def _absolute_paths(data: dict[str, Any], base: Path) -> None:
    """Make the spec's file paths absolute against ``base`` (by the spec's one rule,
    ``spec_path``), since the file is read from the home: the project root, the
    effects file, ``.py`` tool modules, scripts and model files."""
    from corral.supervisor.spec.spec_base import spec_path

    def fix(table: Any, key: str, default: str | None = None, only: Callable[[str], bool] = bool) -> None:
        if not isinstance(table, dict):
            return
        value = table.get(key, default)
        if isinstance(value, str) and only(value):
            table[key] = str(spec_path(base, value))

    fix(data.setdefault("project", {}), "root", ".")
    fix(data.get("chaos"), "effects_file")
    tools = data.get("tools")
    if isinstance(tools, dict) and isinstance(tools.get("modules"), list):
        tools["modules"] = [
            str(spec_path(base, entry)) if isinstance(entry, str) and entry.endswith(".py") else entry
            for entry in tools["modules"]
        ]
    for kind in ("agents", "templates"):
        for table in data.get(kind) or ():
            fix(table, "script")
            fix(table, "instructions_file")
            fix(table.get("local") if isinstance(table, dict) else None, "model", only=_is_file)
    for table in data.get("models") or ():
        fix(table, "path", only=_is_file)
    # An MCP server's program is a bare name found on PATH and its cwd an absolute
    # directory (seed 004 V1.22): neither is a spec path, so neither is rewritten.


def _output_classes(data: dict[str, Any]) -> list[str]:
    """An ``output`` given as a pydantic class (``output=Forecast``) becomes the
    ``module:Class`` the supervisor and the agents load it by (another process:
    they import it by name, as a tool); the directories their PYTHONPATH needs."""
    roots: list[str] = []
    for kind in ("agents", "templates"):
        for table in data.get(kind) or ():
            value = table.get("output") if isinstance(table, dict) else None
            if not isinstance(value, type):
                continue
            what = f"output class {value.__qualname__!r}"
            module = sys.modules.get(value.__module__)
            if "<" in value.__qualname__ or module is None:
                raise ToolSourceError(f"{what}: define it at the top level of a module, which the supervisor"
                                      " (another process) imports by name")
            name, root = _importable(module, what)
            table["output"] = f"{name}:{value.__qualname__}"
            if root is not None:
                roots.append(root)
    return roots


def _is_file(value: str) -> bool:
    """A model named by a path (a ``.gguf`` file), not a packaged model's name."""
    return value.endswith(".gguf")


def tool_entries(tools: Sequence[ToolSource]) -> tuple[list[str], list[str]]:
    """``[tools] modules`` entries for ``Client.start(tools=...)`` (functions declared
    with ``@corral.tool``, or modules holding some) and the import roots they need.

    The supervisor and the agents are other processes: each imports a tool's module
    by name, so a function must be reachable as ``module.qualname``; a lambda, a
    closure, or a function of a script that cannot be imported again is refused here,
    with what to do instead."""
    from corral.actors.tools.declare import declared_name

    entries: list[str] = []
    roots: list[str] = []
    for item in tools:
        if isinstance(item, types.ModuleType):
            module, what = item, f"module {item.__name__!r}"
            if not any(declared_name(value) for value in vars(item).values()):
                raise ToolSourceError(f"{what} has no @corral.tool function")
        elif callable(item):
            module, what = _function_module(item)
        else:
            raise ToolSourceError(f"tools: {item!r} is neither a function nor a module")
        name, root = _importable(module, what)
        entries.append(name)
        if root is not None:
            roots.append(root)
    return list(dict.fromkeys(entries)), list(dict.fromkeys(roots))


class ToolSourceError(UserCodeError):
    """A ``tools=`` entry the supervisor could not import (the message says why)."""


def _function_module(func: Callable[..., Any]) -> tuple[types.ModuleType, str]:
    from corral.actors.tools.declare import declared_name

    qualname = str(getattr(func, "__qualname__", repr(func)))
    what = f"tool function {qualname!r}"
    if "<" in qualname:  # <lambda>, <locals>
        raise ToolSourceError(
            f"{what}: a lambda or a function defined inside another function cannot be imported by name, and"
            " the supervisor is another process that imports each tool by name; define it at the top level of"
            " a module"
        )
    if declared_name(func) is None:
        raise ToolSourceError(f"{what} is not declared as a tool: decorate it with @corral.tool")
    module = sys.modules.get(str(getattr(func, "__module__", "")))
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part, None)
    if module is None or target is not func:
        raise ToolSourceError(
            f"{what} is not reachable as {getattr(func, '__module__', '?')}.{qualname}, and the supervisor is"
            " another process that imports each tool by name; define it at the top level of a module"
        )
    return module, what


def _importable(module: types.ModuleType, what: str) -> tuple[str, str | None]:
    """The name the supervisor imports ``module`` by, and the directory (if any) its
    PYTHONPATH needs for that. The script being run (``__main__``) qualifies when it
    can be imported again without running: under ``python -m``, or a file whose
    top-level work sits under ``if __name__ == "__main__":``."""
    name = module.__name__
    file = getattr(module, "__file__", None)
    if name == "__main__":
        module_spec = getattr(module, "__spec__", None)
        spec_name = getattr(module_spec, "name", None)
        if isinstance(spec_name, str) and spec_name and file:  # python -m package.module
            return spec_name, _import_root(spec_name, Path(file))
        why = _main_refusal(file)
        if why:
            raise ToolSourceError(
                f"{what} is defined in the script being run (__main__) and {why}; the supervisor is another"
                " process that imports each tool by module name: move the tool into a module and import it"
                " from there, or guard the script's work with `if __name__ == \"__main__\":`"
            )
        assert file is not None  # _main_refusal says why otherwise
        return Path(file).stem, str(Path(file).resolve().parent)
    return name, _import_root(name, Path(file)) if file else None


def _main_refusal(file: str | None) -> str:
    """Why the running script cannot be imported again by name ('' if it can)."""
    if not file or not file.endswith(".py"):
        return "has no .py file (an interactive session or `python -c`)"
    if not Path(file).stem.isidentifier():
        return f"its file name {Path(file).name!r} is not a module name"
    try:
        tree = ast.parse(Path(file).read_text())
    except (OSError, SyntaxError, ValueError) as exc:
        return f"its file cannot be read ({exc})"
    for node in tree.body:
        test = node.test if isinstance(node, ast.If) else None
        if (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
                and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)):
            return ""
    return "importing it again would run it (it has no `if __name__ == \"__main__\":` guard)"


def _import_root(name: str, file: Path) -> str | None:
    """The directory ``name`` imports from (None: an installed module, already on the
    supervisor's path)."""
    depth = name.count(".") + (1 if file.stem == "__init__" else 0)
    root = file.resolve().parents[depth]
    installed = {Path(path).resolve() for path in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    if any(prefix == root or prefix in root.parents for prefix in installed):
        return None
    return str(root)


def toml_text(data: Mapping[str, Any]) -> str:
    """``data`` as TOML (tomli-w writes it; the reader takes any TOML). A value a
    spec cannot hold is refused by where it is, before the writer sees it."""
    return tomli_w.dumps(_spec_value(dict(data), "spec"))


def _spec_value(value: Any, where: str) -> Any:
    """``value`` with paths as strings; anything but strings, numbers, booleans,
    lists and tables is a SpecError naming its place (TOML has no null)."""
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                raise SpecError(f"{where}: key {key!r} is not a string")
        return {key: _spec_value(item, key if where == "spec" else f"{where}.{key}") for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_spec_value(item, f"{where}[{index}]") for index, item in enumerate(value)]
    raise SpecError(f"{where}: a {type(value).__name__} cannot be a spec value (strings, numbers, booleans,"
                    " lists and tables; leave a key out rather than set it to None)")
