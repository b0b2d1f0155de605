"""Issue 32, case 15: the ledger refuses an action's outcome (the disk is full), the
effect has happened: the agent keeps the outcome and sends it again, with backoff,
until the ledger takes it. The run completes; the action is ``ok``, never
``needs-reconciliation``, and its effect happened once.

The full disk is the error SQLite gives (``sqlite3.OperationalError: database or
disk is full``), raised inside the supervisor's terminal transaction by the
``action.before-terminal`` failpoint the first three times (``disk-full@3``):
deterministic, and the same path a real full disk takes (the commit is refused, the
supervisor reports ``disk-full``)."""

from __future__ import annotations

from pathlib import Path

from tests.harness import agent_spec, effects, running, wait_run

STEPS = """
[[agents.steps]]
actions = [{ tool = "effect.record", input = { label = "sent once" } }]
[[agents.steps]]
final = "done"
"""


def test_an_outcome_the_full_ledger_refused_is_kept_and_sent_until_it_is_taken(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    env = {"CORRAL_FAILPOINTS": "action.before-terminal=disk-full@3"}
    with running(short_tmp / "home", agent_spec(steps=STEPS), env=env) as daemon:
        run_id = daemon.call("run", agent_id="writer", task="record once")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed", "needs-reconciliation"})
        assert shown["run"]["status"] == "completed", shown["run"]
        (action,) = shown["actions"]
        assert (action["tool"], action["phase"], action["attempts"]) == ("effect.record", "ok", 1)
        assert [e["action_id"] for e in effects(short_tmp / "effects.log")] == [action["action_id"]]
        # The ledger did refuse it three times: every marker of the failpoint is there.
        fired = sorted(path.name for path in (daemon.home / "failpoints").glob("action.before-terminal.fired*"))
        assert fired == ["action.before-terminal.fired", "action.before-terminal.fired.2",
                         "action.before-terminal.fired.3"]
        assert not [e for e in daemon.events() if e["kind"] == "action-needs-reconciliation"]
        assert daemon.status()["degraded"] == ""  # the next commit found room again
