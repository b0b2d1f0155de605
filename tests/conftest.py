"""Shared fixtures. Every test is checked for leftover processes."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _corral_strays(before: set[int]) -> list[psutil.Process]:
    """Processes started during the test that are still alive: our children, and any
    process that names itself corral:* (daemons detach, so they are not children)."""
    strays = []
    for proc in psutil.process_iter(["pid", "name", "cmdline", "status"]):
        try:
            if proc.pid in before or proc.pid == os.getpid():
                continue
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(proc.info["cmdline"] or [])
            if (
                proc.info["name"].startswith("corral:")
                or cmd.startswith("corral:")
                or proc.pid in _descendants()
            ):
                strays.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return strays


@pytest.fixture(autouse=True)
def no_orphans() -> Iterator[None]:
    before = {p.pid for p in psutil.process_iter()}
    yield
    strays = _corral_strays(before)
    if strays:
        # Gone within a grace period is fine (PDEATHSIG is asynchronous); only
        # processes that survive it are orphans.
        _gone, alive = psutil.wait_procs(strays, timeout=3)
        for proc in alive:
            proc.kill()
        psutil.wait_procs(alive, timeout=3)
        if alive:
            names = ", ".join(f"{p.pid}" for p in alive)
            pytest.fail(f"test left processes behind: {names}")


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temporary directory: ipc:// socket paths must stay under 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="crl-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
