"""Where sockets live: ipc:// under the home directory, or tcp on loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# sockaddr_un.sun_path is 108 bytes including the terminating NUL.
MAX_IPC_PATH = 107


class AddressError(ValueError):
    pass


def ipc_address(path: Path) -> str:
    text = str(path)
    if len(text.encode()) > MAX_IPC_PATH:
        raise AddressError(
            f"socket path {text!r} is {len(text.encode())} bytes; ipc:// allows {MAX_IPC_PATH}."
            ' Use a shorter --home, or transport = "tcp" in the swarm spec.'
        )
    return f"ipc://{text}"


def tcp_loopback_address(port: int = 0) -> str:
    return f"tcp://127.0.0.1:{port}"


def check_local(address: str) -> str:
    """Refuse anything that is not ipc:// or loopback tcp: corral never serves a network."""
    if address.startswith("ipc://"):
        return address
    if address.startswith("tcp://127.0.0.1:") or address.startswith("tcp://[::1]:"):
        return address
    raise AddressError(f"address {address!r} is neither ipc:// nor loopback tcp")


def bound_tcp_address(listener: Any) -> str:
    """The real address of a listener bound to port 0. (pynng's ``TCPAddr.port``
    is in network byte order; its ``str()`` is the usable host:port.)"""
    return f"tcp://{listener.local_address}"
