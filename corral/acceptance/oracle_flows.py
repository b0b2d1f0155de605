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
    """V1.1 §5.6: two delegates to two specialists and one isolated group of three
    children, two of one template and one of another, really in parallel (their
    provider requests in flight at one instant), joined once."""
    if facts.error:
        return runtime_failed(f"the flow broke: {facts.error}")
    shape = sorted(facts.templates.values(), reverse=True)
    counts: dict[str, int | str | bool] = {
        "delegates": facts.delegates, "groups": facts.groups, "children": facts.children,
        "child_templates": facts.child_templates, "largest_template": shape[0] if shape else 0,
        "children_overlap": facts.children_overlap, "delegates_overlap": facts.delegates_overlap,
        "joins": facts.joins, "joins_claimed": facts.joins_claimed}
    if facts.groups > 1 or facts.joins > facts.groups:
        return runtime_failed(f"{facts.groups} groups and {facts.joins} joins for one request", **counts)
    if facts.final_status == "completed" and facts.replies != 1:
        return runtime_failed(f"a completed run with {facts.replies} replies", **counts)
    if facts.delegate_agents < 2:
        return model_failed(f"the supervisor delegated to {facts.delegate_agents} specialist(s), not 2", **counts)
    if facts.groups != 1 or shape != [2, 1]:
        return model_failed(f"{facts.groups} isolated group(s) of template instances {shape or []}, not one group"
                            " of 2 of one template and 1 of another", **counts)
    if facts.children_overlap < 3:
        return runtime_failed(f"the three children never ran at once: children_overlap = {facts.children_overlap}"
                              " (most children with a provider request in flight at one instant), not 3", **counts)
    if facts.joins != 1 or facts.joins_claimed != 1:
        return runtime_failed(f"{facts.joins} join(s), {facts.joins_claimed} claimed: expected exactly one", **counts)
    return passed("two delegates; three children (2 + 1 of two templates) in flight at once; joined and claimed"
                  " once", **counts)


def verify_preview(facts: VerifyFacts) -> Judgement:
    """V1.1 §5.5: a change, then project.verify passed on the changed revision, and
    preview.validate passed with desktop and mobile evidence."""
    if facts.blocked:
        return blocked(f"blocked: {facts.blocked}")
    if facts.error:
        return runtime_failed(f"the flow broke: {facts.error}")
    preview = facts.tools.get("preview.validate")
    verify = facts.tools.get("project.verify")
    counts: dict[str, int | str | bool] = {"screenshots": len(facts.screenshots),
                                           "changed_before_verify": facts.changed_before_verify,
                                           "verified_revision": facts.verified_revision}
    if preview is not None and preview[1].startswith("blocked"):
        return blocked(f"preview.validate was blocked ({preview[1]})")
    if preview is None or verify is None:
        missing = [name for name, got in (("preview.validate", preview), ("project.verify", verify)) if got is None]
        return model_failed(f"the model never called {', '.join(missing)}", **counts)
    if preview[0] != "ok" or verify[0] != "ok":
        return model_failed(f"preview.validate {preview[0]}, project.verify {verify[0]}", **counts)
    if facts.changed_before_verify < 1:
        return model_failed("project.verify passed, but the model changed nothing before it"
                            " (changed_before_verify = 0)", **counts)
    if facts.verified_revision < 1:
        return runtime_failed(f"{facts.changed_before_verify} change(s) ran ok before project.verify, yet it"
                              " verified revision 0", **counts)
    if len(facts.screenshots) < 2:
        return runtime_failed(f"preview.validate passed with {len(facts.screenshots)} screenshot(s), not desktop"
                              " + mobile", **counts)
    return passed(f"changed, then project.verify passed at revision {facts.verified_revision}; the preview passed"
                  " on desktop and mobile", **counts)


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


def _plan_counts(facts: RetryFacts) -> dict[str, int | str | bool]:
    return {"first_victim_specialist": facts.first_victim_specialist, "gate_held": facts.gate_held,
            "gate_checked": facts.gate_checked, "gate_drift": facts.gate_drift, "specialists": facts.specialists,
            "specialists_same_batch": facts.specialists_same_batch, "specialists_overlap": facts.specialists_overlap,
            "repairs": facts.repairs, "retries": sum(facts.retries.values()), "replies": facts.replies,
            "proxy_posts": facts.proxy_posts, "lifecycles": facts.lifecycles,
            "deliveries_claimed": facts.deliveries_claimed, "claims": facts.claims,
            "contract_reads": facts.contract_reads}


def retry_plan(facts: RetryFacts) -> Judgement:
    """V1.29: a specialist's first call dropped; one retry, which survived a kill in
    its backoff and waited at a forwarding gate until the ledger was read (nothing of
    the victim's yet); then two specialists in one batch, overlapping, and one repair."""
    if facts.blocked:
        return blocked(f"blocked: {facts.blocked}")
    if facts.error:
        return runtime_failed(f"the flow broke: {facts.error}")
    counts = _plan_counts(facts)
    if facts.plan is None:
        if facts.specialists == 0:
            return model_failed("the supervisor delegated to no specialist, so no specialist's call came to drop",
                                **counts)
        return runtime_failed("the dropped specialist call scheduled no retry", **counts)
    if not facts.first_victim_specialist:
        return runtime_failed(f"the dropped first call was not a specialist's (run {facts.first_victim_run or '?'})",
                              **counts)
    wrong = _backoff("specialist's", facts.plan, facts)
    if wrong:
        return Judgement(wrong.verdict, wrong.reason, counts)
    if not (facts.gate_held and facts.gate_checked):
        return runtime_failed("the retry went on without a forwarding gate that read the ledger first", **counts)
    if facts.gate_drift:
        return runtime_failed(f"at the forwarding gate the ledger held {facts.gate_drift} fact(s) of a call that"
                              " never reached the model (actions, receipts, revisions, deliveries, replies,"
                              " upstream forwards must all be 0)", **counts)
    if facts.proxy_posts > facts.lifecycles:
        return runtime_failed(f"the proxy saw {facts.proxy_posts} requests for {facts.lifecycles} provider"
                              " lifecycles: a request went out with no durable record", **counts)
    if facts.final_status == "completed" and facts.replies != 1:
        return runtime_failed(f"{facts.replies} final replies", **counts)
    if facts.specialists < 2:
        return model_failed(f"the supervisor delegated to {facts.specialists} specialist(s), not 2", **counts)
    if facts.specialists_overlap < 2:
        if facts.specialists_same_batch:
            return runtime_failed("two specialists delegated in one batch never overlapped in time"
                                  f" (specialists_overlap = {facts.specialists_overlap})", **counts)
        return model_failed("the two specialists were delegated in different turns and did not overlap", **counts)
    if facts.repairs != 1:
        return model_failed(f"{facts.repairs} repair(s) of a delivery, not exactly one", **counts)
    if facts.contract_reads < 1:
        return model_failed("the supervisor repaired without a targeted contract read"
                            " (agent.run_status with a delegation_id)", **counts)
    if facts.deliveries_claimed < 3 or facts.claims < 2:
        return model_failed(f"{facts.deliveries_claimed} deliveries claimed in {facts.claims} claim(s): the seed"
                            " wants 2 initial + 1 repair in two claims", **counts)
    if facts.final_status != "completed":
        return model_failed(f"retried once across the kill, but the run ended {facts.final_status}", **counts)
    return passed("a specialist's call dropped; its retry kept across a kill and held at the gate until the ledger"
                  " was read; two specialists overlapped; one repair; one reply", attempt=facts.plan.attempt, **counts)


def _final_counts(facts: RetryFacts) -> dict[str, int | str | bool]:
    return {"final_victim_root": facts.final_victim_root, "final_victim_base": facts.final_victim_base,
            "final_victim_loop": facts.final_victim_loop, "reply_loop": facts.reply_loop,
            "claimed_at_injection": facts.claimed_at_injection,
            "repairs_claimed_at_injection": facts.repairs_claimed_at_injection,
            "replies_at_injection": facts.replies_at_injection, "host_marker": facts.host_marker,
            "host_refusals": facts.host_refusals, "tool_plans_at_injection": facts.tool_plans_at_injection,
            "tool_plans_at_end": facts.tool_plans_at_end, "replies": facts.replies}


def retry_final(facts: RetryFacts) -> Judgement:
    """V1.42: exactly the root's base final reply dropped, after 2 initial + 1 repair
    deliveries were claimed and the host's own check passed; one retry across a kill
    in its backoff, no tool plan added, exactly one reply."""
    if facts.blocked:
        return blocked(f"blocked: {facts.blocked}")
    if facts.error:
        return runtime_failed(f"the flow broke: {facts.error}")
    counts = _final_counts(facts)
    if facts.final is None:
        if not facts.claimed:
            return model_failed("the supervisor never claimed a delivery, so no final reply came after claims",
                                **counts)
        if facts.final_victim_loop >= 0:
            return runtime_failed("the dropped final reply scheduled no retry", **counts)
        if facts.host_refusals:
            return model_failed(f"the host's check failed {facts.host_refusals} time(s) when a final reply was due:"
                                " the specialists' files are not there, so no final reply was dropped", **counts)
        return model_failed("the supervisor never asked for a final reply with every delivery claimed", **counts)
    if not facts.host_marker:
        return runtime_failed("the final reply was dropped without the trusted host check passing first", **counts)
    if not (facts.final_victim_root and facts.final_victim_base):
        return runtime_failed("the dropped request is not the root's base final reply (a successor or another"
                              " run's)", **counts)
    if facts.final_victim_loop != facts.reply_loop:
        return model_failed(f"the dropped request was not the base final reply: the model planned a tool call at"
                            f" loop {facts.final_victim_loop} and replied at loop {facts.reply_loop}", **counts)
    if facts.replies_at_injection:
        return runtime_failed("a reply existed before the final reply was dropped", **counts)
    if facts.claimed_at_injection < 3 or facts.repairs_claimed_at_injection < 1:
        return model_failed(f"before the final reply {facts.claimed_at_injection} deliveries were claimed"
                            f" ({facts.repairs_claimed_at_injection} repair): the seed wants 2 initial + 1 repair",
                            **counts)
    wrong = _backoff("final-reply", facts.final, facts)
    if wrong:
        return Judgement(wrong.verdict, wrong.reason, counts)
    if facts.tool_plans_at_end != facts.tool_plans_at_injection:
        return runtime_failed(f"the root's tool plans went from {facts.tool_plans_at_injection} to"
                              f" {facts.tool_plans_at_end} across the drop", **counts)
    if facts.replies != 1:
        return runtime_failed(f"{facts.replies} final replies, not exactly one", **counts)
    return passed("exactly the base final reply dropped after 2 + 1 claimed deliveries and the host's check; one"
                  " retry across a kill in its backoff; tool plans unchanged; one reply", attempt=facts.final.attempt,
                  **counts)


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
    """V1.31: the same turn's first collaborating batch is 2 delegates + 1 spawn that
    stops for one approval at its action 0 before any side effect; the two static
    specialists overlap, and a static one overlaps an isolated child; the group is
    joined and claimed once; one repair, at whose approval the supervisor is killed
    and restarted with the ledger's identities unchanged."""
    broken = _chat_common(facts)
    if broken:
        return broken
    counts: dict[str, int | str | bool] = {
        "delegates": facts.delegates, "groups": facts.groups, "children": facts.children,
        "joins_claimed": facts.joins_claimed, "batch_delegates": facts.batch_delegates,
        "batch_spawns": facts.batch_spawns, "batch_parked_first": facts.batch_parked_first,
        "batch_approvals": facts.batch_approvals, "static_overlap": facts.static_overlap,
        "mixed_overlap": facts.mixed_overlap, "repairs": sum(facts.repairs.values()),
        "killed_at_repair": facts.killed_at_repair, "identity_stable": facts.identity_stable, "boots": facts.boots}
    if facts.groups > 1 or facts.joins_claimed > facts.groups:
        return runtime_failed(f"{facts.groups} groups, {facts.joins_claimed} joins claimed", **counts)
    if facts.batch_delegates < 2 or facts.batch_spawns != 1 or facts.delegate_agents < 2:
        return model_failed(f"the first batch held {facts.batch_delegates} delegate(s) and {facts.batch_spawns}"
                            f" spawn(s) ({facts.delegate_agents} specialist(s) in all), not 2 + 1", **counts)
    if not facts.batch_parked_first:
        return runtime_failed("the first batch did not stop for approval at its action index 0 before any of it"
                              " executed", **counts)
    if facts.batch_approvals != 1:
        return runtime_failed(f"the first batch took {facts.batch_approvals} approvals, not one for the batch",
                              **counts)
    if facts.static_overlap < 2 or not facts.mixed_overlap:
        return runtime_failed(f"no real overlap in time: static_overlap = {facts.static_overlap}, static with"
                              f" isolated = {facts.mixed_overlap}", **counts)
    if facts.joins_claimed != 1:
        return model_failed("the isolated group's join was never claimed", **counts)
    if not facts.repairs:
        return model_failed("the supervisor sent no delivery back for a repair", **counts)
    if not facts.killed_at_repair:
        return runtime_failed("a repair came, but the supervisor was not killed at its approval", **counts)
    if not facts.identity_stable:
        return runtime_failed("after the restart the deliveries, groups, waiting action or provider requests"
                              " differed", **counts)
    if facts.final_status != "completed":
        return model_failed(f"the turn ended {facts.final_status}", **counts)
    return passed("one approval for a 2 + 1 first batch; static and mixed overlap; joined once; a repair killed"
                  " at its approval and resumed unchanged; one report", **counts)
