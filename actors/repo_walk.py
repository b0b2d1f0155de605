"""One bounded walk of a workspace for its start-up context (seed 004 V1.1 §1):
the top-level tree, where the AGENTS.md files and the manifests are, the language
mix by file extension, entry-point candidates, and the stat of every directory
walked (so a cache can tell, with stats only, that nothing was added or removed).

What is never entered or listed: symlinks (a link may lead out of the workspace),
control directories in any spelling (``.git``, ``.corral``), corral's home when it
lies inside the workspace, dependency/build/cache directories, and secret files
(the file tools' rules: ``.env*``, keys, credentials; sandbox/control_paths.py).
The walk is sorted, so the same tree gives the same result.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from corral.sandbox.control_paths import is_control_name, is_secret_path

#: The seed's budgets: entries looked at, directories entered, depth.
MAX_ENTRIES = 10_000
MAX_DIRECTORIES = 2_000
MAX_DEPTH = 12
#: What the summary lists of the top level, the languages and the entry candidates.
MAX_TOP = 60
MAX_LANGUAGES = 12
MAX_ENTRY_CANDIDATES = 20
MAX_AGENTS_FILES = 20
MAX_MANIFESTS = 12
#: Directories that hold dependencies, builds or caches, not the project's own files.
SKIP_DIRS = frozenset({
    "node_modules", ".venv", "venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".tox",
    "dist", "build", "target", ".next", ".cache", ".idea", ".vscode", ".gradle",
})
MANIFEST_NAMES = ("pyproject.toml", "package.json", "Cargo.toml", "go.mod")
ENTRY_NAMES = frozenset({
    "main.py", "__main__.py", "app.py", "manage.py", "cli.py", "server.py", "wsgi.py", "asgi.py",
    "index.js", "index.ts", "main.js", "main.ts", "server.js", "index.html", "main.go", "main.rs", "lib.rs",
    "Makefile", "justfile", "Dockerfile",
})
#: Manifests and entry candidates deeper than this are not listed (a monorepo's packages are).
MAX_LISTED_DEPTH = 2

#: (directory relative to the workspace, st_mtime_ns, st_ino): what a cache compares.
DirKey = tuple[str, int, int]


@dataclass(frozen=True)
class Walk:
    top: tuple[str, ...] = ()
    top_truncated: bool = False
    files: int = 0
    directories: int = 0
    #: The walk stopped at a budget: counts and lists are partial.
    truncated: bool = False
    #: Directories (relative, ``.`` for the root) holding a regular AGENTS.md, sorted.
    agents_dirs: tuple[str, ...] = ()
    manifests: tuple[str, ...] = ()
    languages: tuple[tuple[str, int], ...] = ()
    entries: tuple[str, ...] = ()
    keys: tuple[DirKey, ...] = ()


def dir_key(root: Path, relative: str) -> DirKey | None:
    try:
        info = os.lstat(root / relative)
    except OSError:
        return None
    return (relative, info.st_mtime_ns, info.st_ino)


def _inside_home(path: Path, homes: tuple[Path, ...]) -> bool:
    return any(path == home or path.is_relative_to(home) for home in homes)


def walk(root: Path, homes: tuple[Path, ...] = ()) -> Walk:
    """The bounded walk of ``root`` (resolved), skipping ``homes`` (resolved) inside it."""
    homes = tuple(home.resolve() for home in homes)
    top: list[str] = []
    agents: list[str] = []
    manifests: list[str] = []
    entries: list[str] = []
    languages: Counter[str] = Counter()
    keys: list[DirKey] = []
    files = directories = seen = 0
    truncated = False
    pending: list[tuple[str, int]] = [(".", 0)]
    while pending:
        relative, depth = pending.pop()
        key = dir_key(root, relative)
        if key is None:
            continue
        keys.append(key)
        here = root if relative == "." else root / relative
        try:
            with os.scandir(here) as listing:
                names = sorted((entry.name, entry) for entry in listing)
        except OSError:
            continue
        children: list[tuple[str, int]] = []
        for name, entry in names:
            seen += 1
            if seen > MAX_ENTRIES:
                truncated = True
                break
            path = name if relative == "." else f"{relative}/{name}"
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            if stat.S_ISLNK(mode) or is_control_name(name) or is_secret_path(path.split("/")):
                continue
            if stat.S_ISDIR(mode):
                if name in SKIP_DIRS or _inside_home(here / name, homes):
                    continue
                directories += 1
                if depth == 0:
                    top.append(name + "/")
                if depth + 1 < MAX_DEPTH and directories <= MAX_DIRECTORIES:
                    children.append((path, depth + 1))
                else:
                    truncated = True
                continue
            if not stat.S_ISREG(mode):
                continue
            files += 1
            if depth == 0:
                top.append(name)
            if name == "AGENTS.md" and len(agents) < MAX_AGENTS_FILES:
                agents.append(relative)
            if depth < MAX_LISTED_DEPTH:
                if name in MANIFEST_NAMES and len(manifests) < MAX_MANIFESTS:
                    manifests.append(path)
                if name in ENTRY_NAMES and len(entries) < MAX_ENTRY_CANDIDATES:
                    entries.append(path)
            suffix = Path(name).suffix.lower()
            languages[suffix or "(none)"] += 1
        if seen > MAX_ENTRIES:
            break
        pending.extend(reversed(children))  # depth first, in name order
    mix = sorted(languages.items(), key=lambda item: (-item[1], item[0]))[:MAX_LANGUAGES]
    return Walk(
        top=tuple(top[:MAX_TOP]),
        top_truncated=len(top) > MAX_TOP,
        files=files,
        directories=directories,
        truncated=truncated,
        agents_dirs=tuple(sorted(agents, key=lambda d: (d != ".", d))),
        manifests=tuple(sorted(manifests)),
        languages=tuple(mix),
        entries=tuple(sorted(entries)),
        keys=tuple(keys),
    )


def unchanged(root: Path, keys: tuple[DirKey, ...]) -> bool:
    """Whether every directory walked still has its stat (no entry added, removed or renamed)."""
    return all(dir_key(root, relative) == key for key, relative in ((k, k[0]) for k in keys))
