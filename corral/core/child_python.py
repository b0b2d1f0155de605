"""How corral starts a Python process of its own (supervisor, fork server, actors,
CLI children): never with the project, the spec's directory or the working
directory on its import path (issue 48 A.1; actors/user_code_pins.py says why).

``-P`` keeps the working directory (``-m``) and the script's directory (``-c``) off
``sys.path``. ``PYTHONPATH`` is not passed on as an import path: it travels as
``CORRAL_USER_PATH``, the directories where the user's own modules are found by
file and pinned. ``-E`` would do that too, but it also drops ``PYTHONUNBUFFERED``
and the like, which the parent reading a child's output may rely on.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

#: Where ``PYTHONPATH`` goes in a child's environment: read as user-module roots only.
USER_PATH_ENV = "CORRAL_USER_PATH"

#: Variables that would put directories on a child's import path.
_IMPORT_PATH_VARS = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONINSPECT")


def python_argv(*args: str) -> list[str]:
    """The interpreter corral runs on, with nothing from the working directory or
    the script's directory on its path, followed by ``args`` (``-m module ...``)."""
    return [sys.executable, "-P", *args]


def python_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) for a corral child: ``PYTHONPATH``
    moved to the front of ``USER_PATH_ENV``, and nothing left that would put a
    directory on the child's import path."""
    env = dict(os.environ if base is None else base)
    # Both: a Client.start from within a corral child adds its caller's directories.
    # Absolute: the child works in another directory (a relative entry meant this one's).
    parts = [os.path.abspath(part) for name in ("PYTHONPATH", USER_PATH_ENV)
             for part in env.get(name, "").split(os.pathsep) if part]
    if parts:
        env[USER_PATH_ENV] = os.pathsep.join(dict.fromkeys(parts))
    for name in _IMPORT_PATH_VARS:
        env.pop(name, None)
    return env


def user_path(environ: Mapping[str, str] | None = None) -> list[str]:
    """The user's module directories: ``PYTHONPATH`` (a spec checked in the user's
    own process), then ``USER_PATH_ENV`` (what a corral child was given)."""
    env = os.environ if environ is None else environ
    parts = [part for name in ("PYTHONPATH", USER_PATH_ENV) for part in env.get(name, "").split(os.pathsep) if part]
    return list(dict.fromkeys(parts))


def drop_working_directory() -> None:
    """Take the working directory off ``sys.path`` in a process started without
    ``-P`` (by hand, or by an older corral): it stays off for every lazy import."""
    if sys.flags.safe_path or not sys.path:
        return
    here = os.getcwd()
    if sys.path[0] in ("", here):
        del sys.path[0]
