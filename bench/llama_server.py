"""``python -m llama_cpp.server`` for the bench: the one starter, in
corral/acceptance/llama_server.py (the acceptance suite's retry points need it too)."""

from __future__ import annotations

from corral.acceptance.llama_server import READY_S, ServerFailed, llama_server

__all__ = ["READY_S", "ServerFailed", "llama_server"]
