"""The launch handshake: nothing runs the target before its launch is durable.

Two halves live here. The *trampoline* is this file run as a script (inside
bubblewrap, or directly when the spec allows unsandboxed commands); it locks itself
down and then waits. The *parent side*, :func:`launch_with_handshake`, drives it::

    parent                                   trampoline
    ------                                   ----------
    ctl pipe  : NONCE <n>             --->   setsid, controlling tty, PDEATHSIG,
                                             NO_NEW_PRIVS, drop all caps, rlimits
    rep pipe  :                       <---   SANDBOX_READY <n>   (or SANDBOX_FAILED)
    await on_ready(info)   (the caller commits its durable launch record here)
    (sandboxed) the tree guard's snapshot, fsync'd (sandbox/guard_record.py)
    ctl pipe  : COMMIT_EXEC <n>       --->   verify, mark rep close-on-exec
    rep pipe  :                       <---   EXEC_ATTEMPT
                                             execve(target)
    rep pipe  : EOF                          => EXEC_ESTABLISHED
            or TARGET_EXEC_FAILED <errno>    => exec failed, trampoline exits 127

The nonce travels over a pipe, never argv or the environment, so no other process
(``ps``, /proc/<pid>/environ) can learn it and forge the readiness report. If the
nonce is wrong, the channel hits EOF before the commit, the commit (``on_ready``)
raises, or the caller is cancelled, the whole tree is killed and reaped and the
target has been executed zero times: the trampoline only calls execve after reading
a correct COMMIT_EXEC, which the parent sends only after ``on_ready`` returned.
If the parent dies while the trampoline waits, the control pipe hits EOF and
PDEATHSIG fires; either way the trampoline exits without executing anything.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import functools
import hmac
import json
import os
import resource
import secrets
import select
import signal
import subprocess
import sys
import termios
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import prctl

if TYPE_CHECKING or __name__ != "__main__":
    # The trampoline runs this file as a script before every target: trio and the
    # rest cost ~100 ms of imports that only the parent side uses.
    import psutil
    import trio

    from .bwrap import (
        LaunchMode,
        SandboxProfile,
        SandboxProfileError,
        SandboxUnavailable,
        build_bwrap_argv,
        find_bwrap,
        resolve_launch_mode,
    )
    from .control_paths import ControlPathError, SandboxEntries, sandbox_entries
    from .guard_record import GuardRecord, guard_dir, process_identity, recover
    from .tree_guard import GuardReport, Snapshot, snapshot

#: This file; the trampoline is ``python -I -B <TRAMPOLINE_PATH>`` (equivalent to
#: ``python -m corral.sandbox.exec_handshake`` but without importing the package,
#: which inside the sandbox is neither needed nor guaranteed importable).
TRAMPOLINE_PATH = Path(__file__).resolve()

MSG_NONCE = "NONCE"
MSG_READY = "SANDBOX_READY"
MSG_SETUP_FAILED = "SANDBOX_FAILED"
MSG_COMMIT = "COMMIT_EXEC"
MSG_EXEC_ATTEMPT = "EXEC_ATTEMPT"
MSG_EXEC_FAILED = "TARGET_EXEC_FAILED"
#: Not a wire message: what the parent concludes from EOF after EXEC_ATTEMPT.
EXEC_ESTABLISHED = "EXEC_ESTABLISHED"

#: Trampoline exit codes (the target never ran in any of these cases).
EXIT_USAGE = 64
EXIT_SETUP_FAILED = 70
EXIT_NO_COMMIT = 75
EXIT_EXEC_FAILED = 127

_MAX_LINE = 512
_ENV_PASSTHROUGH = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

_RLIMIT_FLAGS = {
    "cpu_s": resource.RLIMIT_CPU,
    "address_space_bytes": resource.RLIMIT_AS,
    "open_files": resource.RLIMIT_NOFILE,
    "processes": resource.RLIMIT_NPROC,
}


# --------------------------------------------------------------------------------------
# Trampoline side. Only stdlib and prctl: this runs before every target.
# --------------------------------------------------------------------------------------


@dataclass
class _TrampolineArgs:
    ctl_fd: int
    rep_fd: int
    ctty: bool
    expect_ppid: int
    rlimits: dict[str, int]
    target: list[str]


def _parse_trampoline_args(argv: Sequence[str]) -> _TrampolineArgs:
    args = list(argv)
    ctl = rep = -1
    ctty = False
    expect_ppid = 0
    rlimits: dict[str, int] = {}
    while args:
        flag = args.pop(0)
        if flag == "--":
            break
        if flag == "--ctty":
            ctty = True
            continue
        if not args:
            raise ValueError(f"{flag} needs a value")
        value = args.pop(0)
        if flag == "--ctl":
            ctl = int(value)
        elif flag == "--rep":
            rep = int(value)
        elif flag == "--expect-ppid":
            expect_ppid = int(value)
        elif flag == "--rlimit":
            name, _, number = value.partition("=")
            if name not in _RLIMIT_FLAGS:
                raise ValueError(f"unknown rlimit {name!r}")
            rlimits[name] = int(number)
        else:
            raise ValueError(f"unknown flag {flag!r}")
    if ctl < 0 or rep < 0 or not args:
        raise ValueError("need --ctl, --rep and a target after --")
    return _TrampolineArgs(ctl, rep, ctty, expect_ppid, rlimits, args)


def _write_line(fd: int, line: str) -> None:
    data = (line + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


def _read_line_blocking(fd: int) -> str | None:
    """One line from the control pipe, or None at EOF (the parent is gone)."""
    buf = bytearray()
    while len(buf) <= _MAX_LINE:
        chunk = os.read(fd, 1)
        if not chunk:
            return None
        if chunk == b"\n":
            return buf.decode("ascii", errors="replace")
        buf += chunk
    return None


def _close_fds_except(keep: set[int]) -> None:
    # bwrap passes every inheritable fd through; the target gets stdio and nothing else.
    low = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)


def _status_field(name: str) -> str:
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key == name:
                return value.strip()
    raise RuntimeError(f"/proc/self/status has no {name}")


def _drop_capabilities() -> None:
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        try:
            if prctl.capbset_read(cap):
                prctl.capbset_drop(cap)
        except (OSError, ValueError):
            # Without CAP_SETPCAP (inside bwrap, or as a normal user) the bounding set
            # cannot shrink; the verification below decides whether that is safe.
            pass
    prctl.cap_inheritable.limit()
    prctl.cap_effective.limit()
    prctl.cap_permitted.limit()
    for name in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        if int(_status_field(name), 16) != 0:
            raise RuntimeError(f"{name} still set after dropping capabilities")
    # A non-empty bounding set only matters when an execve can grant capabilities:
    # uid 0 gets the whole bounding set on exec, and NO_NEW_PRIVS does not stop that.
    if int(_status_field("CapBnd"), 16) != 0 and os.geteuid() == 0:
        raise RuntimeError("running as root and the capability bounding set is not empty")
    if _status_field("NoNewPrivs") != "1":
        raise RuntimeError("NO_NEW_PRIVS is not set")


def _apply_rlimits(limits: Mapping[str, int]) -> None:
    for name, value in limits.items():
        flag = _RLIMIT_FLAGS[name]
        _soft, hard = resource.getrlimit(flag)
        # Lowering needs no privilege (and we have none left); a request above the
        # inherited hard limit is clamped rather than failing the launch.
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(flag, (value, value))


def _setup(opts: _TrampolineArgs) -> None:
    _close_fds_except({opts.ctl_fd, opts.rep_fd})
    prctl.set_pdeathsig(signal.SIGKILL)
    # The parent may have died between fork and prctl; then nobody would kill us.
    if opts.expect_ppid and os.getppid() != opts.expect_ppid:
        raise RuntimeError("parent exited during launch")
    # bwrap --new-session makes its pid-1 the session leader, not us; a PTY needs the
    # target to lead its own session so the tty can become its controlling terminal
    # and SIGTERM to the group reaches the target and its job.
    if os.getsid(0) != os.getpid():
        os.setsid()
    if opts.ctty:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    prctl.set_no_new_privs(1)
    _drop_capabilities()
    _apply_rlimits(opts.rlimits)


def trampoline_main(argv: Sequence[str]) -> NoReturn:
    """Entry point of the trampoline process. Never returns."""
    try:
        opts = _parse_trampoline_args(argv)
    except ValueError as exc:
        print(f"exec_handshake: {exc}", file=sys.stderr)
        os._exit(EXIT_USAGE)
    try:
        _setup(opts)
        first = _read_line_blocking(opts.ctl_fd)
        kind, _, nonce = (first or "").partition(" ")
        if kind != MSG_NONCE or not nonce:
            raise RuntimeError("no nonce on the control channel")
    except Exception as exc:
        try:
            _write_line(opts.rep_fd, f"{MSG_SETUP_FAILED} {type(exc).__name__}")
        except OSError:
            pass
        os._exit(EXIT_SETUP_FAILED)
    try:
        _write_line(opts.rep_fd, f"{MSG_READY} {nonce}")
        line = _read_line_blocking(opts.ctl_fd)
    except OSError:
        os._exit(EXIT_NO_COMMIT)
    if line is None or not hmac.compare_digest(line.encode(), f"{MSG_COMMIT} {nonce}".encode()):
        os._exit(EXIT_NO_COMMIT)
    os.close(opts.ctl_fd)
    # Close-on-exec is the exec report: a successful execve closes this end, the
    # parent sees EOF with no failure message.
    os.set_inheritable(opts.rep_fd, False)
    # Python ignores SIGPIPE (and SIGXFSZ); ignored dispositions survive execve.
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    try:
        _write_line(opts.rep_fd, MSG_EXEC_ATTEMPT)
        os.execvp(opts.target[0], opts.target)
    except OSError as exc:
        try:
            _write_line(opts.rep_fd, f"{MSG_EXEC_FAILED} {exc.errno or errno.EIO}")
        except OSError:
            pass
    os._exit(EXIT_EXEC_FAILED)


# --------------------------------------------------------------------------------------
# Parent side.
# --------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class ReadyInfo:
    """What ``on_ready`` gets to write into its durable launch record.

    ``pid`` is the host pid of the trampoline, which becomes the target (execve
    keeps it); it is for logs only: never signal a stored pid after a restart.
    """

    launch_mode: LaunchMode
    pid: int
    pgid: int
    pid_namespace: int | None
    argv: tuple[str, ...]
    cwd: Path


OnReady = Callable[[ReadyInfo], Awaitable[None]]

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


class _LineReader:
    """Bounded line reads from a non-blocking pipe under trio."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self.fd = fd
        self._buf = bytearray()
        self.eof = False

    def _pop_line(self) -> str | None:
        index = self._buf.find(b"\n")
        if index < 0:
            if len(self._buf) > _MAX_LINE:
                raise HandshakeError("oversized message on the report channel")
            return None
        line = bytes(self._buf[:index])
        del self._buf[: index + 1]
        return line.decode("ascii", errors="replace")

    def _fill(self) -> bool:
        """Read what is there; False when nothing was available."""
        try:
            chunk = os.read(self.fd, 4096)
        except BlockingIOError:
            return False
        if not chunk:
            self.eof = True
        self._buf += chunk
        return True

    async def readline(self) -> str | None:
        """The next line, or None at EOF."""
        while True:
            line = self._pop_line()
            if line is not None:
                return line
            if self.eof:
                return None
            if not self._fill():
                await trio.lowlevel.wait_readable(self.fd)

    def pending(self) -> str | None:
        """Without waiting: 'eof', 'data' or None (nothing happened)."""
        while not self.eof and self._fill():
            pass
        if self._buf:
            return "data"
        return "eof" if self.eof else None

    async def read_all(self) -> bytes:
        while not self.eof:
            if not self._fill():
                await trio.lowlevel.wait_readable(self.fd)
        data = bytes(self._buf)
        self._buf.clear()
        return data

    def close(self) -> None:
        trio.lowlevel.notify_closing(self.fd)
        os.close(self.fd)


def default_env(extra: Mapping[str, str] | None = None, *, home: bool = False) -> dict[str, str]:
    """A scrubbed environment: locale and PATH only, so no secret reaches a target."""
    env = {name: os.environ[name] for name in _ENV_PASSTHROUGH if name in os.environ}
    env.setdefault("PATH", _DEFAULT_PATH)
    if home and "HOME" in os.environ:
        env["HOME"] = os.environ["HOME"]
    env.update(extra or {})
    return env


def trampoline_runtime_paths() -> tuple[Path, ...]:
    """Host paths the default trampoline needs inside the sandbox (read-only)."""
    paths = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix)}
    paths.add(Path(sys.executable).resolve().parent)
    paths.add(TRAMPOLINE_PATH.parent)
    return tuple(sorted(paths))


def default_trampoline() -> list[str]:
    return [sys.executable, "-I", "-B", str(TRAMPOLINE_PATH)]


def build_trampoline_argv(
    target_argv: Sequence[str],
    *,
    ctl_fd: int,
    rep_fd: int,
    controlling_tty: bool = False,
    expect_ppid: int = 0,
    rlimits: Mapping[str, int] | None = None,
    trampoline: Sequence[str] | None = None,
) -> list[str]:
    argv = list(trampoline or default_trampoline())
    argv += ["--ctl", str(ctl_fd), "--rep", str(rep_fd)]
    if controlling_tty:
        argv.append("--ctty")
    if expect_ppid:
        argv += ["--expect-ppid", str(expect_ppid)]
    for name, value in (rlimits or {}).items():
        argv += ["--rlimit", f"{name}={value}"]
    argv.append("--")
    argv += list(target_argv)
    return argv


def _records_dir(profile: SandboxProfile) -> Path | None:
    """Where this launch's snapshot is kept while its command runs: in the launcher's
    private directory (corral's home), which the sandbox must never see. None when
    the profile names none (a bare SandboxProfile: the check then runs only in
    this process)."""
    private = profile.private_dir()
    if private is None:
        return None
    if not profile.hidden_inside(private):
        raise SandboxProfileError(f"the launcher's state directory {private} would be visible inside the sandbox")
    try:
        return guard_dir(private)
    except OSError as exc:
        raise LaunchError(f"cannot use {private} for the sandbox's records: {exc.strerror or exc}") from None


def _prepare_guard(root: Path, profile: SandboxProfile) -> tuple[Snapshot, SandboxEntries, Path | None]:
    """Before a sandboxed launch (off the trio thread): the check of every earlier
    launch whose launcher died (it must run before this snapshot, or what it would
    remove would count as existing), then one walk of the project for both the
    snapshot and the sandbox's deny list; and where the snapshot is kept."""
    records = _records_dir(profile)
    if records is not None:
        try:
            recover(records)
        except OSError as exc:
            raise LaunchError(f"cannot check the sandbox's records in {records}: {exc.strerror or exc}") from None
    guard = snapshot(root, profile.masked, scan=True)
    entries = sandbox_entries(root, guard.scan)
    # The scan lists every file of the project: not kept for the command's lifetime.
    # What the check takes is moved to the home's quarantine (sandbox/guard_removal.py).
    home = records.parent if records is not None else None
    return dataclasses.replace(guard, scan=None, home=home), entries, records


def _close_quietly(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


async def launch_with_handshake(
    argv: Sequence[str],
    *,
    cwd: Path,
    profile: SandboxProfile,
    on_ready: OnReady,
    launch_mode: LaunchMode | None = None,
    env: Mapping[str, str] | None = None,
    stdin: int | None = None,
    stdout: int | None = None,
    stderr: int | None = None,
    controlling_tty: bool = False,
    handshake_timeout_s: float = 10.0,
    trampoline: Sequence[str] | None = None,
) -> LaunchedProcess:
    """Launch ``argv`` through the trampoline; returns once EXEC_ESTABLISHED.

    ``launch_mode`` defaults to :func:`resolve_launch_mode` of ``profile.mode``
    (raises ``SandboxUnavailable``). ``stdin``/``stdout``/``stderr`` are fds for the
    target (default /dev/null; never the caller's own stdio); with
    ``controlling_tty`` they must be a PTY slave, which becomes the target's
    controlling terminal. ``env`` defaults to :func:`default_env`. ``trampoline``
    replaces the interpreter + script prefix (tests use it to fake a misbehaving
    trampoline).

    Raises :class:`HandshakeError`, :class:`TargetExecFailed`, or whatever
    ``on_ready`` raised; in all those cases the tree is killed and reaped first and
    the target was not executed (except TargetExecFailed, where execve was tried
    and failed).
    """
    if not argv:
        raise LaunchError("empty argv")
    mode = launch_mode or resolve_launch_mode(profile.mode, executable=profile.bwrap)
    if mode is LaunchMode.SANDBOXED and find_bwrap(profile.bwrap) is None:
        raise SandboxUnavailable("sandboxed launch requested and bubblewrap is not installed")
    cwd = Path(cwd).resolve()
    root = profile.project_root
    if cwd != root and root not in cwd.parents:
        raise LaunchError(f"cwd {cwd} is outside the project root {root}")
    if not cwd.is_dir():
        raise LaunchError(f"cwd {cwd} is not a directory")

    nonce = secrets.token_hex(16)
    ctl_r, ctl_w = os.pipe()
    rep_r, rep_w = os.pipe()
    info_r, info_w = os.pipe() if mode is LaunchMode.SANDBOXED else (-1, -1)
    child_fds = [fd for fd in (ctl_r, rep_w, info_w) if fd >= 0]
    parent_fds = [fd for fd in (ctl_w, rep_r, info_r) if fd >= 0]
    try:
        _write_line(ctl_w, f"{MSG_NONCE} {nonce}")
        rlimits = profile.rlimits.as_dict() if profile.rlimits else {}
        tramp = build_trampoline_argv(
            argv,
            ctl_fd=ctl_r,
            rep_fd=rep_w,
            controlling_tty=controlling_tty,
            expect_ppid=os.getpid() if mode is LaunchMode.UNSANDBOXED else 0,
            rlimits=rlimits,
            trampoline=trampoline,
        )
        guard: Snapshot | None = None
        records: Path | None = None
        if mode is LaunchMode.SANDBOXED:
            # The project's git control entries now: read-only inside (with every other
            # name of their files), and what is new after the command is removed. The
            # walks run off the trio thread.
            sandbox = profile.with_extra_ro(trampoline_runtime_paths())
            try:
                taken, entries, records = await trio.to_thread.run_sync(_prepare_guard, root, sandbox)
            except ControlPathError as exc:
                raise SandboxProfileError(str(exc)) from None
            except OSError as exc:
                raise LaunchError(f"cannot walk the project {root}: {exc.strerror or exc}") from None
            guard = taken
            sandbox = sandbox.with_read_only(taken.protect).with_entries(entries)
            full = await trio.to_thread.run_sync(
                functools.partial(build_bwrap_argv, sandbox, tramp, cwd, info_fd=info_w)
            )
        else:
            full = tramp
        child_env = dict(env) if env is not None else default_env(
            home=mode is LaunchMode.UNSANDBOXED
        )
        # Popen from this (the trio) thread, not trio.run_process: trio spawns from a
        # worker thread, and PDEATHSIG (bwrap --die-with-parent) fires when the
        # *thread* that forked exits, which trio's idle worker threads do.
        try:
            popen = subprocess.Popen(
                full,
                stdin=subprocess.DEVNULL if stdin is None else stdin,
                stdout=subprocess.DEVNULL if stdout is None else stdout,
                stderr=subprocess.DEVNULL if stderr is None else stderr,
                pass_fds=child_fds,
                cwd=str(cwd),
                env=child_env,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise LaunchError(f"cannot start {full[0]}: {exc.strerror}") from exc
    except BaseException:
        _close_quietly(*child_fds, *parent_fds)
        raise
    # Only the child may hold these ends, or EOF would never tell us anything.
    _close_quietly(*child_fds)

    proc = LaunchedProcess(popen, mode, argv, cwd)
    proc.guard = guard
    rep = _LineReader(rep_r)
    ctl_open = True
    try:
        with trio.fail_after(handshake_timeout_s):
            if mode is LaunchMode.SANDBOXED:
                info = _LineReader(info_r)
                info_r = -1
                try:
                    raw = await info.read_all()
                finally:
                    info.close()
                try:
                    report = json.loads(raw) if raw else {}
                    ns_init = int(report["child-pid"])
                    pid_ns = int(report["pid-namespace"]) if "pid-namespace" in report else None
                except (ValueError, KeyError, TypeError):
                    raise HandshakeError("bubblewrap failed before starting the sandbox") from None
                proc._attach_namespace_init(ns_init, pid_ns)
            line = await rep.readline()
        if line is None:
            raise HandshakeError("report channel closed before SANDBOX_READY")
        kind, _, payload = line.partition(" ")
        if kind == MSG_SETUP_FAILED:
            raise HandshakeError(f"sandbox setup failed in the trampoline: {payload}")
        if kind != MSG_READY:
            raise HandshakeError(f"unexpected message before readiness: {kind[:40]!r}")
        if not hmac.compare_digest(payload.encode(), nonce.encode()):
            raise HandshakeError("SANDBOX_READY carried the wrong nonce")
        proc._identify_target()
        assert proc.pid is not None and proc.pgid is not None
        ready = ReadyInfo(
            launch_mode=mode,
            pid=proc.pid,
            pgid=proc.pgid,
            pid_namespace=proc.pid_namespace,
            argv=tuple(argv),
            cwd=cwd,
        )
        await on_ready(ready)
        # The commit took however long it took; if the trampoline died meanwhile, do
        # not mistake its EOF for a successful exec.
        state = rep.pending()
        if state == "eof":
            raise HandshakeError("report channel closed before COMMIT_EXEC")
        if state == "data":
            raise HandshakeError("unexpected message before COMMIT_EXEC")
        if guard is not None and records is not None:
            # Durable before the target may run: if this process dies while it runs,
            # the next launch runs the check after it (sandbox/guard_record.py).
            processes = [proc.direct_pid, *proc._sandbox_pids()]
            identities = [found for pid in processes if (found := process_identity(pid)) is not None]
            try:
                proc._guard_record = await trio.to_thread.run_sync(GuardRecord.write, records, guard, identities)
            except OSError as exc:
                raise LaunchError(f"cannot record the project's snapshot in {records}: {exc.strerror or exc}") from None
        # From here on the target may run: the tree is checked after it ends.
        proc._commit_sent = True
        try:
            _write_line(ctl_w, f"{MSG_COMMIT} {nonce}")
        except BrokenPipeError:
            raise HandshakeError("trampoline gone before COMMIT_EXEC") from None
        os.close(ctl_w)
        ctl_open = False
        with trio.fail_after(handshake_timeout_s):
            lines: list[str] = []
            while (line := await rep.readline()) is not None:
                lines.append(line)
        if MSG_EXEC_ATTEMPT not in lines:
            raise HandshakeError("trampoline exited after COMMIT_EXEC without exec")
        for line in lines:
            kind, _, payload = line.partition(" ")
            if kind == MSG_EXEC_FAILED:
                err = int(payload) if payload.isdigit() else errno.EIO
                reaped = await proc.wait_tree_dead()
                if reaped:
                    proc.close()
                raise TargetExecFailed(err, argv[0], tree_reaped=reaped)
        proc.exec_established = True
        return proc
    except TargetExecFailed:
        raise
    except BaseException as exc:
        reaped = await proc.abort()
        if isinstance(exc, trio.TooSlowError):
            raise HandshakeError("handshake timed out", tree_reaped=reaped) from None
        if isinstance(exc, LaunchError):
            exc.tree_reaped = reaped
        raise
    finally:
        rep.close()
        if ctl_open:
            _close_quietly(ctl_w)
        if info_r >= 0:
            _close_quietly(info_r)


if __name__ == "__main__":
    trampoline_main(sys.argv[1:])
