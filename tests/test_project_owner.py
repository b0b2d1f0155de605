"""One supervisor owns a project (seed 004 V1.1 §2, the audit's live check B): a
second home on the same project root is refused, naming the owner, until the
first supervisor is gone; a supervisor killed outright leaves no lock behind. The
lock holds whatever state directory or HOME each supervisor was started with, and
for nested roots too (red team, MEDIUM): one home on ``p`` and another on ``p/sub``
would both write ``p/sub/x``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.supervisor.home import home_dir as homes
from tests.harness import Daemon, agent_spec, cli, running, wait_supervisor_gone

FINAL = 'steps = [{ final = "x" }]'


def _refused(home: Path, workspace: str, env: dict[str, str] | None = None) -> str:
    """Start a supervisor on ``workspace``; it must be refused: its error."""
    spec = home.parent / f"{home.name}-spec.toml"
    spec.write_text(agent_spec(workspace, steps=FINAL))
    daemon = Daemon(home, spec, env)
    try:
        daemon.up()
    except AssertionError as exc:
        assert not homes.is_locked(home)
        return str(exc)
    daemon.shutdown()  # the defect: reap the second owner before failing
    raise AssertionError(f"a second supervisor started on {workspace}")


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


def test_another_state_directory_or_home_does_not_make_a_second_owner(short_tmp: Path) -> None:
    """The lock's directory is the user's, not the environment's: XDG_STATE_HOME and
    HOME are a process's own, and each supervisor would otherwise lock its own file."""
    (short_tmp / "ws").mkdir()
    (short_tmp / "state").mkdir()
    (short_tmp / "fakehome").mkdir()
    with running(short_tmp / "first", agent_spec(steps=FINAL)) as first:
        for env in ({"XDG_STATE_HOME": str(short_tmp / "state")},
                    {"HOME": str(short_tmp / "fakehome"), "XDG_STATE_HOME": ""}):
            error = _refused(short_tmp / f"second{len(env)}", "ws", env)
            assert f"home {first.home}" in error and "owns the project" in error, error


@pytest.mark.parametrize("owner, second", [("ws", "ws/sub"), ("ws/sub", "ws")])
def test_nested_roots_have_one_owner(short_tmp: Path, owner: str, second: str) -> None:
    """A root inside an owned one, or around it, is refused naming the owner; once the
    owner is killed outright its record stays in the file but counts no more."""
    (short_tmp / "ws" / "sub").mkdir(parents=True)
    with running(short_tmp / "first", agent_spec(owner, steps=FINAL)) as first:
        error = _refused(short_tmp / "second", second)
        assert f"home {first.home}" in error and "owns the project" in error, error
        assert str((short_tmp / owner).resolve()) in error, error
        pid = first.kill_supervisor()
        wait_supervisor_gone(first, pid)
    with running(short_tmp / "second", agent_spec(second, steps=FINAL)):
        pass


def test_sibling_roots_each_have_their_own_owner(short_tmp: Path) -> None:
    (short_tmp / "ws" / "a").mkdir(parents=True)
    (short_tmp / "ws" / "b").mkdir(parents=True)
    with running(short_tmp / "first", agent_spec("ws/a", steps=FINAL)), \
            running(short_tmp / "second", agent_spec("ws/b", steps=FINAL)):
        pass


def test_an_owners_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    """Another user who can write the directory could remove a held lock's file (a
    second owner then locks a new one): such a directory is refused, not used."""
    from corral.supervisor.home.project_lock import _open_owners

    shared = tmp_path / "owners"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(homes.HomeError, match="not yours alone"):
        _open_owners(shared)
    shared.chmod(0o700)
    os.close(_open_owners(shared))


def test_a_clusters_nodes_share_a_project_and_nobody_else_does(tmp_path: Path) -> None:
    """The nodes of one PostgreSQL cluster work in one project root side by side (one
    ledger, one revision: tests/test_cluster_project_revision.py); a home, or another
    cluster, on that root is a second owner and is refused, and a cluster's node is
    refused on a root a home owns (seed 004 V1.1 §2: "不同 AppData 启动的 Runner 不能同时接管同一项目").
    A strict re-audit found cluster nodes taking no project lock at all."""
    from corral.supervisor.home.project_lock import ProjectBusy, ProjectLock

    root = tmp_path / "ws"
    root.mkdir()
    node_a, node_b = ProjectLock(root, tmp_path / "a", cluster="c1"), ProjectLock(root, tmp_path / "b", cluster="c1")
    node_a.acquire()
    node_b.acquire()
    with pytest.raises(ProjectBusy, match="cluster"):
        ProjectLock(root, tmp_path / "home").acquire()
    with pytest.raises(ProjectBusy, match="cluster"):
        ProjectLock(root, tmp_path / "other", cluster="c2").acquire()
    node_a.release()
    with pytest.raises(ProjectBusy, match="cluster"):
        ProjectLock(root, tmp_path / "home").acquire()  # node b still works there
    node_b.release()
    home = ProjectLock(root, tmp_path / "home")
    home.acquire()
    try:
        with pytest.raises(ProjectBusy, match=str(tmp_path / "home")):
            ProjectLock(root, tmp_path / "c", cluster="c1").acquire()
    finally:
        home.release()
    again = ProjectLock(root, tmp_path / "other", cluster="c2")
    again.acquire()  # everyone left: another cluster may come
    again.release()


def test_a_cluster_node_on_a_homes_project_is_refused_and_a_home_on_a_clusters(short_tmp: Path, pg_url: str) -> None:
    """Live: a home runs on ``ws``; a PostgreSQL node started on the same root is refused,
    naming the home. Then a node runs on ``ws2``; a home on it is refused, naming the cluster."""
    from corral.supervisor.ledger.ledger_spec import URL_ENV

    (short_tmp / "ws").mkdir()
    (short_tmp / "ws2").mkdir()
    spec = short_tmp / "node-spec.toml"
    spec.write_text(agent_spec("ws", steps=FINAL))
    node = Daemon(short_tmp / "node", spec, {URL_ENV: pg_url})
    try:
        with running(short_tmp / "owner", agent_spec("ws", steps=FINAL)):
            refused = cli(node.home, "up", "--spec", str(spec), "--node", "n1", env=node.env)
            if refused.returncode == 0:  # the defect: reap the second owner before failing
                node.pids_seen.add(homes.read_endpoint(node.home).pid)
            assert refused.returncode != 0 and not homes.is_locked(node.home), "a node started on a home's project"
            assert f"home {short_tmp / 'owner'}" in refused.stderr + refused.stdout
        spec.write_text(agent_spec("ws2", steps=FINAL))
        started = cli(node.home, "up", "--spec", str(spec), "--node", "n1", env=node.env)
        assert started.returncode == 0, started.stderr + started.stdout
        node.pids_seen.add(homes.read_endpoint(node.home).pid)
        assert "PostgreSQL cluster" in _refused(short_tmp / "home2", "ws2")
    finally:
        node.shutdown()


def test_a_hard_linked_lock_file_is_refused_and_a_crashed_owners_record_is_recovered_from(tmp_path: Path) -> None:
    """The seed: "项目 execution-owner 均拒绝符号链接、硬链接", and the owner's record is a
    diagnostic: a torn one never blocks the lock's new holder, who notes whom it recovered
    from only when the old record was whole ("仅在旧完整记录可信时写入 recoveredFromBootId")."""
    import json

    from corral.supervisor.home.project_lock import ProjectLock, owners_dir

    root = tmp_path / "ws"
    root.mkdir()
    first = ProjectLock(root, tmp_path / "crashed")
    first.acquire()
    assert first._fd is not None
    lock_file = next(path for path in owners_dir().glob("*.lock")
                     if os.fstat(first._fd).st_ino == path.stat().st_ino)
    os.close(first._fd)  # as a SIGKILL would: the lock goes, the record stays
    first._fd = None
    second = ProjectLock(root, tmp_path / "next")
    second.acquire()
    record = json.loads(lock_file.read_text())
    assert record["home"] == str(tmp_path / "next")
    assert record["recovered_from"] == {"home": str(tmp_path / "crashed"), "pid": os.getpid()}
    second.release()
    lock_file.write_text('{"home": "torn')  # a torn record: no recovery noted, nothing blocked
    third = ProjectLock(root, tmp_path / "third")
    third.acquire()
    assert "recovered_from" not in json.loads(lock_file.read_text())
    third.release()
    extra = lock_file.with_name(f"test-second-name-{os.getpid()}")  # a link stays on its file system
    os.link(lock_file, extra)
    try:
        with pytest.raises(homes.HomeError, match="hard link"):
            ProjectLock(root, tmp_path / "fourth").acquire()
    finally:
        extra.unlink()


def test_the_owners_directory_is_opened_level_by_level_without_following_a_symlink(tmp_path: Path) -> None:
    """The seed: "项目 execution-owner 均拒绝符号链接…Unix 通过 openat 逐级无跟随打开": below the
    user's home (the passwd entry's, the one trusted start), no level may be a symlink."""
    from corral.supervisor.home.project_lock import _open_owners

    base = tmp_path / "home"
    (base / "elsewhere").mkdir(parents=True)
    (base / ".local").symlink_to(base / "elsewhere")
    with pytest.raises(homes.HomeError, match="symlink"):
        _open_owners(base / ".local" / "state" / "corral" / "project-owners", base)
    assert not (base / "elsewhere" / "state").exists(), "nothing was made through the symlink"
    (base / ".local").unlink()
    os.close(_open_owners(base / ".local" / "state" / "corral" / "project-owners", base))
    assert (base / ".local" / "state" / "corral" / "project-owners").is_dir()
