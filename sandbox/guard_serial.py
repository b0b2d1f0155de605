"""The tree guard's snapshot as JSON-able data, and back: what the check after a
command needs (sandbox/tree_guard.py), kept on disk while the command runs
(sandbox/guard_record.py) so that a launcher's death does not skip the check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corral.sandbox.tree_guard import Fingerprint, Inode, Snapshot, _Control, _Tree

#: The layout of to_record.
RECORD_VERSION = 1


def to_record(snap: Snapshot) -> dict[str, Any]:
    """What enforce needs (not ``protect`` nor the deny list's scan)."""
    tree = snap.tree
    return {
        "version": RECORD_VERSION,
        "root": str(snap.root),
        "frozen": sorted(snap.frozen),
        "controls": {rel: [c.what, *_fingerprint_record(c.fingerprint)] for rel, c in tree.controls.items()},
        "members": {rel: _fingerprint_record(fp) for rel, fp in tree.members.items()},
        "dirs": sorted(tree.dirs),
        "unreadable": dict(tree.unreadable),
    }


def from_record(data: Any, home: Path | None = None) -> Snapshot:
    """The snapshot ``to_record`` wrote (without ``protect``: only enforce is left to
    do), its quarantine in ``home``. Raises ValueError on anything else."""
    try:
        if data["version"] != RECORD_VERSION:
            raise ValueError(f"unknown record version {data['version']!r}")
        root = Path(_text(data["root"]))
        if not root.is_absolute():
            raise ValueError("the root is not absolute")
        tree = _Tree(root)
        for rel, (what, *fingerprint) in data["controls"].items():
            if what not in ("dotgit", "driver", "shape", "gitdir"):
                raise ValueError(f"unknown control kind {what!r}")
            tree.controls[_text(rel)] = _Control(what, _fingerprint_of(fingerprint))
        for rel, fingerprint in data["members"].items():
            tree.members[_text(rel)] = _fingerprint_of(fingerprint)
        tree.dirs = {_inode_of(pair) for pair in data["dirs"]}
        tree.unreadable = {_text(rel): _text(why) for rel, why in data["unreadable"].items()}
        frozen = frozenset(_inode_of(pair) for pair in data["frozen"])
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a snapshot record ({type(exc).__name__}: {exc})") from None
    return Snapshot(root, tree, frozen, (), home=home)


def _fingerprint_record(fingerprint: Fingerprint) -> list[Any]:
    return [fingerprint.kind, *fingerprint.inode, fingerprint.detail]


def _fingerprint_of(data: Any) -> Fingerprint:
    kind, dev, ino, detail = data
    return Fingerprint(_text(kind), _inode_of((dev, ino)), _text(detail))


def _inode_of(pair: Any) -> Inode:
    dev, ino = pair
    if not (type(dev) is int and type(ino) is int):
        raise ValueError("an inode is two integers")
    return dev, ino


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return value
