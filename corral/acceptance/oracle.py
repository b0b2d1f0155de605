"""The host-side oracle: pure judgements from a flow's evidence to a verdict. Only
persisted facts count (the ledger, the project's files), never the model's own
account. The split: a broken runtime invariant is FAIL-runtime; a runtime that held
while the model did not do the task is FAIL-model."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from corral.acceptance import specs
from corral.acceptance.coder_flow import CoderFacts
from corral.acceptance.leak_scan import LeakScan
from corral.acceptance.report import Verdict
from corral.chaos.invariants import Check

Facts = dict[str, int | str | bool]


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    reason: str
    facts: Facts = field(default_factory=dict)


def passed(reason: str, **facts: int | str | bool) -> Judgement:
    return Judgement(Verdict.PASS, reason, facts)


def model_failed(reason: str, **facts: int | str | bool) -> Judgement:
    return Judgement(Verdict.FAIL_MODEL, reason, facts)


def runtime_failed(reason: str, **facts: int | str | bool) -> Judgement:
    return Judgement(Verdict.FAIL_RUNTIME, reason, facts)


def _crashed(facts: CoderFacts) -> Judgement | None:
    if facts.error:
        return runtime_failed(f"the flow broke: {facts.error}")
    if not facts.run_id:
        return runtime_failed("no run was created")
    return None


def startup_context(facts: CoderFacts, decoys: tuple[str, ...]) -> Judgement:
    """V1.1 §5.1: the first provider turn carried the repository context (AGENTS.md's
    marker), and no decoy from the project's .env or the environment."""
    prompt = facts.first_system_prompt
    if not prompt:
        return _crashed(facts) or runtime_failed("the first provider turn has no recorded system prompt")
    leaked = [d[:6] for d in decoys if d in prompt]
    if leaked:
        return runtime_failed(f"the startup context holds a decoy secret ({', '.join(leaked)}…)")
    if facts.marker not in prompt:
        return runtime_failed("the startup context lacks the project's AGENTS.md")
    return passed("AGENTS.md reached the first turn's system prompt; no decoy did", prompt_chars=len(prompt))


#: The coder's change (V1.1 §5.3: "执行 checkpoint、读取、精确 patch/write"): a changeset,
#: which takes its checkpoint before it writes.
CHANGESET = "project.changeset"


def tool_plan(facts: CoderFacts) -> Judgement:
    """V1.1 §5.2: the model's plan became actions of tools the agent may use."""
    broken = _crashed(facts)
    if broken and not facts.actions:
        return broken
    allowed = {"fs.read", CHANGESET}
    tools = [a["tool"] for a in facts.actions]
    if not tools:
        return model_failed("the model planned no tool call", actions=0)
    illegal = sorted(set(tools) - allowed)
    if illegal:
        return runtime_failed(f"actions of tools the agent may not use: {', '.join(illegal)}", actions=len(tools))
    return passed(f"{len(tools)} legal action(s): {', '.join(tools)}", actions=len(tools))


def _asked_change(action: dict[str, object]) -> bool:
    """Whether the changeset is the one the task asks for: one edit of notes.txt."""
    raw = action["input"]
    value = json.loads(raw) if isinstance(raw, str) else raw
    changes = value.get("changes") if isinstance(value, dict) else None
    if not isinstance(changes, list) or len(changes) != 1 or not isinstance(changes[0], dict):
        return False
    change = changes[0]
    return (change.get("path"), change.get("old_text"), change.get("new_text"),
            change.get("operation", "update")) == ("notes.txt", "status: draft", "status: final", "update")


def _counts(facts: CoderFacts) -> Facts:
    tools = [a["tool"] for a in facts.actions]
    return {"reads": tools.count("fs.read"), "changesets": tools.count(CHANGESET)}


def read_patch_confirm(facts: CoderFacts) -> Judgement:
    """V1.1 §5.3: a read, an exact change that takes a checkpoint (a changeset), and
    the run parked waiting for confirmation."""
    broken = _crashed(facts)
    if broken:
        return broken
    counts = _counts(facts)
    tools = [a["tool"] for a in facts.actions]
    if CHANGESET not in tools:
        return model_failed(f"the model never called {CHANGESET} (the checkpointed change of item 3);"
                            f" it called {', '.join(tools) or 'nothing'}", **counts)
    change = next(a for a in facts.actions if a["tool"] == CHANGESET)
    if change["policy"] != "confirm":
        return runtime_failed(f"{CHANGESET} ran under policy {change['policy']!r}, not confirm", **counts)
    if facts.status_at_cli_exit != "waiting-confirmation" or facts.waiting_tool != CHANGESET:
        return runtime_failed(f"the run did not park for the changeset (status {facts.status_at_cli_exit!r})",
                              **counts)
    if "fs.read" not in tools:
        return model_failed("the changeset parked for confirmation, but the model did not read first", **counts)
    return passed(f"fs.read, then {CHANGESET} parked at waiting-confirmation", **counts)


def confirm_after_cli_exit(facts: CoderFacts) -> Judgement:
    """V1.1 §5.3-5.4: approved from another process after the run's CLI exited, the
    supervisor carried the run on: the changeset took its checkpoint and applied
    exactly, once."""
    broken = _crashed(facts)
    if broken:
        return broken
    if facts.status_at_cli_exit != "waiting-confirmation":
        return model_failed("nothing waited for confirmation (see read-patch-confirm)")
    if facts.approve_exit != 0:
        return runtime_failed(f"`corral approve` exited {facts.approve_exit}")
    change = next(a for a in facts.actions if a["tool"] == CHANGESET)
    counts: Facts = {"changesets": sum(1 for a in facts.actions if a["tool"] == CHANGESET and a["phase"] == "ok"),
                     "checkpoints": facts.checkpoints}
    if change["phase"] not in ("ok", "failed"):
        return runtime_failed(f"after approval the changeset is {change['phase']}, not finished", **counts)
    if change["phase"] == "ok" and facts.checkpoints < 1:
        return runtime_failed("the changeset ran ok but no checkpoint of it was kept (checkpoints = 0)", **counts)
    if facts.notes_after == specs.NOTES_AFTER:
        return passed("approved after the CLI exited; the supervisor took the checkpoint and applied the changeset",
                      **counts)
    if change["phase"] == "failed" or not _asked_change(change):
        return model_failed(f"approved and run, but the model's changeset was not the asked one ({change['phase']})",
                            **counts)
    return runtime_failed(f"the exact changeset ran ok but notes.txt holds {facts.notes_after[:60]!r}", **counts)


def kill_recovery(facts: CoderFacts) -> Judgement:
    """V1.1 §5.7: SIGKILLed at a named failpoint mid-run, the same run finished after
    a restart with exactly one final reply."""
    broken = _crashed(facts)
    if broken:
        return broken
    if not facts.killed_at_failpoint:
        if facts.final_status == "failed":
            return model_failed("the run failed before its final reply, so the kill point was never reached")
        return runtime_failed(f"the failpoint was not reached (run {facts.final_status})")
    if facts.final_status != "completed":
        return runtime_failed(f"after the restart the run ended {facts.final_status}")
    if facts.replies != 1:
        return runtime_failed(f"{facts.replies} final replies after the restart")
    return passed("killed after finalization was prepared; the same run completed with one reply",
                  boots=facts.boots, replies=facts.replies)


def consistency(checks: list[Check]) -> Judgement:
    """V1.1 §5.8: every invariant of every ledger the suite wrote."""
    failed = [f"{c.name}: {'; '.join(c.failures[:3])}" for c in checks if not c.passed]
    if failed:
        return runtime_failed("; ".join(failed)[:800], checks=len(checks))
    if not any(c.exercised for c in checks):
        return runtime_failed("no ledger held anything to check")
    return passed(f"{len(checks)} invariant checks held", checks=len(checks))


def secrets(scan: LeakScan) -> Judgement:
    """V1.1 §5.9: secret_leak_count = 0 over the ledgers, logs and transcripts."""
    facts: Facts = {"secret_leak_count": scan.count, "files_scanned": scan.files}
    if scan.files == 0:
        return runtime_failed("nothing was scanned", **facts)
    if scan.count:
        return runtime_failed("; ".join([*scan.decoy_hits, *scan.pattern_hits])[:800], **facts)
    return passed(f"secret_leak_count = 0 over {scan.files} files", **facts)
