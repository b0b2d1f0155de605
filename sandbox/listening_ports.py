"""The loopback TCP ports a launched process tree listens on, where the host can
reach them: the preview registry of ``preview.validate`` (seed 004 V1.1 §3: "Runtime
只验证当前项目 PreviewRegistry 中的精确 loopback URL").

The browser that checks a preview runs in the host's network namespace, so a port
counts only when its socket lives there too: a sandboxed process with its own
network namespace listens where the browser cannot reach, and its ports are not
listed. The tree is found from the direct child the launcher still holds unreaped
(its pid cannot be recycled), so the ports are never another process's.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable

import psutil

#: Listening addresses that accept connections to 127.0.0.1 (the one origin a
#: preview may have): loopback itself and the wildcard addresses.
_REACHABLE_FROM_LOOPBACK = ("0.0.0.0", "::")


def reachable_on_loopback(address: str) -> bool:
    """Whether a socket listening on ``address`` answers ``127.0.0.1``."""
    if address in _REACHABLE_FROM_LOOPBACK:
        return True
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return isinstance(ip, ipaddress.IPv4Address) and ip.is_loopback


def loopback_ports(listening: Iterable[tuple[str, int]]) -> list[int]:
    """The distinct ports, in order, of the ``(address, port)`` pairs a preview on
    127.0.0.1 could be served from."""
    return sorted({port for address, port in listening if reachable_on_loopback(address)})


def _host_network(pid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return False


def tree_loopback_ports(root_pid: int) -> list[int]:
    """The loopback ports ``root_pid`` and its descendants listen on in the host's
    network namespace (empty once the tree is gone)."""
    try:
        root = psutil.Process(root_pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    listening: list[tuple[str, int]] = []
    for process in tree:
        if not _host_network(process.pid):
            continue
        try:
            connections = process.net_connections(kind="tcp")
        except psutil.Error:
            continue  # exited meanwhile, or not ours to read
        listening.extend((c.laddr.ip, c.laddr.port) for c in connections
                         if c.status == psutil.CONN_LISTEN and c.laddr)
    return loopback_ports(listening)
