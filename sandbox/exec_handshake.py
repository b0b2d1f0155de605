"""The launch handshake: nothing runs the target before its launch is durable.

Two halves. The *trampoline* (sandbox/trampoline.py) runs as a script (inside
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
import functools
import os
import secrets
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

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
from .handshake_decision import ExecFailed, before_commit, bwrap_report, exec_outcome, launch_refusal, readiness
from .launched_process import HandshakeError, LaunchedProcess, LaunchError, TargetExecFailed
from .trampoline import (
    MAX_LINE,
    MSG_COMMIT,
    MSG_NONCE,
    TRAMPOLINE_PATH,
    write_line,
)
from .tree_guard import Snapshot, snapshot

_ENV_PASSTHROUGH = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


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
            if len(self._buf) > MAX_LINE:
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
    # Where its one third-party import lives: not always under sys.prefix (a venv
    # that reaches another environment's site-packages through a .pth file).
    prctl_file = getattr(sys.modules.get("prctl"), "__file__", None)
    if prctl_file:
        paths.add(Path(prctl_file).resolve().parent)
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
        raise LaunchError("empty argv")  # before the mode: nothing to launch says so first
    mode = launch_mode or resolve_launch_mode(profile.mode, executable=profile.bwrap)
    if mode is LaunchMode.SANDBOXED and find_bwrap(profile.bwrap) is None:
        raise SandboxUnavailable("sandboxed launch requested and bubblewrap is not installed")
    cwd = Path(cwd).resolve()
    root = profile.project_root
    refusal = launch_refusal(argv, cwd, root, cwd_is_dir=cwd.is_dir())
    if refusal is not None:
        raise LaunchError(refusal)

    nonce = secrets.token_hex(16)
    ctl_r, ctl_w = os.pipe()
    rep_r, rep_w = os.pipe()
    info_r, info_w = os.pipe() if mode is LaunchMode.SANDBOXED else (-1, -1)
    child_fds = [fd for fd in (ctl_r, rep_w, info_w) if fd >= 0]
    parent_fds = [fd for fd in (ctl_w, rep_r, info_r) if fd >= 0]
    try:
        write_line(ctl_w, f"{MSG_NONCE} {nonce}")
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
        child_env = dict(env) if env is not None else default_env(home=mode is LaunchMode.UNSANDBOXED)
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
                proc._attach_namespace_init(*bwrap_report(raw))
            line = await rep.readline()
        readiness(line, nonce)
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
        before_commit(rep.pending())
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
            write_line(ctl_w, f"{MSG_COMMIT} {nonce}")
        except BrokenPipeError:
            raise HandshakeError("trampoline gone before COMMIT_EXEC") from None
        os.close(ctl_w)
        ctl_open = False
        with trio.fail_after(handshake_timeout_s):
            lines: list[str] = []
            while (line := await rep.readline()) is not None:
                lines.append(line)
        outcome = exec_outcome(lines)
        if isinstance(outcome, ExecFailed):
            reaped = await proc.wait_tree_dead()
            if reaped:
                proc.close()
            raise TargetExecFailed(outcome.errno, argv[0], tree_reaped=reaped)
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
