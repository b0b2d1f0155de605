"""A launched tree: the direct child (bwrap or the trampoline), the target's process
group and, when sandboxed, the sandbox's pid 1; how it is signalled, waited for,
killed and reaped, and the tree guard's check once it is dead. Also the errors a
launch raises. sandbox/exec_handshake.py launches it.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

import psutil
import trio

from .bwrap import LaunchMode
from .guard_record import GuardRecord
from .listening_ports import tree_loopback_ports
from .trampoline import MSG_EXEC_FAILED
from .tree_guard import GuardReport, Snapshot


class LaunchError(RuntimeError):
    """A launch that did not establish the target; ``code`` is machine-readable.

    ``tree_reaped`` says whether the launched tree was confirmed dead afterwards.
    """

    code = "launch-failed"

    def __init__(self, message: str, *, tree_reaped: bool = True) -> None:
        super().__init__(message)
        self.tree_reaped = tree_reaped


class HandshakeError(LaunchError):
    """The trampoline did not follow the protocol (wrong nonce, EOF, timeout, setup)."""

    code = "handshake-failed"


class TargetExecFailed(LaunchError):
    """COMMIT_EXEC was sent and execve failed; ``errno`` is the execve error."""

    code = "target-exec-failed"

    def __init__(self, err: int, argv0: str, *, tree_reaped: bool = True) -> None:
        super().__init__(
            f"{MSG_EXEC_FAILED} {err}: cannot execute {argv0!r}: {os.strerror(err)}",
            tree_reaped=tree_reaped,
        )
        self.errno = err


_REAP_TIMEOUT_S = 5.0


def exit_code_of(returncode: int) -> int:
    """Shell convention, identical in both modes: bwrap reports a target killed by
    signal N as 128+N, so a direct child's -N is mapped the same way."""
    return 128 - returncode if returncode < 0 else returncode


async def _wait_pidfd(pidfd: int) -> None:
    # A private dup per waiter: trio allows one reader per fd, and several tasks (the
    # session's waiter, a terminate) may wait for the same process.
    fd = os.dup(pidfd)
    try:
        await trio.lowlevel.wait_readable(fd)
    finally:
        trio.lowlevel.notify_closing(fd)
        os.close(fd)


def _pidfd_signal(pidfd: int | None, sig: int) -> None:
    if pidfd is None:
        return
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        pass


def _pidfd_exited(pidfd: int) -> bool:
    """Has the process exited (zombie or gone)? Does not reap."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def _status_to_code(result: os.waitid_result) -> int:
    if result.si_code == os.CLD_EXITED:
        return result.si_status
    return 128 + result.si_status


class _Gone(HandshakeError):
    """A process we were about to pin had already exited and been reaped."""


class LaunchedProcess:
    """The launched tree: the direct child (bwrap or the trampoline), the target's
    process group and, when sandboxed, the sandbox's pid 1.

    Killing the sandbox's pid 1 tears down its pid namespace, which reaches every
    process inside, including ones that called setsid(); unsandboxed, the group and
    the descendants still attached to the target are all that can be reached.

    Signals never go to a bare pid that might have been recycled: single processes
    are signalled through pidfds, and the group only while its number is pinned
    (unsandboxed, the leader is our child and stays unreaped until the group is
    confirmed empty; sandboxed, only while the target itself has not exited).
    """

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        launch_mode: LaunchMode,
        argv: Sequence[str],
        cwd: Path,
    ) -> None:
        self._popen = popen
        self._pidfd = os.pidfd_open(popen.pid)
        self.launch_mode = launch_mode
        self.argv = tuple(argv)
        self.cwd = cwd
        self.pid: int | None = None
        self.pgid: int | None = None
        self.pid_namespace: int | None = None
        self._target_fd: int | None = None
        self._ns_init_fd: int | None = None
        self._exit_code: int | None = None
        self.exec_established = False
        self._closed = False
        #: The project's git control entries at launch (sandboxed launches only), and
        #: what the check after the tree's death removed: see sandbox/tree_guard.py.
        self.guard: Snapshot | None = None
        self.guard_report: GuardReport | None = None
        #: The snapshot on disk while the command runs (sandbox/guard_record.py): if
        #: this process dies first, the next launch runs the check.
        self._guard_record: GuardRecord | None = None
        self._commit_sent = False
        self._guard_final = False

    # -- identification (launch_with_handshake fills these in) -------------------------

    def _attach_namespace_init(self, pid: int, pid_namespace: int | None) -> None:
        self.pid_namespace = pid_namespace
        try:
            self._ns_init_fd = self._pinned_pidfd(pid, self._popen.pid, "sandbox init")
        except _Gone:
            # Already exited and reaped by bwrap: its namespace is gone with it, and
            # the report channel's EOF will say why.
            self._ns_init_fd = None

    def _pinned_pidfd(self, pid: int, parent: int, what: str) -> int:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            raise _Gone(f"{what} {pid} exited during the handshake") from None
        try:
            # The pidfd pins the process; checking its parent after opening it proves
            # the number was not recycled between learning it and opening it.
            if psutil.Process(pid).ppid() != parent:
                raise HandshakeError(f"{what} {pid} is not where it should be")
        except psutil.Error as exc:
            os.close(fd)
            raise HandshakeError(f"{what} {pid} vanished: {exc}") from None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _identify_target(self) -> None:
        if self.launch_mode is LaunchMode.UNSANDBOXED:
            pid = self._popen.pid
            self._target_fd = self._pidfd
        else:
            if self._ns_init_fd is None:
                raise HandshakeError("sandbox init pid unknown")
            init_pid = self._pid_of(self._ns_init_fd)
            try:
                children = psutil.Process(init_pid).children()
            except psutil.Error as exc:
                raise HandshakeError(f"sandbox init vanished: {exc}") from None
            if len(children) != 1:
                raise HandshakeError(f"sandbox init has {len(children)} children, expected 1")
            pid = children[0].pid
            self._target_fd = self._pinned_pidfd(pid, init_pid, "trampoline")
        try:
            pgid = os.getpgid(pid)
        except ProcessLookupError:
            raise HandshakeError("trampoline exited during the handshake") from None
        if pgid != pid:
            raise HandshakeError("trampoline does not lead its own process group")
        self.pid, self.pgid = pid, pgid

    def _sandbox_pids(self) -> list[int]:
        """The sandbox's pid 1 and the target, as host pids (those known)."""
        pids = [self.pid] if self.pid is not None else []
        if self._ns_init_fd is not None:
            pids.insert(0, self._pid_of(self._ns_init_fd))
        return pids

    def loopback_ports(self) -> list[int]:
        """The loopback ports the tree listens on where the host reaches them
        (sandbox/listening_ports.py): the preview a session serves."""
        if self._closed or self.target_exited():
            return []
        return tree_loopback_ports(self._popen.pid)

    @staticmethod
    def _pid_of(pidfd: int) -> int:
        with open(f"/proc/self/fdinfo/{pidfd}") as info:
            for line in info:
                if line.startswith("Pid:"):
                    return int(line.split()[1])
        raise HandshakeError("cannot read the pid of a pidfd")

    # -- state ------------------------------------------------------------------------

    @property
    def direct_pid(self) -> int:
        """The process we spawned: bwrap when sandboxed, else the trampoline/target."""
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """Exit code of the target (128+N for signal N); None until it has exited."""
        if self._exit_code is None:
            self._exit_code = self._peek_exit_code()
        return self._exit_code

    def _peek_exit_code(self) -> int | None:
        if self._popen.returncode is not None:
            return exit_code_of(self._popen.returncode)
        if self.launch_mode is LaunchMode.SANDBOXED:
            # bwrap exits when the target does and reports its status; reaping bwrap
            # is harmless because nothing is ever signalled by its number.
            rc = self._popen.poll()
            return None if rc is None else exit_code_of(rc)
        # Unsandboxed the target is our child and also its group's number: read the
        # status without reaping, so the number stays ours until the group is empty.
        try:
            result = os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            if not _pidfd_exited(self._pidfd):
                return None
            # Someone else (a waitpid(-1) reaper) took the status; Popen's own
            # convention for that case is 0, and it is better than waiting forever.
            rc = self._popen.poll()
            return exit_code_of(rc if rc is not None else 0)
        return None if result is None else _status_to_code(result)

    def target_exited(self) -> bool:
        fd = self._target_fd if self._target_fd is not None else self._pidfd
        return _pidfd_exited(fd)

    async def wait_exit(self) -> int:
        """Wait until the target has exited; returns its exit code.

        Sandboxed this waits for bwrap (which outlives the target only by the
        teardown of its namespace); unsandboxed the target is not reaped yet.
        """
        while self.returncode is None:
            await _wait_pidfd(self._pidfd)
        assert self._exit_code is not None
        return self._exit_code

    # -- signals ----------------------------------------------------------------------

    def signal_group(self, sig: int) -> None:
        """Signal the target's process group (the target and its job)."""
        if self.pgid is None or self._popen.returncode is not None:
            return
        if self.launch_mode is LaunchMode.SANDBOXED and self.target_exited():
            # The target's exit ends the sandbox's pid 1 and so everything else; its
            # group number may already be free for reuse.
            return
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill_tree(self) -> None:
        """SIGKILL everything reachable; returns at once (see :meth:`wait_tree_dead`)."""
        descendants: list[psutil.Process] = []
        if self.launch_mode is LaunchMode.UNSANDBOXED and not self.target_exited():
            try:
                descendants = psutil.Process(self._popen.pid).children(recursive=True)
            except psutil.Error:
                descendants = []
        # pid 1 first: its death makes the kernel kill the whole pid namespace.
        _pidfd_signal(self._ns_init_fd, signal.SIGKILL)
        self.signal_group(signal.SIGKILL)
        for proc in descendants:
            try:
                proc.kill()  # psutil checks the create time: no recycled pid is hit
            except psutil.Error:
                pass
        if self._ns_init_fd is None:
            # The direct child: the target when unsandboxed. bwrap only when its pid 1
            # is unknown; otherwise, left alive, it reaps pid 1 and exits by itself
            # instead of leaving a zombie to whoever inherits it.
            self._kill_direct()

    def _kill_direct(self) -> None:
        if self._popen.returncode is None:
            _pidfd_signal(self._pidfd, signal.SIGKILL)

    def _group_alive(self) -> bool:
        if self.pgid is None:
            return False
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # Our unreaped leader (and unreaped orphans) still count for kill(0).
        for proc in psutil.process_iter(["status"]):
            try:
                if os.getpgid(proc.pid) == self.pgid and proc.info["status"] != "zombie":
                    return True
            except (ProcessLookupError, psutil.Error):
                continue
        return False

    async def wait_tree_dead(self, timeout_s: float = _REAP_TIMEOUT_S) -> bool:
        """Confirm nothing of the tree is left, then reap the direct child.

        False means something could not be confirmed dead within ``timeout_s``
        (the direct child is then SIGKILLed but not reaped, so no number is freed
        while something of the tree may still use it).
        """
        with trio.move_on_after(timeout_s):
            await self.wait_exit()
            if self._ns_init_fd is not None:
                # pid 1 becomes a zombie only after the kernel has killed and reaped
                # every other process of its namespace.
                await _wait_pidfd(self._ns_init_fd)
            elif self.launch_mode is LaunchMode.UNSANDBOXED:
                while self._group_alive():
                    await trio.sleep(0.01)
            # else: bwrap died before reporting its pid 1, so it never got far enough
            # to run anything, or --die-with-parent is already taking pid 1 down.
            self._popen.wait()
            await self._check_tree(final=True)
            return True
        self._kill_direct()
        await self._check_tree(final=False)
        return False

    async def _check_tree(self, *, final: bool) -> None:
        """What the target may have left: git control entries it created or changed
        are removed (``guard_report`` says which). Once the tree is confirmed dead the
        check is final; before that (a tree that would not die) it is done anyway,
        and again at the next confirmation."""
        if self.guard is None or not self._commit_sent or self._guard_final:
            return
        report = await trio.to_thread.run_sync(self.guard.enforce)
        self.guard_report = report if self.guard_report is None else self.guard_report.merged(report)
        self._guard_final = final
        if final and self._guard_record is not None:
            await trio.to_thread.run_sync(self._guard_record.finish)

    async def abort(self) -> bool:
        """Kill and reap the whole tree; True when confirmed. Safe to call repeatedly."""
        with trio.CancelScope(shield=True):
            self.kill_tree()
            confirmed = await self.wait_tree_dead()
        if confirmed:
            self.close()
        return confirmed

    def close(self) -> None:
        """Release the pidfds (after the tree is dead)."""
        if self._closed:
            return
        self._closed = True
        if self._guard_record is not None:
            if self._commit_sent:
                self._guard_record.release()  # finished already, unless the check never became final
            else:
                self._guard_record.finish()  # the target never ran: nothing to check
        fds = {self._pidfd, self._ns_init_fd, self._target_fd}
        for fd in fds:
            if fd is not None:
                trio.lowlevel.notify_closing(fd)
                os.close(fd)
