"""SIGKILL at every named failpoint, supervisor and agent, then prove from the
external effects file and the ledger: each side effect at most once, the run ends
completed with exactly one reply or parks in needs-reconciliation with a reason,
and nothing is duplicated."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from corral.supervisor.ledger.ledger_spec import URL_ENV
from tests.harness import (
    Daemon,
    agent_spec,
    effects,
    ledger_rows,
    show,
    wait_run,
    wait_supervisor_gone,
)

STEPS = """
[[agents.steps]]
actions = [{ tool = "effect.record", input = { label = "e1" } }]
[[agents.steps]]
final = "done"
"""

# failpoint -> (action that kills the supervisor, outcome, side effects expected)
SUPERVISOR_KILLS = {
    "action.after-prepared": ("kill", "completed", 1),
    "action.after-executing": ("kill", "needs-reconciliation", 0),
    "agent.before-effect": ("kill-supervisor", "needs-reconciliation", 0),
    "agent.after-effect": ("kill-supervisor", "needs-reconciliation", 1),
    "action.after-terminal": ("kill", "completed", 1),
    "action.after-receipt": ("kill", "completed", 1),
    "plan.after-commit": ("kill", "completed", 1),
    "provider.before-handoff": ("kill-supervisor", "completed", 1),
    "provider.after-handoff": ("kill-supervisor", "completed", 1),
    "finalize.after-prepared": ("kill", "completed", 1),
    "finalize.after-reply": ("kill", "completed", 1),
}

# failpoint -> (action that kills the agent actor, outcome, side effects expected)
AGENT_KILLS = {
    "action.after-prepared": ("kill-caller", "completed", 1),
    "action.after-executing": ("kill-caller", "needs-reconciliation", 0),
    "agent.before-effect": ("kill", "needs-reconciliation", 0),
    "agent.after-effect": ("kill", "needs-reconciliation", 1),
    "action.after-terminal": ("kill-caller", "completed", 1),
    "action.after-receipt": ("kill-caller", "completed", 1),
    "plan.after-commit": ("kill-caller", "completed", 1),
    "provider.before-handoff": ("kill", "completed", 1),  # scripted: safe to re-send
    "provider.after-handoff": ("kill", "completed", 1),
    "finalize.after-prepared": ("kill-caller", "completed", 1),
    "finalize.after-reply": ("kill-caller", "completed", 1),
}


def _setup(tmp: Path, env: dict[str, str] | None = None) -> Daemon:
    (tmp / "ws").mkdir()
    spec = tmp / "spec.toml"
    spec.write_text(agent_spec(steps=STEPS))
    return Daemon(tmp / "h", spec, env)


def _check_no_duplicates(daemon: Daemon, run_id: str) -> None:
    home = daemon.home
    receipts = ledger_rows(home, "SELECT action_id FROM receipts WHERE run_id = ?", run_id)
    actions = ledger_rows(home, "SELECT action_id, phase FROM actions WHERE run_id = ?", run_id)
    terminal = [a for a in actions if a["phase"] in ("ok", "failed", "denied")]
    assert sorted(r["action_id"] for r in receipts) == sorted(a["action_id"] for a in terminal)
    events = ledger_rows(home, "SELECT kind, subject FROM events")
    # Each receipt is announced once: by its terminal move's event (or a repair's).
    announced = ("action-ok", "action-failed", "action-denied", "receipt-written")
    per_action = Counter(e["subject"] for e in events if e["kind"] in announced)
    assert sorted(per_action) == sorted(r["action_id"] for r in receipts), per_action
    assert all(n == 1 for n in per_action.values()), per_action
    replies = Counter(e["subject"] for e in events if e["kind"] == "reply-appended")
    assert all(n == 1 for n in replies.values()), replies
    observations = ledger_rows(home, "SELECT source FROM observations WHERE run_id = ?", run_id)
    assert len(observations) == len({o["source"] for o in observations})


def _finish(daemon: Daemon, run_id: str, outcome: str, expected_effects: int) -> None:
    shown = wait_run(daemon, run_id, {"completed", "needs-reconciliation", "failed"})
    assert shown["run"]["status"] == outcome, shown["run"]
    lines = [e for e in effects(daemon.home.parent / "effects.log") if e["run_id"] == run_id]
    assert len(lines) == expected_effects
    assert max(Counter(e["action_id"] for e in lines).values(), default=0) <= 1
    if outcome == "needs-reconciliation":
        assert shown["run"]["reason"], "a parked run says why"
        unresolved = [a for a in shown["actions"] if a["phase"] == "needs-reconciliation"]
        assert len(unresolved) == 1
        assert shown["final_reply"] is None
        # Nothing was replayed; a person resolves it and the run finishes once.
        daemon.call("reconcile", action_id=unresolved[0]["action_id"], outcome="ok", note="checked the log")
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed"
        again = [e for e in effects(daemon.home.parent / "effects.log") if e["run_id"] == run_id]
        assert len(again) == expected_effects
    assert shown["final_reply"] == "done"
    assert len(ledger_rows(daemon.home, "SELECT * FROM replies WHERE run_id = ?", run_id)) == 1
    _check_no_duplicates(daemon, run_id)


#: On PostgreSQL, CI kills the supervisor at one failpoint of each kind of
#: window (an action's effect, its unknown outcome, a provider handoff, the final
#: reply): what differs there from SQLite is the ledger a restart finds, which every
#: one of them exercises. `make chaos` (``-m slow``) runs all eleven on PostgreSQL too.
PG_SAMPLE = {"action.after-executing", "agent.after-effect", "provider.after-handoff", "finalize.after-reply"}


def _supervisor_cases() -> list[object]:
    cases: list[object] = []
    for failpoint in sorted(SUPERVISOR_KILLS):
        cases.append(pytest.param("sqlite", failpoint, id=f"sqlite-{failpoint}"))
        marks = () if failpoint in PG_SAMPLE else (pytest.mark.slow,)
        cases.append(pytest.param("postgresql", failpoint, marks=marks, id=f"postgresql-{failpoint}"))
    return cases


@pytest.mark.parametrize(("ledger_backend", "failpoint"), _supervisor_cases())
def test_supervisor_killed_at_failpoint(
    short_tmp: Path, failpoint: str, ledger_backend: str, request: pytest.FixtureRequest
) -> None:
    """On each ledger backend: the restart finds the ledger (the home remembers a
    PostgreSQL one) and recovers from it the same way."""
    action, outcome, expected = SUPERVISOR_KILLS[failpoint]
    env = {URL_ENV: request.getfixturevalue("pg_url")} if ledger_backend == "postgresql" else None
    daemon = _setup(short_tmp, env)
    try:
        first = daemon.up(env={"CORRAL_FAILPOINTS": f"{failpoint}={action}@once"})
        run_id = daemon.call("run", agent_id="writer", task="record one effect")["run_id"]
        wait_supervisor_gone(daemon, first.pid)
        assert (daemon.home / "failpoints" / f"{failpoint}.fired").exists()
        second = daemon.up(env={URL_ENV: ""} if env else None)  # the home remembers its ledger
        assert second.boot_id != first.boot_id
        _finish(daemon, run_id, outcome, expected)
    finally:
        daemon.shutdown()


@pytest.mark.parametrize("failpoint", sorted(AGENT_KILLS))
def test_agent_killed_at_failpoint(short_tmp: Path, failpoint: str) -> None:
    action, outcome, expected = AGENT_KILLS[failpoint]
    daemon = _setup(short_tmp)
    try:
        first = daemon.up(env={"CORRAL_FAILPOINTS": f"{failpoint}={action}@once"})
        run_id = daemon.call("run", agent_id="writer", task="record one effect")["run_id"]
        _finish(daemon, run_id, outcome, expected)
        assert (daemon.home / "failpoints" / f"{failpoint}.fired").exists()
        assert daemon.endpoint.boot_id == first.boot_id, "the supervisor itself never died"
        # The supervisor may finish the step on its own before the restart lands.
        status = daemon.wait_until(
            lambda st: any(a["id"] == "writer" and a["restarts"] >= 1 and a["status"] == "running"
                           for a in st["actors"]),
            what="writer restarted",
        )
        writer = next(a for a in status["actors"] if a["id"] == "writer")
        assert writer["restarts"] == 1, "the agent was killed once and restarted once"
    finally:
        daemon.shutdown()


def _confirming(tmp: Path) -> Daemon:
    (tmp / "ws").mkdir()
    spec = tmp / "spec.toml"
    spec.write_text(agent_spec(steps=STEPS, policy='[agents.policy]\n"effect.record" = "confirm"'))
    return Daemon(tmp / "h", spec)


def test_confirmation_survives_a_supervisor_restart_and_runs_once(short_tmp: Path) -> None:
    daemon = _confirming(short_tmp)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="confirm me")["run_id"]
        shown = wait_run(daemon, run_id, {"waiting-confirmation"})
        waiting = daemon.call("pending")["actions"]
        assert [a["phase"] for a in waiting] == ["waiting-confirmation"]
        action_id = waiting[0]["action_id"]
        assert shown["actions"][0]["action_id"] == action_id
        daemon.kill_supervisor()
        daemon.up()
        assert [a["action_id"] for a in daemon.call("pending")["actions"]] == [action_id]
        assert effects(short_tmp / "effects.log") == []
        from tests.harness import cli

        wrong = cli(daemon.home, "approve", action_id, "--fingerprint", "0" * 64)
        assert wrong.returncode != 0 and "fingerprint" in wrong.stderr
        result = cli(daemon.home, "approve", action_id)
        assert result.returncode == 0, result.stderr
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed"
        assert len(effects(short_tmp / "effects.log")) == 1
        second = cli(daemon.home, "approve", action_id)
        assert second.returncode != 0
        assert len(effects(short_tmp / "effects.log")) == 1
    finally:
        daemon.shutdown()


def test_deny_records_a_receipt_and_never_runs_the_tool(short_tmp: Path) -> None:
    daemon = _confirming(short_tmp)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="deny me")["run_id"]
        wait_run(daemon, run_id, {"waiting-confirmation"})
        action_id = daemon.call("pending")["actions"][0]["action_id"]
        daemon.call("continue_action", action_id=action_id, decision="deny")
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert [r["status"] for r in shown["receipts"]] == ["denied"]
        assert effects(short_tmp / "effects.log") == []
    finally:
        daemon.shutdown()


def test_corrupt_and_truncated_plans_fail_the_run_clearly_and_the_supervisor_stays_up(
    short_tmp: Path,
) -> None:
    (short_tmp / "ws").mkdir()
    steps = '[[agents.steps]]\nraw = "{\\"actions\\": [{\\"tool\\": \\"effect.rec"\n' * 3
    spec = short_tmp / "spec.toml"
    spec.write_text(agent_spec(steps=steps))
    daemon = Daemon(short_tmp / "h", spec)
    try:
        boot = daemon.up().boot_id
        run_id = daemon.call("run", agent_id="writer", task="get garbage")["run_id"]
        shown = wait_run(daemon, run_id, {"failed", "completed"})
        assert shown["run"]["status"] == "failed"
        assert "invalid plan" in shown["run"]["reason"] and "arguments-json" in shown["run"]["reason"]
        assert shown["run"]["repairs"] == {"arguments-json": 3}
        assert daemon.call("ping")["boot_id"] == boot
        assert show(daemon, run_id)["actions"] == []
    finally:
        daemon.shutdown()


def test_path_attacks_are_refused_and_nothing_is_written(short_tmp: Path) -> None:
    ws = short_tmp / "ws"
    ws.mkdir()
    outside = short_tmp / "outside"
    outside.mkdir()
    (ws / "link").symlink_to(outside)
    attacks = ["../x", "/tmp/abs", "link/escape.txt", ".corral/ledger.db", ".env", "sub/.env.local", "id_rsa"]
    actions = ", ".join(
        f'{{ tool = "fs.write", input = {{ path = "{path}", content = "pwned" }} }}' for path in attacks[:3]
    )
    more = ", ".join(
        f'{{ tool = "fs.write", input = {{ path = "{path}", content = "pwned" }} }}' for path in attacks[3:6]
    )
    steps = f"""
[[agents.steps]]
actions = [{actions}]
[[agents.steps]]
actions = [{more}]
[[agents.steps]]
actions = [{{ tool = "fs.write", input = {{ path = "{attacks[6]}", content = "pwned" }} }}]
[[agents.steps]]
final = "tried"
"""
    spec = short_tmp / "spec.toml"
    spec.write_text(agent_spec(steps=steps))
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="attack")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert [a["phase"] for a in shown["actions"]] == ["failed"] * len(attacks)
        errors = [a["error"] for a in shown["actions"]]
        assert "relative" not in errors[0] and "'..'" in errors[0]
        assert "relative" in errors[1]
        assert "escapes the workspace" in errors[2]
        assert "control directory" in errors[3]
        assert all("secrets" in e for e in errors[4:])
        assert list(outside.iterdir()) == []
        assert not (short_tmp / "x").exists()
        assert sorted(p.name for p in ws.iterdir()) == ["link"]
        receipts = ledger_rows(daemon.home, "SELECT input_summary, result_summary FROM receipts")
        assert all("pwned" not in r["input_summary"] + r["result_summary"] for r in receipts)
    finally:
        daemon.shutdown()
