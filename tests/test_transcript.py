"""Transcripts (issue 34, item 1): `corral transcript RUN` shows what the model was
sent and what it answered, turn by turn; the system prompt and the tool catalog
are kept once by content hash however many turns there are; a secret the agent
read is masked in the transcript and absent from the ledger's bytes; a bad run id
or turn is a clear error; and the transcript reads the same after `corral down`.
The local model's own run is checked in tests/test_local_model.py."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

import corral
from corral.actors.providers.base import MAX_TRANSCRIPT_CHARS
from corral.actors.tools.registry import builtin_tools
from corral.actors.turn_notes import capped, catalog_text, observations_seen, text_sha256
from corral.mailbox.control import ControlError
from corral.mailbox.protocol import TurnNote
from corral.mailbox.steps import ProviderStep
from corral.supervisor.home import home_dir as homes
from tests.harness import agent_spec, cli, ledger_rows, running, wait_run

#: Secret-shaped values in a file the agent reads (an AWS key id, a GitHub token).
AWS_KEY = "AKIAQ3EGZXKP7RT2LMNB"
GITHUB_TOKEN = "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
SCRIPT = json.dumps({"steps": [
    {"actions": [{"tool": "fs.read", "input": {"path": "keys.txt"}}]},
    {"raw": "this is not a plan", "unless_observed": "response-shape"},
    {"actions": [{"tool": "fs.read", "input": {"path": "notes.txt"}}], "when_observed": "response-shape"},
    {"final": "read both files"},
]})


def _dashboard_get(home: Path, path: str) -> tuple[int, str]:
    """One page of the dashboard (corral ui) for the supervisor on ``home``, in process."""
    from starlette.testclient import TestClient

    from corral.ui.server import Dashboard

    board = Dashboard(home, token="t" * 24)
    with TestClient(board.app(), backend="trio") as client:
        reply = client.get(path, headers={"Authorization": "Bearer " + "t" * 24})
    return reply.status_code, reply.text


@pytest.fixture(scope="module")
def finished() -> Iterator[dict[str, Any]]:
    """One scripted run of four turns (a read, a repair, a read, the reply) on a
    supervisor that is then stopped; what it answered while it ran."""
    top = Path(tempfile.mkdtemp(prefix="crl-", dir="/tmp"))
    try:
        (top / "ws").mkdir()
        (top / "ws" / "keys.txt").write_text(f"aws_access_key_id = {AWS_KEY}\ntoken: {GITHUB_TOKEN}\n")
        (top / "ws" / "notes.txt").write_text("plain notes\n")
        home = top / "home"
        with running(home, agent_spec(steps='  [[agents.steps]]\n  final = "each run brings its own"')) as daemon:
            run_id = daemon.call("run", agent_id="writer", task="read the keys and the notes",
                                 script=SCRIPT)["run_id"]
            shown = wait_run(daemon, run_id, {"completed", "failed"})
            assert shown["run"]["status"] == "completed", shown["run"]
            live = cli(home, "transcript", run_id, "--json")
            assert live.returncode == 0, live.stderr
            text = cli(home, "transcript", run_id)
            turn = cli(home, "transcript", run_id, "--turn", "2")
            errors = {"turn": cli(home, "transcript", run_id, "--turn", "9")}
            with corral.Client.connect(home) as client, pytest.raises(ControlError) as refused:
                client.transcript("run-nope")
            errors["run"] = refused.value
            blobs = ledger_rows(home, "SELECT kind, text FROM transcript_blobs")
            page = _dashboard_get(home, f"/runs/{run_id}/conversation")
            run_page = _dashboard_get(home, f"/runs/{run_id}")
            assert cli(home, "down").returncode == 0
        assert not homes.is_locked(home)
        yield {"home": home, "run_id": run_id, "json": json.loads(live.stdout), "text": text, "turn": turn,
               "errors": errors, "blobs": blobs, "page": page, "run_page": run_page}
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_each_turn_shows_what_was_sent_and_what_came_back(finished: dict[str, Any]) -> None:
    shown = finished["json"]
    turns = shown["turns"]
    assert [t["status"] for t in turns] == ["completed"] * 4
    assert [t["response"] is not None for t in turns] == [True] * 4
    # The system prompt: in full on the first turn, unchanged after it.
    assert turns[0]["system"]["text"].startswith("(scripted provider for agent writer")
    assert [t["system"]["unchanged"] for t in turns] == [False, True, True, True]
    assert turns[0]["catalog"]["tools"] and "fs.read" in turns[0]["catalog"]["tools"]
    # What each turn became: a call with its arguments and outcome, a repair, a call, the reply.
    assert turns[0]["plan"]["actions"][0]["tool"] == "fs.read"
    assert turns[0]["plan"]["actions"][0]["input"] == {"path": "keys.txt"}
    assert turns[0]["plan"]["actions"][0]["outcome"]["phase"] == "ok"
    assert turns[1]["plan"] is None and turns[1]["repair"]["category"] == "response-shape"
    assert turns[1]["response"] == "this is not a plan"
    assert turns[2]["plan"]["actions"][0]["input"] == {"path": "notes.txt"}
    assert turns[3]["plan"]["final"] == "read both files" and shown["final_reply"] == "read both files"
    # The history delta: each observation once, in the turn that first saw it.
    assert [[entry["seq"] for entry in t["history"]] for t in turns] == [[], [1], [2], [3]]
    assert turns[2]["history"][0]["role"] == "repair"
    text = finished["text"]
    assert text.returncode == 0, text.stderr
    assert text.stdout.count("system prompt (") == 1 and text.stdout.count("system prompt: unchanged") == 3
    assert 'fs.read(path="keys.txt")' in text.stdout and "repair (response-shape)" in text.stdout
    assert "this is not a plan" in text.stdout and "→ final reply: read both files" in text.stdout


def test_a_secret_the_agent_read_is_masked_and_not_in_the_ledger_file(finished: dict[str, Any]) -> None:
    read = finished["json"]["turns"][1]["history"][0]
    assert read["tool"] == "fs.read" and "[redacted]" in json.dumps(read["output"])
    for out in (json.dumps(finished["json"]), finished["text"].stdout):
        assert AWS_KEY not in out and GITHUB_TOKEN not in out
    ledger = finished["home"] / homes.LEDGER
    stored = b"".join(path.read_bytes() for path in (ledger, ledger.with_name(ledger.name + "-wal"))
                      if path.exists())
    assert len(stored) > 0
    assert AWS_KEY.encode() not in stored and GITHUB_TOKEN.encode() not in stored


def test_the_prompt_and_catalog_are_kept_once_by_content_hash(finished: dict[str, Any]) -> None:
    assert sorted(blob["kind"] for blob in finished["blobs"]) == ["catalog", "system"], "four turns, one copy each"
    turns = finished["json"]["turns"]
    assert len({t["system"]["sha256"] for t in turns}) == 1
    assert turns[0]["system"]["sha256"] == text_sha256(turns[0]["system"]["text"])


def test_one_turn_and_bad_input_are_clear(finished: dict[str, Any]) -> None:
    turn = finished["turn"]
    assert turn.returncode == 0, turn.stderr
    assert "── turn 2 " in turn.stdout and "── turn 1 " not in turn.stdout and "── turn 3 " not in turn.stdout
    assert "system prompt (" in turn.stdout, "one turn alone shows its system prompt in full"
    assert '"name":"fs.read"' in turn.stdout, "and its tool catalog"
    result = finished["errors"]["turn"]
    assert result.returncode != 0 and "has turns 1 to 4; there is no turn 9" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    unknown = finished["errors"]["run"]
    assert unknown.code == "not-found" and unknown.message == "no run 'run-nope'"


def test_the_transcript_reads_the_same_without_a_supervisor(finished: dict[str, Any]) -> None:
    home, run_id = finished["home"], finished["run_id"]
    offline = cli(home, "transcript", run_id, "--json")
    assert offline.returncode == 0 and offline.stderr == "", offline.stderr
    read = json.loads(offline.stdout)
    assert read.pop("read_from") == "ledger"
    assert read == finished["json"]
    text = cli(home, "transcript", run_id)
    assert text.returncode == 0 and "read from the ledger" in text.stderr
    assert text.stdout == finished["text"].stdout


def test_turn_notes_cap_and_views() -> None:
    big = "x" * (MAX_TRANSCRIPT_CHARS + 10)
    assert capped(big).endswith("[… 10 more characters cut]") and len(capped(big)) < MAX_TRANSCRIPT_CHARS + 100
    tools = tuple(tool.schema for tool in builtin_tools().values())
    assert catalog_text(tools) == catalog_text(tuple(reversed(tools))[::-1])
    assert observations_seen(ProviderStep(loop=0, history_from=3, history=[{}, {}])) == 5
    summary = {"role": "summary", "text": "s", "covers": [1, 7]}
    assert observations_seen(ProviderStep(loop=0, history=[summary, {"tool": "a"}, {"tool": "b"}])) == 9


def test_the_dashboard_shows_the_conversation_beside_the_actions(finished: dict[str, Any]) -> None:
    status, page = finished["page"]
    assert status == 200, page
    assert page.count('class="turn" id="turn-') == 4 and "The model said" in page
    assert "this is not a plan" in page and "repair (response-shape)" in page
    assert "<h3>Actions</h3>" in page and "fs.read" in page and AWS_KEY not in page
    status, run_page = finished["run_page"]
    assert status == 200 and f'href="/runs/{finished["run_id"]}/conversation"' in run_page


def _note(fields: dict[str, Any]) -> TurnNote:
    """A turn's notes as the supervisor's decoder checks them off the wire."""
    return msgspec.convert(fields, TurnNote, strict=True)


def test_turns_are_kept_and_read_on_either_ledger(open_ledger: Any) -> None:
    """The store and the view on SQLite and PostgreSQL: a text sent twice is kept
    once, a turn naming it by hash reads as unchanged, a bad note changes nothing."""
    from corral.supervisor.errors import BadRequest
    from corral.supervisor.runs import provider_store, run_store
    from corral.supervisor.runs.run_feature import RunFeatures
    from corral.supervisor.runs.run_store import RunLimits
    from corral.supervisor.runs.transcript_store import notes_from
    from corral.supervisor.runs.transcript_view import transcript

    ledger = open_ledger()
    ledger.begin_boot("b1", 1, 1)
    features = RunFeatures()  # a supervisor with no features
    run_id = run_store.create_run(ledger, features, agent_id="writer", task="t", provider="scripted",
                                  provider_config={"script": {"steps": []}})
    system = f"You are an agent. Key {AWS_KEY}."
    sent = {"system": system, "system_sha256": text_sha256(system)}
    for loop, notes in enumerate(({**sent, "seen": 0}, {**sent, "seen": 0}, {"system_sha256": text_sha256(system)})):
        slot = provider_store.begin_provider_request(ledger, run_id, loop, features)["slot"]
        provider_store.provider_handoff(ledger, run_id, slot, f"answer {loop}", notes=notes_from(_note(notes)))
    slot = provider_store.begin_provider_request(ledger, run_id, 3, features)["slot"]
    provider_store.provider_failed(ledger, run_id, slot, "fatal", "boom", RunLimits(), features,
                                   notes_from(_note(sent)))
    (blob,) = ledger.all("SELECT kind, text FROM transcript_blobs")
    assert blob["kind"] == "system" and blob["text"] == "You are an agent. Key [redacted]."
    turns = transcript(ledger, run_id)["turns"]
    assert [t["response"] for t in turns] == ["answer 0", "answer 1", "answer 2", None]
    assert [t["system"]["unchanged"] for t in turns] == [False, True, True, True]
    assert turns[0]["system"]["text"] == blob["text"] and turns[3]["error"] == {"kind": "fatal", "error": "boom"}
    assert transcript(ledger, run_id, turn=3)["turns"][0]["system"]["text"] == blob["text"]
    # Pages (the control method's, inside one frame): at least one turn each, in order.
    paged = [transcript(ledger, run_id, from_turn=n, page_chars=10) for n in (1, 2, 4)]
    assert [([t["turn"] for t in page["turns"]], page["next_turn"]) for page in paged] == [
        ([1], 2), ([2], 3), ([4], None)]
    # A delegate's run is linked by id, with the action that started it.
    helper = run_store.create_run(ledger, features,
                                  agent_id="helper", task="help", provider="scripted", kind="delegate",
                                  provider_config={"script": {"steps": []}}, parent_run_id=run_id, root_run_id=run_id)
    with ledger.tx() as db:
        db.execute("INSERT INTO delegations (delegation_id, parent_run_id, parent_action_id, target_agent, task,"
                   " acceptance_criteria, expected_artifacts, run_id, status, created_at)"
                   " VALUES ('d1', ?, 'act-1', 'helper', 'help', '[]', '[]', ?, 'running', 0)", (run_id, helper))
    (child,) = transcript(ledger, run_id)["children"]
    assert (child["run_id"], child["via"], child["action_id"]) == (helper, "delegate", "act-1")
    assert transcript(ledger, helper)["run"]["parent_run_id"] == run_id
    # A text that is not the one its hash names is refused by the handler; a hash
    # that is no sha256, or a count below 0, by the record at the boundary.
    with pytest.raises(BadRequest, match="system_sha256 is not the sha256 of system"):
        notes_from(_note({"system": "x", "system_sha256": "0" * 64}))
    for bad in ({"catalog_sha256": "nope"}, {"seen": -1}):
        with pytest.raises(msgspec.ValidationError):
            _note(bad)
