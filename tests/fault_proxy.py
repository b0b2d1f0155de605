"""The fault proxy the tests put in front of their fake OpenAI server: the one in
corral/acceptance/fault_proxy.py, which the acceptance suite puts in front of a real
server (one copy)."""

from __future__ import annotations

from corral.acceptance.fault_proxy import MAX_PROXIED_RESPONSE, Fault, FaultProxy, ProxyRecord, Selector

__all__ = ["MAX_PROXIED_RESPONSE", "Fault", "FaultProxy", "ProxyRecord", "Selector"]
