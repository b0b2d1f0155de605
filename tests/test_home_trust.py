"""A home is trusted only as the seed says (seed 004 V1.1 §2, the re-audit aud6): "AppData
在 Unix 上必须由当前用户持有且权限为 0700 … 只读状态入口只能校验", and "Runner lock …
拒绝符号链接 … Unix 通过 openat 逐级无跟随打开". Checked live, with real supervisors and
the real ``corral`` command."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from corral import client
from corral.supervisor.home import home_dir as homes
from tests.harness import Daemon, cli


@contextmanager
def _live(home: Path) -> Iterator[Daemon]:
    """A supervisor with no spec (no swarm): a home and its control endpoint are enough here."""
    daemon = Daemon(home)
    try:
        daemon.up(spec=False)
        yield daemon
    finally:
        daemon.shutdown()


@contextmanager
def _loosened(home: Path, mode: int | None = None, uid: int | None = None) -> Iterator[None]:
    """The live home with another mode or owner, put back before the supervisor is stopped."""
    info = home.stat()
    try:
        if mode is not None:
            os.chmod(home, mode)
        if uid is not None:
            os.chown(home, uid, -1)
        yield
    finally:
        os.chown(home, info.st_uid, -1)
        os.chmod(home, stat.S_IMODE(info.st_mode))


def _refused_reads(home: Path) -> list[str]:
    """Every read entry on ``home``: each must refuse, saying what is wrong and how to fix it."""
    errors = []
    for args in (("status",), ("ping",), ("events",), ("runs",)):
        done = cli(home, *args)
        assert done.returncode != 0, f"corral {args[0]} went ahead on an untrusted home: {done.stdout}"
        assert "Traceback" not in done.stderr, done.stderr
        errors.append(done.stderr)
    with pytest.raises(homes.HomeError) as caught:
        client.Client.connect(home).close()
    errors.append(str(caught.value))
    return errors


def test_a_live_home_others_can_read_is_refused_by_every_read_and_left_as_it_is(short_tmp: Path) -> None:
    with _live(short_tmp / "h") as daemon:
        assert cli(daemon.home, "ping").returncode == 0  # trusted: it answers
        with _loosened(daemon.home, mode=0o755):
            for error in _refused_reads(daemon.home):
                assert "mode 755" in error and f"chmod 700 {daemon.home}" in error, error
            # Only verified: a read entry fixes nothing.
            assert stat.S_IMODE(daemon.home.stat().st_mode) == 0o755
        assert cli(daemon.home, "ping").returncode == 0


@pytest.mark.skipif(os.getuid() != 0, reason="giving a home to another user needs root")
def test_a_live_home_of_another_user_is_refused_by_every_read(short_tmp: Path) -> None:
    with _live(short_tmp / "h") as daemon, _loosened(daemon.home, uid=65534):
        for error in _refused_reads(daemon.home):
            assert "belongs to uid 65534" in error, error
        assert daemon.home.stat().st_uid == 65534


def test_a_stopped_home_others_can_read_is_refused_by_the_ledger_reads(short_tmp: Path) -> None:
    """No supervisor: ``status`` and ``events`` would read the ledger; they verify first."""
    with _live(short_tmp / "h") as daemon:
        home = daemon.home
    os.chmod(home, 0o750)
    for args in (("status",), ("events",), ("runs",)):
        done = cli(home, *args)
        assert done.returncode != 0 and f"chmod 700 {home}" in done.stderr, (args, done.stdout, done.stderr)
    assert stat.S_IMODE(home.stat().st_mode) == 0o750


def test_a_home_below_a_symlinked_directory_is_refused_naming_it_and_nothing_is_made(short_tmp: Path) -> None:
    """The audit's check: ``corral --home /tmp/x/symlev/h9 up`` with ``symlev`` a symlink."""
    (short_tmp / "real").mkdir()
    (short_tmp / "symlev").symlink_to(short_tmp / "real")
    home = short_tmp / "symlev" / "h9"
    done = cli(home, "up")
    if done.returncode == 0:  # the defect: stop what it started before failing
        cli(home, "down")
    assert done.returncode != 0, done.stdout
    assert f"{short_tmp / 'symlev'} is a symlink" in done.stderr, done.stderr
    assert not (short_tmp / "real" / "h9").exists(), "nothing was made through the symlink"
    # The supervisor itself refuses it too (``corral.supervisor --home``, as started by hand).
    with pytest.raises(homes.HomeError, match="symlev is a symlink"):
        homes.ensure_home(home)
    with pytest.raises(homes.HomeError, match="symlev is a symlink"):
        homes.HomeLock(home).acquire()
    assert not (short_tmp / "real" / "h9").exists()
    # A path whose text says one place and whose levels lead to another is refused too.
    with pytest.raises(homes.HomeError, match=r"'\.\.'"):
        homes.ensure_home(short_tmp / "real" / ".." / "h10")
    assert not (short_tmp / "h10").exists()


def test_a_home_that_is_a_symlink_is_refused_by_the_reads(short_tmp: Path) -> None:
    with _live(short_tmp / "h") as daemon:
        (short_tmp / "link").symlink_to(daemon.home)
        done = cli(short_tmp / "link", "status")
        assert done.returncode != 0 and "is a symlink" in done.stderr, done.stdout


def test_a_home_path_through_a_real_directory_still_starts(short_tmp: Path) -> None:
    """Not over-refused: a plain path below a real directory, with missing levels made."""
    with _live(short_tmp / "a" / "b" / "h") as daemon:
        assert stat.S_IMODE(daemon.home.stat().st_mode) == 0o700
        assert cli(daemon.home, "ping").returncode == 0
