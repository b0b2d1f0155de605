"""What an agent knows of its repository when it plans (seed 004 V1.1 §1, V1.24, V1.25).

One build core, used by the agent's prompt, by ``project.index`` and by the
supervisor's stale-action guard (supervisor/context/repo_fingerprint_service.py):

* **Documents.** Every ``AGENTS.md`` (instructions, scoped to its directory) and the
  root ``README.md``/``CONTEXT.md`` (reference data, not instructions), each with
  the SHA-256 of its first MAX_DOCUMENT_HASH_BYTES (the whole file, for any real
  one), its size and whether its text was cut. A document that cannot be read as a
  plain file is listed with the reason instead.
* **Skills** (actors/repo_skills.py): metadata only.
* **Layout** (actors/repo_walk.py, actors/repo_manifests.py): the top-level tree,
  manifests and their script names, a safe git summary, the language mix and entry
  candidates.

The **fingerprint** is the SHA-256 of the canonical JSON (RFC 8785) of the documents
and the skill catalog: everything that steers the model. The layout is shown but
not fingerprinted: an agent's own writes move it at every step, and a fingerprint
that moved with them would block the second write of every plan.

Nothing outside the workspace is read: no symlink is followed, no control directory
(``.git``, ``.corral``), no corral home, no secret file. No git runs except through
the host git (and only when the layout asks for it). Sizes and counts are bounded,
with markers where cut.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import rfc8785

from corral.actors import repo_manifests, repo_walk
from corral.actors.repo_skills import ROOTS as SKILL_ROOTS
from corral.actors.repo_skills import FrontMatterMemo, Skill, SkillCatalog, discover, skill_section
from corral.core import nesting
from corral.core.path_scrub import scrub_paths
from corral.core.redact import redact_text

SCHEMA = "corral-repository-context-v3"
#: The seed's budgets: one document read, all documents read.
MAX_DOCUMENT_BYTES = 24 * 1024
MAX_DOCUMENTS_TOTAL = 64 * 1024
#: What is read (and hashed) of one document: a sparse 64 GiB AGENTS.md was hashed
#: whole at every build (issue 48). Past it, the digest is of this head.
MAX_DOCUMENT_HASH_BYTES = 256 * 1024
REFERENCE_NAMES = ("README.md", "CONTEXT.md")
#: A prompt label for each kind.
INSTRUCTIONS, REFERENCE = "instructions", "reference"

#: (path relative to the workspace, size, st_mtime_ns, st_ctime_ns, st_ino).
FileKey = tuple[str, int, int, int, int]

__all__ = ["ContextCache", "Document", "LiveContext", "RepoContext", "Skill", "SkippedDocument", "build", "changes",
           "load"]


@dataclass(frozen=True)
class Document:
    path: str
    kind: str
    #: The directory it applies to (``.`` for the root; README/CONTEXT are always ``.``).
    scope: str
    sha256: str
    size: int
    #: Redacted, with this machine's absolute paths replaced, bounded.
    text: str
    truncated: bool


@dataclass(frozen=True)
class SkippedDocument:
    """A document the walk found that cannot be read as a plain file (swapped for a
    FIFO or a symlink since, say): named, with why, never waited on or followed."""

    path: str
    reason: str


@dataclass(frozen=True)
class Layout:
    walk: repo_walk.Walk = field(default_factory=repo_walk.Walk)
    manifests: tuple[dict[str, Any], ...] = ()
    git: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        walk = self.walk
        return {
            "top": list(walk.top), "top_truncated": walk.top_truncated, "files": walk.files,
            "directories": walk.directories, "walk_truncated": walk.truncated,
            "manifests": [dict(m) for m in self.manifests], "git": dict(self.git),
            "languages": {ext: count for ext, count in walk.languages}, "entry_candidates": list(walk.entries),
        }


@dataclass(frozen=True)
class RepoContext:
    documents: tuple[Document, ...] = ()
    catalog: SkillCatalog = field(default_factory=SkillCatalog)
    layout: Layout = field(default_factory=Layout)
    #: Documents were left out (the total budget): the context is not whole.
    documents_truncated: bool = False
    #: Documents found but not read, with why (shown, not fingerprinted: the reason of
    #: an unreadable file may change while nothing that steers the model does).
    documents_skipped: tuple[SkippedDocument, ...] = ()

    # -- what is fingerprinted ---------------------------------------------------------

    def governing(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "documents": [{"path": d.path, "kind": d.kind, "scope": d.scope, "sha256": d.sha256,
                           "truncated": d.truncated} for d in self.documents],
            "documents_truncated": self.documents_truncated,
            # The file's digest covers its description; the shown (redacted) one is left
            # out: redaction depends on the secrets a process holds, the digest does not.
            "skills": [{"name": s.name, "path": s.path, "root": s.root, "sha256": s.sha256}
                       for s in self.catalog.skills],
            # Left out by a limit of the catalog or by the prompt's 4 KiB (V1.25).
            "skills_truncated": self.catalog.truncated or skill_section(self.catalog).cut,
        }

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(rfc8785.dumps(self.governing())).hexdigest()

    def sources(self) -> dict[str, str]:
        """Each fingerprinted source by a readable name: the first 16 hex digits of its digest."""
        found = {f"{'AGENTS.md' if d.kind == INSTRUCTIONS else d.path} at {d.path}": d.sha256[:16]
                 for d in self.documents}
        for s in self.catalog.skills:
            found[f"skill {s.name} at {s.path}"] = s.sha256[:16]
        return found

    def stamp(self) -> dict[str, Any]:
        """What a plan records of the context it was made with."""
        return {"schema": SCHEMA, "fingerprint": self.fingerprint, "sources": self.sources()}

    def summary(self) -> dict[str, Any]:
        """The whole canonical summary (``project.index``): governing part, texts, layout."""
        return {
            **self.governing(),
            "fingerprint": self.fingerprint,
            "skills": [{"name": s.name, "path": s.path, "root": s.root, "description": s.description,
                        "sha256": s.sha256} for s in self.catalog.skills],
            "texts": {d.path: d.text for d in self.documents},
            "documents_skipped": [{"path": d.path, "reason": d.reason} for d in self.documents_skipped],
            "skills_skipped": [{"path": s.path, "reason": s.reason} for s in self.catalog.skipped],
            "layout": self.layout.summary(),
        }

    # -- scoped instructions -------------------------------------------------------------

    def applicable(self, path: str) -> tuple[Document, ...]:
        """The AGENTS.md files that apply to ``path``: those on its ancestor chain, root first."""
        parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
        chain = {"."} | {"/".join(parts[:i]) for i in range(1, len(parts) + 1)}
        return tuple(d for d in self.documents if d.kind == INSTRUCTIONS and d.scope in chain)

    # -- the earlier shape (tests, the providers) ------------------------------------------

    @property
    def instructions(self) -> tuple[tuple[str, str], ...]:
        return tuple((d.scope, d.text) for d in self.documents if d.kind == INSTRUCTIONS)

    @property
    def references(self) -> tuple[tuple[str, str], ...]:
        return tuple((d.path, d.text) for d in self.documents if d.kind == REFERENCE)

    @property
    def skills(self) -> tuple[Skill, ...]:
        return self.catalog.skills

    def prompt(self, with_layout: bool = True) -> str:
        from corral.actors.repo_prompt import render

        return render(self, with_layout)


def changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two ``sources()`` maps, one line each, in name order."""
    lines = []
    for name in sorted(set(old) | set(new)):
        before, after = old.get(name), new.get(name)
        if before == after:
            continue
        if before is None:
            lines.append(f"{name} was added (sha256 {str(after)[:12]})")
        elif after is None:
            lines.append(f"{name} was removed (it had sha256 {str(before)[:12]})")
        else:
            lines.append(f"{name} changed sha256 {str(before)[:12]}→{str(after)[:12]}")
    return lines


# -- building ------------------------------------------------------------------------------


def file_key(root: Path, relative: str) -> FileKey | None:
    try:
        info = os.lstat(root / relative)
    except OSError:
        return None
    return (relative, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)


def _scrub(text: str, root: Path) -> str:
    """Secrets first, then paths (V1.41 "依次过滤密钥、项目路径和其它绝对路径"): the
    workspace's root as ``<project>``, every other absolute path of this machine (the
    home's too) as ``<absolute-path>`` (V1.24 "正文继续执行凭据和绝对路径清洗")."""
    return scrub_paths(redact_text(text), (str(root),))


def _document(root: Path, path: str, kind: str, scope: str) -> Document | SkippedDocument:
    """A regular file inside the workspace, reached without following a symlink at
    any level (nesting.read_inside): its head hashed, its text bounded."""
    try:
        read = nesting.read_inside(root, path, MAX_DOCUMENT_HASH_BYTES)
    except nesting.NotReadable as exc:
        return SkippedDocument(path, str(exc))
    truncated = read.size > MAX_DOCUMENT_BYTES
    text = _scrub(read.data[:MAX_DOCUMENT_BYTES].decode("utf-8", errors="replace"), root)
    return Document(path, kind, scope, hashlib.sha256(read.data).hexdigest(), read.size, text, truncated)


def build(workspace: Path, home: Path | None = None, *, with_layout: bool = True, with_git: bool = False,
          memo: FrontMatterMemo | None = None) -> tuple[RepoContext, tuple[FileKey, ...], tuple[repo_walk.DirKey, ...]]:
    """The context of ``workspace``, the stat of every file read and every directory
    walked. ``memo``: the skills' front matter parsed by an earlier build."""
    root = workspace.resolve()
    if not root.is_dir():
        return RepoContext(), (), ()
    homes = (home,) if home is not None else ()
    walk = repo_walk.walk(root, homes)
    documents: list[Document] = []
    skipped: list[SkippedDocument] = []
    total, cut = 0, False
    wanted = [(f"{d}/AGENTS.md" if d != "." else "AGENTS.md", INSTRUCTIONS, d) for d in walk.agents_dirs]
    wanted += [(name, REFERENCE, ".") for name in REFERENCE_NAMES if name in walk.top]
    for path, kind, scope in wanted:
        if total >= MAX_DOCUMENTS_TOTAL:
            cut = True
            break
        found = _document(root, path, kind, scope)
        if isinstance(found, SkippedDocument):
            skipped.append(found)
        else:
            documents.append(found)
            total += min(found.size, MAX_DOCUMENT_BYTES)
    catalog = discover(root, memo)
    files = [path for path, _, _ in wanted] + [s.path for s in catalog.skills] + [s.path for s in catalog.skipped]
    dirs = [*SKILL_ROOTS, *(str(Path(s.path).parent) for s in catalog.skills)]
    keys = tuple(k for k in (file_key(root, f) for f in files) if k is not None)
    dir_keys = walk.keys + tuple(k for k in (repo_walk.dir_key(root, d) for d in dirs) if k is not None)
    layout = Layout()
    if with_layout:
        manifests = tuple(repo_manifests.manifest(root, path) for path in walk.manifests)
        layout = Layout(walk, manifests, repo_manifests.git_summary(root) if with_git else {})
    return RepoContext(tuple(documents), catalog, layout, cut, tuple(skipped)), keys, dir_keys


def load(workspace: Path, home: Path | None = None) -> RepoContext:
    """The context with its layout and git summary, built now (``project.index``)."""
    return build(workspace, home, with_git=True)[0]


class ContextCache:
    """The context of one workspace, rebuilt only when a stat says something changed
    (a directory walked, a document or skill read): a step does not re-read the tree.
    A rebuild (any write moves a walked directory) parses again only the skills'
    front matter that changed (``memo``); all of it is bounded (actors/repo_skills.py)."""

    def __init__(self, workspace: Path, home: Path | None = None) -> None:
        self.root = workspace.resolve()
        self.home = home
        self.memo = FrontMatterMemo()
        self._built: RepoContext | None = None
        self._keys: tuple[FileKey, ...] = ()
        self._dir_keys: tuple[repo_walk.DirKey, ...] = ()

    def _fresh(self) -> bool:
        return (self._built is not None and repo_walk.unchanged(self.root, self._dir_keys)
                and all(file_key(self.root, key[0]) == key for key in self._keys))

    def seed(self, built: tuple[RepoContext, tuple[FileKey, ...], tuple[repo_walk.DirKey, ...]]) -> None:
        """Take a build made elsewhere (the lane's first, with its layout) as the cached one."""
        self._built, self._keys, self._dir_keys = built

    def current(self) -> RepoContext:
        """Documents and skills as they are now (no layout: the guard needs none)."""
        if not self._fresh():
            self._built, self._keys, self._dir_keys = build(self.root, self.home, with_layout=False, memo=self.memo)
        assert self._built is not None
        return self._built


class LiveContext:
    """A lane's context: the layout is the lane's start-up snapshot (with git); the
    documents and skills are re-checked at every turn, so the next plan sees an
    edited AGENTS.md. ``stamp`` is what the last rendered prompt was made from."""

    def __init__(self, workspace: Path, home: Path | None = None, with_layout: bool = True) -> None:
        self.cache = ContextCache(workspace, home)
        self.with_layout = with_layout
        self.layout: Layout | None = None
        self.rendered: RepoContext | None = None
        #: The cache's context the rendered one was made from (the same object: unchanged).
        self._source: RepoContext | None = None
        self._prompt = ""

    def prompt(self) -> str:
        if self.layout is None:
            built = build(self.cache.root, self.cache.home, with_git=True, memo=self.cache.memo)
            self.layout = built[0].layout
            self.cache.seed(built)
        now = self.cache.current()
        if self.rendered is None or now is not self._source:
            context = RepoContext(now.documents, now.catalog, self.layout, now.documents_truncated,
                                  now.documents_skipped)
            self.rendered, self._source, self._prompt = context, now, context.prompt(self.with_layout)
        return self._prompt

    def stamp(self) -> dict[str, Any]:
        if self.rendered is None:
            self.prompt()
        assert self.rendered is not None
        return self.rendered.stamp()
