"""The CLI's control client reports a supervisor that dies mid-call as SupervisorGone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from corral.mailbox.control import ControlClient, SupervisorGone

# A stand-in supervisor: takes one request, then dies without answering.
DIES_ON_REQUEST = """
import os, sys, pynng
with pynng.Rep0() as socket:
    socket.listen(sys.argv[1])
    print("listening", flush=True)
    socket.recv()
    os._exit(9)
"""


def test_a_supervisor_that_dies_mid_call_raises_supervisor_gone(short_tmp: Path) -> None:
    address = f"ipc://{short_tmp}/control.ipc"
    server = subprocess.Popen([sys.executable, "-c", DIES_ON_REQUEST, address], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "listening"
        # Not an ExceptionGroup and not a raw NNGException: the one error callers handle.
        with ControlClient(address, "t" * 64, timeout=60, pid=server.pid) as control, pytest.raises(SupervisorGone):
            control.call("status")
        assert server.wait(timeout=30) == 9
    finally:
        server.kill()
        server.wait()


def test_a_call_to_a_supervisor_already_gone_raises_supervisor_gone(short_tmp: Path) -> None:
    address = f"ipc://{short_tmp}/control.ipc"
    server = subprocess.Popen([sys.executable, "-c", DIES_ON_REQUEST, address], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "listening"
        pid = server.pid
        server.kill()
        server.wait()
        with pytest.raises(SupervisorGone), ControlClient(address, "t" * 64, timeout=60, pid=pid) as control:
            control.call("status")
    finally:
        server.kill()
        server.wait()
