"""A poll's status facts (seed 004 V1.10: "返回至少包含 status / output / cursor /
nextCursor / hasMore / stdinOpen / exitCode / signal / outputBytes / outputSha256 /
sourceChanged / needsReconciliation；未终态时 exitCode / signal 为空").

A strict re-audit (aud1, 2026-12-07) found the poll returned only the process id, the
chunk, the cursor, the status, the exit code, ``more`` and ``live``. Here a real
supervisor runs a process on a terminal that waits for a line, writes a file of the
project, then ends itself by SIGTERM: a poll while it waits says stdin is open,
names no signal and sees the sources unchanged; a poll after its end says stdin is
closed, names SIGTERM and sees the sources changed; each gives the size and digest
of the output so far, which match the private transcript.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.harness import wait_run
from tests.test_process_sessions import _daemon, _spec, outputs, session_in, wait_for

PID = '"${running.process_id}"'
SCRIPT = 'echo ready; read line; echo "got:$line" > made.txt; echo "got:$line"; kill -TERM $$'
START = f'{{ program = "sh", args = ["-c", {json.dumps(SCRIPT)}], timeout_s = 60 }}'
STEPS = f"""
[[agents.steps]]
actions = [{{ tool = "process.start", input = {START} }}]
[[agents.steps]]
actions = [{{ tool = "process.poll", input = {{ process_id = {PID}, wait_ms = 20000 }} }}]
[[agents.steps]]
actions = [{{ tool = "process.stdin", input = {{ process_id = {PID}, data = "go", append_newline = true }} }}]
[[agents.steps]]
actions = [{{ tool = "process.poll", input = {{ process_id = {PID}, max_chars = 4096 }} }}]
[[agents.steps]]
final = "done"
"""
POLICY = '[agents.policy]\n"process.start" = "auto"\n"process.stdin" = "auto"\n"process.poll" = "confirm"'


def test_a_poll_says_whether_stdin_is_open_what_signal_ended_it_and_how_much_output(short_tmp: Path) -> None:
    daemon = _daemon(short_tmp, _spec(STEPS, policy=POLICY))
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="drive a process")["run_id"]
        # The first poll runs while the process waits for its line: it is running.
        wait_run(daemon, run_id, {"waiting-confirmation"})
        (first,) = daemon.call("pending")["actions"]
        daemon.call("continue_action", action_id=first["action_id"], decision="approve")
        # The second waits for a person until the process has ended.
        wait_run(daemon, run_id, {"waiting-confirmation"})
        row = wait_for(daemon, lambda: session_in(daemon, run_id, {"exited", "terminated"}), "the process to end")
        (second,) = daemon.call("pending")["actions"]
        assert second["action_id"] != first["action_id"]
        daemon.call("continue_action", action_id=second["action_id"], decision="approve")
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed", shown["run"]

        _start, waiting, _stdin, ended = outputs(shown, daemon)
        transcript = (daemon.home / "transcripts" / run_id / f"{row['process_id']}.log").read_bytes()
        live = waiting["output"]
        assert live["status"] == "running" and "ready" in live["chunk"]
        assert live["stdin_open"] is True and live["signal"] is None and live["exit_code"] is None
        assert live["needs_reconciliation"] is False and live["source_changed"] is False
        assert 0 < live["output_bytes"] < len(transcript)
        assert live["output_sha256"] == hashlib.sha256(transcript[: live["output_bytes"]]).hexdigest()

        done = ended["output"]
        assert "got:go" in done["chunk"] and done["status"] == row["state"]
        assert done["stdin_open"] is False and done["signal"] == "SIGTERM" and done["exit_code"] == 143
        assert done["needs_reconciliation"] is False
        # It wrote a file of the project after its line: the sources changed.
        assert done["source_changed"] is True and (short_tmp / "ws" / "made.txt").read_text() == "got:go\n"
        assert done["output_bytes"] == len(transcript)
        assert done["output_sha256"] == hashlib.sha256(transcript).hexdigest()
    finally:
        daemon.shutdown()


def test_a_signal_is_named_only_for_an_ended_process() -> None:
    from corral.actors.session_state import SessionState as S
    from corral.actors.session_state import signal_of

    assert signal_of(S.EXITED, 143) == "SIGTERM" and signal_of(S.TERMINATED, 137) == "SIGKILL"
    assert signal_of(S.RUNNING, 143) is None and signal_of(S.EXITED, 0) is None and signal_of(S.EXITED, 3) is None
    assert signal_of(S.EXITED, None) is None and signal_of(S.EXITED, 255) is None


def test_a_transcript_gives_its_size_and_digest(tmp_path: Path) -> None:
    from corral.supervisor.sessions.session_store import transcript_facts

    path = tmp_path / "proc.log"
    assert transcript_facts(path) == (0, hashlib.sha256(b"").hexdigest())
    path.write_bytes(b"ready\r\n")
    assert transcript_facts(path) == (7, hashlib.sha256(b"ready\r\n").hexdigest())
