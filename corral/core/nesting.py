"""How deep a JSON or TOML text nests, found before any parser sees it.

``json`` and ``tomllib`` recurse once per level: a body 1,000 levels deep (2 KB)
raised RecursionError from inside them, which callers took for a crash (a 500, a
traceback). The depth is bounded here first, by a scan that counts brackets
outside strings (and, for TOML, comments), in C loops only: strings are cut out
by one regex, the brackets kept by another, and the running depth is
``itertools.accumulate``. A text with no more opening brackets than the limit is
not scanned at all.

It is also where a file to be parsed is read (``read_file``, ``read_inside``): a
regular file, opened with ``O_NONBLOCK`` (a FIFO must not wait for a writer) and,
for a workspace file, with ``O_NOFOLLOW`` at every level below the root (a symlink
swapped in after a walk's lstat is refused, never followed), read only up to a cap
(a sparse 64 GiB AGENTS.md costs its cap, not 64 GiB). Bytes first, then depth,
then the parser: docs/security.md, "Hostile workspace".
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: A JSON string, escapes included (the unrolled form: no backtracking per char).
_JSON_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_JSON_OTHER = re.compile(rb"[^\[\]{}]+")
#: TOML strings (multi-line and one-line, basic and literal) and comments.
_TOML_SKIPPED = re.compile(
    r'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'|"[^"\\\n]*(?:\\.[^"\\\n]*)*"|\'[^\'\n]*\'|#[^\n]*'
)
_TOML_OTHER = re.compile(r"[^\[\]{}]+")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class TooDeep(ValueError):
    """``at_least``: the scan stopped at ``depth``; the text may nest deeper still."""

    def __init__(self, depth: int, limit: int, at_least: bool = False) -> None:
        super().__init__(f"nested {depth}{'+' if at_least else ''} levels deep (at most {limit})")
        self.depth = depth
        self.limit = limit


def check_json(text: str | bytes, limit: int) -> None:
    """TooDeep when the arrays and objects of ``text`` nest deeper than ``limit``."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if data.count(b"[") + data.count(b"{") <= limit:
        return  # it cannot nest deeper than it has brackets
    _check(_JSON_OTHER.sub(b"", _JSON_STRINGS.sub(b"", data)), limit)


def check_toml(text: str, limit: int) -> None:
    """TooDeep when the arrays and inline tables of ``text`` nest deeper than
    ``limit`` (a table header's brackets are a level or two, closed on its line)."""
    if text.count("[") + text.count("{") <= limit:
        return
    _check(_TOML_OTHER.sub("", _TOML_SKIPPED.sub("", text)).encode(), limit)


def _check(brackets: bytes, limit: int) -> None:
    depth = max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)
    if depth > limit:
        raise TooDeep(depth, limit)


#: libyaml's own bound (``yaml_set_max_nest_level``'s default): past it, its scanner
#: or parser stops with "exceeded maximum nesting depth".
LIBYAML_MAX_DEPTH = 1000


def yaml_loader() -> type[Any]:
    """libyaml's safe loader when PyYAML was built with it (about 10 times the pure
    parser's speed on a skill's front matter), else the pure-Python one."""
    import yaml

    return getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader


class TooMany(ValueError):
    """A YAML text holds more nodes than its bound (what building it would cost)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} YAML nodes")
        self.limit = limit


def check_yaml(text: str, limit: int, loader: type[Any] | None = None) -> None:
    """TooDeep when the sequences and mappings of the YAML ``text`` nest deeper than
    ``limit``. Every level needs one of ``[{-:?``: a text with no more of them than
    the limit is not parsed at all. Otherwise as ``yaml_nodes``."""
    if sum(text.count(mark) for mark in "[{-:?") <= limit:
        return
    yaml_nodes(text, limit, loader=loader)


def yaml_nodes(text: str, limit: int, most: int | None = None, loader: type[Any] | None = None) -> int:
    """How many nodes (scalars, sequences, mappings, aliases) the YAML ``text`` holds:
    TooDeep when its sequences and mappings nest deeper than ``limit``, TooMany past
    ``most`` nodes. Block style nests without brackets (``- - - x``, indentation), so
    both are counted on the parser's events: the parser is a state machine with its
    own stack (libyaml's, or PyYAML's pure one, as ``yaml_loader`` has it), while the
    pure composer that builds nodes from them recurses once per level (2,000 levels
    raised RecursionError). The scan stops at the first level or node too many;
    libyaml, which scans ahead of the events it hands out, may stop first at its own
    bound (LIBYAML_MAX_DEPTH), reported as too deep too. ``loader``: the parser to
    count with (``yaml_loader()`` when not given). Any other parse error is raised."""
    import yaml  # only a text that could nest deep, or a YAML file read, pays for it

    depth = nodes = 0
    starts, ends = (yaml.SequenceStartEvent, yaml.MappingStartEvent), (yaml.SequenceEndEvent, yaml.MappingEndEvent)
    try:
        for event in yaml.parse(text, Loader=loader or yaml_loader()):
            if isinstance(event, ends):
                depth -= 1
                continue
            if isinstance(event, starts):
                depth += 1
                if depth > limit:
                    raise TooDeep(depth, limit, at_least=True)
            elif not isinstance(event, yaml.NodeEvent):
                continue  # the stream's and documents' own events
            nodes += 1
            if most is not None and nodes > most:
                raise TooMany(most)
    except yaml.MarkedYAMLError as exc:
        if "maximum nesting depth" not in (exc.problem or ""):
            raise
        raise TooDeep(max(depth, LIBYAML_MAX_DEPTH), limit, at_least=True) from None
    return nodes


# -- reading a file to be parsed, bounded --------------------------------------------


class NotReadable(ValueError):
    """The file cannot be read as a plain file (the message says why: missing, a
    symlink on the way, not a regular file, an I/O error)."""


@dataclass(frozen=True)
class Head:
    #: At most the cap's bytes, from the start of the file.
    data: bytes
    #: The file's size when opened (or the bytes read, if it grew).
    size: int
    #: There was more than the cap.
    truncated: bool


_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 16


def read_file(path: Path | str, limit: int, *, follow: bool = True) -> Head:
    """The first ``limit`` bytes of the regular file ``path`` (a spec's script, say).
    ``follow=False``: a symlink as the last component is refused."""
    flags = _FILE_FLAGS if follow else _FILE_FLAGS | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise NotReadable(_why(exc)) from None
    return _read_fd(fd, limit)


def read_inside(root: Path, relative: str, limit: int) -> Head:
    """The first ``limit`` bytes of the regular file ``relative`` below the directory
    ``root`` (a workspace), reached without following a symlink at any level below
    ``root``: each directory is opened from its parent's fd with ``O_NOFOLLOW``, so
    nothing swapped in after a walk's lstat leads elsewhere."""
    parts = [part for part in relative.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        raise NotReadable(f"{relative!r} is not a path below the workspace")
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise NotReadable(_why(exc)) from None
    try:
        for part in parts[:-1]:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise NotReadable(_why(exc, f"{part}/")) from None
            os.close(fd)
            fd = child
        try:
            file_fd = os.open(parts[-1], _FILE_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
        except OSError as exc:
            raise NotReadable(_why(exc)) from None
    finally:
        os.close(fd)
    return _read_fd(file_fd, limit)


def _why(exc: OSError, where: str = "") -> str:
    if exc.errno == errno.ELOOP:
        return f"{where or 'the file'} is a symlink (a symlink is not followed)"
    if exc.errno == errno.ENOTDIR:
        return f"{where or 'the file'} is not a directory (a symlink is not followed)"
    if exc.errno == errno.ENOENT:
        return f"{where or 'the file'} does not exist"
    return f"cannot be read ({exc.strerror or exc})"


def _read_fd(fd: int, limit: int) -> Head:
    """Read and close ``fd``: NotReadable unless it is a regular file."""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotReadable("not a regular file (a FIFO, a device or a directory is not read)")
        chunks: list[bytes] = []
        left = limit + 1  # one byte past the cap says whether there was more
        while left > 0:
            chunk = os.read(fd, min(left, _CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise NotReadable(_why(exc)) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    return Head(data[:limit], max(info.st_size, len(data)), len(data) > limit)
