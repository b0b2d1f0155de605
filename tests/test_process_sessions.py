"""Process sessions and commands through a running supervisor and a scripted agent.

Everything is real: the supervisor daemon, the agent actor, one session actor per
process, PTYs, bubblewrap (when this host can run it) and SIGKILL. Tests wait on
conditions (ledger rows, events, process exits) with deadlines only as safety
nets; where a script must not run ahead of a process (a poll that should see a
finished output), the poll is gated behind a confirmation that the test gives once
the condition holds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from corral.sandbox.bwrap import bwrap_available
from tests.harness import Daemon, ledger_rows, show, wait_run, wait_supervisor_gone

T = TypeVar("T")

#: This host's sandbox: the real one when bubblewrap works here, otherwise the
#: explicitly allowed unsandboxed mode (the fail-closed path is tested on its own).
SANDBOXED = bwrap_available()
MODE = "sandboxed" if SANDBOXED else "unsandboxed"
SANDBOX_TABLE = "" if SANDBOXED else '[sandbox]\nmode = "allow-unsandboxed"\n'


def _spec(steps: str, *, policy: str = "", sandbox: str = SANDBOX_TABLE) -> str:
    # A second agent gives another run (and another agent) to try foreign ids from.
    return f"""
[project]
root = "ws"
{sandbox}
[[agents]]
id = "writer"
{policy}
{steps}
[[agents]]
id = "other"
[[agents.steps]]
final = "idle"
"""


def _daemon(tmp: Path, spec_text: str, home: str = "h", env: dict[str, str] | None = None) -> Daemon:
    (tmp / "ws").mkdir(exist_ok=True)
    spec = tmp / f"{home}-spec.toml"
    spec.write_text(spec_text)
    return Daemon(tmp / home, spec, env)


def wait_for(daemon: Daemon, check: Callable[[], T | None], what: str, timeout: float = 30) -> T:
    """Re-check ``check`` each time the event stream moves, until it yields a value."""
    deadline = time.monotonic() + timeout
    cursor = 0
    while True:
        value = check()
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"timed out waiting for {what}")
        cursor = daemon.call("events", timeout=remaining + 5, since=cursor, wait_ms=int(min(remaining, 2) * 1000))[
            "cursor"
        ]


def sessions(daemon: Daemon, run_id: str) -> list[dict[str, Any]]:
    return ledger_rows(daemon.home, "SELECT * FROM sessions WHERE run_id = ? ORDER BY created_at", run_id)


def session_in(daemon: Daemon, run_id: str, states: set[str], index: int = 0) -> dict[str, Any] | None:
    rows = sessions(daemon, run_id)
    return rows[index] if len(rows) > index and rows[index]["state"] in states else None


def held(daemon: Daemon, run_id: str) -> bool:
    rows = ledger_rows(daemon.home, "SELECT 1 FROM events WHERE kind = 'finalize-held' AND subject = ?", run_id)
    return bool(rows)


def events_of(daemon: Daemon, subject: str) -> list[dict[str, Any]]:
    """The session's own events (its actor's lifecycle events share the subject)."""
    rows = ledger_rows(
        daemon.home, "SELECT * FROM events WHERE subject = ? AND kind LIKE 'session-%' ORDER BY cursor", subject
    )
    return [{**row, "data": json.loads(row["data"])} for row in rows]


def outputs(shown: dict[str, Any], daemon: Daemon) -> list[dict[str, Any]]:
    rows = ledger_rows(
        daemon.home,
        "SELECT tool, phase, result, error FROM actions WHERE run_id = ? ORDER BY loop_index, action_index",
        shown["run"]["run_id"],
    )
    return [{**row, "output": json.loads(row["result"])["output"] if row["result"] else {}} for row in rows]


#: Every ledger table that records what the model asked for or what happened. (The
#: scripted provider's own script, which the test wrote, sits in runs.provider_config.)
RECORDS = ("events", "sessions", "receipts", "plans", "actions", "provider_requests", "observations")


def persisted_text(daemon: Daemon) -> str:
    """The ledger surfaces that must never carry stdin content.

    What a poll read is the process's own transcript (the terminal echoes what it is
    sent, and a program may print it back): that output is what the agent asked to
    see, so the result and the observation of each poll are left out.
    """
    polls = {
        row["action_id"]
        for row in ledger_rows(daemon.home, "SELECT action_id FROM actions WHERE tool = 'process.poll'")
    }
    kept: list[dict[str, Any]] = []
    for table in RECORDS:
        for row in ledger_rows(daemon.home, f"SELECT * FROM {table}"):
            if table == "observations" and row["source"] in polls:
                continue
            if table == "actions" and row["action_id"] in polls:
                row = {**row, "result": None}
            kept.append(row)
    return json.dumps(kept)


def stdin_row(daemon: Daemon, run_id: str) -> dict[str, Any]:
    rows = ledger_rows(daemon.home, "SELECT * FROM actions WHERE run_id = ? AND tool = 'process.stdin'", run_id)
    assert len(rows) == 1
    return rows[0]


def call(tool: str, script: str, extra: str = "") -> str:
    """One scripted action running ``sh -c SCRIPT`` (a JSON string is a TOML string)."""
    return f'{{ tool = "{tool}", input = {{ program = "sh", args = ["-c", {json.dumps(script)}]{extra} }} }}'


# --------------------------------------------------------------------------------------


PID = '"${running.process_id}"'
# Reads one line, then (cat) everything up to end-of-file, then exits 3.
READER = 'echo ready; read line; echo "got:$line"; cat; echo eof-seen; exit 3'
LIFECYCLE = f"""
[[agents.steps]]
actions = [{call("process.start", READER, ", timeout_s = 60")}]
[[agents.steps]]
actions = [
  {{ tool = "process.stdin", input = {{ process_id = {PID}, data = "hello", append_newline = true, eof = true }} }},
  {{ tool = "process.poll", input = {{ process_id = {PID}, max_chars = 4096 }} }},
]
[[agents.steps]]
actions = [{call("process.start", 'trap "echo stopping; exit 0" TERM; echo waiting; while :; do sleep 0.05; done')}]
[[agents.steps]]
actions = [{{ tool = "process.poll", input = {{ process_id = {PID}, wait_ms = 20000 }} }}]
[[agents.steps]]
actions = [{{ tool = "process.terminate", input = {{ process_id = {PID}, cursor = "${{running.cursor}}" }} }}]
[[agents.steps]]
actions = [{{ tool = "process.poll", input = {{ process_id = {PID}, cursor = "${{terminated.next_cursor}}" }} }}]
[[agents.steps]]
final = "done"
"""


def test_start_stdin_poll_natural_exit_and_terminate(short_tmp: Path) -> None:
    daemon = _daemon(short_tmp, _spec(LIFECYCLE, policy='[agents.policy]\n"process.poll" = "confirm"'))
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="drive two processes")["run_id"]
        # The poll waits for a person; the process ends meanwhile, so the poll then
        # sees its whole output deterministically.
        wait_run(daemon, run_id, {"waiting-confirmation"})
        first = wait_for(daemon, lambda: session_in(daemon, run_id, {"exited"}), "the first process to exit")
        # "hello\n" and the terminal's EOF character (^D): cat ends only on end-of-file.
        assert first["exit_code"] == 3 and first["stdin_bytes"] == 7 and first["launch_mode"] == MODE
        poll_id = daemon.call("pending")["actions"][0]["action_id"]
        daemon.call("continue_action", action_id=poll_id, decision="approve")
        # The second poll waits for the second process's first output, which comes
        # after its TERM trap is set: the terminate cannot overtake the trap.
        wait_run(daemon, run_id, {"waiting-confirmation"})
        second_poll = daemon.call("pending")["actions"][0]["action_id"]
        assert second_poll != poll_id
        daemon.call("continue_action", action_id=second_poll, decision="approve")
        # After the terminate, a poll from the cursor it gave back reads the tail.
        wait_run(daemon, run_id, {"waiting-confirmation"})
        tail_poll = daemon.call("pending")["actions"][0]["action_id"]
        daemon.call("continue_action", action_id=tail_poll, decision="approve")
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed" and shown["final_reply"] == "done"

        start_a, stdin, poll, start_b, poll_b, term, tail = outputs(shown, daemon)
        assert [a["phase"] for a in (start_a, stdin, poll, start_b, poll_b, term, tail)] == ["ok"] * 7
        assert "waiting" in poll_b["output"]["chunk"] and poll_b["output"]["status"] == "running"
        assert start_a["output"]["status"] == "running" and start_a["output"]["launch_mode"] == MODE
        assert stdin["output"]["bytes_written"] == 7 and stdin["output"]["eof"] is True
        assert stdin["output"]["sha256"] == hashlib.sha256(b"hello\n\x04").hexdigest()
        chunk = poll["output"]["chunk"]
        assert "ready" in chunk and "got:hello" in chunk and "eof-seen" in chunk
        assert poll["output"]["status"] == "exited" and poll["output"]["exit_code"] == 3
        # Seed 004 V1.10: "terminate 只返回同一 cursor 的零消费状态元数据，不读取": it reads
        # nothing and gives the cursor back; the poll from it has the whole tail.
        assert term["output"]["status"] == "terminated" and "chunk" not in term["output"]
        assert term["output"]["next_cursor"] == start_b["output"]["cursor"]
        assert "waiting" in tail["output"]["chunk"] and "stopping" in tail["output"]["chunk"]
        assert tail["output"]["status"] == "terminated" and tail["output"]["more"] is False
        assert start_a["output"]["process_id"] != start_b["output"]["process_id"]

        rows = sessions(daemon, run_id)
        assert [r["state"] for r in rows] == ["exited", "terminated"]
        # Seed 004 V1.11 and V1.11.1: each record names its sandbox and its handshake's stages.
        for row in rows:
            assert (row["sandbox_mode"], row["network_access"], row["sandbox_backend"]) == (
                (MODE, 0, "bubblewrap") if SANDBOXED else (MODE, 1, "none"))
            assert row["sandbox_establishment"] == ("ready" if SANDBOXED else "unsandboxed")
            assert row["target_exec"] == "established" and row["launch_failure_kind"] is None
            assert row["created_at"] <= row["sandbox_ready_at"] <= row["exec_established_at"]
        kinds = [e["kind"] for e in events_of(daemon, rows[0]["process_id"])]
        assert kinds[:4] == ["session-prepared", "session-launching", "session-launched", "session-running"]
        assert "session-stdin" in kinds and kinds[-1] == "session-exited"
        assert [e["kind"] for e in events_of(daemon, rows[1]["process_id"])][-2:] == [
            "session-terminating",
            "session-terminated",
        ]
        # stdin content stays out of the ledger: the plan, the action and the receipt
        # hold its digest, the raw provider response was withheld at plan commit, and
        # the private spool entry was used once and removed.
        assert "hello" not in persisted_text(daemon)
        receipts = {r["tool"]: r for r in shown["receipts"]}
        assert "data=<sealed, 5 bytes>" in receipts["process.stdin"]["input_summary"]
        sealed = json.loads(stdin_row(daemon, run_id)["input"])["data"]
        assert sealed == {"sealed": hashlib.sha256(b"hello").hexdigest(), "bytes": 5}
        assert list((daemon.home / "sealed").iterdir()) == []
        assert f"launch={MODE}" in receipts["process.start"]["result_summary"]
        # The run ended: its session actors are stopped (polls of an ended run are over).
        ids = {r["process_id"] for r in rows}
        daemon.wait_until(
            lambda status: all(a["status"] == "stopped" for a in status["actors"] if a["id"] in ids),
            what="session actors stopped after the run",
        )
    finally:
        daemon.shutdown()


WAITING = f"""
[[agents.steps]]
actions = [{call("process.start", "echo up; while [ ! -e release ]; do sleep 0.05; done; echo released")}]
[[agents.steps]]
final = "done"
"""


def test_final_reply_waits_for_a_live_session_and_other_runs_are_refused(short_tmp: Path) -> None:
    daemon = _daemon(short_tmp, _spec(WAITING))
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="wait for release")["run_id"]
        wait_for(daemon, lambda: held(daemon, run_id), "the final reply to be held")
        shown = show(daemon, run_id)
        assert shown["run"]["status"] == "running" and shown["final_reply"] is None
        assert shown["sessions"][0]["state"] == "running"
        busy = daemon.call("shutdown_if_idle")
        assert busy["status"] == "busy" and "1 process session(s) running" in busy["reasons"]

        process_id = sessions(daemon, run_id)[0]["process_id"]
        script = f"""
[[steps]]
actions = [
  {{ tool = "process.poll", input = {{ process_id = "{process_id}" }} }},
  {{ tool = "process.stdin", input = {{ process_id = "{process_id}", data = "intruder", append_newline = true }} }},
  {{ tool = "process.terminate", input = {{ process_id = "{process_id}" }} }},
]
[[steps]]
actions = [{{ tool = "process.poll", input = {{ process_id = "proc-00000000000000000000" }} }}]
[[steps]]
final = "poked"
"""
        intruder = daemon.call("run", agent_id="other", task="poke a foreign process", script=script)["run_id"]
        poked = wait_run(daemon, intruder, {"completed", "failed"})
        assert [a["phase"] for a in poked["actions"]] == ["failed"] * 4
        assert all("not a process session of run" in a["error"] for a in poked["actions"])
        # Refused means untouched: still running, nothing written to it.
        row = sessions(daemon, run_id)[0]
        assert row["state"] == "running" and row["stdin_bytes"] == 0
        # The refused write's sealed data went with its receipt, and never reached the ledger.
        assert list((daemon.home / "sealed").iterdir()) == []
        assert "intruder" not in persisted_text(daemon).replace("poke a foreign process", "")

        (short_tmp / "ws" / "release").touch()
        done = wait_run(daemon, run_id, {"completed", "failed"})
        assert done["run"]["status"] == "completed" and done["final_reply"] == "done"
        assert sessions(daemon, run_id)[0]["state"] == "exited"
    finally:
        daemon.shutdown()


# The poll returns once there is output; "ready" comes after the launch was counted.
CRASH = f"""
[[agents.steps]]
actions = [{call("process.start", "echo launched >> launches.log; echo ready; exec sleep 120")}]
[[agents.steps]]
actions = [{{ tool = "process.poll", input = {{ process_id = {PID}, wait_ms = 20000 }} }}]
[[agents.steps]]
final = "done"
"""


def _targets() -> list[psutil.Process]:
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.cmdline() == ["sleep", "120"]:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _wait_old_tree_gone(timeout: float = 15) -> None:
    """Every process the dead supervisor left (this test process is the subreaper of
    all of them) has exited: only then is the launch count final."""
    from tests.processes import live_descendants  # not the worker's PostgreSQL server

    assert psutil.wait_procs(live_descendants(), timeout=timeout)[1] == []


@pytest.mark.parametrize("when", ["running", "launch", "prepared"])
def test_supervisor_killed_with_a_session_only_reconciles(short_tmp: Path, when: str) -> None:
    daemon = _daemon(short_tmp, _spec(CRASH))
    launches = short_tmp / "ws" / "launches.log"
    try:
        if when == "prepared":
            # Seed 004 V1.10: "对旧 boot 的 prepared 也采取保守核对": recorded, never launched.
            first = daemon.up(env={"CORRAL_FAILPOINTS": "session.after-prepared=kill@once"})
            run_id = daemon.call("run", agent_id="writer", task="crash before the launch")["run_id"]
            wait_supervisor_gone(daemon, first.pid, timeout=30)
        elif when == "launch":
            # Inside the session actor: launched and committed, running not yet recorded.
            first = daemon.up(env={"CORRAL_FAILPOINTS": "session.after-launch=kill-supervisor@once"})
            run_id = daemon.call("run", agent_id="writer", task="crash at launch")["run_id"]
            wait_supervisor_gone(daemon, first.pid, timeout=30)
        else:
            first = daemon.up()
            run_id = daemon.call("run", agent_id="writer", task="crash while running")["run_id"]
            wait_for(daemon, lambda: held(daemon, run_id), "the session to run and the reply to wait")
            assert "ready" in outputs(show(daemon, run_id), daemon)[1]["output"]["chunk"]
            assert launches.read_text().splitlines() == ["launched"]
            targets = _targets()
            assert len(targets) == 1
            daemon.kill_supervisor()
            # The process dies with the supervisor (PDEATHSIG through the session actor).
            assert psutil.wait_procs(targets, timeout=10)[1] == []
        _wait_old_tree_gone()
        count = len(launches.read_text().splitlines()) if launches.exists() else 0
        assert count == {"running": 1, "prepared": 0}.get(when, count) and count <= 1

        second = daemon.up()
        assert second.boot_id != first.boot_id
        row = sessions(daemon, run_id)[0]
        assert row["state"] == "needs-reconciliation" and row["error_code"] == "supervisor-restarted"
        assert "not relaunched, reconnected or signalled" in row["reason"]
        process_id = row["process_id"]
        after = [e for e in events_of(daemon, process_id) if e["boot_id"] == second.boot_id]
        assert [e["kind"] for e in after] == ["session-needs-reconciliation"]
        # Nothing to signal: no pid of a session is stored anywhere in the ledger.
        columns = {c["name"] for c in ledger_rows(daemon.home, "SELECT name FROM pragma_table_info('sessions')")}
        assert not any("pid" in name for name in columns)
        assert all("pid" not in e["data"] for e in events_of(daemon, process_id))
        assert _targets() == []

        shown = show(daemon, run_id)
        assert shown["run"]["status"] == "needs-reconciliation" and shown["final_reply"] is None
        pending = daemon.call("pending")
        assert run_id in [r["run_id"] for r in pending["runs"]]
        assert [(s["process_id"], s["run_id"]) for s in pending["sessions"]] == [(process_id, run_id)]
        busy = daemon.call("shutdown_if_idle")
        assert busy["status"] == "busy"
        assert "1 process session(s) needs-reconciliation" in busy["reasons"]

        daemon.call("reconcile", action_id=process_id, outcome="ok", note="the process died with the supervisor")
        assert daemon.call("pending")["sessions"] == []
        for action in daemon.call("pending")["actions"]:
            # At launch the start action itself was still executing: also unknown.
            assert action["run_id"] == run_id and action["phase"] == "needs-reconciliation"
            daemon.call("reconcile", action_id=action["action_id"], outcome="failed", note="no usable session")
        done = wait_run(daemon, run_id, {"completed", "failed"})
        assert done["run"]["status"] == "completed" and done["final_reply"] == "done"
        assert done["sessions"][0]["resolution"] == "ok"
        assert (len(launches.read_text().splitlines()) if launches.exists() else 0) == count
    finally:
        daemon.shutdown()


#: The command makes the secret as it runs: a plan holding it would fail its handoff
#: closed (seed 004 V1.43), so only the output carries it.
COMMAND = f"""
[[agents.steps]]
actions = [{call("command.exec", 'seq -f "line%g" 1 100; echo "api_key=$(echo supersecret)value123"; pwd;'
                 ' echo oops >&2')}]
[[agents.steps]]
actions = [
  {{ tool = "command.output_read", input = {{ action_id = "${{ok.action_id}}", start_line = 50, max_lines = 10 }} }},
  {{ tool = "command.output_read", input = {{ action_id = "act-000000000000000000000000" }} }},
]
[[agents.steps]]
final = "done"
"""


def test_command_exec_captures_head_and_tail_and_pages_the_transcript(short_tmp: Path) -> None:
    daemon = _daemon(short_tmp, _spec(COMMAND))
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="run a command")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed"
        exec_, page, missing = outputs(shown, daemon)
        out = exec_["output"]
        assert exec_["phase"] == "ok" and out["status"] == "exited" and out["exit_code"] == 0
        assert out["launch_mode"] == MODE
        assert out["stdout"]["head"] == [f"line{i}" for i in range(1, 21)]
        assert out["stdout"]["tail"][:18] == [f"line{i}" for i in range(83, 101)]
        assert out["stdout"]["total_lines"] == 102 and out["stdout"]["omitted_lines"] == 62
        assert out["stderr"]["head"] == ["oops"] and out["transcript_lines"] == 103
        # Sanitized: the secret is redacted, the absolute project path replaced.
        assert "supersecretvalue123" not in json.dumps(out) and "[redacted]" in out["stdout"]["tail"][18]
        assert str(short_tmp) not in out["stdout"]["tail"][19]

        action_id = out["action_id"]
        launch = ledger_rows(daemon.home, "SELECT * FROM command_launches WHERE action_id = ?", action_id)
        assert [(r["launch_mode"], r["exit_code"]) for r in launch] == [(MODE, 0)]
        transcript = Path(launch[0]["transcript"])
        assert transcript == daemon.home / "transcripts" / run_id / f"{action_id}.log"
        # The transcript merges the two pipes in arrival order, so where "oops" lands
        # among the stdout lines is up to the scheduler; within stdout, order holds.
        lines = transcript.read_text().splitlines()
        assert lines.count("oops") == 1
        assert [line for line in lines if line != "oops"][:100] == [f"line{i}" for i in range(1, 101)]

        # Each line with its stable number in the transcript (seed 004 V1.8).
        numbered = [f"{n}: {line}" for n, line in enumerate(lines[49:59], start=50)]
        assert page["phase"] == "ok" and page["output"]["lines"] == numbered
        assert page["output"]["nextLine"] == 60 and page["output"]["totalLines"] == 103
        assert page["output"]["hasMore"] is True and page["output"]["exitCode"] == 0
        assert page["output"]["outputSha256"] == out["outputSha256"] and out["sourceActionId"] == action_id
        assert missing["phase"] == "failed" and "no command transcript" in missing["error"]
        assert stat.S_IMODE(transcript.stat().st_mode) == 0o600
        assert {stat.S_IMODE(p.stat().st_mode) for p in (transcript.parent, transcript.parent.parent)} == {0o700}
        assert "supersecretvalue123" not in transcript.read_text()
        receipt = next(r for r in shown["receipts"] if r["tool"] == "command.exec")
        assert f"launch={MODE}" in receipt["result_summary"]
        assert [(c["launch_mode"], c["exit_code"]) for c in shown["commands"]] == [(MODE, 0)]
    finally:
        daemon.shutdown()


NO_BWRAP = f"""
[[agents.steps]]
actions = [
  {call("command.exec", "echo ran >> ran.log")},
  {call("process.start", "echo ran >> ran.log; echo hi")},
]
[[agents.steps]]
final = "done"
"""


def test_without_bubblewrap_required_fails_closed_and_allowed_unsandboxed_is_recorded(short_tmp: Path) -> None:
    # A PATH with a shell but no bwrap: the host's bubblewrap is invisible.
    bin_dir = short_tmp / "bin"
    bin_dir.mkdir()
    shell = shutil.which("sh")
    assert shell is not None
    os.symlink(shell, bin_dir / "sh")
    env = {"PATH": str(bin_dir)}
    ran = short_tmp / "ws" / "ran.log"

    required = _daemon(short_tmp, _spec(NO_BWRAP, sandbox=""), home="h1", env=env)
    try:
        required.up()
        run_id = required.call("run", agent_id="writer", task="try without a sandbox")["run_id"]
        shown = wait_run(required, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed"
        exec_, start = outputs(shown, required)
        assert exec_["phase"] == "failed" and exec_["output"]["code"] == "sandbox-unavailable"
        assert "bubblewrap" in exec_["error"]
        assert start["phase"] == "failed" and start["output"]["code"] == "sandbox-unavailable"
        row = sessions(required, run_id)[0]
        assert row["state"] == "failed" and row["error_code"] == "sandbox-unavailable" and row["launch_mode"] is None
        assert not ran.exists(), "the target ran zero times"
        assert ledger_rows(required.home, "SELECT * FROM command_launches") == []
    finally:
        required.shutdown()

    allowed = _daemon(short_tmp, _spec(NO_BWRAP, sandbox='[sandbox]\nmode = "allow-unsandboxed"'), home="h2", env=env)
    try:
        allowed.up()
        run_id = allowed.call("run", agent_id="writer", task="run without a sandbox, as allowed")["run_id"]
        shown = wait_run(allowed, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed"
        assert [a["phase"] for a in shown["actions"]] == ["ok", "ok"]
        assert all("launch=unsandboxed" in r["result_summary"] for r in shown["receipts"])
        assert [r["launch_mode"] for r in ledger_rows(allowed.home, "SELECT * FROM command_launches")] == [
            "unsandboxed"
        ]
        assert sessions(allowed, run_id)[0]["launch_mode"] == "unsandboxed"
        assert ran.read_text().splitlines() == ["ran", "ran"]
    finally:
        allowed.shutdown()
