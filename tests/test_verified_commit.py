"""Write, verify, commit, with real processes (issue 40's flows, seed 004 V1.3 and
V1.12): a commit needs a person's approval and a passed verification on the
current project revision; a write after a verification makes the next commit wait
for another; a changeset that fails its check writes nothing and moves no revision.
One supervisor on one git repository; each flow is one run with its own script."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

from corral.actors.tools.git_exact_commit import StatusEntry, commit_snapshot_fingerprint
from corral.sandbox.bwrap import bwrap_available
from tests.harness import Daemon, ledger_rows, running, wait_for, wait_run

SANDBOX_TABLE = "" if bwrap_available() else '[sandbox]\nmode = "allow-unsandboxed"\n'
SPEC = f"""
[project]
root = "ws"
verify = [["sh", "-c", "grep -q good app.py"]]
{SANDBOX_TABLE}
[policy]
"fs.write" = "auto"
"project.changeset" = "auto"
"project.verify" = "auto"
[[agents]]
id = "dev"
role = "root"
[[agents.steps]]
final = "each run brings its own script"
"""


def _git(ws: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=ws, check=True, capture_output=True, text=True).stdout


def _act(tool: str, **tool_input: Any) -> dict[str, Any]:
    return {"actions": [{"tool": tool, "input": tool_input}]}


def _commit(ws: Path, message: str, content: str) -> dict[str, Any]:
    """The commit of app.py when it is the one change (`` M``) and holds ``content``,
    on the branch main at the HEAD of now."""
    head = _git(ws, "rev-parse", "HEAD").strip()
    change = StatusEntry("app.py", " M", hashlib.sha256(content.encode()).hexdigest())
    fingerprint = commit_snapshot_fingerprint(head, "refs/heads/main", [change])
    return _act("project.git_commit", message=message, paths=["app.py"], expected_head=head,
                expected_snapshot_fingerprint=fingerprint)


def _run(daemon: Daemon, task: str, *steps: dict[str, Any] | str) -> str:
    script = json.dumps({"steps": [{"final": s} if isinstance(s, str) else s for s in steps]})
    run_id: str = daemon.call("run", agent_id="dev", task=task, script=script)["run_id"]
    return run_id


def _approve_next(daemon: Daemon, run_id: str) -> dict[str, Any]:
    shown = wait_run(daemon, run_id, {"waiting-confirmation", "completed", "failed"})
    assert shown["run"]["status"] == "waiting-confirmation", shown["run"]
    (waiting,) = [a for a in shown["actions"] if a["phase"] == "waiting-confirmation"]
    assert waiting["tool"] == "project.git_commit" and waiting["policy"] == "confirm"
    daemon.call("continue_action", action_id=waiting["action_id"], decision="approve")
    return waiting


def _revisions(daemon: Daemon) -> int:
    return int(ledger_rows(daemon.home, "SELECT COUNT(*) AS n FROM project_revisions")[0]["n"])


def test_write_verify_commit_and_a_write_after_the_verify_waits_for_another(short_tmp: Path) -> None:
    ws = short_tmp / "ws"
    ws.mkdir()
    _git(ws, "init", "-q", "-b", "main")
    _git(ws, "config", "user.name", "Repo Owner")
    _git(ws, "config", "user.email", "owner@example.invalid")
    (ws / "app.py").write_text("v0\n")
    (ws / "notes.txt").write_text("keep\n")
    _git(ws, "add", ".")
    _git(ws, "commit", "-q", "-m", "start")
    start = _git(ws, "rev-parse", "HEAD").strip()
    with running(short_tmp / "home", SPEC) as daemon:
        # 1. A write, a verify, then the commit (after a person approves it).
        first = _run(daemon, "first", _act("project.changeset", changes=[{"path": "app.py", "content": "good\n"}]),
                     _act("project.verify"), _commit(ws, "make app good", "good\n"), "committed")
        _approve_next(daemon, first)
        shown = wait_run(daemon, first, {"completed", "failed"})
        assert shown["run"]["status"] == "completed", shown["run"]
        one = _git(ws, "rev-parse", "HEAD").strip()
        assert _git(ws, "rev-parse", f"{one}^").strip() == start
        assert _git(ws, "show", f"{one}:app.py") == "good\n"
        assert _git(ws, "log", "-1", "--format=%an <%ae>") == "Repo Owner <owner@example.invalid>\n"

        # 2. A write after the verify: the commit is refused, nothing is committed,
        #    until the project is verified again on the new revision.
        second = _run(daemon, "second", _act("fs.write", path="app.py", content="good again\n"),
                      _commit(ws, "again, unverified", "good again\n"), _act("project.verify"),
                      _commit(ws, "again, verified", "good again\n"), "committed again")
        refused = _approve_next(daemon, second)
        accepted = _approve_next(daemon, second)
        shown = wait_run(daemon, second, {"completed", "failed"})
        assert shown["run"]["status"] == "completed", shown["run"]
        phases = {a["action_id"]: (a["phase"], a["error"]) for a in shown["actions"]}
        assert phases[refused["action_id"]][0] == "failed"
        assert "no passed verification on the current project revision" in str(phases[refused["action_id"]][1])
        assert phases[accepted["action_id"]][0] == "ok"
        two = _git(ws, "rev-parse", "HEAD").strip()
        assert _git(ws, "rev-parse", f"{two}^").strip() == one, "one commit, on the verified revision"
        assert _git(ws, "log", "--format=%s", f"{one}..{two}") == "again, verified\n"
        verified = ledger_rows(daemon.home, "SELECT status, revision FROM project_verifications ORDER BY created_at")
        assert [(v["status"], v["revision"]) for v in verified] == [("passed", 1), ("passed", 2)]

        # 3. A changeset whose second file fails its expected_sha256: nothing is
        #    written and the revision does not move.
        before = _revisions(daemon)
        stale = hashlib.sha256(b"not what is there").hexdigest()
        third = _run(daemon, "third", _act("project.changeset", changes=[
            {"path": "notes.txt", "content": "changed\n"},
            {"path": "app.py", "content": "good, third\n", "expected_sha256": stale},
        ]), "nothing changed")
        shown = wait_run(daemon, third, {"completed", "failed"})
        assert shown["run"]["status"] == "completed" and shown["final_reply"] == "nothing changed"
        assert [a["phase"] for a in shown["actions"]] == ["failed"]
        assert (ws / "notes.txt").read_text() == "keep\n" and (ws / "app.py").read_text() == "good again\n"
        assert _revisions(daemon) == before


def _refused_commit(daemon: Daemon, run_id: str) -> str:
    """The run's commit, approved, fails before any git write: its error."""
    waiting = _approve_next(daemon, run_id)
    shown = wait_run(daemon, run_id, {"completed", "failed"})
    (action,) = [a for a in shown["actions"] if a["action_id"] == waiting["action_id"]]
    assert action["phase"] == "failed", action
    return str(action["error"])


def test_a_commit_needs_a_passed_verification_of_its_own_run_on_a_non_zero_revision(short_tmp: Path) -> None:
    """Seed 004 V1.12: "当前 run 必须已在当前非零项目 revision 上取得 passed 验证凭证；……只审阅了
    用户预存脏改动或 revision 0 的工作树都不能提交": a verification at revision 0 (the
    user's own change, no change of corral's) and one made by another run do not count."""
    ws = short_tmp / "ws"
    ws.mkdir()
    _git(ws, "init", "-q", "-b", "main")
    _git(ws, "config", "user.name", "Repo Owner")
    _git(ws, "config", "user.email", "owner@example.invalid")
    (ws / "app.py").write_text("v0\n")
    _git(ws, "add", ".")
    _git(ws, "commit", "-q", "-m", "start")
    start = _git(ws, "rev-parse", "HEAD").strip()
    (ws / "app.py").write_text("good, the user's\n")  # the user's own dirty change
    with running(short_tmp / "home", SPEC) as daemon:
        zero = _run(daemon, "revision 0", _act("project.verify"), _commit(ws, "the user's", "good, the user's\n"),
                    "tried")
        why = _refused_commit(daemon, zero)
        assert "revision 0" in why
        assert [(v["status"], v["revision"]) for v in ledger_rows(
            daemon.home, "SELECT status, revision FROM project_verifications")] == [("passed", 0)]

        writer = _run(daemon, "write and verify", _act("fs.write", path="app.py", content="good\n"),
                      _act("project.verify"), "verified")
        assert wait_run(daemon, writer, {"completed", "failed"})["run"]["status"] == "completed"
        other = _run(daemon, "commit another run's verification", _commit(ws, "not mine", "good\n"), "tried")
        assert "this run" in _refused_commit(daemon, other)
        assert _git(ws, "rev-parse", "HEAD").strip() == start, "nothing was committed"

        own = _run(daemon, "verify, then commit", _act("project.verify"), _commit(ws, "mine", "good\n"), "done")
        _approve_next(daemon, own)
        assert wait_run(daemon, own, {"completed", "failed"})["run"]["status"] == "completed"
        assert _git(ws, "log", "--format=%s", f"{start}..HEAD") == "mine\n"


def test_an_agent_killed_after_the_branch_moved_leaves_the_commit_for_a_person(short_tmp: Path) -> None:
    """V1.12: "已知 commit 成功但专用 Agent DB 审计失败时，needs-reconciliation observation 和
    fallback terminal receipt 仍保留同一组安全字段，确保人工核对能找到 commit SHA": the agent
    is SIGKILLed right after the branch moved; the action waits for a person, its
    record holds the commit, its parent and the branch, and the reconciled receipt
    the model then sees names the commit. It is never committed twice."""
    ws = short_tmp / "ws"
    ws.mkdir()
    _git(ws, "init", "-q", "-b", "main")
    _git(ws, "config", "user.name", "Repo Owner")
    _git(ws, "config", "user.email", "owner@example.invalid")
    (ws / "app.py").write_text("v0\n")
    _git(ws, "add", "app.py")
    _git(ws, "commit", "-q", "-m", "start")
    start = _git(ws, "rev-parse", "HEAD").strip()
    spec = SPEC + '[[agents]]\nid = "noop"\n[[agents.steps]]\nfinal = "-"\n'
    with running(short_tmp / "h", spec, env={"CORRAL_FAILPOINTS": "commit.after-ref=kill@once"}) as daemon:
        run_id = _run(daemon, "write, verify, commit", _act("fs.write", path="app.py", content="good\n"),
                      _act("project.verify"), _commit(ws, "Make it good", "good\n"), "committed")
        _approve_next(daemon, run_id)
        shown = wait_run(daemon, run_id, {"needs-reconciliation", "completed", "failed"})
        assert shown["run"]["status"] == "needs-reconciliation", shown["run"]
        commit = _git(ws, "rev-parse", "HEAD").strip()
        assert commit != start and _git(ws, "rev-parse", "HEAD^").strip() == start
        (row,) = ledger_rows(daemon.home, "SELECT action_id, phase, result FROM actions WHERE run_id = ? AND"
                             " tool = 'project.git_commit'", run_id)
        assert row["phase"] == "needs-reconciliation"
        kept = json.loads(row["result"])["output"]
        assert (kept["commit"], kept["parent"], kept["branch"]) == (commit, start, "main")
        daemon.call("reconcile", action_id=row["action_id"], outcome="ok", note="the commit is on main")
        (receipt,) = ledger_rows(daemon.home, "SELECT result_summary FROM receipts WHERE action_id = ?",
                                 row["action_id"])
        assert commit[:12] in receipt["result_summary"]
        assert wait_run(daemon, run_id, {"completed", "failed"})["run"]["status"] == "completed"
        assert _git(ws, "rev-list", "--count", "HEAD").strip() == "2", "committed once"


def test_a_command_or_process_started_after_the_verify_voids_it_even_when_its_agent_dies(short_tmp: Path) -> None:
    """Seed 004 V1.11.1: "command.exec 只在 SANDBOX_READY 后推进 revision 和清除旧验证凭证" (and
    "command.start 只在 sandbox-ready 后写 … commit record"), with V1.12's "验证后再次修改…不能
    提交". The audit's live check: a verified change, then a command that appends to
    the file and whose agent is SIGKILLed before its result is recorded (failpoint
    ``command.after-exit``). Its outcome is unknown, a person reconciles it, and the
    commit that follows must not pass on the verification made before the command:
    the command made the next revision when its sandbox was ready, before it ran.
    The same for a process session. A command known to have changed nothing still
    made its revision, but its run finalizes without a verification. And a process
    that writes after the verify (it started before it) leaves sources that are not
    the verified ones: the commit compares the tree with the verification's."""
    ws = short_tmp / "ws"
    ws.mkdir()
    _git(ws, "init", "-q", "-b", "main")
    _git(ws, "config", "user.name", "Repo Owner")
    _git(ws, "config", "user.email", "owner@example.invalid")
    (ws / "app.py").write_text("v0\n")
    _git(ws, "add", "app.py")
    _git(ws, "commit", "-q", "-m", "start")
    start = _git(ws, "rev-parse", "HEAD").strip()
    spec = SPEC.replace("[policy]\n", '[policy]\n"command.exec" = "auto"\n"process.start" = "auto"\n')
    sh = lambda tool, script: _act(tool, program="sh", args=["-c", script])  # noqa: E731
    by_command, by_process = "good\nby-the-command\n", "good\nby-the-command\nby-the-process\n"
    with running(short_tmp / "h", spec, env={"CORRAL_FAILPOINTS": "command.after-exit=kill@once"}) as daemon:
        # 1. Verified, then a command whose agent dies once it exited: the commit after it is refused.
        first = _run(daemon, "verify, then a command, then commit", _act("fs.write", path="app.py", content="good\n"),
                     _act("project.verify"), sh("command.exec", "echo by-the-command >> app.py"),
                     _commit(ws, "with the command's line", by_command), _act("project.verify"), "done")
        shown = wait_run(daemon, first, {"needs-reconciliation", "completed", "failed"})
        assert shown["run"]["status"] == "needs-reconciliation", shown["run"]
        assert (ws / "app.py").read_text() == by_command  # the command did run
        (command,) = [a for a in shown["actions"] if a["tool"] == "command.exec"]
        assert command["phase"] == "needs-reconciliation"
        tools = [r["tool"] for r in ledger_rows(daemon.home, "SELECT tool FROM project_revisions ORDER BY revision")]
        assert tools == ["fs.write", "command.exec"], "the command's revision was made before it ran"
        daemon.call("reconcile", action_id=command["action_id"], outcome="failed", note="its agent died")
        why = _refused_commit(daemon, first)
        assert "no passed verification on the current project revision" in why, why
        assert _git(ws, "rev-parse", "HEAD").strip() == start, "nothing was committed"
        verified = ledger_rows(daemon.home, "SELECT status, revision FROM project_verifications ORDER BY created_at")
        assert [(v["status"], v["revision"]) for v in verified] == [("passed", 1), ("passed", 2)]

        # 2. A process session started after this run's verify: the same.
        second = _run(daemon, "verify, then a process, then commit", _act("project.verify"),
                      sh("process.start", "echo by-the-process >> app.py"),
                      _commit(ws, "with the process's line", by_process), _act("project.verify"), "done")
        shown = wait_run(daemon, second, {"waiting-confirmation", "completed", "failed"})
        wait_for("the process's write", lambda: (ws / "app.py").read_text() == by_process)
        why = _refused_commit(daemon, second)
        assert "no passed verification on the current project revision" in why, why
        assert _git(ws, "rev-parse", "HEAD").strip() == start, "nothing was committed"

        # 3. A command that changed nothing: a revision all the same, and no verification needed to finish.
        third = _run(daemon, "only look", sh("command.exec", "cat app.py"), "looked")
        assert wait_run(daemon, third, {"completed", "failed"})["run"]["status"] == "completed"
        tools = [r["tool"] for r in ledger_rows(daemon.home, "SELECT tool FROM project_revisions ORDER BY revision")]
        assert tools == ["fs.write", "command.exec", "process.start", "command.exec"]

        # 4. A process started before the verify writes after it (on a signal the test
        #    gives once the commit waits): its revision came before the verify, so only
        #    the tree itself tells that the verified sources are not the ones committed.
        late = by_process + "late\n"
        signal = ws / ".git" / "corral-test-go"  # outside the source fingerprint, readable inside
        fourth = _run(daemon, "a process, verify, commit",
                      sh("process.start", "until [ -e .git/corral-test-go ]; do sleep 0.05; done; echo late >> app.py"),
                      _act("project.verify"), _commit(ws, "with the late line", late), _act("project.verify"), "done")
        wait_run(daemon, fourth, {"waiting-confirmation", "completed", "failed"})
        signal.touch()
        wait_for("the late write", lambda: (ws / "app.py").read_text() == late)
        why = _refused_commit(daemon, fourth)
        assert "changed since" in why, why
        assert _git(ws, "rev-parse", "HEAD").strip() == start, "nothing was committed"
