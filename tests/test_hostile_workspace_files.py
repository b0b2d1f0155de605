"""A hostile repository's context files (issue 48, A.2, A.3, D.17): every file the
host parses is bounded in bytes and in nesting before a parser sees it.

* A skill whose YAML front matter nests 2,000 deep, and manifests nested 100,000
  deep (under their byte cap), raised RecursionError while the agent built its
  first prompt: the agent crash-looped, its group gave up, and the run stayed
  ``running`` for good. Each is now skipped with its reason, and the run completes.
* A sparse 64 GiB AGENTS.md was hashed whole at every build: it is read to a cap.
* A FIFO or a symlink swapped in after the walk's lstat is neither waited on nor
  followed.
* A scripted agent's script nested 100,000 deep made ``corral up`` die with a
  RecursionError traceback: it is a spec error naming the file and the bound.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.harness import CORRAL, agent_spec, ledger_rows, running, wait_run

#: 100,000 levels, 200 KB: under the 256 KiB manifest cap, past every parser's stack.
DEEP = 100_000


def _skill(ws: Path, name: str, front_matter: str) -> None:
    folder = ws / ".agents" / "skills" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SKILL.md").write_text(f"---\n{front_matter}\n---\nBODY\n")


def _hostile_repository(ws: Path) -> None:
    """A repository as a clone would bring it: deep skills and deep manifests beside
    a well-formed skill and AGENTS.md (which must still reach the model)."""
    ws.mkdir(parents=True)
    (ws / "AGENTS.md").write_text("ROOT-RULE\n")
    _skill(ws, "release", "name: release\ndescription: Cut a release")
    # Flow style, 2,000 deep, about 9 KB (the case).
    _skill(ws, "flow", "name: flow\ndescription: deep\nmeta: " + "{a: " * 2000 + "1" + "}" * 2000)
    # Block style: one sequence per "- ", on one line (no indentation needed).
    _skill(ws, "block", "name: block\ndescription: deep\nmeta:\n  " + "- " * 2000 + "x")
    (ws / "package.json").write_text("[" * DEEP + "]" * DEEP)
    (ws / "pyproject.toml").write_text("x = " + "[" * DEEP + "]" * DEEP + "\n")
    (ws / "crate").mkdir()
    (ws / "crate" / "Cargo.toml").write_text("x = " + "{ a = " * (DEEP // 4) + "1" + " }" * (DEEP // 4) + "\n")
    assert all(p.stat().st_size < 256 * 1024 for p in (ws / "package.json", ws / "pyproject.toml"))


INDEX_THEN_DONE = """
[[agents.steps]]
actions = [{ tool = "project.index", input = {} }]
[[agents.steps]]
final = "done"
"""


def test_deep_skills_and_manifests_are_skipped_with_a_reason_and_the_run_completes(short_tmp: Path) -> None:
    ws = short_tmp / "ws"
    _hostile_repository(ws)
    with running(short_tmp / "h", agent_spec(workspace=str(ws), steps=INDEX_THEN_DONE)) as daemon:
        run_id = daemon.call("run", agent_id="writer", task="look")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed", shown["run"]
        (index,) = [a for a in shown["actions"] if a["tool"] == "project.index"]
        assert index["phase"] == "ok", index
        result = ledger_rows(daemon.home, "SELECT result FROM actions WHERE action_id = ?", index["action_id"])
        plans = ledger_rows(daemon.home, "SELECT plan FROM plans WHERE run_id = ? ORDER BY loop_index", run_id)
        actors = {a["id"]: a for a in daemon.status()["actors"]}
    assert (actors["writer"]["status"], actors["writer"]["restarts"]) == ("running", 0), "the agent never crashed"
    summary = json.loads(result[0]["result"])["output"]["summary"]
    assert [s["name"] for s in summary["skills"]] == ["release"], "a good skill beside bad ones still counts"
    reasons = {s["path"]: s["reason"] for s in summary["skills_skipped"]}
    for name in ("flow", "block"):
        reason = reasons[f".agents/skills/{name}/SKILL.md"]
        assert "nested" in reason and "levels deep (at most" in reason, reason
    manifests = {m["path"]: m for m in summary["layout"]["manifests"]}
    assert set(manifests) == {"package.json", "pyproject.toml", "crate/Cargo.toml"}
    for path, found in manifests.items():
        assert "nested" in found.get("error", "") and "levels deep (at most" in found["error"], (path, found)
    # The first plan was made with the context: the AGENTS.md and the good skill, fingerprinted.
    sources = json.loads(plans[0]["plan"])["context"]["sources"]
    assert sources["AGENTS.md at AGENTS.md"] == hashlib.sha256(b"ROOT-RULE\n").hexdigest()[:16]
    assert set(sources) == {"AGENTS.md at AGENTS.md", "skill release at .agents/skills/release/SKILL.md"}


#: Past the 24 KiB shown (so the text shown is plain), far short of the cap; then a hole.
SPARSE_HEAD = b"RULE-HEAD\n" + b"keep lines short\n" * 2000


def test_a_sparse_64_gib_agents_md_is_read_to_its_cap(short_tmp: Path) -> None:
    """``truncate -s 64G AGENTS.md``: the digest covers the capped head (what was
    read), the document is marked truncated, and the run completes. The assertion
    is on what was read (the digest of exactly the cap's bytes), not on time."""
    from corral.actors.project_context import MAX_DOCUMENT_HASH_BYTES

    ws = short_tmp / "ws"
    ws.mkdir()
    agents = ws / "AGENTS.md"
    agents.write_bytes(SPARSE_HEAD)
    os.truncate(agents, 64 << 30)
    head = (SPARSE_HEAD + b"\0" * MAX_DOCUMENT_HASH_BYTES)[:MAX_DOCUMENT_HASH_BYTES]
    capped = hashlib.sha256(head).hexdigest()
    steps = """
[[agents.steps]]
actions = [{ tool = "fs.write", input = { path = "note.txt", content = "hi" } },
           { tool = "project.index", input = {} }]
[[agents.steps]]
final = "done"
"""
    with running(short_tmp / "h", agent_spec(workspace=str(ws), steps=steps)) as daemon:
        run_id = daemon.call("run", agent_id="writer", task="write")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed", shown["run"]
        assert [a["phase"] for a in shown["actions"]] == ["ok", "ok"], "the stale guard agreed: same capped digest"
        plans = ledger_rows(daemon.home, "SELECT plan FROM plans WHERE run_id = ? ORDER BY loop_index", run_id)
        result = ledger_rows(daemon.home, "SELECT result FROM actions WHERE action_id = ?",
                             shown["actions"][1]["action_id"])
    sources = json.loads(plans[0]["plan"])["context"]["sources"]
    assert sources["AGENTS.md at AGENTS.md"] == capped[:16], "the prompt's digest is of the first cap bytes only"
    (document,) = json.loads(result[0]["result"])["output"]["summary"]["documents"]
    assert (document["path"], document["sha256"], document["truncated"]) == ("AGENTS.md", capped, True)
    assert (ws / "note.txt").read_text() == "hi"


def test_the_reader_neither_waits_on_a_fifo_nor_follows_a_swapped_symlink(tmp_path: Path) -> None:
    """What the walk's lstat saw can change before the open: the open itself refuses."""
    from corral.core import nesting

    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    outside = tmp_path / "outside.md"
    outside.write_text("OUTSIDE SECRET\n")
    os.mkfifo(ws / "AGENTS.md")  # no writer: an open without O_NONBLOCK would wait forever
    (ws / "README.md").symlink_to(outside)
    (ws / "linked").symlink_to(ws / "sub")
    (ws / "sub" / "AGENTS.md").write_text("SUB\n")
    with pytest.raises(nesting.NotReadable, match="not a regular file"):
        nesting.read_inside(ws, "AGENTS.md", 1024)
    with pytest.raises(nesting.NotReadable, match="symlink"):
        nesting.read_inside(ws, "README.md", 1024)
    with pytest.raises(nesting.NotReadable, match="symlink"):
        nesting.read_inside(ws, "linked/AGENTS.md", 1024)
    read = nesting.read_inside(ws, "sub/AGENTS.md", 2)
    assert (read.data, read.size, read.truncated) == (b"SU", 4, True)


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_a_script_nested_100000_deep_is_a_spec_error_without_a_traceback(short_tmp: Path, suffix: str) -> None:
    script = short_tmp / f"deep{suffix}"
    if suffix == ".json":
        script.write_text('{"steps": ' + "[" * DEEP + "]" * DEEP + "}")
    else:
        script.write_text("steps = " + "[" * DEEP + "]" * DEEP + "\n")
    spec = short_tmp / "swarm.toml"
    spec.write_text(f'[project]\nroot = "."\n[[agents]]\nid = "a"\nscript = "{script.name}"\n')
    home = short_tmp / "home"
    result = subprocess.run([*CORRAL, "--home", str(home), "up", "--spec", str(spec)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr  # the exit code of a bad spec
    assert "bad spec" in result.stderr and str(script) in result.stderr, result.stderr
    assert "nested" in result.stderr and "at most" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "RecursionError" not in result.stderr, result.stderr[-2000:]
    assert not home.exists(), "nothing created"


def test_a_script_nested_deep_over_the_wire_is_refused_by_name(short_tmp: Path) -> None:
    """``corral run --script`` sends the text: the supervisor parses it, bounded too."""
    ws = short_tmp / "ws"
    ws.mkdir()
    with running(short_tmp / "h", agent_spec(workspace=str(ws), steps='[[agents.steps]]\nfinal = "ok"')) as daemon:
        deep = '{"steps": ' + "[" * DEEP + "]" * DEEP + "}"
        caught: Any = None
        try:
            daemon.call("run", agent_id="writer", task="t", script=deep)
        except Exception as exc:  # the client raises the supervisor's refusal
            caught = exc
        assert caught is not None and "nested" in str(caught) and "at most" in str(caught), caught
        assert daemon.actor("writer")["status"] == "running"
        run_id = daemon.call("run", agent_id="writer", task="still fine")["run_id"]
        assert wait_run(daemon, run_id, {"completed", "failed"})["run"]["status"] == "completed"


def test_a_fifo_as_the_collaboration_policy_is_a_named_problem_not_a_hung_supervisor(short_tmp: Path) -> None:
    """A clone can ship ``.corral/collaboration-policy.json``; as a FIFO with no writer
    it blocked the supervisor's own loop at its first read."""
    ws = short_tmp / "ws"
    (ws / ".corral").mkdir(parents=True)
    os.mkfifo(ws / ".corral" / "collaboration-policy.json")
    with running(short_tmp / "h", agent_spec(workspace=str(ws), steps='[[agents.steps]]\nfinal = "ok"')) as daemon:
        shown = daemon.call("collaboration.show")
        assert shown["exists"] and "not a regular file" in shown["problem"], shown
        assert daemon.status()["actors"], "the supervisor still answers"
