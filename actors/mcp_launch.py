"""The launcher every stdio MCP server is started through: the server dies with
its actor, even when the actor is SIGKILLed.

    python -I -S mcp_launch.py ACTOR_PID PROGRAM [ARGS...]

It forks a watcher, then execs PROGRAM in its own place, so the server keeps
this process's pid: it stays the SDK's child and the leader of the process group
the SDK gave it. The watcher holds a pidfd of the actor and one of the server.
If the actor exits first, the watcher SIGKILLs the server's process group (which
it is in itself); if the server exits first, the watcher just exits.

Why not ``PR_SET_PDEATHSIG`` (``setpriv --pdeathsig``), the kernel's own way:
the signal follows the *thread* that forked, not the process. trio forks a
subprocess from a worker thread of its thread cache, and that thread exits
after 10 s idle, so every server was SIGKILLed 10 s after its start unless
something kept the thread busy: healthy, and sometimes in the middle of a call
(issue 48, D.12: "Connection closed" on a loaded machine).

The watcher cannot reach a worker of the server that moved to a session of its
own; the actor's subreaper and the tree's tag do (actors/mcp_tree.py). Only the
standard library is used here: this runs isolated (``-I -S``) before anything
of the user's server.
"""

from __future__ import annotations

import os
import select
import signal
import sys

#: Exit code when the actor is already gone (the server is never started).
EXIT_ORPHANED = 125
#: Exit code when the arguments make no sense (a caller's bug).
EXIT_USAGE = 126


def _quiet_fds(keep: tuple[int, ...]) -> None:
    """The watcher holds none of the server's pipes: the actor sees the server's
    stdout close when the server exits, not when the watcher does."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _watch(actor: int, server: int, server_pid: int) -> None:
    """Wait for the first of the two to exit; on the actor's exit, end the server's group."""
    _quiet_fds((actor, server))
    poller = select.poll()
    poller.register(actor, select.POLLIN)
    poller.register(server, select.POLLIN)
    while True:
        try:
            ready = {fd for fd, _ in poller.poll()}
        except InterruptedError:
            continue
        if server in ready:
            os._exit(0)
        if actor in ready:
            # The group cannot have been recycled: this watcher is in it.
            try:
                os.killpg(server_pid, signal.SIGKILL)
            finally:
                os._exit(0)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or not argv[1].isdigit():
        print("usage: mcp_launch.py ACTOR_PID PROGRAM [ARGS...]", file=sys.stderr)
        return EXIT_USAGE
    actor_pid, command = int(argv[1]), argv[2:]
    try:
        actor = os.pidfd_open(actor_pid)
    except ProcessLookupError:
        return EXIT_ORPHANED
    # After the pidfd is held: the actor is still our parent, so the pidfd is its.
    if os.getppid() != actor_pid:
        return EXIT_ORPHANED
    server_pid = os.getpid()  # the server's, once it is exec'd here
    server = os.pidfd_open(server_pid)
    if os.fork() == 0:
        _watch(actor, server, server_pid)
    os.close(actor)
    os.close(server)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"cannot start {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126


if __name__ == "__main__":
    sys.exit(main(sys.argv))
