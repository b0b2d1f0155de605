"""No git control entry that a sandboxed command created or changed outlives it.

Git runs programs that files of a repository name (corral.sandbox.git_shapes), and a
repository is anything git recognises as one: a ``.git`` entry at any depth (a
directory, a ``gitdir:`` file, a symlink), the directory such a file names, a
directory with a repository's shape, and ``.gitattributes``/``.gitmodules``, which
pick drivers. Inside the sandbox every such entry that exists at launch is read-only
(sandbox/bwrap.py binds them, and every other name, a hard link, of a file inside
one), but a command can still *create* new ones anywhere in the writable tree:
``git init``, ``sub/.git`` pointing at ``../evil``, a bare-repository shape. The user's
next ``git status`` (or the IDE's, which scans nested repositories by itself) would
run what they name, on the host.

So each launch is bracketed by two walks of the project tree:

* :func:`snapshot`, before launch: every control entry, fingerprinted (kind, inode,
  content or link target), every directory's inode, and the files that are another
  name of a control file (to bind read-only: :attr:`Snapshot.protect`).
* :meth:`Snapshot.enforce`, once the launched tree is confirmed dead: the same walk
  again. A control entry that is not in the snapshot unchanged (or moved with a
  renamed parent, same inode and content) was created or changed while the command
  ran; it is removed. (The snapshot's own entries were read-only inside, so one of
  them that changed was changed from outside the sandbox: it is left alone.) A
  directory that existed before and only now has a repository's shape keeps its
  other content: only the new members of the shape (``HEAD``, ``objects``, ...) go.
  The report names every path, for the command's observation.

Removal (sandbox/guard_removal.py) moves an entry into corral's home's quarantine
rather than deleting it (the check cannot tell the command's ``git init`` from the
user's), never follows a symlink, and takes an entry only if it has the inode seen.

The walk before a launch also makes the sandbox's deny list (``snapshot(...,
scan=True)``: control_paths.ControlScan rides on the same listing), so a launch lists
the tree once. The snapshot is kept on disk while the command runs
(sandbox/guard_serial.py, sandbox/guard_record.py), so that if the launching
process dies with the command, the next launch runs the check.

The walk uses ``scandir`` (file types come with the directory listing), so a tree of
a few thousand files costs a few milliseconds; it never enters a ``.git`` directory,
the home or a ``.corral`` directory (they are masked or read-only inside). What a
command creates and removes again while it runs is not seen, and neither is what it
leaves for the short time between its end and the check; entries created by anyone
else in the tree while the command runs are judged the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.sandbox.control_paths import MAX_WALK_ENTRIES, ControlPathError, ControlScan
from corral.sandbox.git_shapes import (
    DOTGIT_NAMES,
    DRIVER_FILES,
    commondir_target,
    fold_name,
    gitdir_target,
    has_repository_shape,
)
from corral.sandbox.guard_removal import Moved, Removal

log = logging.getLogger("corral.sandbox")

#: An inode: (st_dev, st_ino).
Inode = tuple[int, int]

#: Folded names that make (or feed) a repository shape: removed from a directory that
#: existed before the command when they are new, so the rest of it is kept.
SHAPE_MEMBERS: frozenset[str] = frozenset(
    {"head", "objects", "refs", "commondir", "config", "config.worktree", "hooks", "info", "packed-refs", "gitdir"}
)
_HEAD = "head"
#: The object store names no program and can be huge: the hard-link search skips it.
_OBJECTS = "objects"
#: corral's control directory: hidden inside the sandbox (an empty tmpfs).
_CORRAL = ".corral"

#: Larger files are fingerprinted by size and times instead of content.
MAX_HASH_BYTES = 1 << 20
#: A report names at most this many paths per list (a command can create thousands).
MAX_REPORTED = 40
#: Pointers (``gitdir:``, ``commondir``) followed from one directory, at most.
_MAX_POINTER_HOPS = 8


@dataclass(frozen=True)
class Fingerprint:
    """What an entry is: its kind, its inode and, for a file its content digest, for a
    symlink its target. Directories are their inode (their content is walked)."""

    kind: str
    inode: Inode
    detail: str = ""


@dataclass(frozen=True)
class _Control:
    #: "dotgit", "driver", "shape" (a directory with a repository's shape) or "gitdir"
    #: (a directory a ``.git`` file, a ``.git`` symlink or a ``commondir`` names).
    what: str
    fingerprint: Fingerprint


@dataclass
class _Tree:
    root: Path
    controls: dict[str, _Control] = field(default_factory=dict)
    #: Entries named like a shape member, anywhere (relative path -> fingerprint).
    members: dict[str, Fingerprint] = field(default_factory=dict)
    #: Inodes of every directory walked (the root included).
    dirs: set[Inode] = field(default_factory=set)
    #: Regular files outside control entries (absolute), for the hard-link search.
    files: list[str] = field(default_factory=list)
    #: Directories that could not be listed (relative path -> why).
    unreadable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GuardReport:
    """What the check after a command did; empty when the command left no control entry."""

    removed: tuple[str, ...] = ()
    #: Control entries that could not be removed or checked, each with the reason.
    failed: tuple[str, ...] = ()
    #: Removed entries that were moved, not deleted: (path in the project, where it
    #: is now), so that a person can put back what was theirs (sandbox/guard_removal.py).
    moved_to: tuple[tuple[str, str], ...] = ()

    @property
    def clean(self) -> bool:
        return not (self.removed or self.failed)

    def as_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {"removed": list(self.removed), "failed": list(self.failed)}
        if self.moved_to:
            found["moved_to"] = dict(self.moved_to)
        return found

    def merged(self, later: GuardReport) -> GuardReport:
        return GuardReport(
            tuple(dict.fromkeys((*self.removed, *later.removed))),
            tuple(dict.fromkeys((*self.failed, *later.failed))),
            tuple(dict.fromkeys((*self.moved_to, *later.moved_to))),
        )

    def notice(self) -> str:
        """One paragraph for the command's observation ('' when clean)."""
        if self.clean:
            return ""
        parts = []
        if self.removed:
            parts.append(f"removed {_listing(self.removed)}")
        if self.moved_to:
            moves = tuple(f"{rel} -> {where}" for rel, where in self.moved_to)
            parts.append(f"kept, not deleted (move it back to restore it): {_listing(moves)}")
        if self.failed:
            parts.append(f"could NOT remove {_listing(self.failed)}")
        return (
            "corral refused git control entries the command created or changed (git runs the programs they"
            " name, outside the sandbox): " + "; ".join(parts) + ". Do not create .git entries, repositories,"
            " .gitattributes or .gitmodules; use project.git_* tools for git."
        )


def _listing(paths: tuple[str, ...]) -> str:
    shown = ", ".join(paths[:MAX_REPORTED])
    more = len(paths) - MAX_REPORTED
    return shown + (f" and {more} more" if more > 0 else "")


def _inode(info: os.stat_result) -> Inode:
    return info.st_dev, info.st_ino


def _fingerprint(path: str, info: os.stat_result) -> Fingerprint:
    mode = info.st_mode
    if stat.S_ISDIR(mode):
        return Fingerprint("dir", _inode(info))
    if stat.S_ISLNK(mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return Fingerprint("link", _inode(info), target)
    if stat.S_ISREG(mode):
        return Fingerprint("file", _inode(info), _digest(path, info))
    return Fingerprint("other", _inode(info), str(stat.S_IFMT(mode)))


def _digest(path: str, info: os.stat_result) -> str:
    if info.st_size > MAX_HASH_BYTES:
        return f"size={info.st_size} mtime={info.st_mtime_ns} ctime={info.st_ctime_ns}"
    data = _read_regular(path, MAX_HASH_BYTES)
    return "unreadable" if data is None else hashlib.sha256(data).hexdigest()


def _read_regular(path: str, limit: int) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None  # a FIFO swapped in must not hang the walk
        chunks = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _lstat(path: str | Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _scandir(path: str, *, repair: bool) -> list[os.DirEntry[str]]:
    """A directory's entries. After a command (``repair``), a directory it made
    unreadable (``chmod 000``) to hide what it holds is given its owner's rights back."""
    try:
        with os.scandir(path) as listing:
            return list(listing)
    except PermissionError:
        if not repair:
            raise
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise
        os.chmod(path, stat.S_IMODE(info.st_mode) | stat.S_IRWXU)
        with os.scandir(path) as listing:
            return list(listing)


def _walk(
    root: Path,
    frozen: set[Inode],
    *,
    after: bool,
    closed: frozenset[str] = frozenset(),
    scan: ControlScan | None = None,
) -> _Tree:
    """One walk of the tree. Before a launch (``after`` false) every ``.corral``
    directory joins ``frozen``: hidden inside, it is never walked again. After it, a
    directory the command made unreadable is opened again (not those in ``closed``,
    unreadable before it: the user's own).

    ``scan`` (before a launch only): the sandbox's deny list (control_paths.ControlScan)
    rides on this walk, so the tree is listed once for both. Each keeps its own rules
    of which directories it enters (the deny list enters a home not named ``.corral``,
    this walk enters a secret directory): a directory only one of them enters is given
    to that one only, so each sees exactly what a walk of its own would."""
    assert scan is None or not after
    tree = _Tree(root)
    root_info = os.lstat(root)
    tree.dirs.add(_inode(root_info))
    pointers: list[Path] = []
    # (relative path, path, this walk enters it, the deny list enters it)
    stack: list[tuple[str, str, bool, bool]] = [("", str(root), True, scan is not None)]
    seen = 0
    scan_failed: ControlPathError | None = None
    while stack:
        rel, path, guarded, scanned = stack.pop()
        if not guarded and scan_failed is not None:
            continue  # the deny list's own directory, and it has given up
        try:
            entries = _scandir(path, repair=after and (rel or ".") not in closed)
        except OSError as exc:
            if guarded:
                tree.unreadable[rel or "."] = exc.strerror or type(exc).__name__
            continue
        folded_names = [fold_name(entry.name) for entry in entries]
        scan_enters: list[str] = []
        if scan is not None and scanned and scan_failed is None:
            try:
                scan_enters = scan.visit(path, entries, folded_names)
            except ControlPathError as exc:
                # The launch fails either way; this walk's own limit, if it is passed
                # too, is the error a launch has always reported first.
                scan_failed = exc
        guard_enters: list[tuple[str, str]] = []
        if guarded:
            seen += len(entries)
            if seen > MAX_WALK_ENTRIES and not after:
                # After a command the walk goes on: what it created must be judged.
                raise ControlPathError(
                    f"{root} has more than {MAX_WALK_ENTRIES} entries; corral cannot check it for git control"
                    " entries (narrow the workspace)"
                )
            guard_enters = _record(tree, rel, path, entries, folded_names, frozen, pointers, after=after)
        if not scan_enters:
            stack += [(_child(rel, name), child, True, False) for name, child in guard_enters]
            continue
        # Both lists are in listing order: merge them, keeping it (the deny list's
        # results come out in the order of a walk of its own).
        guard_paths = {child for _name, child in guard_enters}
        scan_paths = set(scan_enters)
        for entry in entries:
            by_guard, by_scan = entry.path in guard_paths, entry.path in scan_paths
            if by_guard or by_scan:
                stack.append((_child(rel, entry.name), entry.path, by_guard, by_scan))
    _resolve_pointers(tree, pointers)
    if scan_failed is not None:
        raise scan_failed
    return tree


def _child(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


def _record(
    tree: _Tree,
    rel: str,
    path: str,
    entries: list[os.DirEntry[str]],
    folded_names: list[str],
    frozen: set[Inode],
    pointers: list[Path],
    *,
    after: bool,
) -> list[tuple[str, str]]:
    """Record one listed directory in ``tree``; the (name, path) of the
    subdirectories the walk enters, in listing order."""
    enters: list[tuple[str, str]] = []
    # HEAD first: it is rare, and git_shapes' rule (one rule for every check) folds again.
    if _HEAD in folded_names and has_repository_shape(folded_names):
        info = _lstat(path)
        if info is not None:
            tree.controls[rel] = _Control("shape", _fingerprint(path, info))
            _add_commondir(pointers, Path(path))
    for entry, folded in zip(entries, folded_names, strict=True):
        child = _child(rel, entry.name)
        if folded in SHAPE_MEMBERS or folded in DOTGIT_NAMES or folded in DRIVER_FILES:
            info = _lstat(entry.path)
            if info is None:
                continue
            fingerprint = _fingerprint(entry.path, info)
            if folded in SHAPE_MEMBERS:
                tree.members[child] = fingerprint
            if folded in DOTGIT_NAMES:
                tree.controls[child] = _Control("dotgit", fingerprint)
                _add_pointer(pointers, Path(entry.path), fingerprint.kind)
                continue  # never into a .git directory: read-only inside, or removed whole
            if folded in DRIVER_FILES and fingerprint.kind != "dir":
                tree.controls[child] = _Control("driver", fingerprint)
                continue
        if entry.is_dir(follow_symlinks=False):
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            inode = _inode(info)
            tree.dirs.add(inode)
            if not after and folded == _CORRAL:
                frozen.add(inode)
            if inode not in frozen:
                enters.append((entry.name, entry.path))
        elif entry.is_file(follow_symlinks=False):
            tree.files.append(entry.path)
    return enters


def _add_pointer(pointers: list[Path], path: Path, kind: str) -> None:
    """Where a ``.git`` entry sends git: a gitdir file's target, a symlink's target."""
    if kind == "file":
        target = gitdir_target(path)
        if target is not None:
            pointers.append(target)
    elif kind == "link":
        with contextlib.suppress(OSError, RuntimeError):
            target = path.resolve()
            if target.is_dir():
                pointers.append(target)
            elif target.is_file():
                named = gitdir_target(target)
                if named is not None:
                    pointers.append(named)
    elif kind == "dir":
        _add_commondir(pointers, path)


def _add_commondir(pointers: list[Path], gitdir: Path) -> None:
    with contextlib.suppress(OSError, RuntimeError):
        common = commondir_target(gitdir)
        if common is not None:
            pointers.append(common)


def _resolve_pointers(tree: _Tree, pointers: list[Path]) -> None:
    """Directories in the tree that a pointer names are control entries ("gitdir"),
    and so is whatever their own ``commondir`` names."""
    seen: set[Path] = set()
    for _hop in range(_MAX_POINTER_HOPS):
        found: list[Path] = []
        for target in pointers:
            if target in seen or not _inside(target, tree.root) or target == tree.root:
                continue
            seen.add(target)
            info = _lstat(target)
            if info is None or not stat.S_ISDIR(info.st_mode):
                continue
            rel = target.relative_to(tree.root).as_posix()
            tree.controls.setdefault(rel, _Control("gitdir", _fingerprint(str(target), info)))
            _add_commondir(found, target)
        if not found:
            return
        pointers = found


def _linked_inodes(root: Path, tree: _Tree) -> set[Inode]:
    """Inodes of the control files (in control directories, skipping object stores,
    and the control files themselves) that have another name."""
    inodes: set[Inode] = set()
    for rel, control in tree.controls.items():
        top = root / rel if rel else root
        if control.fingerprint.kind == "file":
            info = _lstat(top)
            if info is not None and info.st_nlink > 1:
                inodes.add(_inode(info))
        elif control.fingerprint.kind == "dir" and rel:
            for directory, dirs, files in os.walk(top, followlinks=False):
                dirs[:] = [name for name in dirs if fold_name(name) != _OBJECTS]
                for name in files:
                    info = _lstat(os.path.join(directory, name))
                    if info is not None and stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                        inodes.add(_inode(info))
    return inodes


def _outermost(paths: Iterable[Path]) -> list[Path]:
    chosen: list[Path] = []
    for path in sorted(set(paths), key=lambda p: (len(p.parts), str(p))):
        if not any(_inside(path, done) for done in chosen):
            chosen.append(path)
    return chosen


@dataclass(frozen=True)
class Snapshot:
    """The control entries of a project tree at launch (see the module docstring)."""

    root: Path
    tree: _Tree
    #: Directories hidden inside the sandbox (the home, ``.corral``): never walked.
    frozen: frozenset[Inode]
    #: Existing control entries (files and directories, outermost first) and every
    #: other name of a file inside one: bound read-only inside the sandbox.
    protect: tuple[Path, ...]
    #: The deny list's walk of the same tree, made by the same listing (``snapshot(...,
    #: scan=True)``): control_paths.sandbox_entries(root, scan) needs no walk of its own.
    scan: ControlScan | None = field(default=None, compare=False, repr=False)
    #: corral's home (the launcher's private directory): what the check takes is
    #: moved to its quarantine, not deleted. None: deleted (sandbox/guard_removal.py).
    home: Path | None = None

    def enforce(self, *, live: bool = True) -> GuardReport:
        """Walk the tree again; take out every control entry the command created or
        changed. The snapshot's own entries were read-only inside (``protect``), so a
        change to one of them was made by someone else, outside: it is kept. Not
        ``live``: catching up a dead launcher (guard_record.py), nothing is deleted."""
        try:
            return self._enforce(Removal(self.home, live))
        except Exception as exc:  # never let the check crash the caller: report it
            log.exception("checking %s for git control entries failed", self.root)
            return GuardReport(failed=(f"the whole tree: the check failed ({type(exc).__name__}: {exc})",))

    def _enforce(self, removal: Removal) -> GuardReport:
        closed = frozenset(self.tree.unreadable)
        after = _walk(self.root, set(self.frozen), after=True, closed=closed)
        verdicts = _judge(self.tree, after)
        hidden = {rel: why for rel, why in after.unreadable.items() if rel not in self.tree.unreadable}
        if not verdicts and not hidden:
            return GuardReport()
        removed: list[str] = []
        moved: list[tuple[str, str]] = []
        failed: dict[str, str] = {rel: f"cannot be checked ({why})" for rel, why in sorted(hidden.items())}
        for verdict in verdicts:
            try:
                where = removal.take(self.root, verdict.rel, verdict.fingerprint.inode)
            except (OSError, Moved) as exc:
                failed[verdict.rel] = str(exc)
                continue
            removed.append(verdict.rel)
            if where is not None:
                moved.append((verdict.rel, where))
        if removed:
            # Confirm: a second walk must find nothing left to do.
            again = _judge(self.tree, _walk(self.root, set(self.frozen), after=True, closed=closed))
            for verdict in again:
                failed.setdefault(verdict.rel, "still there after removal")
        report = GuardReport(tuple(removed), tuple(f"{rel}: {why}" for rel, why in failed.items()), tuple(moved))
        log.warning("sandboxed command left git control entries in %s: %s", self.root, report.as_dict())
        return report


def snapshot(root: Path, masked: Iterable[Path] = (), *, scan: bool = False) -> Snapshot:
    """Walk ``root`` before a launch. ``masked`` are directories hidden inside the
    sandbox (the home): never walked, there or after. With ``scan``, the same walk
    also makes the sandbox's deny list scan (``Snapshot.scan``): one listing of the
    tree per launch instead of two."""
    root = root.resolve()
    frozen: set[Inode] = set()
    for path in masked:
        info = _lstat(path.resolve())
        if info is not None and stat.S_ISDIR(info.st_mode):
            frozen.add(_inode(info))
    deny = ControlScan(root) if scan else None
    tree = _walk(root, frozen, after=False, scan=deny)
    # Files and directories only: a bind over a symlink lands on its target.
    bindable = ("file", "dir")
    protect = [root / rel for rel, control in tree.controls.items() if rel and control.fingerprint.kind in bindable]
    if any(c.what == "shape" for rel, c in tree.controls.items() if not rel):
        # The root itself has a repository's shape: its members, not the whole tree.
        protect += [root / rel for rel, fp in tree.members.items() if "/" not in rel and fp.kind in bindable]
    inodes = _linked_inodes(root, tree)
    if inodes:
        # Rare (a control file with a second name), so every file is stat'ed only then.
        for name in tree.files:
            info = _lstat(name)
            if info is not None and info.st_nlink > 1 and _inode(info) in inodes:
                protect.append(Path(name))
    return Snapshot(root, tree, frozenset(frozen), tuple(_outermost(protect)), deny)


@dataclass(frozen=True)
class _Verdict:
    """An entry to remove (it must still have this fingerprint's inode)."""

    rel: str
    fingerprint: Fingerprint


def _judge(before: _Tree, after: _Tree) -> list[_Verdict]:
    old_by_inode = {c.fingerprint.inode: rel for rel, c in before.controls.items()}
    verdicts: list[_Verdict] = []
    for rel, control in sorted(after.controls.items(), key=lambda item: (item[0].count("/"), item[0])):
        fingerprint = control.fingerprint
        old = before.controls.get(rel)
        if old is not None and old.fingerprint == fingerprint:
            continue
        moved_from = old_by_inode.get(fingerprint.inode)
        if moved_from is not None and moved_from != rel and before.controls[moved_from].fingerprint == fingerprint:
            still = after.controls.get(moved_from)
            if still is None or still.fingerprint != fingerprint:
                continue  # the same entry under a renamed parent: not new
        if old is not None and fingerprint.kind in ("file", "dir") and old.fingerprint.kind in ("file", "dir"):
            # It was bound read-only inside (only a symlink cannot be): the command
            # cannot have changed it; someone outside the sandbox did.
            log.info("control entry %s changed while a command ran, outside its sandbox", rel)
            continue
        if control.what in ("shape", "gitdir") and (not rel or fingerprint.inode in before.dirs):
            # A directory that was there before: only what makes it a repository goes.
            verdicts += _new_members(before, after, rel)
        else:
            verdicts.append(_Verdict(rel, fingerprint))
    return _drop_nested(verdicts)


def _new_members(before: _Tree, after: _Tree, rel: str) -> list[_Verdict]:
    prefix = f"{rel}/" if rel else ""
    found = []
    for member, fingerprint in after.members.items():
        if member.startswith(prefix) and "/" not in member[len(prefix) :] and before.members.get(member) != fingerprint:
            found.append(_Verdict(member, fingerprint))
    return found


def _drop_nested(verdicts: list[_Verdict]) -> list[_Verdict]:
    kept: list[_Verdict] = []
    removed_dirs: list[str] = []
    for verdict in verdicts:
        if any(verdict.rel.startswith(f"{d}/") for d in removed_dirs):
            continue
        if verdict.rel in {v.rel for v in kept}:
            continue
        kept.append(verdict)
        if verdict.fingerprint.kind == "dir":
            removed_dirs.append(verdict.rel)
    return kept
