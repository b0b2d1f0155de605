"""Issue 32, cases 20 and 21: bad input is a clear error, never a 500, a traceback or
unbounded memory. Deeply nested JSON and TOML are refused before a parser recurses
into them; a body past the 1 MiB cap is refused while it streams in, and the
server's memory does not grow with it. (The dashboard's side: tests/test_ui.py.)"""

from __future__ import annotations

import http.client
import json
import select
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from corral.supervisor.spec.swarm_spec import SpecError, load_spec
from tests.bridge_harness import Bridge

CORRAL = [sys.executable, "-m", "corral"]
MB = 1 << 20


def _post(bridge: Bridge, body: bytes, token: str | None = None) -> tuple[int, Any]:
    port = int(bridge.url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/rpc", body=body, headers={"Authorization": f"Bearer {token or bridge.tokens['owner']}",
                                                          "Content-Type": "application/json"})
        reply = conn.getresponse()
        text = reply.read()
        return reply.status, json.loads(text) if text.startswith((b"{", b"[")) else text
    finally:
        conn.close()


def _watermark(bridge: Bridge) -> int:
    return int(bridge.client("owner").call("events.open")["watermark"])


# -- case 20: deeply nested JSON and TOML ---------------------------------------------------


def test_the_bridge_answers_a_body_1000_levels_deep_with_a_parse_error(bridge: Bridge) -> None:
    before = _watermark(bridge)
    deep_array = b"[" * 1000 + b"]" * 1000  # 2 KB: a plain-text 500 before
    deep_params = (b'{"jsonrpc": "2.0", "id": 7, "method": "task.create", "params": {"title": "t",'
                   b' "idempotency_key": "deep-key-0001", "body": {"extensions": {"com.example.x": '
                   + b'{"a": ' * 1000 + b"1" + b"}" * 1000 + b"}}}}")
    for body in (deep_array, deep_params, b"[" * 100_000):
        status, reply = _post(bridge, body)
        assert status == 200, (status, reply)
        assert reply["error"]["code"] == -32700 and reply["error"]["data"]["reason"] == "too-deep", reply
    # Nesting a little is fine; the bridge is alive and nothing changed.
    status, reply = _post(bridge, b'[{"jsonrpc": "2.0", "id": 1, "method": "principal.whoami", "params": {}}]')
    assert status == 200 and reply[0]["result"]["principal"] == "owner"
    assert _watermark(bridge) == before
    assert bridge.process is not None and bridge.process.poll() is None


def _deep_spec(params: str) -> str:
    return f"""
[[actors]]
id = "deep"
template = "echo"
params = {{ value = {params} }}
"""


@pytest.mark.parametrize("shape", ["arrays", "inline-tables"])
def test_a_spec_nested_5000_deep_is_a_spec_error_and_creates_nothing(short_tmp: Path, shape: str) -> None:
    deep = "[" * 5000 + "1" + "]" * 5000 if shape == "arrays" else "{ a = " * 5000 + "1" + " }" * 5000
    spec = short_tmp / "deep.toml"
    spec.write_text(_deep_spec(deep))
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    assert "nested 5001 levels deep" in str(caught.value) or "nested 5002 levels deep" in str(caught.value)
    home = short_tmp / "home"
    result = subprocess.run([*CORRAL, "--home", str(home), "up", "--spec", str(spec)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr  # the exit code of a bad spec
    assert "bad spec" in result.stderr and str(spec) in result.stderr and "nested" in result.stderr
    assert "Traceback" not in result.stderr and "RecursionError" not in result.stderr
    assert not home.exists(), "nothing created: no half-made home"
    # An existing home is left as it was.
    home.mkdir(mode=0o700)
    (home / "keep.txt").write_text("mine")
    result = subprocess.run([*CORRAL, "--home", str(home), "up", "--spec", str(spec)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and sorted(p.name for p in home.iterdir()) == ["keep.txt"]


def test_brackets_inside_strings_and_comments_do_not_count(short_tmp: Path) -> None:
    spec = short_tmp / "fine.toml"
    spec.write_text(_deep_spec('"' + "[" * 500 + '"') + "# " + "{" * 500 + "\n")
    assert load_spec(spec).actors[0].params["value"] == "[" * 500


# -- case 21: a body past the cap, refused while it streams -----------------------------------


def _chunks(total: int, size: int = 64 * 1024) -> Iterator[bytes]:
    """``total`` bytes of chunked transfer encoding, made as they are sent."""
    chunk = b"x" * size
    for _ in range(total // size):
        yield f"{size:x}\r\n".encode() + chunk + b"\r\n"
    yield b"0\r\n\r\n"


def stream_post(port: int, path: str, headers: dict[str, str], total: int) -> tuple[int, bytes, int]:
    """POST ``total`` bytes chunked, stopping when the server answers (or stops
    reading): (status, body, bytes sent). Nothing is held in memory here."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n{head}\r\n".encode())
        sent = 0
        for piece in _chunks(total):
            if select.select([sock], [], [], 0)[0]:
                break  # the server has answered (or closed): it refused before the end
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                break
            sent += len(piece)
        sock.settimeout(30)
        reply = http.client.HTTPResponse(sock)
        reply.begin()
        return reply.status, reply.read(), sent
    finally:
        sock.close()


def _rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


def test_the_bridge_refuses_a_200_mb_chunked_body_while_it_streams(bridge: Bridge) -> None:
    assert bridge.process is not None
    port = int(bridge.url.rsplit(":", 1)[1])
    headers = {"Authorization": f"Bearer {bridge.tokens['owner']}", "Content-Type": "application/json"}
    _post(bridge, b'{"jsonrpc": "2.0", "id": 1, "method": "bridge.info"}')  # warm: the app is loaded
    before = _rss(bridge.process.pid)
    status, body, sent = stream_post(port, "/rpc", headers, 200 * MB)
    grown = _rss(bridge.process.pid) - before
    assert grown < 50 * MB, f"the bridge grew by {grown // MB} MB"
    assert status == 413 and sent < 50 * MB, f"refused while the body streamed, not after {sent // MB} MB"
    assert json.loads(body)["error"]["code"] == -32600, body
    # A declared length past the cap is refused before a byte of the body.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest("POST", "/rpc")
        for name, value in {**headers, "Content-Length": str(200 * MB)}.items():
            conn.putheader(name, value)
        conn.endheaders()
        assert conn.getresponse().status == 413
    finally:
        conn.close()
    status, reply = _post(bridge, b'{"jsonrpc": "2.0", "id": 2, "method": "principal.whoami"}')
    assert status == 200 and reply["result"]["principal"] == "owner", "and it serves on"
