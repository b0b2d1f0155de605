"""The far end of the raw pynng baselines: ``python -m bench._child MODE ADDR ...``.

Modes:
  rep ADDR               Rep0 echo server, synchronous pynng
  rep_trio ADDR          Rep0 echo server, pynng's async API under trio
  pull ADDR COUNT BATCH  Pull0 sink: after COUNT messages (frames of BATCH msgpack'd
                         messages when BATCH > 1) print "done", then start over

Each mode listens, prints "ready", and exits when stdin closes or its parent dies
(PR_SET_PDEATHSIG). It imports nothing from the harness so that it stays bare.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

import pynng

PR_SET_PDEATHSIG = 1
RECV_TIMEOUT_MS = 60_000


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _exit_on_stdin_eof() -> None:
    def watch() -> None:
        while sys.stdin.buffer.read(4096):
            pass
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def _ready() -> None:
    sys.stdout.write("ready\n")
    sys.stdout.flush()


def rep(addr: str) -> None:
    with pynng.Rep0(listen=addr, recv_timeout=RECV_TIMEOUT_MS) as sock:
        _ready()
        while True:
            sock.send(sock.recv())


def rep_trio(addr: str) -> None:
    import trio

    async def serve() -> None:
        with pynng.Rep0(listen=addr) as sock:
            _ready()
            while True:
                msg = await sock.arecv()
                await sock.asend(msg)

    trio.run(serve)


def pull(addr: str, count: int, batch: int) -> None:
    import msgpack

    with pynng.Pull0(listen=addr, recv_timeout=RECV_TIMEOUT_MS) as sock:
        _ready()
        while True:
            got = 0
            while got < count:
                frame = sock.recv()
                got += len(msgpack.unpackb(frame)) if batch > 1 else 1
            sys.stdout.write("done\n")
            sys.stdout.flush()


def main(argv: list[str]) -> None:
    _die_with_parent()
    _exit_on_stdin_eof()
    mode, addr, *rest = argv
    if mode == "rep":
        rep(addr)
    elif mode == "rep_trio":
        rep_trio(addr)
    elif mode == "pull":
        pull(addr, int(rest[0]), int(rest[1]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except pynng.Timeout:
        os._exit(3)
