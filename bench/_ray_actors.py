"""Ray actor and task bodies for the peer baseline (imported by Ray's workers, so it
imports nothing but the standard library)."""

from __future__ import annotations

import os


class Echo:
    def __init__(self) -> None:
        self.count = 0

    def ready(self) -> bool:
        return True

    def pid(self) -> int:
        return os.getpid()

    def ping(self, payload: bytes) -> bytes:
        return payload

    def tell(self, payload: bytes) -> None:
        self.count += 1

    def counted(self) -> int:
        return self.count

    def work(self, index: int) -> int:
        return index


def work_task(index: int) -> int:
    return index
