"""The trampoline: what runs before every target, as a script (inside bubblewrap,
or directly when the spec allows unsandboxed commands).

It locks itself down (setsid, controlling tty, PDEATHSIG, NO_NEW_PRIVS, no
capabilities, rlimits), reports SANDBOX_READY with the nonce it was sent, and
calls execve only after a correct COMMIT_EXEC: sandbox/exec_handshake.py drives
it and describes the protocol. Only stdlib and prctl: this runs before every
target, and the package is neither needed nor guaranteed importable inside.
"""

from __future__ import annotations

import errno
import fcntl
import hmac
import os
import resource
import signal
import sys
import termios
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import prctl

#: This file; the trampoline is ``python -I -B <TRAMPOLINE_PATH>`` (equivalent to
#: ``python -m corral.sandbox.trampoline`` but without importing the package,
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

MAX_LINE = 512

_RLIMIT_FLAGS = {
    "cpu_s": resource.RLIMIT_CPU,
    "address_space_bytes": resource.RLIMIT_AS,
    "open_files": resource.RLIMIT_NOFILE,
    "processes": resource.RLIMIT_NPROC,
}




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


def write_line(fd: int, line: str) -> None:
    data = (line + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


def _read_line_blocking(fd: int) -> str | None:
    """One line from the control pipe, or None at EOF (the parent is gone)."""
    buf = bytearray()
    while len(buf) <= MAX_LINE:
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
            write_line(opts.rep_fd, f"{MSG_SETUP_FAILED} {type(exc).__name__}")
        except OSError:
            pass
        os._exit(EXIT_SETUP_FAILED)
    try:
        write_line(opts.rep_fd, f"{MSG_READY} {nonce}")
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
        write_line(opts.rep_fd, MSG_EXEC_ATTEMPT)
        os.execvp(opts.target[0], opts.target)
    except OSError as exc:
        try:
            write_line(opts.rep_fd, f"{MSG_EXEC_FAILED} {exc.errno or errno.EIO}")
        except OSError:
            pass
    os._exit(EXIT_EXEC_FAILED)


if __name__ == "__main__":
    trampoline_main(sys.argv[1:])
