"""Approvals show what they approve (issue 34, item 2): ``corral pending``, ``corral
approve ACTION --show``, the chat's prompt and the dashboard show the real argument
values, with only secret-looking substrings masked, a file tool's diff against the
current file, long values paged; and the approval is bound to the fingerprint shown.

One supervisor for the end-to-end part; the view's pieces are tested as functions."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from corral import approval_text
from corral.cli.main import main
from corral.client_types import ViewChanged, joined_pages
from corral.supervisor.runs import approval_diff, approval_view
from corral.supervisor.runs.action_state import fingerprint
from corral.ui import pages
from tests.harness import agent_spec, ledger_rows, running, wait_run
from tests.test_user_tools import write_package

SECRET = "AKIAIOSFODNN7EXAMPLE"
TOKEN = "ghp_1234567890abcdefghijABCDEFGHIJ123456"
#: What a model's plan may carry and redaction still masks: code that names a secret.
#: A plan holding a secret value never reaches an approval (its handoff fails closed,
#: seed 004 V1.43: tests/test_provider_secrets.py).
SECRET_CODE = "token = get_token()"
TOKEN_CODE = "secret = vault.read(path)"
BODY = f"Hi Ann,\nthe key is {SECRET_CODE}, keep it safe.\n" + "".join(f"line {i} of the report\n" for i in range(200))
MAIL = {"to": "ann@example.com", "subject": "the report", "body": BODY}
NOTES = "first line\nsecond line\nthird line\n"
WRITE = {"path": "notes.txt", "content": f"first line\nsecond line, edited\nthird line\nkey {TOKEN_CODE}\n"}
ESCAPE = {"path": "link/evil.txt", "content": "harmless"}


def _script(tool: str, tool_input: dict[str, Any]) -> str:
    return json.dumps({"steps": [{"actions": [{"tool": tool, "input": tool_input}]}, {"final": "done"}]})


def _cli(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> tuple[int, str, str]:
    """The real CLI, in this process (a subprocess per command would cost seconds)."""
    code = main(["--home", str(home), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_pending_shows_the_real_values_masks_secrets_diffs_writes_and_binds_the_fingerprint(
    short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (short_tmp / "ws").mkdir()
    (short_tmp / "ws" / "notes.txt").write_text(NOTES)
    (short_tmp / "outside").mkdir()
    (short_tmp / "outside" / "evil.txt").write_text("OUTSIDE-FILE-CONTENT\n")
    (short_tmp / "ws" / "link").symlink_to(short_tmp / "outside")
    write_package(short_tmp / "site")
    spec = agent_spec(
        steps='[[agents.steps]]\nfinal = "idle"',
        extra='[tools]\nmodules = ["userpkg_tools.tools"]',
        policy='tools = ["mail.*", "fs.*"]\n[agents.policy]\n"mail.send" = "confirm"\n"fs.write" = "confirm"',
    )
    with running(short_tmp / "h", spec, env={"PYTHONPATH": str(short_tmp / "site")}) as daemon:
        runs = [
            daemon.call("run", agent_id="writer", task=tool, script=_script(tool, tool_input))["run_id"]
            for tool, tool_input in (("mail.send", MAIL), ("fs.write", WRITE), ("fs.write", ESCAPE))
        ]
        for run_id in runs:
            wait_run(daemon, run_id, {"waiting-confirmation"})
        mail, write, escape = (
            next(a for a in daemon.call("pending")["actions"] if a["run_id"] == run_id) for run_id in runs
        )

        code, text, _ = _cli(capsys, daemon.home, "pending")
        assert code == 0
        # The real values of an external user tool; only the secret-looking substring masked.
        assert "    to: ann@example.com" in text and "    subject: the report" in text
        assert "the key is [redacted], keep it safe." in text and SECRET_CODE not in text
        assert f"fingerprint {mail['fingerprint']}" in text and "effect external  policy confirm" in text
        # A long value is paged, never cut silently.
        more = re.search(rf"… (\d+) more chars, see `corral approve {mail['action_id']} --show --all`", text)
        assert more is not None and "line 9 of the report" in text and "line 10 of the report" not in text
        # A file write: the diff against the file as it is now, its secret masked too.
        assert "-second line\n" in text and "+second line, edited\n" in text and "+key [redacted]" in text
        assert TOKEN_CODE not in text
        # A symlink out of the workspace: the refusal, never the outside file.
        assert "escapes the workspace through a symlink" in text and "OUTSIDE-FILE-CONTENT" not in text

        code, raw, _ = _cli(capsys, daemon.home, "pending", "--json")
        by_id = {a["action_id"]: a["approval"] for a in json.loads(raw)["actions"]}
        body = next(v for v in by_id[mail["action_id"]]["arguments"] if v["name"] == "body")
        assert body["text"] == BODY.replace(SECRET_CODE, "[redacted]") and body["chars"] == len(body["text"])
        assert SECRET_CODE not in raw and TOKEN_CODE not in raw and by_id[escape["action_id"]]["files"][0]["error"]
        # The dashboard's pending page renders the same view.
        html = pages.pending(daemon.call("pending"))
        assert "ann@example.com" in html and "the key is [redacted]" in html and SECRET_CODE not in html
        assert f"see <code>corral approve {mail['action_id']} --show --all</code>" in html
        assert "+second line, edited" in html and "OUTSIDE-FILE-CONTENT" not in html

        code, shown, _ = _cli(capsys, daemon.home, "approve", mail["action_id"], "--show")
        assert code == 0 and "line 199 of the report" in shown and "more chars" not in shown
        assert f"corral approve {mail['action_id']} --fingerprint {mail['fingerprint']}" in shown
        phases = [a["phase"] for a in daemon.call("pending")["actions"]]
        assert phases == ["waiting-confirmation"] * 3, "--show decides nothing"

        # The fingerprint shown is the one approve checks: that of the raw input the tool gets.
        (row,) = ledger_rows(daemon.home, "SELECT fingerprint FROM actions WHERE action_id = ?", mail["action_id"])
        assert mail["fingerprint"] == row["fingerprint"] == fingerprint("mail.send", MAIL)
        code, _, err = _cli(capsys, daemon.home, "approve", mail["action_id"], "--fingerprint", write["fingerprint"])
        assert code == 1 and "not the one approved" in err
        assert len(daemon.call("pending")["actions"]) == 3, "a stale fingerprint changes nothing"
        code, _, err = _cli(capsys, daemon.home, "approve", mail["action_id"], "--fingerprint", mail["fingerprint"])
        assert code == 0, err
        assert wait_run(daemon, runs[0], {"completed", "failed"})["run"]["status"] == "completed"

        # A bad ACTION id: a clear error, no traceback, nothing changed.
        for args in (("approve", "act-nope", "--show"), ("approve", "act-nope"), ("deny", "act-nope")):
            code, _, err = _cli(capsys, daemon.home, *args)
            assert code == 1 and "act-nope" in err and "Traceback" not in err, (args, err)
        code, _, err = _cli(capsys, daemon.home, "approve", write["action_id"], "--show", "--page", "0")
        assert code == 2 and "--page" in err
        code, _, err = _cli(capsys, daemon.home, "approve", write["action_id"], "--show", "--page", "5")
        assert code == 2 and "1 page(s)" in err
        assert len(daemon.call("pending")["actions"]) == 2


# -- the view's pieces ------------------------------------------------------------------


def test_arguments_mask_only_what_looks_secret_and_keep_sealed_fields_sealed() -> None:
    sealed = {"sealed": "ab" * 32, "bytes": 5}
    shown = {
        a.name: (a.kind, a.text)
        for a in approval_view.arguments(
            {"to": "ann@example.com", "body": f"key {SECRET} ok", "api_token": "plain-looking", "data": sealed,
             "count": 3, "stdin": "typed"},
            sealed=("stdin",),
        )
    }
    assert shown["to"] == ("text", "ann@example.com")
    assert shown["body"] == ("text", "key [redacted] ok")
    assert shown["api_token"] == ("text", "[redacted]"), "a key named like a secret, as in the ledger"
    assert shown["data"] == ("sealed", f"<sealed {'ab' * 6}… 5 bytes>")
    assert shown["stdin"] == ("sealed", "<sealed>"), "a field the tool declares sealed is never shown"
    assert shown["count"] == ("json", "3")


def test_long_values_are_paged_with_the_command_that_shows_the_rest() -> None:
    row = {"action_id": "act-1", "run_id": "run-1", "agent_id": "a", "tool": "mail.send", "phase":
           "waiting-confirmation", "policy": "confirm", "fingerprint": "f" * 64, "reason": None,
           "input": json.dumps({"body": "x" * 2500, "to": "ann"})}
    pages = [approval_view.view(row, effect="external", sealed=(), files=[], page=page, page_chars=1000)
             for page in (1, 2, 3)]
    first = "\n".join(approval_text.render(pages[0], preview=False))
    assert "… 1500 more chars, see `corral approve act-1 --show --page 2` or `corral approve act-1 --show --all`" in (
        first
    )
    last = "\n".join(approval_text.render(pages[2], preview=False))
    assert "body: (page 3 of 3)" in last and "more chars" not in last
    whole = joined_pages(pages)
    assert [a["text"] for a in whole["arguments"]] == ["x" * 2500, "ann"]
    changed = json.loads(json.dumps(pages))
    changed[1]["arguments"][0]["digest"] = "0" * 16
    with pytest.raises(ViewChanged):
        joined_pages(changed)


def test_a_value_cannot_rewrite_the_line_that_asks_for_approval() -> None:
    assert approval_text.printable("ok\x1b[2K\rto: boss\u202e") == "ok\\x1b[2K\\x0dto: boss\\u202e"
    assert approval_text.printable("two\nlines\tand tab") == "two\nlines\tand tab"


def test_file_diffs_follow_the_tools_path_rules(tmp_path: Path) -> None:
    ws, home = tmp_path / "ws", tmp_path / "home"
    (ws / "docs").mkdir(parents=True)
    home.mkdir()
    (tmp_path / "out.txt").write_text("outside\n")
    (ws / "up").symlink_to(tmp_path)
    (ws / "docs" / "a.txt").write_text(f"one\nsecret {TOKEN}\n")
    where = approval_diff.Workspace(ws, ("docs",), home)

    def change(tool: str, tool_input: dict[str, Any]) -> approval_diff.FileChange:
        (only,) = approval_diff.file_changes(tool, tool_input, where)
        return only

    new = change("fs.write", {"path": "docs/new.txt", "content": "hello\n"})
    assert new.diff == "--- /dev/null\n+++ b/docs/new.txt\n@@ -0,0 +1 @@\n+hello\n"
    edited = change("fs.write", {"path": "docs/a.txt", "content": "one\ntwo"})
    assert "-secret [redacted]\n" in edited.diff and "+two\n\\ No newline at end of file\n" in edited.diff
    assert TOKEN not in edited.diff
    assert "escapes the workspace" in change("fs.write", {"path": "up/out.txt", "content": "x"}).error
    assert "write scopes" in change("fs.write", {"path": "top.txt", "content": "x"}).error
    assert "'..'" in change("fs.write", {"path": "../out.txt", "content": "x"}).error
    assert "relative" in change("fs.write", {"path": str(tmp_path / "out.txt"), "content": "x"}).error
    stale = change("fs.patch", {"path": "docs/a.txt", "old_text": "one", "new_text": "1", "expected_sha256": "0"})
    assert "sha256 mismatch" in stale.error and not stale.diff
    import hashlib

    digest = hashlib.sha256((ws / "docs" / "a.txt").read_bytes()).hexdigest()
    patched = change("fs.patch", {"path": "docs/a.txt", "old_text": "one", "new_text": "1", "expected_sha256": digest})
    assert "-one\n+1\n" in patched.diff and TOKEN not in patched.diff
    assert approval_diff.file_changes("mail.send", {"path": "x"}, where) == []
    assert "outside" not in "".join(c.diff + c.error for c in approval_diff.file_changes(
        "project.changeset", {"changes": [{"path": "up/out.txt", "content": "y"}]}, where))
