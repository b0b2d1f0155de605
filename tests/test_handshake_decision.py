"""The launch handshake's judgements as pure functions: what the trampoline (or
bubblewrap) reported in, go on or refuse out. No processes: each row is a report
sandbox/exec_handshake.py's ``launch_with_handshake`` may read off its pipes.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from corral.sandbox.handshake_decision import (
    ExecEstablished,
    ExecFailed,
    before_commit,
    bwrap_report,
    exec_outcome,
    launch_refusal,
    readiness,
)
from corral.sandbox.launched_process import HandshakeError

NONCE = "ab" * 16
ROOT = Path("/p")

LAUNCHES = [
    ("fine", ["true"], Path("/p/sub"), True, None),
    ("the root itself", ["true"], ROOT, True, None),
    ("empty argv", [], Path("/p"), True, "empty argv"),
    ("outside the root", ["true"], Path("/q"), True, "cwd /q is outside the project root /p"),
    ("a sibling with the root's prefix", ["true"], Path("/p2"), True, "cwd /p2 is outside the project root /p"),
    ("not a directory", ["true"], Path("/p/file"), False, "cwd /p/file is not a directory"),
]


@pytest.mark.parametrize(("name", "argv", "cwd", "is_dir", "says"), LAUNCHES, ids=[r[0] for r in LAUNCHES])
def test_launch_refusal(name: str, argv: list[str], cwd: Path, is_dir: bool, says: str | None) -> None:
    assert launch_refusal(argv, cwd, ROOT, cwd_is_dir=is_dir) == says


REPORTS = [
    ("both", b'{"child-pid": 7, "pid-namespace": 4026}', (7, 4026)),
    ("no namespace", b'{"child-pid": 7}', (7, None)),
    ("nothing: bwrap died first", b"", "bubblewrap failed before starting the sandbox"),
    ("no child pid", b'{"pid-namespace": 4026}', "bubblewrap failed"),
    ("not json", b"{oops", "bubblewrap failed"),
    ("not a number", b'{"child-pid": "x"}', "bubblewrap failed"),
    ("a list", b"[1]", "bubblewrap failed"),
]


@pytest.mark.parametrize(("name", "raw", "expected"), REPORTS, ids=[r[0] for r in REPORTS])
def test_bwrap_report(name: str, raw: bytes, expected: tuple[int, int | None] | str) -> None:
    if isinstance(expected, tuple):
        assert bwrap_report(raw) == expected
        return
    with pytest.raises(HandshakeError, match=expected):
        bwrap_report(raw)


READY = [
    ("ready", f"SANDBOX_READY {NONCE}", None),
    ("channel closed", None, "report channel closed before SANDBOX_READY"),
    ("setup failed", "SANDBOX_FAILED no caps", "sandbox setup failed in the trampoline: no caps"),
    ("wrong nonce", "SANDBOX_READY " + "cd" * 16, "SANDBOX_READY carried the wrong nonce"),
    ("no nonce", "SANDBOX_READY", "wrong nonce"),
    ("exec before commit", "EXEC_ATTEMPT", "unexpected message before readiness: 'EXEC_ATTEMPT'"),
    ("noise is cut short", "X" * 100, "unexpected message before readiness: '" + "X" * 40 + "'"),
]


@pytest.mark.parametrize(("name", "line", "says"), READY, ids=[r[0] for r in READY])
def test_readiness(name: str, line: str | None, says: str | None) -> None:
    if says is None:
        readiness(line, NONCE)
        return
    with pytest.raises(HandshakeError) as raised:
        readiness(line, NONCE)
    assert says in str(raised.value)


@pytest.mark.parametrize(
    ("pending", "says"),
    [
        (None, None),
        ("eof", "report channel closed before COMMIT_EXEC"),
        ("data", "unexpected message before COMMIT_EXEC"),
    ],
)
def test_before_commit(pending: str | None, says: str | None) -> None:
    if says is None:
        before_commit(pending)
        return
    with pytest.raises(HandshakeError, match=says):
        before_commit(pending)


EXECS = [
    ("established", ["EXEC_ATTEMPT"], ExecEstablished()),
    ("failed", ["EXEC_ATTEMPT", f"TARGET_EXEC_FAILED {errno.ENOENT}"], ExecFailed(errno.ENOENT)),
    ("failed, errno garbled", ["EXEC_ATTEMPT", "TARGET_EXEC_FAILED x"], ExecFailed(errno.EIO)),
    ("no attempt", [], "trampoline exited after COMMIT_EXEC without exec"),
    ("a failure without the attempt", [f"TARGET_EXEC_FAILED {errno.ENOENT}"], "without exec"),
]


@pytest.mark.parametrize(("name", "lines", "expected"), EXECS, ids=[r[0] for r in EXECS])
def test_exec_outcome(name: str, lines: list[str], expected: object) -> None:
    if isinstance(expected, str):
        with pytest.raises(HandshakeError, match=expected):
            exec_outcome(lines)
        return
    assert exec_outcome(lines) == expected
