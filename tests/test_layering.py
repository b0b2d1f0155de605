"""Which layer may import which, checked on the source (ast).

The run layer (supervisor/runs/) is what every feature builds on; a feature
reaches it through its ``RunFeature`` object (supervisor/runs/run_feature.py),
never the other way round, so no feature folder is imported by it, not even
under ``TYPE_CHECKING`` or inside a function. The fork server (sandbox/) forks
actors without knowing what an actor is: the actors' side hands it what to
preload and what to run (actors/fork_host.py).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: supervisor/ folders that are features built on the run layer (not what it stands on:
#: errors, params, ledger, spec, tree, home).
FEATURE_FOLDERS = (
    "bridge",
    "cluster",
    "context",
    "intent",
    "interactive",
    "longtask",
    "mcp",
    "models",
    "project",
    "sessions",
    "swarm",
    "telemetry",
)


def _imports(path: Path, package: str | None = None) -> Iterator[tuple[int, str]]:
    """Every module ``path`` imports, anywhere in it, as a dotted name (``from a
    import b`` yields ``a.b`` too: ``b`` may be a module). A relative import is
    refused, or resolved against ``package`` (the one ``path`` is in) when given."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 or package, f"{path}:{node.lineno}: corral imports absolutely"
            module = node.module or ""
            if node.level:
                assert package is not None
                base = package.rsplit(".", node.level - 1)[0]
                module = f"{base}.{module}" if module else base
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _feature_imports(root: Path) -> list[str]:
    """Each import of a feature folder in the run layer under ``root`` (its
    sub-folders too), as ``path:line: module``."""
    features = [f"corral.supervisor.{folder}" for folder in FEATURE_FOLDERS]
    return sorted(
        {
            f"{path.relative_to(root)}:{line}: {name}"
            for path in sorted((root / "supervisor" / "runs").rglob("*.py"))
            for line, name in _imports(path)
            if any(_under(name, feature) for feature in features)
        }
    )


def test_the_run_layer_imports_no_feature_folder() -> None:
    found = _feature_imports(ROOT)
    assert not found, "the run layer imports a feature folder:\n" + "\n".join(found)


def test_the_check_finds_a_feature_import_however_it_is_written(tmp_path: Path) -> None:
    """What the run layer once held (approval_view.py read mcp/'s catalog,
    run_control.py longtask/'s goal store) is found, in a function, under
    ``TYPE_CHECKING`` or in a sub-folder alike; what it stands on is not."""
    runs = tmp_path / "supervisor" / "runs"
    (runs / "deeper").mkdir(parents=True)
    (runs / "approval_view.py").write_text(
        "from corral.supervisor.mcp.mcp_catalog import pinned\nfrom corral.supervisor.ledger.port import Ledger\n"
    )
    (runs / "run_control.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    import corral.supervisor.models\n"
        "def goal():\n"
        "    from corral.supervisor import longtask\n"
    )
    (runs / "deeper" / "x.py").write_text("from corral.supervisor.swarm.claim_store import claim\n")
    assert _feature_imports(tmp_path) == [
        "supervisor/runs/approval_view.py:1: corral.supervisor.mcp.mcp_catalog",
        "supervisor/runs/approval_view.py:1: corral.supervisor.mcp.mcp_catalog.pinned",
        "supervisor/runs/deeper/x.py:1: corral.supervisor.swarm.claim_store",
        "supervisor/runs/deeper/x.py:1: corral.supervisor.swarm.claim_store.claim",
        "supervisor/runs/run_control.py:3: corral.supervisor.models",
        "supervisor/runs/run_control.py:5: corral.supervisor.longtask",
    ]


def test_the_feature_folders_listed_are_the_supervisors_own() -> None:
    # A folder renamed or removed would make the check above pass for nothing.
    missing = [folder for folder in FEATURE_FOLDERS if not (ROOT / "supervisor" / folder / "__init__.py").is_file()]
    assert not missing


def test_the_fork_server_imports_no_actor_module() -> None:
    path = ROOT / "sandbox" / "forkserver.py"
    found = [f"{line}: {name}" for line, name in _imports(path) if _under(name, "corral.actors")]
    assert not found, "sandbox/forkserver.py imports the actors' side:\n" + "\n".join(found)


#: The top-level folders the package ``corral`` maps (pyproject's package-dir);
#: the rest of ``corral.*`` is under corral/.
MAPPED = ("actors", "mailbox", "sandbox", "supervisor")


def _source(module: str) -> Path | None:
    """The file of a corral module, or None (not corral's, or a name imported from one)."""
    parts = module.split(".")
    if parts[0] != "corral" or len(parts) < 2:
        return None
    base = ROOT.joinpath(*parts[1:]) if parts[1] in MAPPED else ROOT.joinpath("corral", *parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _closure(module: str) -> dict[str, str]:
    """Every corral module ``module`` imports, directly or through another, each
    with the module that imports it first (a breadth-first walk of the source)."""
    seen = {module: ""}
    queue = [module]
    while queue:
        current = queue.pop(0)
        path = _source(current)
        if path is None:
            continue
        package = current if path.name == "__init__.py" else current.rpartition(".")[0]
        for _, name in _imports(path, package):
            if name not in seen and _source(name) is not None:
                seen[name] = current
                queue.append(name)
    return seen


def test_the_fork_server_reaches_no_actor_module_through_another() -> None:
    """Not through mailbox/, core/ or sandbox/ either: what the fork server imports,
    and all those import, holds nothing of actors/ (actors/runtime.py least of all)."""
    closure = _closure("corral.sandbox.forkserver")
    assert "corral.mailbox.actor_config" in closure  # the walk follows imports
    found = [f"{name} (imported by {by})" for name, by in closure.items() if _under(name, "corral.actors")]
    assert not found, "the fork server reaches the actors' side:\n" + "\n".join(found[:10])


def test_the_walk_finds_an_actor_module_reached_through_another() -> None:
    # corral.actors.agent imports actors/runtime.py: the walk must see it.
    assert "corral.actors.runtime" in _closure("corral.actors.agent")


def test_the_features_order_is_written_in_one_place() -> None:
    """Only the daemon lists a supervisor's features (``RunFeatures.install``): a
    service that added itself would run in an order nobody wrote down."""
    found = []
    for folder in ("supervisor", "actors", "mailbox", "sandbox", "corral"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "install"
                    and isinstance(node.func.value, ast.Attribute)
                    and node.func.value.attr == "features"
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found and all(where.startswith("supervisor/daemon.py:") for where in found), found
    assert len(found) == 1, found


def test_no_service_adds_itself_to_a_supervisor_table() -> None:
    """A service's part in runs and in the supervisor's life is one object each
    (``RunFeature``, ``ServicePart``) in the daemon's two lists: nothing appends
    to, or sets a key of, a table on the supervisor but its control methods'
    names (``control_methods``; its actor methods are typed families, issue 50 §1)."""
    allowed = {"control_methods"}
    found = []
    for path in sorted((ROOT / "supervisor").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            table = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in {"append", "extend", "insert", "update", "setdefault"}:
                    table = node.func.value
            elif isinstance(node, ast.Assign):
                table = next((t.value for t in node.targets if isinstance(t, ast.Subscript)), None)
            if (
                isinstance(table, ast.Attribute)
                and isinstance(table.value, ast.Name)
                and table.value.id == "sup"
                and table.attr not in allowed
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: sup.{table.attr}")
            if (
                isinstance(table, ast.Attribute)
                and isinstance(table.value, ast.Attribute)
                and table.value.attr == "hooks"
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: ….hooks.{table.attr}")
    assert not found, "a service registers itself in a table:\n" + "\n".join(found)


def test_the_features_come_off_the_ledger(tmp_path: Path) -> None:
    """The run layer's hooks are handed to whoever calls them, never looked up on
    the ``Ledger`` (issue 50 §3): no source, test or bench reads or sets
    ``ledger.features`` (or ``self.ledger.features``), and a ``Ledger`` has none."""
    from corral.supervisor.ledger.ledger_sqlite import SqliteLedger

    found = []
    for folder in ("supervisor", "actors", "mailbox", "sandbox", "corral", "tests", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr == "features"
                    and (
                        (isinstance(node.value, ast.Name) and node.value.id == "ledger")
                        or (isinstance(node.value, ast.Attribute) and node.value.attr == "ledger")
                    )
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, "reaches the features through the ledger:\n" + "\n".join(found)
    ledger = SqliteLedger(tmp_path / "ledger.db")
    try:
        assert not hasattr(ledger, "features"), "the Ledger still carries the supervisor's features"
    finally:
        ledger.close()
