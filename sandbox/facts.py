"""The fixed sandbox facts a command's receipt records (seed 004, V1.11): how it ran,
whether it had the network, which backend isolated it and the profile's version.

Derived from the launch mode the handshake reported, never from what was asked:
a sandboxed launch is bubblewrap with every namespace unshared (so no network), an
unsandboxed one (``allow-unsandboxed``) ran on the host with the host's network.
"""

from __future__ import annotations

from typing import TypedDict

from corral.sandbox.bwrap import LaunchMode

#: Bump when what a sandboxed launch may see or do changes (sandbox/bwrap.py).
SANDBOX_PROFILE_VERSION = 1


class SandboxFacts(TypedDict):
    sandboxMode: str
    networkAccess: bool
    sandboxBackend: str
    sandboxProfileVersion: int


def sandbox_facts(mode: LaunchMode) -> SandboxFacts:
    sandboxed = mode is LaunchMode.SANDBOXED
    return {
        "sandboxMode": mode.value,
        "networkAccess": not sandboxed,
        "sandboxBackend": "bubblewrap" if sandboxed else "none",
        "sandboxProfileVersion": SANDBOX_PROFILE_VERSION,
    }
