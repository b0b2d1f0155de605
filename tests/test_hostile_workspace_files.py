"""A hostile repository's context files (issue 48, A.2, A.3, D.17): every file the
host parses is bounded in bytes and in nesting before a parser sees it.

* A skill whose YAML front matter nests 1,500 or 2,000 deep, and manifests nested 100,000
  deep (under their byte cap), raised RecursionError while the agent built its
  first prompt: the agent crash-looped, its group gave up, and the run stayed
  ``running`` for good. Each is now skipped with its reason, and the run completes.
* 24 skills of 122 KiB front matter took 3.4 s each to parse: the agent was killed
  by its stall watchdog every 30 s, and the supervisor's stale-action guard held its
  loop. A front matter is bounded (8 KiB), all of them too (64 KiB), and libyaml parses.
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

from tests.harness import CORRAL, actor_running, agent_spec, ledger_rows, running, wait_run

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
    # Flow style, 1,500 deep, 7.5 KB (under the 8 KiB front matter cap): past libyaml's
    # own 1,000, whose scanner stops before the first event; reported as too deep.
    _skill(ws, "flow", "name: flow\ndescription: deep\nmeta: " + "{a: " * 1500 + "1" + "}" * 1500)
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
        # The agent was never restarted (its first incarnation comes up and stays).
        daemon.wait_until(actor_running("writer", incarnation=1), what="writer running")
        run_id = daemon.call("run", agent_id="writer", task="still fine")["run_id"]
        assert wait_run(daemon, run_id, {"completed", "failed"})["run"]["status"] == "completed"
        assert daemon.actor("writer")["incarnation"] == 1


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


# -- parse work: a skill's front matter and all of them, bounded --------------------------

#: The bounds docs/security.md names (actors/repo_skills.py): the test writes its
#: repository against them, so it fails, rather than passes by luck, if they move.
FRONT_MATTER_CAP = 8 * 1024
FRONT_MATTER_NODES = 256
FRONT_MATTER_TOTAL = 64 * 1024
FRONT_MATTER_NODES_TOTAL = 4096


def _costly_front_matter(name: str, pairs: int) -> tuple[str, int]:
    """The red team's shape: ``k{i}: [a, b]`` per line, the costliest text per byte
    for a YAML parser (four nodes in 12 bytes). Returns the text and its nodes."""
    text = f"name: {name}\ndescription: costly\n" + "".join(f"k{i}: [a, b]\n" for i in range(pairs))
    return text.rstrip("\n"), 5 + 4 * pairs


def _costly_repository(ws: Path) -> tuple[dict[str, str], list[str], list[str]]:
    """24 skills of ~122 KiB front matter each (under the 128 KiB file cap: they took
    3.4 s each to parse; the agent was killed by the stall watchdog every 30 s), 4
    of 301 nodes in 1 KiB, and 14 of ~6.3 KiB each (each within the per-skill caps,
    together past the total). Returns the reason expected for each skill refused by
    a per-skill cap, the names counted within the total and those past it."""
    ws.mkdir(parents=True)
    (ws / "AGENTS.md").write_text("ROOT-RULE\n")
    # .codex is read first: its skill counts whatever comes after.
    folder = ws / ".codex" / "skills" / "release"
    folder.mkdir(parents=True)
    release = "name: release\ndescription: Cut a release"
    (folder / "SKILL.md").write_text(f"---\n{release}\n---\nBODY\n")
    refused: dict[str, str] = {}
    spent, within, past = len(release), ["release"], []
    for i in range(4):  # sorted before huge-*, wide-*: scanned, so their bytes count
        name = f"dense-{i:02}"
        text, nodes = _costly_front_matter(name, 74)
        assert len(text) < FRONT_MATTER_CAP and nodes > FRONT_MATTER_NODES
        _skill(ws, name, text)
        refused[name], spent = f"the front matter has more than {FRONT_MATTER_NODES} YAML nodes", spent + len(text)
    for i in range(24):
        name = f"huge-{i:02}"
        text, _ = _costly_front_matter(name, 9000)
        assert len(text) > FRONT_MATTER_CAP and len(f"---\n{text}\n---\nBODY\n") < 128 * 1024
        _skill(ws, name, text)
        refused[name] = "the front matter is larger than 8 KiB"
    for i in range(14):
        name = f"wide-{i:02}"
        text = f"name: {name}\ndescription: {'wide ' * 1260}"
        assert len(text) < FRONT_MATTER_CAP
        _skill(ws, name, text)
        if not past and spent + len(text) <= FRONT_MATTER_TOTAL:
            spent += len(text)
            within.append(name)
        else:
            past.append(name)
    assert within[1:] and past
    return refused, within, past


WRITE_INDEX_THEN_DONE = """
[[agents.steps]]
actions = [{ tool = "fs.write", input = { path = "note.txt", content = "hi" } },
           { tool = "project.index", input = {} }]
[[agents.steps]]
final = "done"
"""


def test_costly_front_matter_is_bounded_per_skill_and_in_all_and_the_run_completes(short_tmp: Path) -> None:
    """The agent builds its prompt and the supervisor's stale-action guard rebuilds the
    context at each action (after the write, the walked root moved): neither may spend
    seconds per skill. The assertion is on the bounds (what was parsed, what skipped
    and why), and on the agent never having been restarted by its stall watchdog."""
    ws = short_tmp / "ws"
    refused, within, past = _costly_repository(ws)
    with running(short_tmp / "h", agent_spec(workspace=str(ws), steps=WRITE_INDEX_THEN_DONE)) as daemon:
        run_id = daemon.call("run", agent_id="writer", task="look")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed", shown["run"]
        assert [a["phase"] for a in shown["actions"]] == ["ok", "ok"], "the stale guard agreed after the write"
        result = ledger_rows(daemon.home, "SELECT result FROM actions WHERE action_id = ?",
                             shown["actions"][1]["action_id"])
        plans = ledger_rows(daemon.home, "SELECT plan FROM plans WHERE run_id = ? ORDER BY loop_index", run_id)
        actors = {a["id"]: a for a in daemon.status()["actors"]}
    assert (actors["writer"]["status"], actors["writer"]["restarts"]) == ("running", 0), "never stalled"
    assert (ws / "note.txt").read_text() == "hi"
    summary = json.loads(result[0]["result"])["output"]["summary"]
    assert [s["name"] for s in summary["skills"]] == sorted(within)
    assert summary["skills_truncated"] is True, "a skill left out for the budget marks the catalog cut"
    reasons = {s["path"]: s["reason"] for s in summary["skills_skipped"]}
    assert set(reasons) == {f".agents/skills/{name}/SKILL.md" for name in [*refused, *past]}, reasons
    for name, why in refused.items():
        assert reasons[f".agents/skills/{name}/SKILL.md"] == why
    for name in past:
        reason = reasons[f".agents/skills/{name}/SKILL.md"]
        assert "front matter budget" in reason and "64 KiB" in reason, reason
    sources = json.loads(plans[0]["plan"])["context"]["sources"]
    skills = {f"skill {n} at .agents/skills/{n}/SKILL.md" for n in within[1:]}
    assert set(sources) == {"AGENTS.md at AGENTS.md", "skill release at .codex/skills/release/SKILL.md", *skills}


def test_the_nodes_built_for_a_catalog_are_bounded_and_a_rebuild_parses_nothing_again(tmp_path: Path) -> None:
    """Small front matters dense in nodes, each within the per-skill caps: past the
    catalog's node budget the rest are skipped, never built. What the parser did is
    counted (``parses``), not timed."""
    from corral.actors import repo_skills

    ws = tmp_path / "ws"
    ws.mkdir()
    spent, within = 0, []
    for i in range(24):
        name = f"dense-{i:02}"
        text, nodes = _costly_front_matter(name, 60)
        assert nodes <= FRONT_MATTER_NODES and len(text) < 1024
        _skill(ws, name, text)
        if len(within) == i and spent + nodes <= FRONT_MATTER_NODES_TOTAL:
            spent, within = spent + nodes, [*within, name]
    assert 0 < len(within) < 24
    memo = repo_skills.FrontMatterMemo()
    catalog = repo_skills.discover(ws, memo)
    assert [s.name for s in catalog.skills] == within and catalog.truncated
    reasons = [s.reason for s in catalog.skipped]
    assert len(reasons) == 24 - len(within)
    assert all("front matter budget" in r and "4096 YAML nodes" in r for r in reasons), reasons
    # Each counted one scanned and built; the first past the budget scanned only; the rest not at all.
    assert memo.parses == 2 * len(within) + 1
    assert repo_skills.discover(ws, memo) == catalog and memo.parses == 2 * len(within) + 1


def test_the_depth_check_counts_on_libyaml_and_on_the_pure_parser_alike() -> None:
    """libyaml (when PyYAML has it) and the pure parser give the same verdicts; past
    libyaml's own 1,000 levels its scanner stops first, which is too deep all the same."""
    import yaml

    from corral.core import nesting

    loaders = [yaml.SafeLoader, *([yaml.CSafeLoader] if yaml.__with_libyaml__ else [])]
    assert nesting.yaml_loader() is loaders[-1], "libyaml's loader whenever PyYAML has it"
    flow, block = "a: " + "[" * 1500 + "]" * 1500, "- " * 40 + "x"
    for loader in loaders:
        nesting.check_yaml("a:\n- - x\nb: {c: [1]}", 3, loader)  # exactly 3 deep: fine
        with pytest.raises(nesting.TooDeep, match=r"nested 17\+ levels deep \(at most 16\)"):
            nesting.check_yaml(block, 16, loader)
        with pytest.raises(nesting.TooDeep, match=r"levels deep \(at most 16\)"):
            nesting.check_yaml(flow, 16, loader)
        with pytest.raises(yaml.YAMLError):  # any other parse error is the caller's to name
            nesting.check_yaml("a: [1, 2}  # " + "-" * 20, 16, loader)
        assert nesting.yaml_nodes("a: [b, c]\nd: e", 16, 7, loader) == 7  # a map, 4 scalars, a list, 2 in it
        with pytest.raises(nesting.TooMany, match="more than 6 YAML nodes"):
            nesting.yaml_nodes("a: [b, c]\nd: e", 16, 6, loader)
    if yaml.__with_libyaml__:  # a limit past libyaml's own: its refusal, by name
        with pytest.raises(nesting.TooDeep, match=r"nested 1000\+ levels deep \(at most 1200\)"):
            nesting.check_yaml(flow, 1200, yaml.CSafeLoader)


def test_a_rebuild_parses_only_the_front_matter_that_changed(tmp_path: Path) -> None:
    """The stale-action guard rebuilds the context after every write (a walked
    directory moved): the skills' front matter is parsed again only where it changed.
    Counted in parser runs, not time."""
    from corral.actors.project_context import ContextCache

    ws = tmp_path / "ws"
    ws.mkdir()
    for name in ("alpha", "beta", "gamma"):
        _skill(ws, name, f"name: {name}\ndescription: the {name} skill")
    cache = ContextCache(ws)
    first = cache.current()
    # Each front matter scanned (depth, nodes) and built: two parser runs.
    assert [s.name for s in first.skills] == ["alpha", "beta", "gamma"] and cache.memo.parses == 6
    (ws / "note.txt").write_text("an agent's write")
    second = cache.current()
    assert second is not first and second.fingerprint == first.fingerprint
    assert cache.memo.parses == 6, "nothing the skills say changed: nothing parsed again"
    _skill(ws, "beta", "name: beta\ndescription: the beta skill, edited")
    third = cache.current()
    assert cache.memo.parses == 8 and third.fingerprint != first.fingerprint
    assert [s.description for s in third.skills][1] == "the beta skill, edited"
