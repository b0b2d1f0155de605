"""Loading user code named by ``module:attribute`` references (actor templates,
providers), with errors that name the reference, the module and the exception.

One loader for every kind of reference, so an actor template and a provider fail
the same way. Where the import happens is the caller's choice: the fork server may
preload a reference (``preload_references``), an actor imports it at start
otherwise; both go through ``load``.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from corral.errors import UserCodeError

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
REFERENCE = re.compile(rf"^{_NAME}(\.{_NAME})*:{_NAME}(\.{_NAME})*$")


def is_reference(text: str) -> bool:
    """A ``module:attribute`` reference, as opposed to a built-in name."""
    return ":" in text


def check_syntax(reference: str) -> None:
    if not REFERENCE.match(reference):
        raise UserCodeError(
            f"{reference!r} is not a reference of the form 'package.module:Name' (dotted module, a colon, a name)"
        )


def load(reference: str) -> Any:
    """Import the module of ``reference`` and return the named attribute."""
    check_syntax(reference)
    module_name, _, qualname = reference.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        where = "" if exc.name == module_name else f" (while importing it: {exc})"
        raise UserCodeError(
            f"cannot import module {module_name!r} for {reference!r}: no module named {exc.name!r}{where};"
            " is it installed, or on PYTHONPATH / next to the spec?"
        ) from exc
    except Exception as exc:
        raise UserCodeError(
            f"importing module {module_name!r} for {reference!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    for part in qualname.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UserCodeError(f"module {module_name!r} has no attribute {qualname!r} (for {reference!r})") from None
    return target


def add_import_path(directory: Path) -> None:
    """Make modules next to a spec importable here and in every process started
    from here (the fork server and exec-launched actors inherit PYTHONPATH)."""
    entry = str(directory.resolve())
    if entry not in sys.path:
        sys.path.insert(0, entry)
    current = [part for part in os.environ.get("PYTHONPATH", "").split(os.pathsep) if part]
    if entry not in current:
        os.environ["PYTHONPATH"] = os.pathsep.join([entry, *current])


def preload_references(references: Iterable[str]) -> list[str]:
    """Import each reference once (the fork server calls this before forking, so
    actors fork with user code loaded). Returns the errors instead of raising: a
    template that fails to import must fail in its actor, where it counts against
    the restart intensity, not take the fork server down."""
    errors = []
    for reference in references:
        try:
            load(reference)
        except UserCodeError as exc:
            errors.append(str(exc))
    return errors


class import_path:
    """Temporarily put ``directory`` first on ``sys.path`` (spec checks import user
    code next to the spec without changing the importing process for good)."""

    def __init__(self, directory: Path) -> None:
        self.entry = str(directory.resolve())
        self.added = False

    def __enter__(self) -> None:
        if self.entry not in sys.path:
            sys.path.insert(0, self.entry)
            self.added = True

    def __exit__(self, *exc: object) -> None:
        if self.added and self.entry in sys.path:
            sys.path.remove(self.entry)
