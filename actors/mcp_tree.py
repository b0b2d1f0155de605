"""A stdio MCP server's process tree ends with the server's actor.

The server runs in a session, so a process group, of its own, and when the
session closes its stdin is closed and the group is signalled only if the server
itself does not exit (actors/mcp_stdio.py). Workers outlive that: those left in
the group by a server that exited cleanly, and those that called setsid() (npx,
uvx and other launchers start such workers), which no signal to the group
reaches.

So the MCP actor is made a child subreaper (``PR_SET_CHILD_SUBREAPER``): an
orphan of the server's tree is re-parented to the actor instead of init, and so
stays among its descendants, whatever session or group it moved to. When the
session ends, the actor ends every descendant it has (it starts nothing but its
server), SIGTERM and a short grace, then SIGKILL, and reaps them.

When the actor itself is SIGKILLed, that clean-up never runs. The server's
group still dies by its launcher's watcher (actors/mcp_launch.py), but a worker
in a session of its own is re-parented past the dead actor. Every process of the
tree carries the tree's tag in its environment (``CORRAL_MCP_TREE``, inherited
unless a worker scrubs its environment), so the next incarnation of the actor
ends them before it starts its own server.

Why not a cgroup, which would hold even a worker that scrubs its environment:
corral's actors run as the user, without the delegated, writable cgroup v2
subtree that would need (a systemd user slice has one; most containers, CI
runners and hybrid v1 hosts do not). The subreaper and the tag work for any user
on Linux 3.4 and later, with nothing to set up.
"""

from __future__ import annotations

import hashlib
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import prctl
import psutil
import trio

#: The environment variable that tags every process of one server's tree.
TAG_VAR = "CORRAL_MCP_TREE"
#: How long the tree gets to exit on SIGTERM before SIGKILL.
GRACE_S = 0.5
#: How long SIGKILLed processes get to die (only an unkillable one runs this out).
KILL_WAIT_S = 3.0
_POLL_S = 0.02


def tree_tag(home: str, server_id: str) -> str:
    """The tag of a server's tree: one per server of one home, the same for every
    incarnation (so a successor finds what a killed predecessor left)."""
    digest = hashlib.sha256(f"{os.path.realpath(home)}\0{server_id}".encode()).hexdigest()[:32]
    return f"{server_id}:{digest}"


class ServerTree:
    """One incarnation's hold on its server's tree (see the module's docstring)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        #: The server's pid, once started: the one child its transport reaps.
        self.server_pid: int | None = None

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """While inside: orphans of the server's tree come to this process. On entry,
        what a killed predecessor left is ended; on exit, even when cancelled, the
        whole tree is."""
        prctl.set_child_subreaper(1)
        await end_tree(self.tag)
        try:
            yield
        finally:
            with trio.CancelScope(shield=True):
                await end_tree(self.tag)

    def reap_orphans(self) -> None:
        """Reap the orphans of the server's tree that exited meanwhile: this process
        adopted them, so their zombies are its to clear. Never the server itself (its
        status is the transport's), and nothing at all if the server is unknown."""
        if self.server_pid is None:
            return
        while True:
            try:
                exited = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if exited is None or exited.si_pid == self.server_pid:
                return
            os.waitpid(exited.si_pid, os.WNOHANG)


async def end_tree(tag: str) -> list[int]:
    """End every descendant of this process and every process tagged ``tag``;
    reap those that are this process's children. Returns the pids that could
    not be confirmed dead (empty when the tree is gone)."""
    tagged = _tagged(tag)  # one scan of the whole process table; descendants are re-read each round
    members = _members(tagged)
    if not members:
        return []
    _signal(members, signal.SIGTERM)
    members = await _wait_gone(tagged, GRACE_S)
    _signal(members, signal.SIGKILL)
    members = await _wait_gone(tagged, KILL_WAIT_S, kill=True)
    return [proc.pid for proc in members]


def _tagged(tag: str) -> list[psutil.Process]:
    """The processes whose environment carries ``tag`` (psutil pins each by pid
    and start time: a recycled pid is never signalled)."""
    found: list[psutil.Process] = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(TAG_VAR) == tag:
                found.append(proc)
        except psutil.Error:  # gone, another user's, or a kernel thread
            continue
    return found


def _members(tagged: list[psutil.Process]) -> list[psutil.Process]:
    """The tree's live processes: this process's descendants (a worker forked
    since the last look included) and the tagged ones."""
    found = {proc.pid: proc for proc in tagged}
    try:
        found.update((proc.pid, proc) for proc in psutil.Process().children(recursive=True))
    except psutil.Error:
        pass
    return [proc for proc in found.values() if _live(proc)]


def _live(proc: psutil.Process) -> bool:
    """Running and not a zombie; a zombie child of ours is reaped on the way."""
    try:
        if not proc.is_running():  # gone, or its pid recycled
            return False
        if proc.status() != psutil.STATUS_ZOMBIE:
            return True
        if proc.ppid() == os.getpid():
            os.waitpid(proc.pid, os.WNOHANG)
    except (psutil.Error, ChildProcessError):
        pass
    return False


def _signal(members: list[psutil.Process], sig: int) -> None:
    for proc in members:
        try:
            proc.send_signal(sig)  # psutil checks the start time first
        except psutil.Error:
            continue


async def _wait_gone(tagged: list[psutil.Process], timeout: float, *, kill: bool = False) -> list[psutil.Process]:
    """Poll until the tree is gone or ``timeout`` passed; what is left. A new
    descendant (a worker that forked while dying) is SIGKILLed at once when ``kill``."""
    with trio.move_on_after(timeout):
        while True:
            members = _members(tagged)
            if not members:
                return []
            if kill:
                _signal(members, signal.SIGKILL)
            await trio.sleep(_POLL_S)
    return _members(tagged)
