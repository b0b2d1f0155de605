"""The project tree the sandbox tests launch commands in, as a fixture.

Shared by test_sandbox.py and test_sandbox_handshake.py; a module that uses it
imports it under its own name (``import project as project``, which tells ruff the
import is deliberate) so that pytest finds it there.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def project(short_tmp: Path) -> Iterator[Path]:
    root = short_tmp / "proj"
    (root / ".git").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / ".corral").mkdir()
    (root / ".corral" / "ledger.db").write_text("control data\n")
    (root / "src").mkdir()
    yield root
