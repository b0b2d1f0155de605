"""The credentials an MCP server's ``env`` and ``headers`` name as ``${NAME}``.

Seed 004 V1.22: the project's configuration, a ``.env`` file and the host's
environment are never a credential fallback. The one place is the user's private
credentials file, ``$XDG_CONFIG_HOME/corral/mcp-credentials.toml`` (else
``~/.config/corral/...``): flat ``NAME = "value"`` lines, a regular file of mode
0600, read like every other secret file (corral/core/private_file.py). Only the
server's actor reads it, so no value reaches the spec, the ledger or a log.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path

from corral.core.private_file import PrivateFileError, read_private_file

FILE_NAME = "mcp-credentials.toml"
#: A credentials file past this is not one.
MAX_FILE_BYTES = 64 * 1024
WHAT = "the MCP credentials file"
VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]{0,63})\}")


class CredentialsError(ValueError):
    """What is wrong; the message names the name and the file, never a value."""


class Credentials:
    """The names the file holds, or why it could not be read (a missing file
    is no error until a name is asked of it)."""

    def __init__(self, values: Mapping[str, str], missing: bool) -> None:
        self._values = dict(values)
        self.missing = missing

    def get(self, name: str) -> str | None:
        return self._values.get(name)


def credentials_file(environ: Mapping[str, str]) -> Path:
    """Where the user's credentials file is: a location, not a secret. A relative
    ``XDG_CONFIG_HOME`` is invalid under the XDG spec and ignored."""
    config = environ.get("XDG_CONFIG_HOME", "")
    base = Path(config) if config and Path(config).is_absolute() else Path(environ.get("HOME", "~")) / ".config"
    return base.expanduser() / "corral" / FILE_NAME


def read_credentials(path: Path) -> Credentials:
    """The file's names; a file open to group or others, not regular, too large,
    not TOML or holding a non-string is refused whole."""
    try:
        raw = read_private_file(path, WHAT, MAX_FILE_BYTES)
    except PrivateFileError as exc:
        if not path.exists() and not path.is_symlink():
            return Credentials({}, missing=True)
        raise CredentialsError(str(exc)) from None
    try:
        table = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        # Not the parser's words: they may quote the file.
        raise CredentialsError(f'{WHAT} {path} is not valid TOML (NAME = "value" lines)') from None
    for name, value in table.items():
        if not isinstance(value, str):
            raise CredentialsError(f'{WHAT} {path}: {name} must be a string (NAME = "value")')
    return Credentials(table, missing=False)


def expand_credentials(template: str, credentials: Credentials, path: Path) -> str:
    """``template`` with each ``${NAME}`` taken from the file; a name it lacks is
    an error naming the name, the file and the fix."""

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        value = credentials.get(name)
        if value is None:
            why = "which does not exist" if credentials.missing else "which does not define it"
            raise CredentialsError(
                f"${{{name}}} is not in {WHAT} {path} ({why}); the host environment is never used for"
                f' credentials: add {name} = "..." to that file and `chmod 600` it'
            )
        return value

    return VAR.sub(sub, template)
