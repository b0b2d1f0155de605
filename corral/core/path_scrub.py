"""Absolute paths in text the model wrote or will read (seed 004: V1.6 "上下文清洗
覆盖 Unix、Windows 盘符、正反斜杠 UNC、file:/...、file:///... 和百分号编码的 file:
URI，绝对路径统一替换为 <absolute-path>，同时保留普通相对文本与 HTTP(S) URL"; V1.41
"依次过滤密钥、项目路径和其它绝对路径"; V1.43 "结构化可执行路径/命令参数中的项目及
其它绝对路径 ... 失败关闭").

One finder, :data:`ABSOLUTE_PATH`, serves all three: :func:`scrub_paths` rewrites a
text (the project's root as ``<project>``, every other absolute path as
``<absolute-path>``), :func:`absolute_paths_in` says whether a command's argument
names one. Secrets are another filter's job (corral/core/redact.py), applied first.

An absolute path starts where no word, path or URL character precedes it: so
``and/or``, ``1/2``, ``s/a/b/``, ``</div>``, ``<project>/src`` and the path of
``https://host/a/b`` are not paths, while ``/etc/hosts``, ``C:\\Users``,
``\\\\server\\share``, ``file:///opt/x``, ``file:%2Fetc``, ``file%3A%2F%2F%2Fetc`` and
a path glued to an option (``-isystem/usr/include``, ``-Wl,-rpath,/usr/lib``) are.
Unquoted, a Unix path ends at a space (``cp /tmp/a src/b`` keeps ``src/b``) unless
the path with the next name is the project's or exists on this host
(``/home/John Smith/x`` is one path).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable

PROJECT = "<project>"
ABSOLUTE = "<absolute-path>"

#: What a path may hold after its start (no spaces: text after a space is text, so a
#: path with one is whole when quoted, below, or when this host has it: ``_across_spaces``).
_BODY = r"[\w.\-~+@%/\\:$]*"
#: What may not stand right before a path's start: a word or a path (``and/or``,
#: ``1/2``), a URL's scheme or host, or one of this filter's own placeholders
#: (``<project>/src``). A redirection (``2>/tmp/x``, ``</etc/x``) may.
_NOT_AFTER = r"(?<![\w.\-~+@%/\\$])(?<!<project>)(?<!<absolute-path>)(?<!<url>)"
#: A closing tag (``</div>``) is no path: its one segment ends at ``>``.
_NOT_TAG = r"(?![\w.\-]*>)"
#: A Windows path's body: it goes on past a space while the next word goes on as a
#: path (``C:\\Users\\John Smith\\x``); a Unix path stops at one (``cp /tmp/a src/b``).
_WIN_BODY = r"(?:[\w.\-~+@%/\\:$]|[ ](?=[\w.\-~+@%$]+\\))*"
#: curl's ``@file`` (``-d @/etc/passwd``): an ``@`` starting a word.
_AFTER_AT = r"(?:(?<=\s@)|(?<=^@)|(?<==@))"
#: An option glued to its value, one letter or more, or a linker's comma list
#: (``-I/usr/include``, ``-isystem/usr/include``, ``--prefix/usr``,
#: ``-Wl,-rpath,/usr/lib``, ``-oC:\\out``): the option is kept, its value is a path.
#: A value starting with ``-`` is another option (``-v/--verbose``).
_OPTION = r"(?P<option>(?:(?<=[\s\"'`(\[])|^)--?[A-Za-z][\w\-]*?(?:,[\w\-]+)*,?)"

#: An HTTP(S) URL is kept whole, its path and query too ("保留 ... HTTP(S) URL").
_URL = r"(?P<url>(?i:https?)://[^\s\"'<>`)\]]*)"
ABSOLUTE_PATH = re.compile(
    "|".join(
        (
            _URL,
            # Quoted, a path runs to its closing quote, spaces and all.
            r"""(?<=(?P<quote>["'`]))(?:/|[A-Za-z]:[\\/]|\\\\)(?=[\w.~\-$%])[^"'`\n]*(?=(?P=quote))""",
            rf"(?i:file):(?:/|%2[fF]|\\){_BODY}",  # file:/x, file:///x, file:%2Fx
            rf"(?i:file%3A)(?:%2[fF]|%5[cC]){_BODY}",  # file%3A%2F%2F%2Fx: encoded whole
            rf"{_OPTION}(?:/(?=[\w.~]){_BODY}|[A-Za-z]:[\\/]{_WIN_BODY})",  # -isystem/usr/include
            rf"{_NOT_AFTER}[A-Za-z]:[\\/]{_WIN_BODY}",  # C:\x, C:/x
            rf"{_NOT_AFTER}\\\\[\w.$\-?]+{_WIN_BODY}",  # \\server\share, \\?\C:\x
            rf"{_NOT_AFTER}(?P<unix>/{_NOT_TAG}(?=[\w.~\-]|/[\w.~\-]){_BODY})",  # /x, //server/share
            rf"{_AFTER_AT}/(?=[\w.~\-]){_BODY}",  # @/etc/passwd
        )
    )
)
#: A sentence's punctuation after a path is not part of it ("see /srv/p.").
_TRAILING = ".,;:"


def _project_roots(roots: Iterable[str]) -> list[str]:
    # "/" alone as a root would turn every path into the project; longest first, so
    # a nested root wins.
    cleaned = {root.rstrip("/\\") for root in roots if root}
    return sorted((root for root in cleaned if len(root) > 1), key=len, reverse=True)


def _path_start(match: re.Match[str]) -> int:
    """Where the path of ``match`` starts: after the option it is glued to, if any."""
    return match.end("option") if match.group("option") is not None else match.start()


def _replace(text: str, start: int, end: int, roots: list[str]) -> str:
    path = text[start:end]
    kept = len(path.rstrip(_TRAILING))
    path, tail = path[:kept], path[kept:]
    for root in roots:
        if path == root or path.startswith((root + "/", root + "\\")):
            return PROJECT + path[len(root) :] + tail
    return ABSOLUTE + tail


#: The next word after a space, up to the next slash: a directory's or a file's name
#: with a space in it (``/home/John Smith/x``), if this host has it.
_NEXT_NAME = re.compile(r" [^\s/\\\"'`<>|;&]+")
_BODY_AT = re.compile(_BODY)
#: How many such names one text may look up on the host: a bound on what a long,
#: space-filled text costs (one ``lstat`` each).
MAX_LOOKUPS = 64


class _Lookups:
    """The host lookups one text has left (:data:`MAX_LOOKUPS`)."""

    def __init__(self) -> None:
        self.left = MAX_LOOKUPS

    def names_a_place(self, path: str, roots: list[str]) -> bool:
        """Whether ``path`` is the project's (the root, a directory above it or a path
        under it) or exists on this host."""
        if any(root == path or root.startswith(path + "/") or path.startswith(root + "/") for root in roots):
            return True
        if self.left <= 0:
            return False
        self.left -= 1
        return os.path.lexists(path)


def _across_spaces(text: str, start: int, end: int, roots: list[str], lookups: _Lookups) -> int:
    """Where the Unix path at ``start`` ends. Unquoted, text after a space is text
    (``cp /tmp/a src/b``), unless the path with the next name is one this host or
    the project has (``/home/John Smith/x``): then the path goes on, its tail too."""
    while (name := _NEXT_NAME.match(text, end)) is not None:
        if not lookups.names_a_place(text[start : name.end()].rstrip(_TRAILING), roots):
            break
        body = _BODY_AT.match(text, name.end())
        end = body.end() if body is not None else name.end()
    return end


def _spans(text: str, roots: list[str]) -> list[tuple[int, int, int]]:
    """Each absolute path of ``text`` as (where its match starts, where its path
    starts, where it ends); URLs are not paths."""
    spans = []
    lookups = _Lookups()
    position = 0
    while (match := ABSOLUTE_PATH.search(text, position)) is not None:
        start, end = _path_start(match), match.end()
        position = end
        if match.group("url") is not None:
            continue
        if text.startswith("/", start) and match.group("quote") is None:
            end = position = _across_spaces(text, start, end, roots, lookups)
        spans.append((match.start(), start, end))
    return spans


#: Any URL a provider's failure names (its endpoint, a gateway's status page).
_ANY_URL = re.compile(r"(?i:https?|wss?)://[^\s\"'<>`)\]]*")
URL = "<url>"


def scrub_urls(text: str) -> str:
    """``text`` with every http(s)/ws(s) URL as ``<url>``: a provider failure is
    stored and shown naming the provider, never where it lives (seed 004 V1.41:
    "Provider URL ... 公共泄漏均为 0"). The spec holds the address."""
    return _ANY_URL.sub(URL, text) if "://" in text else text


def scrub_paths(text: str, project_roots: Iterable[str] = ()) -> str:
    """``text`` with a project root (and what lies under it) as ``<project>`` and
    every other absolute path as ``<absolute-path>``."""
    if not any(mark in text for mark in "/\\:%"):
        return text
    roots = _project_roots(project_roots)
    pieces, done = [], 0
    for _, start, end in _spans(text, roots):
        pieces += [text[done:start], _replace(text, start, end, roots)]
        done = end
    return "".join(pieces) + text[done:]


#: An option's or an assignment's name before its value (``--config=``, ``PATH=``),
#: or a one-letter option glued to it (``-I/usr/include``, ``-oC:\\out``).
_NAMED_VALUE = re.compile(
    r"-{0,2}[A-Za-z_][\w.\-]*=|--?[A-Za-z][\w\-]*?(?:,[\w\-]+)*,?(?=/[\w.~]|[A-Za-z]:[/\\]|file:)"
)
#: Device files that name no place of the host's or the project's: a command that
#: writes to /dev/null leaks nothing and reaches nothing.
_STREAMS = frozenset({"/dev/null", "/dev/stdin", "/dev/stdout", "/dev/stderr"})


#: The top directories of a Unix host. An argument under one of them (or under
#: another top directory this host has) names a place of the host; one under none
#: (``/api/users``, a route a command searches for) is no path of it.
_HOST_TOP = frozenset(
    {
        "bin",
        "boot",
        "dev",
        "etc",
        "home",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "media",
        "mnt",
        "nix",
        "opt",
        "proc",
        "root",
        "run",
        "sbin",
        "snap",
        "srv",
        "sys",
        "tmp",
        "usr",
        "var",
        "workspace",
        "Users",
        "Volumes",
    }
)


@functools.cache
def _host_top() -> frozenset[str]:
    try:
        return _HOST_TOP | frozenset(os.listdir("/"))
    except OSError:
        return _HOST_TOP


def _names_host_place(path: str) -> bool:
    """A Unix path under one of the host's top directories; any other kind (a drive
    letter, UNC, ``file:``) always names a place."""
    if not path.startswith("/") or path.startswith("//"):
        return True
    top = path[1:].split("/", 1)[0]
    return top in _host_top()


def names_absolute_path(argument: str) -> bool:
    """Whether a structured argument *is* an absolute path of the host: whole, or as
    the value of an option or an assignment (``--config=/etc/x``, ``PATH=/usr/bin``,
    ``-I/usr/include``), under one of the host's top directories (so ``grep
    /api/users`` searches as before). A script that holds one is
    :func:`holds_host_path`'s."""
    named = _NAMED_VALUE.match(argument)
    value = argument[named.end() :] if named else argument
    match = ABSOLUTE_PATH.match(value)
    if match is None or match.group("url") is not None:
        return False
    path = match.group(0).rstrip(_TRAILING)
    return path not in _STREAMS and _names_host_place(path)


def holds_host_path(text: str) -> bool:
    """Whether ``text`` (a script a command runs: ``sh -c``, ``python3 -c``) names an
    absolute path of the host anywhere in it: the seed's command takes no shell, so a
    script's paths are the command's arguments (V1.43). ``/dev/null``, a route under no
    top directory of the host (``/api/users``), ``</div>`` and URLs are not."""
    return any(path not in _STREAMS and _names_host_place(path) for path in absolute_paths_in(text))


def absolute_paths_in(text: str) -> list[str]:
    """The absolute paths ``text`` names (their spelling), in order."""
    return [
        match.group(0)[_path_start(match) - match.start() :].rstrip(_TRAILING)
        for match in ABSOLUTE_PATH.finditer(text)
        if match.group("url") is None
    ]
