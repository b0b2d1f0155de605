"""Waiting for processes that are not our children.

A pidfd turns readable when its process exits, reaped or not. That matters here:
a detached supervisor is re-parented to PID 1, and when PID 1 does not reap (as in
many containers) the dead supervisor lingers as a zombie that ``psutil.wait``
would wait on until its timeout.
"""

from __future__ import annotations

import os
import select


def wait_exit(pid: int, timeout: float) -> bool:
    """True once ``pid`` has exited (or never existed); False on timeout."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(max(0, int(timeout * 1000))))
    finally:
        os.close(fd)


def is_alive(pid: int) -> bool:
    return not wait_exit(pid, 0)
