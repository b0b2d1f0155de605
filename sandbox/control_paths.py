"""The one deny list of control paths, shared by the file tools and the sandbox.

A control path is something an agent must never write (and mostly never read):
corral's own control directory and home, a git control entry (writing ``.git/config``,
a hook, or a repository anywhere git will find one is code execution on the host at
the next ``git status``: see corral.sandbox.git_shapes), and files that hold secrets.
The file tools refuse these paths at any depth, through any symlink and through any
other name of the same inode (actors/tools/paths.py, actors/tools/fs.py); the
bubblewrap profile masks or write-protects the same entries inside the sandbox
(sandbox/bwrap.py, through ``sandbox_entries``); what a sandboxed command leaves behind
is judged by ``control_entry_reason``. Keep every rule here, so they can never disagree.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from corral.sandbox.git_shapes import (
    DOTGIT_NAMES,
    DRIVER_FILES,
    commondir_target,
    fold_name,
    gitdir_target,
    has_repository_shape,
    is_dotgit,
    is_driver_file,
)

#: Directory (or file) names that are control paths at any depth. ``.git`` is also a
#: *file* in a worktree or a submodule (``gitdir: ...``): refused all the same. ``.git``
#: is matched as git matches it on any volume (git_shapes.is_dotgit: ``.GIT``, ``git~1``...).
CONTROL_NAMES: tuple[str, ...] = (".corral", ".git")

#: Files holding secrets: never read by a tool (under any name of the same inode),
#: bound empty in the sandbox. A pattern is matched against the entry's name, or, if
#: it has a slash, against as many trailing components of its path
#: (``.docker/config.json`` is ``config.json`` in a directory named ``.docker``).
SECRET_PATTERNS: tuple[str, ...] = (
    ".env",
    ".env.*",
    ".envrc",
    "*.pem",
    "*.key",
    "id_rsa*",
    "id_ed25519*",
    "id_ecdsa*",
    "id_dsa*",
    "*.p12",
    "*.pfx",
    "credentials*",
    ".git-credentials",
    "*service-account*.json",
    ".docker/config.json",
    ".netrc",
    ".pgpass",
    ".npmrc",
    ".pypirc",
)

#: A project walk for secret files stops here and fails closed (see scan_controls).
MAX_WALK_ENTRIES = 200_000

#: An inode: (st_dev, st_ino).
Inode = tuple[int, int]


class ControlPathError(ValueError):
    """A path that reaches a control path; the message names the rule."""


#: The one-component secret patterns as one regex: the sandbox tests every name of a
#: project tree on each launch, and one match per name is much cheaper than one per pattern.
_SECRET_RE = re.compile("|".join(fnmatch.translate(p) for p in SECRET_PATTERNS if "/" not in p))
#: Patterns with a slash, one regex per component (``*`` must not cross a ``/``).
_SECRET_PATH_PATTERNS: tuple[tuple[re.Pattern[str], ...], ...] = tuple(
    tuple(re.compile(fnmatch.translate(component)) for component in p.split("/")) for p in SECRET_PATTERNS if "/" in p
)
#: The last components of the patterns with a slash: a cheap first test in the walk.
_SECRET_LAST_RE = re.compile("|".join(fnmatch.translate(p.rsplit("/", 1)[1]) for p in SECRET_PATTERNS if "/" in p))


def is_control_name(name: str) -> bool:
    # Folded: on a case-insensitive file system (macOS, a mounted FAT or NTFS volume)
    # `.GIT/config` *is* `.git/config`; refusing `.GIT` on Linux costs nothing.
    return is_dotgit(name) or fold_name(name) in CONTROL_NAMES


def is_secret_name(name: str) -> bool:
    return _SECRET_RE.match(fold_name(name)) is not None


def is_secret_path(parts: Sequence[str]) -> bool:
    """Whether the entry at the end of ``parts`` holds secrets: by its name, or by its
    last components for a pattern with a slash."""
    if not parts:
        return False
    if is_secret_name(parts[-1]):
        return True
    for components in _SECRET_PATH_PATTERNS:
        tail = parts[-len(components):]
        if len(tail) == len(components) and all(
            c.match(fold_name(part)) for c, part in zip(components, tail, strict=True)
        ):
            return True
    return False


def refusal(parts: Sequence[str]) -> str | None:
    """Why a relative path (its parts) is a control path, or None."""
    for index, part in enumerate(parts):
        if is_control_name(part):
            return f"reaches the control directory {part}/"
        if is_secret_path(parts[: index + 1]):
            return "names a secrets file"
    return None


def write_refusal(parts: Sequence[str]) -> str | None:
    """Why a relative path may be read but not written by a tool, or None.
    ``.gitattributes`` and ``.gitmodules`` name drivers and submodule commands: all
    writes to them are refused rather than only those that add a driver, because
    telling one from the other means parsing them as git does (attribute macros,
    quoting, ``!attr``, submodule keys), and an agent rarely needs to edit them."""
    if parts and is_driver_file(parts[-1]):
        return f"is {parts[-1]}, which names git drivers (only a person edits it)"
    return None


def check_not_control(relative: os.PathLike[str] | str, raw: str) -> None:
    why = refusal(PurePosixPath(relative).parts)
    if why is not None:
        raise ControlPathError(f"path {raw!r} {why}")


def check_outside(target: Path, forbidden: Iterable[Path], raw: str, *, workspace: Path) -> None:
    """A resolved target must not lie in (or be) a forbidden directory that lies in
    the workspace, e.g. a home at ``<project>/state``. (A workspace inside such a
    directory is a different layout: what is outside the workspace is out of reach
    anyway.)"""
    for directory in forbidden:
        real = directory.resolve()
        if workspace == real or real in workspace.parents:
            continue
        if target == real or real in target.parents:
            raise ControlPathError(f"path {raw!r} reaches corral's home directory")


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return path.lstat()
    except OSError:
        return None


def _inode(info: os.stat_result) -> Inode:
    return info.st_dev, info.st_ino


def _linked_files(top: Path, *, skip: frozenset[str] = frozenset()) -> Iterator[os.stat_result]:
    """The stat of every regular file under ``top`` (or of ``top``) that has another
    name: only those can be reached under a name no rule sees."""
    info = _lstat(top)
    if info is None:
        return
    if not stat.S_ISDIR(info.st_mode):
        if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
            yield info
        return
    for directory, dirs, files in os.walk(top, followlinks=False):
        dirs[:] = [name for name in dirs if name not in skip]
        for name in files:
            found = _lstat(Path(directory) / name)
            if found is not None and stat.S_ISREG(found.st_mode) and found.st_nlink > 1:
                yield found


#: A repository's object store is content-addressed and names no program; it can be
#: large (a clone with --local hard-links every object), so the inode scan skips it.
_NO_PROGRAMS = frozenset({"objects"})


@dataclass
class ControlScan:
    """One walk of a tree (symlinks never followed, except to record where a ``.git``
    or secret-named link points): every control entry in it. Paths are absolute
    under ``root`` (resolved)."""

    root: Path
    #: ``.git`` directories and files (any spelling) and ``.corral`` files.
    control_entries: list[Path] = field(default_factory=list)
    #: ``.corral`` directories (hidden in the sandbox).
    hidden: list[Path] = field(default_factory=list)
    #: Where ``.git`` files and symlinks and ``commondir`` files point, resolved,
    #: existing or not, in the tree or not: git treats each as a repository.
    gitdir_targets: list[Path] = field(default_factory=list)
    #: Directories with a repository shape (root included).
    shapes: list[Path] = field(default_factory=list)
    #: ``.gitattributes`` and ``.gitmodules`` files.
    drivers: list[Path] = field(default_factory=list)
    #: Secret files and directories (and the in-tree targets of secret-named links).
    secrets: list[Path] = field(default_factory=list)
    #: Inodes of secret files with more than one name (files inside secret directories too).
    secret_inodes: set[Inode] = field(default_factory=set)
    #: Every other file (as a string: there may be many), to find other names of a
    #: secret or control inode.
    others: list[str] = field(default_factory=list)

    def control_dirs(self) -> list[Path]:
        """Directories whose whole content is a git control entry, in the tree."""
        # Not the root: a pointer at it counts only if the root has a shape (see reason).
        targets = [t for t in self.gitdir_targets if t != self.root and _inside(t, self.root) and t.is_dir()]
        return [p for p in self.control_entries if is_dotgit(p.name)] + targets + self.shapes

    #: control_inodes, once computed (the scan is one snapshot of the tree).
    _control_inodes: set[Inode] | None = field(default=None, repr=False)

    def control_inodes(self) -> set[Inode]:
        """Inodes of git control files that have another name (a hard link elsewhere
        in the tree is the same bytes: writing it writes the hook or the config). The
        object store is skipped: it names no program. Computed on first use."""
        if self._control_inodes is None:
            inodes: set[Inode] = set()
            for top in [*self.control_dirs(), *self.control_entries, *self.drivers]:
                inodes.update(_inode(info) for info in _linked_files(top, skip=_NO_PROGRAMS))
            self._control_inodes = inodes
        return self._control_inodes

    def linked_to(self, inodes: set[Inode]) -> list[Path]:
        """The files of ``others`` that are another name of one of ``inodes``."""
        if not inodes:
            return []
        found = []
        for name in self.others:
            path = Path(name)
            info = _lstat(path)
            if info is not None and info.st_nlink > 1 and _inode(info) in inodes:
                found.append(path)
        return found

    def gitdir_target_inodes(self) -> set[Inode]:
        inodes: set[Inode] = set()
        for target in self.gitdir_targets:
            info = _lstat(target)
            if info is not None and stat.S_ISDIR(info.st_mode):
                inodes.add(_inode(info))
        return inodes

    def reason(self, relative: PurePosixPath) -> str | None:
        """Why ``root/relative`` (as it is now, by lstat: no symlink followed) is a git
        control entry or lies in one, or None. See control_entry_reason."""
        parts = relative.parts
        if any(part in ("", ".", "..") for part in parts) or relative.is_absolute():
            return f"{relative} is not a plain relative path"
        for index, part in enumerate(parts):
            if is_dotgit(part):
                where = "/".join(parts[: index + 1])
                return f"{relative} is a .git entry" if index == len(parts) - 1 else f"{relative} lies in {where}"
        if parts and is_driver_file(parts[-1]):
            return f"{relative} names git drivers ({parts[-1]})"
        full = self.root.joinpath(*parts)
        for target in self.gitdir_targets:
            # A pointer at the root or above it names a directory git uses only if it
            # has a repository shape (checked below at the root): no reason to refuse
            # the whole workspace for a pointer git itself rejects.
            if _inside(full, target) and target != self.root and target not in self.root.parents:
                return f"{relative} lies in {target.relative_to(self.root)}, a git directory a .git file names"
        target_inodes = self.gitdir_target_inodes()
        for depth in range(len(parts) + 1):
            level = self.root.joinpath(*parts[:depth])
            shown = "/".join(parts[:depth]) or "the workspace root"
            info = _lstat(level)
            if info is None or not stat.S_ISDIR(info.st_mode):
                break
            if depth > 0 and _inode(info) in target_inodes:
                return f"{relative} lies in {shown}, a git directory a .git file names"
            try:
                names = os.listdir(level)
            except OSError:
                break
            if has_repository_shape(names):
                where = "is" if depth == len(parts) else f"lies in {shown},"
                return f"{relative} {where} a directory with the shape of a git repository (HEAD, objects, refs)"
        info = _lstat(self.root.joinpath(*parts))
        linked = info is not None and stat.S_ISREG(info.st_mode) and info.st_nlink > 1
        if info is not None and linked and _inode(info) in self.control_inodes():
            return f"{relative} is another name (a hard link) of a git control file"
        return None

    #: Entries listed so far by the walk (it fails closed past MAX_WALK_ENTRIES).
    listed: int = field(default=0, repr=False)

    def visit(self, directory: str, entries: Sequence[os.DirEntry[str]], folded_names: Sequence[str]) -> list[str]:
        """Record one listed directory of the walk (``folded_names``: fold_name of each
        entry); the subdirectories the walk must enter, in listing order. Raises
        ControlPathError once the walk has listed more than MAX_WALK_ENTRIES entries.
        scan_controls drives it; the tree guard's walk before a launch drives it too,
        so one listing of the tree serves both (sandbox/tree_guard.py)."""
        self.listed += len(entries)
        if self.listed > MAX_WALK_ENTRIES:
            raise ControlPathError(
                f"{self.root} has more than {MAX_WALK_ENTRIES} entries; corral cannot check it for control and"
                " secret files (narrow the workspace)"
            )
        enter: list[str] = []
        for entry, folded in zip(entries, folded_names, strict=True):
            try:
                if entry.is_symlink():
                    _scan_link(self, Path(entry.path), folded)
                elif entry.is_dir(follow_symlinks=False):
                    if _scan_dir(self, Path(entry.path), folded):
                        enter.append(entry.path)
                else:
                    _scan_file(self, entry.path, folded)
            except OSError:
                continue
        # "head" first: rare, and has_repository_shape (the one rule) folds every name again.
        if "head" in folded_names and has_repository_shape(folded_names):
            # Still walked: a secret inside must be masked all the same.
            self.shapes.append(Path(directory))
            _add_commondir(self, Path(directory))
        return enter


def scan_controls(root: Path) -> ControlScan:
    """Walk ``root`` once and record every control entry (see ControlScan). Fails
    closed (ControlPathError) past MAX_WALK_ENTRIES entries. One ``scandir`` per
    directory and no stat per plain file: it runs before every write of a file tool
    (and, through the tree guard's walk, before every sandboxed command)."""
    scan = ControlScan(root.resolve())
    pending = [str(scan.root)]
    while pending:
        directory = pending.pop()
        try:
            with os.scandir(directory) as listing:
                entries = list(listing)
        except OSError:
            continue  # vanished or unreadable meanwhile: nothing of it can be bound or read either
        pending += scan.visit(directory, entries, [fold_name(entry.name) for entry in entries])
    return scan


def _is_secret(folded: str, path: str | Path) -> bool:
    if _SECRET_RE.match(folded) is not None:
        return True
    # Rare: only a name that ends some pattern with a slash pays for the path's parts.
    return _SECRET_LAST_RE.match(folded) is not None and is_secret_path(Path(path).parts)


def _add_commondir(scan: ControlScan, gitdir: Path) -> None:
    common = commondir_target(gitdir)
    if common is not None:
        scan.gitdir_targets.append(common)


def _scan_link(scan: ControlScan, path: Path, folded: str) -> None:
    """A symlink is never followed by the walk; one with a control or secret name is
    recorded at its target (binding over the link itself would land there anyway)."""
    root = scan.root
    is_git = folded in DOTGIT_NAMES
    if not (is_git or folded in CONTROL_NAMES or folded in DRIVER_FILES or _is_secret(folded, path)):
        return
    target = path.resolve()
    if is_git:
        if target.is_dir():  # `.git -> gitdata`: gitdata is the repository
            scan.gitdir_targets.append(target)
            _add_commondir(scan, target)
        elif target.is_file():  # git reads the target as a `gitdir:` file
            if _inside(target, root):
                scan.control_entries.append(target)
            pointed = gitdir_target(target)
            if pointed is not None:
                scan.gitdir_targets.append(pointed)
    elif folded in CONTROL_NAMES:
        if target.is_dir() and _inside(target, root):
            scan.hidden.append(target)
    elif target.is_file() and _inside(target, root):
        (scan.drivers if folded in DRIVER_FILES else scan.secrets).append(target)


def _scan_dir(scan: ControlScan, path: Path, folded: str) -> bool:
    """Record a directory; whether the walk goes into it."""
    if folded in DOTGIT_NAMES:
        scan.control_entries.append(path)
        _add_commondir(scan, path)
        return False
    if folded in CONTROL_NAMES:
        scan.hidden.append(path)
        return False
    if _is_secret(folded, path):
        scan.secrets.append(path)
        # A hard link to a file in here, under a harmless name elsewhere, is the same bytes.
        scan.secret_inodes.update(_inode(info) for info in _linked_files(path))
        return False
    return True


def _scan_file(scan: ControlScan, name: str, folded: str) -> None:
    if folded in DOTGIT_NAMES:
        path = Path(name)
        scan.control_entries.append(path)
        pointed = gitdir_target(path)
        if pointed is not None:
            scan.gitdir_targets.append(pointed)
            if pointed.is_dir():
                _add_commondir(scan, pointed)
    elif folded in CONTROL_NAMES:
        scan.control_entries.append(Path(name))
    elif folded in DRIVER_FILES:
        scan.drivers.append(Path(name))
    elif _is_secret(folded, name):
        scan.secrets.append(Path(name))
        info = _lstat(Path(name))
        if info is not None and stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
            scan.secret_inodes.add(_inode(info))
    else:
        scan.others.append(name)


def control_entry_reason(root: Path, relative: PurePosixPath, scan: ControlScan | None = None) -> str | None:
    """Why the existing entry ``root/relative`` is a git control entry (or lies in
    one), judged as it is on disk (lstat: no symlink followed), or None.

    A git control entry is anything git reads as a repository or as a driver:
    a ``.git`` entry in any spelling (directory, ``gitdir:`` file or symlink) or
    anything under one; anything in a directory a ``.git`` file, a ``.git`` symlink or
    a ``commondir`` file names (compared by path and by inode); anything in a directory
    with a repository shape (``HEAD`` with ``objects`` and ``refs``, or with
    ``commondir``), the workspace root included; ``.gitattributes`` and
    ``.gitmodules``; and a file that is another name (hard link) of a file inside a
    control entry.

    To judge many paths of one tree (after a sandboxed command, say), take one
    ``scan = scan_controls(root)`` and pass it: otherwise each call walks the tree.
    """
    return (scan or scan_controls(root)).reason(relative)


def control_inodes(root: Path) -> set[Inode]:
    """Inodes of the git control files under ``root`` that have another name (see
    ControlScan.control_inodes)."""
    return scan_controls(root).control_inodes()


#: What sandbox_entries returns: (read-only, hidden, secret) paths.
SandboxEntries = tuple[list[Path], list[Path], list[Path]]


def sandbox_entries(root: Path, scan: ControlScan | None = None) -> SandboxEntries:
    """What the sandbox must treat specially under ``root``, at any depth:
    (read-only control entries such as ``.git``, gitdir targets, repository shapes and
    driver files; hidden control dirs such as ``.corral``; secret files and dirs to
    mask, with every other name of a secret inode). Symlinks are never returned:
    binding over a symlink would land on its target. ``scan``: a walk of ``root``
    already made (the tree guard's, before a launch); otherwise one is made here."""
    if scan is None:
        scan = scan_controls(root)
    read_only: list[Path] = []
    # Outermost first, so an entry inside one already bound read-only is not bound again.
    entries = {*scan.control_entries, *scan.control_dirs(), *scan.drivers}
    for path in sorted(entries, key=lambda p: (len(p.parts), str(p))):
        if not any(_inside(path, done) for done in read_only):
            read_only.append(path)
    secrets = list(scan.secrets)
    # A hard link to a secret under a harmless name (`innocent.txt`) is the same
    # bytes: mask it too. Rare, so the stat of every file is paid only then.
    secrets += scan.linked_to(scan.secret_inodes)
    return read_only, scan.hidden, secrets
