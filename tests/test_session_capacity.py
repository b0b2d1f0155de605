"""Process-session capacity and bounds (seed 004 V1.10), through a running supervisor:
at most 4 unresolved sessions per project and 2 per agent, checked before anything
is launched and refused as an ordinary failure; a session left unresolved by an
earlier boot stops every new start; a poll reads at most 16,000 characters and
waits at most 30,000 ms; one stdin write is at most 8 KiB."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.harness import Daemon, ledger_rows, wait_run, wait_supervisor_gone
from tests.test_process_sessions import SANDBOX_TABLE, call, wait_for

LOOPING = "echo up; while :; do sleep 0.05; done"


def _starts(n: int, then: str = "") -> str:
    listed = ",\n  ".join(call("process.start", LOOPING) for _ in range(n))
    return f'[[agents.steps]]\nactions = [\n  {listed},\n]\n{then}[[agents.steps]]\nfinal = "done"\n'


def _agent(agent_id: str, steps: str) -> str:
    return f'[[agents]]\nid = "{agent_id}"\n[agents.policy]\ndefault = "auto"\n{steps}'


def _daemon(tmp: Path, agents: str) -> Daemon:
    (tmp / "ws").mkdir(exist_ok=True)
    spec = tmp / "spec.toml"
    spec.write_text(f'[project]\nroot = "ws"\n{SANDBOX_TABLE}\n{agents}')
    return Daemon(tmp / "h", spec)


def _actions(daemon: Daemon, run_id: str, tool: str) -> list[dict[str, Any]]:
    return ledger_rows(
        daemon.home,
        "SELECT phase, error, result FROM actions WHERE run_id = ? AND tool = ? ORDER BY loop_index, action_index",
        run_id,
        tool,
    )


def _unresolved(daemon: Daemon) -> list[dict[str, Any]]:
    return ledger_rows(
        daemon.home,
        "SELECT process_id, agent_id FROM sessions WHERE state IN ('prepared', 'launching', 'running', 'terminating')"
        " OR (state = 'needs-reconciliation' AND resolved_at IS NULL)",
    )


def _ended(daemon: Daemon, run_id: str, tool: str, n: int) -> list[dict[str, Any]] | None:
    rows = _actions(daemon, run_id, tool)
    done = [r for r in rows if r["phase"] in ("ok", "failed", "denied", "needs-reconciliation")]
    return rows if len(done) >= n else None


def test_four_unresolved_sessions_per_project_and_two_per_agent(short_tmp: Path) -> None:
    """The seed: "同一项目最多 4 个、同一 Agent instance 最多 2 个 unresolved process session";
    "容量…拒绝必须发生在 revision 推进与 OS spawn 前，不能把普通拒绝误记为 reconciliation"."""
    daemon = _daemon(
        short_tmp, _agent("writer", _starts(3)) + _agent("other", _starts(2)) + _agent("third", _starts(1))
    )
    try:
        daemon.up()
        writer = daemon.call("run", agent_id="writer", task="three servers")["run_id"]
        starts = wait_for(daemon, lambda: _ended(daemon, writer, "process.start", 3), "the writer's three starts")
        assert [s["phase"] for s in starts] == ["ok", "ok", "failed"]
        assert "at most 2 unresolved process sessions per agent" in starts[2]["error"]
        assert len(_unresolved(daemon)) == 2, "the refused start launched nothing"

        other = daemon.call("run", agent_id="other", task="two servers")["run_id"]
        starts = wait_for(daemon, lambda: _ended(daemon, other, "process.start", 2), "the other's two starts")
        assert [s["phase"] for s in starts] == ["ok", "ok"] and len(_unresolved(daemon)) == 4

        third = daemon.call("run", agent_id="third", task="one more server")["run_id"]
        starts = wait_for(daemon, lambda: _ended(daemon, third, "process.start", 1), "the third agent's start")
        assert starts[0]["phase"] == "failed"
        assert "at most 4 unresolved process sessions per project" in starts[0]["error"]
        assert sorted(r["agent_id"] for r in _unresolved(daemon)) == ["other", "other", "writer", "writer"]
        assert ledger_rows(daemon.home, "SELECT 1 FROM sessions WHERE agent_id = 'third'") == []
        assert ledger_rows(daemon.home, "SELECT 1 FROM project_revisions WHERE run_id = ?", third) == []
        assert wait_run(daemon, third, {"completed", "failed"})["run"]["status"] == "completed"
    finally:
        daemon.shutdown()


def test_a_session_an_earlier_boot_left_unresolved_stops_every_new_start(short_tmp: Path) -> None:
    """The seed: "存在未解决旧 boot 会话时禁止新 start"."""
    daemon = _daemon(short_tmp, _agent("writer", _starts(1)) + _agent("other", _starts(1)))
    try:
        first = daemon.up()
        writer = daemon.call("run", agent_id="writer", task="a server")["run_id"]
        wait_for(daemon, lambda: _ended(daemon, writer, "process.start", 1), "the writer's start")
        daemon.kill_supervisor()
        wait_supervisor_gone(daemon, first.pid)
        daemon.up()
        [left] = _unresolved(daemon)
        other = daemon.call("run", agent_id="other", task="another server")["run_id"]
        [start] = wait_for(daemon, lambda: _ended(daemon, other, "process.start", 1), "the other's start")
        assert start["phase"] == "failed" and left["process_id"] in start["error"]
        assert "an earlier boot left unresolved" in start["error"]
        assert ledger_rows(daemon.home, "SELECT 1 FROM sessions WHERE agent_id = 'other'") == []
    finally:
        daemon.shutdown()


PID = '"${running.process_id}"'
BOUNDS = _starts(
    1,
    then=f"""[[agents.steps]]
actions = [
  {{ tool = "process.poll", input = {{ process_id = {PID}, max_chars = 16001 }} }},
  {{ tool = "process.poll", input = {{ process_id = {PID}, wait_ms = 30001 }} }},
  {{ tool = "process.stdin", input = {{ process_id = {PID}, data = "{"x" * (8 * 1024 + 1)}" }} }},
]
[[agents.steps]]
actions = [
  {{ tool = "process.poll", input = {{ process_id = {PID}, max_chars = 16000, wait_ms = 30000 }} }},
  {{ tool = "process.stdin", input = {{ process_id = {PID}, data = "{"y" * (8 * 1024)}" }} }},
]
[[agents.steps]]
actions = [{{ tool = "process.terminate", input = {{ process_id = {PID} }} }}]
""",
)


def test_a_poll_reads_at_most_16000_characters_waits_30000_ms_and_stdin_takes_8_kib(short_tmp: Path) -> None:
    """The seed: "maxChars 默认 8,000、最大 16,000，waitMs 最大 30,000"; stdin "单次最终 bytes
    最大 8 KiB"."""
    daemon = _daemon(short_tmp, _agent("writer", BOUNDS))
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="bounds")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"}, timeout=90)
        assert shown["run"]["status"] == "completed"
        polls = _actions(daemon, run_id, "process.poll")
        stdins = _actions(daemon, run_id, "process.stdin")
        assert [p["phase"] for p in polls] == ["failed", "failed", "ok"]
        assert "16000" in polls[0]["error"] and "30000" in polls[1]["error"]
        assert [s["phase"] for s in stdins] == ["failed", "ok"] and "8192" in stdins[0]["error"]
        assert json.loads(stdins[1]["result"])["output"]["bytes_written"] == 8 * 1024
        [session] = ledger_rows(daemon.home, "SELECT stdin_bytes FROM sessions")
        assert session["stdin_bytes"] == 8 * 1024, "the refused write sent nothing"
    finally:
        daemon.shutdown()
