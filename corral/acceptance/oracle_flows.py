"""The oracle's judgements of the multi-agent flows: the swarm (V1.1 §5.6), verify
and preview (V1.1 §5.5), the transient retries (V1.29, V1.42) and the autonomous
chat (V1.30, V1.31). Pure, like ``oracle``: evidence in, verdict out."""

from __future__ import annotations

from corral.acceptance.chat_flow import ChatFacts
from corral.acceptance.oracle import Judgement, model_failed, passed, runtime_failed
from corral.acceptance.report import Verdict
from corral.acceptance.retry_flow import Backoff, RetryFacts
from corral.acceptance.swarm_flow import SwarmFacts
from corral.acceptance.verify_flow import VerifyFacts


def blocked(reason: str) -> Judgement:
    return Judgement(Verdict.BLOCKED, reason)


def swarm(facts: SwarmFacts) -> Judgement:
    """Two delegates to two specialists and one isolated group (two templates), joined once."""
    if facts.error:
        return runtime_failed(f"the flow broke: {facts.error}")
    counts: dict[str, int | str | bool] = {
        "delegates": facts.delegates, "groups": facts.groups, "children": facts.children, "joins": facts.joins}
    if facts.groups > 1 or facts.joins > facts.groups:
        return runtime_failed(f"{facts.groups} groups and {facts.joins} joins for one request", **counts)
    if facts.final_status == "completed" and facts.replies != 1:
        return runtime_failed(f"a completed run with {facts.replies} replies", **counts)
    if facts.delegate_agents < 2:
        return model_failed(f"the supervisor delegated to {facts.delegate_agents} specialist(s), not 2", **counts)
    if facts.groups != 1 or facts.child_templates < 2:
        return model_failed(f"{facts.groups} isolated group(s) of {facts.child_templates} template(s), not 1 of 2",
                            **counts)
    if facts.joins != 1 or facts.joins_claimed != 1:
        return runtime_failed(f"{facts.joins} join(s), {facts.joins_claimed} claimed: expected exactly one", **counts)
    return passed("two delegates and one isolated group, joined and claimed once", **counts)


def verify_preview(facts: VerifyFacts) -> Judgement:
    if facts.blocked:
        return blocked(f"blocked: {facts.blocked}")
    if facts.error:
        return runtime_failed(f"the flow broke: {facts.error}")
    preview = facts.tools.get("preview.validate")
    verify = facts.tools.get("project.verify")
    shots = len(facts.screenshots)
    if preview is not None and preview[1].startswith("blocked"):
        return blocked(f"preview.validate was blocked ({preview[1]})")
    if preview is None or verify is None:
        missing = [name for name, got in (("preview.validate", preview), ("project.verify", verify)) if got is None]
        return model_failed(f"the model never called {', '.join(missing)}", screenshots=shots)
    if preview[0] != "ok" or verify[0] != "ok":
        return model_failed(f"preview.validate {preview[0]}, project.verify {verify[0]}", screenshots=shots)
    if shots < 2:
        return runtime_failed(f"preview.validate passed with {shots} screenshot(s), not desktop + mobile")
    return passed("project.verify passed; the preview passed on desktop and mobile", screenshots=shots)


def _backoff(name: str, backoff: Backoff | None, facts: RetryFacts) -> Judgement | None:
    if backoff is None:
        return None
    if not backoff.killed_in_backoff:
        return runtime_failed(f"the supervisor was killed only after the {name} retry was due")
    if not backoff.survived:
        return runtime_failed(f"the {name} attempt or its retry_at changed across the supervisor kill")
    retries = facts.retries.get(backoff.slot.split("-transient-")[0], 0)
    if retries != 1:
        return runtime_failed(f"the dropped {name} request was retried {retries} times, not once")
    return None


def retry_plan(facts: RetryFacts) -> Judgement:
    """V1.29: the swarm's first planning call dropped; one retry, survived a kill in its backoff."""
    if facts.blocked:
        return blocked(f"blocked: {facts.blocked}")
    if facts.error:
        return runtime_failed(f"the flow broke: {facts.error}")
    if facts.plan is None:
        return runtime_failed("the dropped planning call scheduled no retry")
    wrong = _backoff("planning", facts.plan, facts)
    if wrong:
        return wrong
    if facts.final_status == "completed" and facts.replies != 1:
        return runtime_failed(f"{facts.replies} final replies")
    if facts.final_status != "completed":
        return model_failed(f"retried once across the kill, but the run ended {facts.final_status}")
    return passed("one retry, its attempt and retry_at kept across a kill in the backoff; one reply",
                  attempt=facts.plan.attempt)


def retry_final(facts: RetryFacts) -> Judgement:
    """V1.42: the supervisor's request after its claims (its final reply) dropped; the same."""
    if facts.blocked:
        return blocked(f"blocked: {facts.blocked}")
    if facts.error:
        return runtime_failed(f"the flow broke: {facts.error}")
    if not facts.claimed:
        return model_failed("the supervisor never claimed a delivery, so no final reply came after claims")
    if facts.final is None:
        return runtime_failed("the dropped request after the claims scheduled no retry")
    wrong = _backoff("final-reply", facts.final, facts)
    if wrong:
        return wrong
    if facts.replies != 1:
        return runtime_failed(f"{facts.replies} final replies, not exactly one")
    return passed("the final reply retried once across a kill in its backoff; exactly one reply",
                  attempt=facts.final.attempt)


def _chat_common(facts: ChatFacts) -> Judgement | None:
    if facts.error:
        return runtime_failed(f"the flow broke: {facts.error}")
    if len(facts.reports) != 1:
        return runtime_failed(f"the chat printed {len(facts.reports)} [turn.report] lines, not one")
    report = facts.reports[0]
    if report.get("outcome") != "settled":
        return runtime_failed(f"the turn report says {report.get('outcome')!r}, not settled")
    if any(n > 1 for n in facts.repairs.values()):
        return runtime_failed(f"a delivery was repaired more than once: {facts.repairs}")
    if facts.final_status == "completed" and (facts.replies != 1 or report.get("new_assistant_messages") != 1):
        return runtime_failed(f"{facts.replies} replies for one turn")
    return None


def chat_autonomous(facts: ChatFacts) -> Judgement:
    """V1.30: a business-only task; the supervisor delegates to two specialists on its
    own, at most one repair per delivery, the host oracle finds both results."""
    broken = _chat_common(facts)
    if broken:
        return broken
    counts: dict[str, int | str | bool] = {"delegates": facts.delegates, "repairs": sum(facts.repairs.values()),
                                           "research_files": facts.artifacts.get("research", 0),
                                           "review_files": facts.artifacts.get("review", 0)}
    if facts.delegate_agents < 2:
        return model_failed(f"the supervisor delegated to {facts.delegate_agents} specialist(s) on its own, not 2",
                            **counts)
    if not all(facts.artifacts.get(scope) for scope in ("research", "review")):
        return model_failed("the host oracle found no result in research/ or review/", **counts)
    if facts.final_status != "completed":
        return model_failed(f"the turn ended {facts.final_status}", **counts)
    return passed("delegated to two specialists on its own; both results on disk; one settled [turn.report]",
                  **counts)


def chat_static_isolated(facts: ChatFacts) -> Judgement:
    """V1.31: the same turn also spawned one isolated group, joined and claimed once."""
    broken = _chat_common(facts)
    if broken:
        return broken
    counts: dict[str, int | str | bool] = {"delegates": facts.delegates, "groups": facts.groups,
                                           "children": facts.children, "joins_claimed": facts.joins_claimed}
    if facts.groups > 1 or facts.joins_claimed > facts.groups:
        return runtime_failed(f"{facts.groups} groups, {facts.joins_claimed} joins claimed", **counts)
    if facts.delegate_agents < 2 or facts.groups != 1:
        return model_failed(f"{facts.delegate_agents} specialist(s) and {facts.groups} isolated group(s), not 2 and 1",
                            **counts)
    if facts.joins_claimed != 1:
        return model_failed("the isolated group's join was never claimed", **counts)
    return passed("two static delegates and one isolated group in one turn, joined once", **counts)
