"""One supervisor owns a project (seed 004 V1.1 §2, the audit's live check B): a
second home on the same project root is refused, naming the owner, until the
first supervisor is gone; a supervisor killed outright leaves no lock behind."""

from __future__ import annotations

import os
from pathlib import Path

from corral.supervisor.home import home_dir as homes
from tests.harness import Daemon, agent_spec, cli, running, wait_supervisor_gone


def test_a_second_home_on_the_same_project_is_refused_naming_the_owner(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    spec = short_tmp / "swarm.toml"
    with running(short_tmp / "first", agent_spec(steps='steps = [{ final = "x" }]')) as first:
        spec.write_text((first.spec or spec).read_text())
        second = cli(short_tmp / "second", "up", "--spec", str(spec))
        if second.returncode == 0:  # the defect: reap the second owner before failing
            cli(short_tmp / "second", "down")
        assert second.returncode != 0
        assert f"home {first.home}" in second.stderr and "owns the project" in second.stderr, second.stderr
        assert str((short_tmp / "ws").resolve()) in second.stderr
        assert not homes.is_locked(short_tmp / "second")
        # The owner is killed outright: the kernel drops its lock, and the next one starts.
        pid = first.kill_supervisor()
        wait_supervisor_gone(first, pid)
    other = Daemon(short_tmp / "second", spec)
    try:
        other.up()
    finally:
        other.shutdown()


def test_the_lock_is_on_the_directory_not_a_file_the_model_could_remove(short_tmp: Path) -> None:
    """Nothing is written into the project: there is no lock file to delete."""
    (short_tmp / "ws").mkdir()
    with running(short_tmp / "h", agent_spec(steps='steps = [{ final = "x" }]')):
        assert sorted(os.listdir(short_tmp / "ws")) == []
