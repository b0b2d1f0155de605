"""Progressive disclosure of project skills (seed 004 V1.25): the provider's first
request carries a skill's metadata only, and its body reaches the model only in the
turn after a successful ``fs.read`` of the entry ("Provider 捕获请求中首轮只有 metadata、成功
file.read 后下一轮才出现正文 marker"). Real supervisor, real agent, a fake OpenAI server
that keeps the request bodies."""

from __future__ import annotations

import json
from pathlib import Path

from fake_openai import FakeOpenAIServer, Reply, completion, tool_call
from loopback_http import serve_in_thread
from tests.harness import running, wait_run

MARKER = "BODY-MARKER-5d1c"
SKILL = f"---\nname: release\ndescription: How to cut a release\n---\n# Release\n{MARKER}: tag, then build.\n"


def test_a_skills_body_reaches_the_model_only_after_it_read_the_entry(tmp_path: Path) -> None:
    entry = tmp_path / "ws" / ".codex" / "skills" / "release" / "SKILL.md"
    entry.parent.mkdir(parents=True)
    entry.write_text(SKILL)
    server = FakeOpenAIServer(keep_bodies=True)
    server.add(Reply(body=completion(tool_calls=[tool_call("fs_read", {"path": ".codex/skills/release/SKILL.md"})])),
               Reply(body=completion("released")))
    with serve_in_thread(server) as url:
        spec = (f'[project]\nroot = "ws"\n[[agents]]\nid = "dev"\nprovider = "openai"\n[agents.openai]\n'
                f'base_url = "{url}"\nmodel = "fake-model"\ntimeout_s = 10\nstructured = "tools"\n')
        with running(tmp_path / "home", spec) as daemon:
            run_id = daemon.call("run", agent_id="dev", task="cut the release")["run_id"]
            shown = wait_run(daemon, run_id, {"completed", "failed"})
    assert shown["run"]["status"] == "completed", shown
    first, second = (json.dumps(json.loads(record.body or b"{}")) for record in server.requests)
    assert "release: How to cut a release" in first and ".codex/skills/release/SKILL.md" in first
    assert MARKER not in first, "a skill's body is not in the first request"
    assert MARKER in second, "the body the model read reaches the next turn"
