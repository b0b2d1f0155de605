"""The two launch modes for command tests: sandboxed (needs working bubblewrap) and not."""

from __future__ import annotations

import pytest

from corral.sandbox.bwrap import LaunchMode, bwrap_available

needs_bwrap = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap missing or unable to create namespaces")
BOTH_MODES = pytest.mark.parametrize(
    "mode",
    [
        pytest.param(LaunchMode.SANDBOXED, marks=needs_bwrap, id="sandboxed"),
        pytest.param(LaunchMode.UNSANDBOXED, id="unsandboxed"),
    ],
)
