"""The guard's decisions and completion evidence, in the reference guard's terms.

Rules are the entries of ``authorization`` and ``must_and_must_not.must_not``:

* ``action:<tag>`` matches an action carrying the tag (supervisor/intent/intent_classify.py);
  ``action:write`` also means ``write_workspace``, ``action:external`` also
  ``external_side_effect``, ``publish`` and ``network``, ``action:destructive``
  also ``delete``;
* ``tool:<name>`` matches the tool's name (``tool:fs.write``, ``tool:mcp.git.git_log``);
* ``command-prefix:<text>`` matches a command line that starts with the text;
* anything else is a plain-language constraint: never a block, but a high-risk
  action under one gets a ``remind``.

The kind and the text are matched without regard to case. The first
``forbidden`` or ``must_not`` match blocks; then a ``requires_user`` match asks;
then a high-risk action under a plain-language constraint gets a ``remind`` (an
allowance does not silence it); then an ``allowed`` match continues as an
explicit allowance. ``allowed`` is not
an allow-list: an unlisted action continues. A run without a valid contract is
advisory: high-risk actions get a ``remind``, nothing is blocked. Path scopes
(supervisor/intent/intent_scope.py) come first: a path the contract excludes, a write
outside its include paths, a path the file tools refuse, or a tool the scope
cannot judge is a ``block``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from corral.supervisor.intent.intent_classify import Action
from corral.supervisor.intent.intent_scope import PathVerdict
from corral.supervisor.intent.intent_shell import JS_SPACE, js_trim

_LINE_END = "\n\r\u2028\u2029"
_STRUCTURED = re.compile(rf"(action|tool|command-prefix):([^{_LINE_END}]+)", re.IGNORECASE | re.ASCII)
_ALIASES = {
    "write": ("write_workspace",),
    "external": ("external_side_effect", "publish", "network"),
    "destructive": ("destructive", "delete"),
}


def sha16(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Rule:
    raw: str
    kind: str = ""  # "" for a plain-language constraint
    value: str = ""

    @property
    def structured(self) -> bool:
        return bool(self.kind)


def parse_rule(entry: Any) -> Rule:
    raw = js_trim(str(entry if entry is not None else ""))
    match = _STRUCTURED.fullmatch(raw)
    if match is None:
        return Rule(raw)
    return Rule(raw, match.group(1).lower(), js_trim(match.group(2)).lower())


def matches(rule: Rule, action: Action) -> bool:
    if not rule.value:
        return False
    if rule.kind == "action":
        return any(tag in action.tags for tag in _ALIASES.get(rule.value, (rule.value,)))
    if rule.kind == "tool":
        return action.tool.lower() == rule.value
    if rule.kind == "command-prefix":
        return js_trim(action.command).lower().startswith(rule.value)
    return False


def rule_id(bucket: str, rule: Rule) -> str:
    return f"{bucket}:{sha16(rule.raw)}"


@dataclass(frozen=True)
class Decision:
    """A decision in the receipt's terms (docs/intent.md lists every value)."""

    decision: str = "continue"  # continue | remind | ask | block
    authority: str = "deterministic_rule"
    severity: str = "low"
    reason_codes: tuple[str, ...] = ("no_material_conflict",)
    rule_ids: tuple[str, ...] = ()
    visibility: str = "silent"
    reversible: bool = True
    coverage: str = "observed"
    unlock: str | None = None
    #: Corral's own words for the person and the model (not part of the receipt).
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def decide(projection: dict[str, Any] | None, action: Action) -> Decision:
    """The reference guard's decision (its "balanced" mode) for a bound contract's
    projection, or for an unbound run (``None``)."""
    if projection is None:
        if not action.high_risk:
            return Decision(reason_codes=("contract_unbound",), coverage="partial", reversible=action.reversible)
        return Decision(
            "remind", "semantic_candidate", "medium", ("contract_unbound", "high_risk_action_uncovered"),
            visibility="model", coverage="partial", reversible=action.reversible,
            unlock="No valid intent contract is bound; bind one before relying on the guard.",
            detail=f"{action.tool} is a high-risk action ({', '.join(action.tags)}) and no valid contract is bound",
        )
    authorization = projection.get("authorization") or {}
    musts = projection.get("must_and_must_not") or {}
    conflicts = [("forbidden", parse_rule(e)) for e in authorization.get("forbidden") or []]
    conflicts += [("must_not", parse_rule(e)) for e in musts.get("must_not") or []]
    for bucket, rule in conflicts:
        if matches(rule, action):
            return Decision(
                "block", "deterministic_rule", "high", ("explicit_contract_conflict",), (rule_id(bucket, rule),),
                "user", action.reversible,
                unlock=f"Change the contract, or choose an action its {rule.kind} rule does not match.",
                detail=f"{action.tool} matches the contract's {bucket} rule {rule.raw!r}",
            )
    for entry in authorization.get("requires_user") or []:
        rule = parse_rule(entry)
        if matches(rule, action):
            return Decision(
                "ask", "deterministic_rule", "medium", ("explicit_user_authorization_required",),
                (rule_id("requires_user", rule),), "user", action.reversible,
                unlock="Approve or deny this one action; a later similar action asks again until the contract's"
                       " owner publishes a version that allows it.",
                detail=f"{action.tool} needs the user's approval under the contract's rule {rule.raw!r}",
            )
    unstructured = [
        entry for entry in (*(authorization.get("forbidden") or []), *(authorization.get("requires_user") or []),
                            *(musts.get("must_not") or []))
        if not parse_rule(entry).structured
    ]
    if action.high_risk and unstructured:
        return Decision(
            "remind", "semantic_candidate", "medium", ("semantic_constraint_candidate", "no_deterministic_match"),
            visibility="model", reversible=action.reversible,
            unlock="Compare this action with the contract's plain-language constraints.",
            detail=f"{action.tool} is high-risk ({', '.join(action.tags)}); the contract has plain-language"
                   f" constraints to weigh: {'; '.join(str(e) for e in unstructured)[:300]}",
        )
    if any(matches(parse_rule(entry), action) for entry in authorization.get("allowed") or []):
        return Decision(reason_codes=("explicit_contract_allowance",), reversible=action.reversible)
    return Decision(reversible=action.reversible)


def with_paths(decision: Decision, verdicts: Sequence[PathVerdict] | None, action: Action) -> Decision:
    """A path scope first: the first refused, excluded or out-of-scope path blocks;
    an action a scoped contract cannot judge blocks; judged paths are named."""
    if verdicts is None:
        return Decision(
            "block", "deterministic_rule", "high", ("scope_unjudgeable",), (), "user", action.reversible,
            unlock="The contract limits paths and this tool's paths cannot be judged before it runs; use the file"
                   " tools, or change the contract.",
            detail=f"{action.tool}: the contract's path scope cannot judge this tool, so it is blocked",
        )
    for verdict in verdicts:
        if not verdict.ok:
            rules = (verdict.rule.rule_id,) if verdict.rule is not None else ()
            return Decision(
                "block", "deterministic_rule", "high", (verdict.code,), rules, "user", action.reversible,
                unlock=verdict.detail[:500], detail=verdict.detail,
            )
    if not verdicts or decision.decision == "block":
        return decision
    codes = decision.reason_codes if "path_in_scope" in decision.reason_codes else (*decision.reason_codes,
                                                                                   "path_in_scope")
    return replace(decision, reason_codes=codes)


# -- completion evidence --------------------------------------------------------------------

_S = "[" + re.escape("".join(sorted(JS_SPACE))) + "]"
_NOT_A_RUN = re.compile(
    rf"(?:^|{_S})(?:--help|-h|--version|--collect-only|--co|-list|--list|--list-tests|--if-present|--no-run)"
    rf"(?:=|{_S}|\Z)", re.IGNORECASE | re.ASCII,
)
_TEST_RUN = re.compile(
    rf"{_S}*(?:node{_S}+--test|npm{_S}+(?:run{_S}+)?test|pnpm{_S}+(?:run{_S}+)?test|yarn{_S}+(?:run{_S}+)?test"
    rf"|pytest|cargo{_S}+test|go{_S}+test|dotnet{_S}+test)(?:{_S}+[^;&|<>`$(){{}}\r\n]*)?{_S}*\Z",
    re.IGNORECASE | re.ASCII,
)
_STRUCTURED_EVIDENCE = re.compile(r"evidence:([a-z_]+)(?::action:([a-z_]+))?")


def is_test_run(command: str) -> bool:
    """A command line that runs a test suite directly (not ``--help``, a listing, a dry run)."""
    text = command.lower()
    return not _NOT_A_RUN.search(text) and _TEST_RUN.match(text) is not None


@dataclass(frozen=True)
class Evidence:
    ref: str  # the action id
    kinds: frozenset[str]
    passed: bool
    tags: tuple[str, ...] = ()


def requirement_ref(index: int, requirement: str) -> str:
    """A requirement's stable id (the reference guard's form)."""
    return f"requirement:{index}:{sha16(requirement)}"


def missing_evidence(projection: dict[str, Any], evidence: Sequence[Evidence]) -> tuple[list[tuple[int, str]],
                                                                                        list[str]]:
    """(unmet requirements as (index, text), the evidence refs used). Each item
    takes its own reference; among the ones it accepts, the latest decides, so a
    test run that failed after one that passed leaves its requirement unmet. An
    ``evidence:<kind>[:action:<tag>]`` requirement takes only that kind (one of its
    acceptable sources) from an action with that tag."""
    used: list[str] = []
    missing: list[tuple[int, str]] = []
    for index, item in enumerate(projection.get("completion_evidence") or []):
        requirement = str(item.get("requirement", ""))
        wanted = set(item.get("acceptable_sources") or [])
        tag = None
        structured = _STRUCTURED_EVIDENCE.fullmatch(js_trim(requirement).lower())
        if structured is not None:
            wanted &= {structured.group(1)}
            tag = structured.group(2)
        candidates = [e for e in evidence if e.ref not in used and e.kinds & wanted and (tag is None or tag in e.tags)]
        if candidates and candidates[-1].passed:
            used.append(candidates[-1].ref)
        else:
            missing.append((index, requirement))
    return missing, used
