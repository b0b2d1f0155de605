"""A loopback port when ``bind(127.0.0.1:0)`` found none (seed 004 V1.1 §2).

Port 0 lets the kernel pick from its ephemeral range; only when that bind fails for
want of a free port (``AddrInUse``) does a listener look further, and then only in
the high range 61000-65535, outside the current ephemeral range (whose ports the
kernel hands to outgoing connections), not below the real unprivileged start, and
outside the explicitly reserved ports. The three sysctls are parsed strictly: a
missing or malformed one, or no candidate left, fails closed (``FallbackError``),
never a guess. Each boot starts at its own place in the list (``seed``), so two
supervisors that fell back at once do not race for the same first port; the caller
skips a port that is taken and tries the next.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

HIGH_FIRST = 61000
HIGH_LAST = 65535
SYSCTL_DIR = Path("/proc/sys/net/ipv4")

_NUMBER = re.compile(r"(0|[1-9][0-9]{0,4})")


class FallbackError(RuntimeError):
    """No port can be chosen safely; the message says why."""


def _port(text: str, what: str) -> int:
    if not _NUMBER.fullmatch(text) or int(text) > HIGH_LAST + 1:
        raise FallbackError(f"{what}: {text!r} is not a port number")
    return int(text)


def parse_range(text: str) -> tuple[int, int]:
    """``ip_local_port_range``: two numbers, low before high."""
    parts = text.split()
    if len(parts) != 2:
        raise FallbackError(f"ip_local_port_range: {text.strip()!r} is not two numbers")
    low, high = (_port(part, "ip_local_port_range") for part in parts)
    if low > high or high > HIGH_LAST:
        raise FallbackError(f"ip_local_port_range: {text.strip()!r} is no range of ports")
    return low, high


def parse_start(text: str) -> int:
    """``ip_unprivileged_port_start``: one number (65536 is allowed: none is unprivileged)."""
    return _port(text.strip(), "ip_unprivileged_port_start")


def parse_reserved(text: str) -> list[tuple[int, int]]:
    """``ip_local_reserved_ports``: empty, or comma-separated ports and ``low-high`` ranges."""
    text = text.strip()
    if not text:
        return []
    ranges = []
    for item in text.split(","):
        low, dash, high = item.partition("-")
        first = _port(low, "ip_local_reserved_ports")
        last = _port(high, "ip_local_reserved_ports") if dash else first
        if first > last or last > HIGH_LAST:
            raise FallbackError(f"ip_local_reserved_ports: {item!r} is no range of ports")
        ranges.append((first, last))
    return ranges


def candidates(
    ephemeral: tuple[int, int], unprivileged: int, reserved: Sequence[tuple[int, int]], seed: int
) -> list[int]:
    """The high ports a listener may try, in order, starting at this boot's place."""
    ports = [
        port
        for port in range(max(HIGH_FIRST, unprivileged), HIGH_LAST + 1)
        if not ephemeral[0] <= port <= ephemeral[1] and not any(low <= port <= high for low, high in reserved)
    ]
    if not ports:
        raise FallbackError(
            f"no candidate port in {HIGH_FIRST}-{HIGH_LAST} outside the ephemeral range"
            f" {ephemeral[0]}-{ephemeral[1]}, below the unprivileged start {unprivileged} and the"
            " reserved ports"
        )
    start = seed % len(ports)
    return ports[start:] + ports[:start]


def read_candidates(sysctl: Path = SYSCTL_DIR, *, seed: int) -> list[int]:
    """The candidates from this host's three sysctls (strictly: any problem fails closed)."""
    texts = []
    for name in ("ip_local_port_range", "ip_unprivileged_port_start", "ip_local_reserved_ports"):
        try:
            texts.append((sysctl / name).read_text(encoding="ascii"))
        except (OSError, UnicodeDecodeError) as exc:
            raise FallbackError(f"{name} cannot be read: {exc}") from None
    return candidates(parse_range(texts[0]), parse_start(texts[1]), parse_reserved(texts[2]), seed)
