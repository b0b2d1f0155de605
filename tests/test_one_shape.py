"""The supervisor's shape, checked on its source: no hidden plug-in order.

Features once registered themselves at import or boot into module-global tables,
replaced other modules' functions and wrapped each other's handlers, so what a
method did depended on an install order nobody could see. These checks read the
source (ast) and fail on any of the three coming back.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTATORS = {"append", "extend", "insert", "update", "setdefault", "add", "pop", "popitem", "remove", "clear",
            "discard", "__setitem__"}


def _modules(*folders: str) -> Iterator[tuple[Path, ast.Module]]:
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path, ast.parse(path.read_text(), str(path))


def _module_level_containers(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        containers = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
        is_container = isinstance(value, containers) or (
            isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and value.func.id in {"list", "dict", "set", "defaultdict", "OrderedDict"})
        if is_container:
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _mutations(tree: ast.Module, names: set[str]) -> Iterator[tuple[int, str]]:
    """Mutations inside functions: a table built by statements at import (the schema's
    migrations) is fixed once imported; one filled by a call later is a registry."""
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for node in (inner for function in functions for inner in ast.walk(function)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id in names and node.func.attr in MUTATORS:
                yield node.lineno, f"{owner.id}.{node.func.attr}(...)"
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for target in targets:
            if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and target.value.id in names:
                yield node.lineno, f"{target.value.id}[...] ="


def _imported_modules(tree: ast.Module) -> set[str]:
    """Local names bound to modules: ``import x.y as z``, ``from corral.x import module``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("corral"):
            for alias in node.names:
                local = alias.asname or alias.name
                if local.islower():  # a module (or function) name; classes and constants are not
                    names.add(local)
    return names


def test_no_module_level_table_in_the_supervisor_is_mutated() -> None:
    found = []
    for path, tree in _modules("supervisor"):
        for line, what in _mutations(tree, _module_level_containers(tree)):
            found.append(f"{path.relative_to(ROOT)}:{line}: {what}")
    assert found == []


def _module_assignments(tree: ast.Module) -> Iterator[tuple[int, str]]:
    modules = _imported_modules(tree)
    for node in ast.walk(tree):
        for target in node.targets if isinstance(node, ast.Assign) else []:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id in modules:
                yield node.lineno, f"{target.value.id}.{target.attr} ="


def test_nothing_assigns_to_another_modules_attribute() -> None:
    found = []
    for path, tree in _modules("supervisor", "actors", "mailbox", "sandbox", "corral"):
        found.extend(f"{path.relative_to(ROOT)}:{line}: {what}" for line, what in _module_assignments(tree))
    assert found == []


def test_no_service_is_looked_up_by_name_or_loaded_by_string() -> None:
    found = []
    for folder in ("supervisor", "actors"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if 'import_optional("corral.' in line or "services[" in line:
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []


def test_the_checks_see_what_they_look_for() -> None:
    """The scans above on a sample that breaks each rule: they are not vacuous."""
    sample = ast.parse(
        "from corral.supervisor.runs import run_store\n"
        "HOOKS = []\nTABLE: dict[str, int] = {}\n"
        "def install() -> None:\n"
        "    HOOKS.append(1)\n    TABLE['x'] = 1\n    run_store.create_run = None\n"
    )
    assert sorted(what for _, what in _mutations(sample, _module_level_containers(sample))) == [
        "HOOKS.append(...)", "TABLE[...] ="]
    assert [what for _, what in _module_assignments(sample)] == ["run_store.create_run ="]
