"""The processes a test started: this test process's live descendants, except
the long-lived services a session fixture runs (one module, so conftest and the
tests that import it share the one registry)."""

from __future__ import annotations

import psutil

#: Long-lived services a session fixture started (the PostgreSQL server): they and
#: their own children (one backend per connection) are not a test's leftovers.
SERVICE_PIDS: set[int] = set()


def _service_tree() -> set[int]:
    pids = set(SERVICE_PIDS)
    for pid in SERVICE_PIDS:
        try:
            pids.update(child.pid for child in psutil.Process(pid).children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    return pids


def live_descendants() -> list[psutil.Process]:
    alive = []
    services = _service_tree() if SERVICE_PIDS else set()
    for proc in psutil.Process().children(recursive=True):
        if proc.pid in services:
            continue
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            continue
    return alive
