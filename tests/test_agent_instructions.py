"""An agent's own instructions (issue 49 §1): ``instructions`` and
``instructions_file`` on an agent and a template, in the TOML spec and the Python
spec. They lead the system prompt of every turn, before the project context; a
delegate or a child gets its own; an edit of the file between plan and execution
blocks the action as an AGENTS.md edit does; ``corral transcript`` shows them;
the local model's prompt keeps them within its budget and compaction never drops
them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

import corral
from corral.actors.providers.base import ProviderRequest
from corral.actors.providers.local import system_prompt as local_prompt
from corral.actors.providers.openai import system_prompt as openai_prompt
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.spec.swarm_spec import SpecError, parse_spec
from tests.harness import agent_spec, cli, ledger_rows, running, wait_run

#: The run layer's calls as on a supervisor with no features (nothing is installed).
NO_FEATURES = RunFeatures()


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _transcript(home: Path, run_id: str) -> str:
    shown = cli(home, "transcript", run_id)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


# -- the spec ---------------------------------------------------------------------------


def test_the_spec_takes_them_on_agents_and_templates_and_reads_the_file_bounded(tmp_path: Path) -> None:
    (tmp_path / "roles").mkdir()
    (tmp_path / "roles" / "writer.md").write_text("You write release notes.\n")
    spec = parse_spec({
        "project": {"root": str(tmp_path)},
        "agents": [{"id": "writer", "instructions": "Be brief.", "instructions_file": "roles/writer.md",
                    "steps": [{"final": "x"}]}],
        "templates": [{"id": "helper", "instructions": "You help.", "steps": [{"final": "x"}]}],
    }, str(tmp_path / "swarm.toml"))
    agent, template = spec.agents[0], spec.templates[0]
    assert agent.instructions == "Be brief."
    assert agent.instructions_file == str((tmp_path / "roles" / "writer.md").resolve())
    assert (template.instructions, template.instructions_file) == ("You help.", None)

    def refused(table: dict[str, Any]) -> str:
        with pytest.raises(SpecError) as caught:
            agent = {"id": "a", "steps": [{"final": "x"}], **table}
            parse_spec({"project": {"root": str(tmp_path)}, "agents": [agent]}, str(tmp_path / "swarm.toml"))
        return str(caught.value)

    assert "agents[0].instructions_file" in refused({"instructions_file": "roles/missing.md"})
    (tmp_path / "roles" / "huge.md").write_text("x" * (300 * 1024))
    assert "agents[0].instructions_file" in refused({"instructions_file": "roles/huge.md"})
    assert "agents[0].instructions" in refused({"instructions": 5})
    assert "agents[0]: unknown key 'instruction'" in refused({"instruction": "x"})


def test_the_python_spec_makes_the_file_absolute(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    role = short_tmp / "role.md"
    role.write_text("ROLE-FROM-PYTHON\n")
    spec = {"project": {"root": str(short_tmp)},
            "agents": [{"id": "writer", "instructions_file": "role.md", "steps": [{"final": "done"}]}]}
    monkeypatch.chdir(short_tmp)  # a dict's relative paths are relative to the current directory
    with corral.Client.start(spec=spec, home=short_tmp / "h") as client:
        result = client.run("writer", "go", timeout=60)
        assert result.status == "completed"
        run_id = result.run_id
    assert "ROLE-FROM-PYTHON" in _transcript(short_tmp / "h", run_id)


# -- the prompt -------------------------------------------------------------------------


def _request(instructions: str, context: str = "REPOSITORY CONTEXT\nAGENTS-RULE") -> ProviderRequest:
    return ProviderRequest(run_id="r", agent_id="a", task="t", loop_index=0, history=(), tools=(), slot="s",
                           project_context=context, instructions=instructions)


def test_they_lead_the_system_prompt_before_the_project_context() -> None:
    request = _request("You are the release writer.")
    for prompt in (openai_prompt(request, native_tools=True), local_prompt(request, {"final": {}})):
        assert prompt.startswith("You are the release writer."), prompt
        assert prompt.index("You are the release writer.") < prompt.index("AGENTS-RULE")


def test_the_local_prompt_keeps_them_within_its_budget_whatever_the_context() -> None:
    long_rules = "RULE " * 2000  # far past what a 2048-token model can read
    prompt = local_prompt(_request("FIRST-LINE " + long_rules, context="CTX " * 5000), {"final": {}})
    assert prompt.startswith("FIRST-LINE ")
    assert "[... the agent's instructions were cut" in prompt
    assert len(prompt) < 6000, "the instructions and the context are each bounded"
    short = local_prompt(_request("Answer in French.", context="CTX " * 5000), {"final": {}})
    assert short.startswith("Answer in French.") and "were cut" not in short


# -- real runs --------------------------------------------------------------------------


def test_every_turn_leads_with_them_and_corral_transcript_shows_them(short_tmp: Path) -> None:
    ws = short_tmp / "ws"
    ws.mkdir()
    (ws / "AGENTS.md").write_text("PROJECT-RULE\n")
    steps = ('[[agents.steps]]\nactions = [{ tool = "fs.list", input = { path = "." } }]\n'
             '[[agents.steps]]\nfinal = "listed"\n')
    spec = agent_spec(workspace="ws", steps=steps, policy='instructions = "INLINE-ROLE: list, then stop."')
    with running(short_tmp / "h", spec) as daemon:
        run_id = daemon.call("run", agent_id="writer", task="list")["run_id"]
        assert wait_run(daemon, run_id, {"completed", "failed"})["run"]["status"] == "completed"
    text = _transcript(short_tmp / "h", run_id)
    assert "INLINE-ROLE: list, then stop." in text


def test_a_delegate_and_a_child_get_their_own_instructions(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    (short_tmp / "writer.md").write_text("WRITER-ROLE from its file\n")
    spec = """
[project]
root = "ws"
[policy]
default = "auto"
[[agents]]
id = "lead"
instructions = "LEAD-ROLE"
  [[agents.steps]]
  actions = [
    { tool = "agent.delegate", input = { agent_id = "writer", task = "Draft the notes" } },
    { tool = "agent.spawn_isolated", input = { join_mode = "all", children = [
        { template = "helper", task = "Help", write_scopes = ["help"] },
    ] } },
  ]
  [[agents.steps]]
  actions = [{ tool = "agent.run_status", input = {} }]
  [[agents.steps]]
  final = "delegated"
[[agents]]
id = "writer"
role = "specialist"
instructions_file = "writer.md"
  [[agents.steps]]
  actions = [{ tool = "fs.list", input = { path = "." } }]
  [[agents.steps]]
  final = "drafted"
[[templates]]
id = "helper"
instructions = "HELPER-ROLE"
  [[templates.steps]]
  actions = [{ tool = "fs.list", input = { path = "." } }]
  [[templates.steps]]
  final = "helped"
"""
    with running(short_tmp / "h", spec) as daemon:
        run_id = daemon.call("run", agent_id="lead", task="notes")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed", json.dumps(shown)[:3000]
        runs = ledger_rows(daemon.home, "SELECT run_id, kind, options FROM runs ORDER BY created_at")
    delegated = [r for r in runs if r["kind"] == "delegation"]
    children = [r for r in runs if r["kind"] == "child"]
    assert len(delegated) == 1 and len(children) == 1
    child_text = _transcript(short_tmp / "h", children[0]["run_id"])
    assert "HELPER-ROLE" in child_text and "LEAD-ROLE" not in child_text
    lead_text, writer_text = _transcript(short_tmp / "h", run_id), _transcript(short_tmp / "h", delegated[0]["run_id"])
    assert "LEAD-ROLE" in lead_text and "WRITER-ROLE" not in lead_text
    assert "WRITER-ROLE from its file" in writer_text and "LEAD-ROLE" not in writer_text
    assert json.loads(delegated[0]["options"])["instructions"]["file"] == str((short_tmp / "writer.md").resolve())


def test_a_child_run_carries_its_templates_instructions_not_its_parents(open_ledger: Any) -> None:
    from corral.supervisor.runs import action_store, run_store
    from corral.supervisor.runs.action_state import ActionPhase
    from corral.supervisor.swarm import children_store

    spec = parse_spec({"templates": [{"id": "helper", "instructions": "HELPER-ROLE", "steps": [{"final": "x"}]}],
                       "agents": [{"id": "boss", "instructions": "BOSS-ROLE", "steps": [{"final": "x"}]}]})
    ledger = open_ledger()
    ledger.begin_boot("b", 1, 1)
    run_id = run_store.create_run(ledger, NO_FEATURES,
                                  agent_id="boss", task="t", provider="scripted", provider_config={},
                                  options={"workspace": "/tmp", "instructions": {"text": "BOSS-ROLE", "file": None}})
    row = action_store.prepare_action(ledger, run_id, 0, 0, "agent.spawn_isolated", {}, NO_FEATURES, rerunnable=True,
                                      policy="auto")
    run_store.set_run_status(ledger, run_id, run_store.RunStatus.RUNNING, NO_FEATURES)
    action_store.move_action(ledger, row["action_id"], ActionPhase.EXECUTING)
    view = children_store.spawn_group(ledger, spec, run_store.get_run(ledger, run_id), row["action_id"],
                                      [{"template": "helper", "task": "help", "write_scopes": ["a"]}], "all",
                                      NO_FEATURES)
    child = run_store.get_run(ledger, view["children"][0]["run_id"])
    assert json.loads(child["options"])["instructions"] == {"text": "HELPER-ROLE", "file": None}


def test_an_instructions_file_edited_between_plan_and_execution_blocks_the_action(short_tmp: Path) -> None:
    """The plan's first action waits for a person while the file is edited: once
    approved it fails as stale at the step boundary, and the plan's second action
    is refused before it is prepared; the next plan is made with the new text."""
    ws = short_tmp / "ws"
    ws.mkdir()
    role = short_tmp / "ROLE.md"
    role.write_text("OLD ROLE\n")
    new_role = "NEW ROLE: list only what you need\n"
    steps = """
[[agents.steps]]
actions = [{ tool = "fs.read", input = { path = "notes.txt" } }, { tool = "fs.list", input = { path = "." } }]
[[agents.steps]]
actions = [{ tool = "fs.list", input = { path = "." } }]
[[agents.steps]]
final = "done"
"""
    (ws / "notes.txt").write_text("n")
    policy = 'instructions_file = "ROLE.md"\n[agents.policy]\n"fs.read" = "confirm"\n"fs.list" = "auto"'
    spec = agent_spec(workspace="ws", steps=steps, policy=policy)
    with running(short_tmp / "h", spec) as daemon:
        run_id = daemon.call("run", agent_id="writer", task="list")["run_id"]
        waiting = wait_run(daemon, run_id, {"waiting-confirmation", "completed", "failed"})
        assert waiting["run"]["status"] == "waiting-confirmation", waiting["run"]
        role.write_text(new_role)  # edited while a person decides
        daemon.call("continue_action", action_id=waiting["actions"][0]["action_id"], decision="approve")
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed", shown["run"]
        plans = ledger_rows(daemon.home, "SELECT plan FROM plans WHERE run_id = ? ORDER BY loop_index", run_id)
    phases = [(a["loop_index"], a["action_index"], a["phase"], a["attempts"]) for a in shown["actions"]]
    # The second read is refused before it is prepared, or, when the two reads were
    # prepared as one batch before the edit, fails at the boundary: never run.
    assert phases[0] == (0, 0, "failed", 0) and phases[2:] == [(1, 0, "ok", 1)], phases
    assert phases[1] in ((0, 1, "denied", 0), (0, 1, "failed", 0)), phases
    for reason in (shown["actions"][0]["reason"], shown["actions"][1]["reason"]):
        assert "stale:" in reason and f"agent instructions at {role.resolve()}" in reason, reason
        assert f"changed sha256 {_sha('OLD ROLE' + chr(10))[:12]}→{_sha(new_role)[:12]}" in reason
    stamps = [json.loads(row["plan"])["context"]["sources"][f"agent instructions at {role.resolve()}"]
              for row in plans[:2]]
    assert stamps == [_sha("OLD ROLE\n")[:16], _sha(new_role)[:16]], "the next plan was made with the new text"
    assert "NEW ROLE" in _transcript(short_tmp / "h", run_id)


def test_compaction_never_drops_them(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    steps = ('[[agents.steps]]\nactions = [{ tool = "fs.list", input = { path = "." } }]\n' * 14
             + '[[agents.steps]]\nfinal = "long task done"\n')
    # The newest 4 observations are never folded: the limit leaves room for them and a summary.
    # Its one tool offered: every request carries the tool schemas, and they count toward the limit.
    limits = ('instructions = "KEEP-THIS-ROLE"\ntools = ["fs.list"]\nauto_compact_token_limit = 700'
              '\ntool_output_token_limit = 40')
    with running(short_tmp / "h", agent_spec(steps=steps, policy=limits)) as daemon:
        run_id = daemon.call("run", agent_id="writer", task="a long task")["run_id"]
        assert wait_run(daemon, run_id, {"completed", "failed"}, timeout=120)["run"]["status"] == "completed"
        compactions = ledger_rows(daemon.home, "SELECT to_seq FROM compactions WHERE run_id = ?", run_id)
    assert compactions, "the run compacted"
    last = cli(short_tmp / "h", "transcript", run_id, "--turn", "15")
    assert last.returncode == 0, last.stderr
    assert "KEEP-THIS-ROLE" in last.stdout, "the last turn, after compaction, still leads with them"
