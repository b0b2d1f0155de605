"""What the project tools share: the one path check, the content a change is
compared with, and their bounds."""

from __future__ import annotations

import hashlib
from pathlib import Path

from corral.actors.tools import fs
from corral.actors.tools.base import ToolContext, ToolError

MAX_FILES = 50
#: A file a changeset leaves behind (seed 004 V1.3: "单文件修改后仍受 2 MiB 文本上限约束").
MAX_FILE_BYTES = 2 << 20
MAX_DIFF_CHARS = 60_000


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def target(ctx: ToolContext, relative: str) -> Path:
    """The one path check of the file tools (workspace, home, control paths)."""
    return fs.confined(ctx, relative)


def old_content(ctx: ToolContext, relative: str) -> bytes:
    """The file's bytes as fs.read reads them (no symlink followed at any level, not a
    secret or control file under another name), or b"" when there is no file. The
    hash of these bytes is shown and compared with the caller's: read through a hard
    link to `.env`, it would confirm a guess of the secret."""
    try:
        return fs.read_confined(ctx, relative)
    except ToolError as exc:
        if exc.code == "not-found":
            return b""
        raise


