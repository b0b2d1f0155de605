"""The public surface: ``corral.__all__`` resolves, is typed where it matters, and
``import corral`` loads nothing heavy and has no import cycle."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import corral

HEAVY = ("trio", "pynng", "pydantic", "msgpack", "psutil", "sqlite3", "jsonschema")


def _run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return result.stdout


def test_import_corral_loads_nothing_heavy() -> None:
    # A fresh interpreter: this test process has imported everything already.
    code = f"import json, sys, corral; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    loaded = json.loads(_run(code))
    assert loaded == []


def test_import_time_is_measured_as_a_fact() -> None:
    # -X importtime's cumulative microseconds for the package itself; reported, not
    # asserted against a wall clock (see docs/extending.md for the figure).
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import corral"], capture_output=True, text=True, check=True
    )
    rows = [line.split("|") for line in result.stderr.splitlines() if line.rstrip().endswith("| corral")]
    assert len(rows) == 1
    print(f"import corral: {int(rows[0][1])} us cumulative")


def test_every_public_name_resolves_without_cycles() -> None:
    for name in corral.__all__:
        # Each in a fresh interpreter, so an import cycle reachable from one name shows.
        out = _run(f"import corral; value = corral.{name}; print(type(value).__name__)")
        assert out.strip(), name
    assert sorted(corral.__all__) == sorted(set(corral.__all__)), "no duplicates"
    assert set(dir(corral)) >= set(corral.__all__)


def test_unknown_names_are_attribute_errors() -> None:
    with pytest.raises(AttributeError, match="no attribute 'client_types'"):
        corral.__getattr__("client_types")
    with pytest.raises(AttributeError):
        corral.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018


def test_every_error_a_user_catches_is_a_corral_error() -> None:
    for name in (
        "SpecError",
        "NotRunning",
        "SupervisorGone",
        "ControlError",
        "DeadlineExceeded",
        "RunFailed",
        "RunTimeout",
        "UserCodeError",
        "SupervisorStartError",
    ):
        assert issubclass(getattr(corral, name), corral.CorralError), name
    # Existing callers that catch the standard bases keep working.
    assert issubclass(corral.SpecError, ValueError)
    assert issubclass(corral.SupervisorGone, ConnectionError)
    assert issubclass(corral.DeadlineExceeded, TimeoutError)


def test_public_classes_and_functions_are_documented() -> None:
    for name in corral.__all__:
        if name.startswith("__") or name == "PROTOCOL_VERSION":
            continue
        value = getattr(corral, name)
        assert (value.__doc__ or "").strip(), f"corral.{name} has no docstring"


def test_the_ground_every_layer_imports_never_loads_the_public_roof() -> None:
    """corral.core sits inside the package whose __init__ is the public API. Importing
    it runs that __init__, which is lazy: so a core module may load only corral.core
    itself, never the client, the CLI or any layer above it."""
    code = (
        "import importlib, json, pkgutil, sys, corral.core as core\n"
        "out = {}\n"
        "for info in pkgutil.iter_modules(core.__path__, 'corral.core.'):\n"
        "    importlib.import_module(info.name)\n"
        "out = sorted(m for m in sys.modules if m.startswith('corral') and m != 'corral'"
        " and not m.startswith('corral.core'))\n"
        "print(json.dumps(out))\n"
    )
    assert json.loads(_run(code)) == []
