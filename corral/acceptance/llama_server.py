"""``python -m llama_cpp.server`` on one GGUF, on a free loopback port, for as long as
a ``with`` block lasts: the HTTP route a user's vLLM or Ollama takes. The acceptance
suite's retry points (a fault proxy in front of it), the bench (real_model_swarm's
server rows, through bench/llama_server.py) and tests/test_openai_structured.py start
it the same way: 2 threads (or CORRAL_MODEL_THREADS, if lower) and a 2048-token context,
as the model actor runs it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from corral.core.child_python import python_argv, python_env
from corral.core.model_threads import generation_threads

READY_S = 60.0


class ServerFailed(RuntimeError):
    """The server exited or never answered; the message ends with its log's tail."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def llama_server(model: Path, log: Path) -> Iterator[str]:
    """The server's base URL (``http://127.0.0.1:PORT/v1``) once ``/models`` answers;
    stopped (terminated, then killed) when the block ends."""
    port = _free_port()
    threads = generation_threads(2, os.environ)
    with log.open("wb") as out:
        server = subprocess.Popen(
            python_argv("-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
                        "--port", str(port), "--n_ctx", "2048", "--n_threads", str(threads), "--seed", "0"),
            stdout=out, stderr=subprocess.STDOUT, env=python_env(),
        )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + READY_S
        while True:
            if server.poll() is not None:
                raise ServerFailed(f"llama_cpp.server exited with {server.returncode}: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{base_url}/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise ServerFailed(f"llama_cpp.server not ready within {READY_S:.0f} s: {log.read_text()[-2000:]}")
            time.sleep(0.2)  # polling readiness, bounded by the deadline above
        yield base_url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
