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


def tool_plan(facts: CoderFacts) -> Judgement:
    """V1.1 §5.2: the model's plan became actions of tools the agent may use."""
    broken = _crashed(facts)
    if broken and not facts.actions:
        return broken
    allowed = {"fs.read", "fs.patch"}
    tools = [a["tool"] for a in facts.actions]
    if not tools:
        return model_failed("the model planned no tool call", actions=0)
    illegal = sorted(set(tools) - allowed)
    if illegal:
        return runtime_failed(f"actions of tools the agent may not use: {', '.join(illegal)}", actions=len(tools))
    return passed(f"{len(tools)} legal action(s): {', '.join(tools)}", actions=len(tools))


def _patch_input(facts: CoderFacts) -> dict[str, object]:
    for action in facts.actions:
        if action["tool"] == "fs.patch":
            value = json.loads(action["input"]) if isinstance(action["input"], str) else action["input"]
            return value if isinstance(value, dict) else {}
    return {}


def read_patch_confirm(facts: CoderFacts) -> Judgement:
    """V1.1 §5.3: a read, an exact patch, and the run parked waiting for confirmation."""
    broken = _crashed(facts)
    if broken:
        return broken
    tools = [a["tool"] for a in facts.actions]
    if "fs.patch" not in tools:
        return model_failed("the model never called fs.patch", reads=tools.count("fs.read"))
    patch = next(a for a in facts.actions if a["tool"] == "fs.patch")
    if patch["policy"] != "confirm":
        return runtime_failed(f"fs.patch ran under policy {patch['policy']!r}, not confirm")
    if facts.status_at_cli_exit != "waiting-confirmation" or facts.waiting_tool != "fs.patch":
        return runtime_failed(f"the run did not park for the patch (status {facts.status_at_cli_exit!r})")
    if "fs.read" not in tools:
        return model_failed("the patch parked for confirmation, but the model did not read first")
    return passed("fs.read, then fs.patch parked at waiting-confirmation", reads=tools.count("fs.read"))


def confirm_after_cli_exit(facts: CoderFacts) -> Judgement:
    """V1.1 §5.4: approved from another process after the run's CLI exited, the
    supervisor carried the run on: the patch applied exactly, once."""
    broken = _crashed(facts)
    if broken:
        return broken
    if facts.status_at_cli_exit != "waiting-confirmation":
        return model_failed("nothing waited for confirmation (see read-patch-confirm)")
    if facts.approve_exit != 0:
        return runtime_failed(f"`corral approve` exited {facts.approve_exit}")
    patch = next(a for a in facts.actions if a["tool"] == "fs.patch")
    if patch["phase"] not in ("ok", "failed"):
        return runtime_failed(f"after approval the patch is {patch['phase']}, not finished")
    exact = _patch_input(facts) == {"path": "notes.txt", "old_text": "status: draft", "new_text": "status: final"}
    if facts.notes_after == specs.NOTES_AFTER:
        return passed("approved after the CLI exited; the supervisor applied the patch", patch=patch["phase"])
    if patch["phase"] == "failed" or not exact:
        return model_failed(f"approved and run, but the model's patch was not the asked one ({patch['phase']})")
    return runtime_failed(f"the exact patch ran ok but notes.txt holds {facts.notes_after[:60]!r}")


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
