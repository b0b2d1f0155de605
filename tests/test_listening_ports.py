"""The preview registry's ports (sandbox/listening_ports.py): the loopback ports a
launched tree listens on where the host's browser reaches them, read from the
processes' own sockets. Real processes, each reaped here."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from corral.sandbox.listening_ports import loopback_ports, reachable_on_loopback, tree_loopback_ports

#: Listens on ``argv[1]`` (an address) in itself and in a child, prints both ports,
#: then waits for its stdin to close (the test's explicit end, no sleep).
TREE = """
import socket, subprocess, sys
address = sys.argv[1]
own = socket.socket(socket.AF_INET6 if ':' in address else socket.AF_INET)
own.bind((address, 0)); own.listen()
child = subprocess.Popen([sys.executable, '-c', '''
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
print(s.getsockname()[1], flush=True); sys.stdin.read()
'''], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
print(own.getsockname()[1], child.stdout.readline().strip(), flush=True)
sys.stdin.read()
child.stdin.close(); child.wait()
"""


@contextmanager
def _tree(address: str, prefix: tuple[str, ...] = ()) -> Iterator[tuple[subprocess.Popen[str], list[int]]]:
    proc = subprocess.Popen([*prefix, sys.executable, "-c", TREE, address], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # both sockets listen once this line is out
        yield proc, [int(port) for port in line.split()]
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=60)


def test_the_ports_of_a_tree_are_its_own_listening_loopback_ports() -> None:
    with _tree("127.0.0.1") as (proc, ports):
        assert len(ports) == 2
        assert tree_loopback_ports(proc.pid) == sorted(ports)
    assert tree_loopback_ports(proc.pid) == []  # reaped: nothing, never another's


def test_a_wildcard_listener_counts_and_another_address_does_not() -> None:
    with _tree("0.0.0.0") as (proc, ports):
        assert tree_loopback_ports(proc.pid) == sorted(ports)
    assert loopback_ports([("127.0.0.1", 5), ("::", 6), ("::ffff:127.0.0.1", 7), ("::1", 8), ("10.0.0.2", 9),
                           ("192.168.1.4", 10), ("127.0.0.1", 5)]) == [5, 6, 7]
    assert [reachable_on_loopback(a) for a in ("127.0.0.2", "0.0.0.0", "fe80::1%eth0", "not-an-ip")] == [
        True, True, False, False]


def test_a_tree_in_its_own_network_namespace_lists_nothing() -> None:
    """A sandboxed dev server without the host's network listens where the host's
    browser cannot reach: none of its ports is a preview."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here: a second network namespace cannot be made")
    probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"no user and network namespaces here: {probe.stderr.decode()[:200]}")
    with _tree("127.0.0.1", ("unshare", "-rn")) as (proc, ports):
        assert len(ports) == 2
        assert tree_loopback_ports(proc.pid) == []
