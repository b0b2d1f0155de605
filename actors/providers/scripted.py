"""The scripted provider: a deterministic list of plans, one per loop step.

Used by the demo, the tests, chaos and the benchmarks. A script is TOML or JSON::

    [[steps]]
    actions = [{ tool = "fs.write", input = { path = "a.md", content = "hi" } }]
    [[steps]]
    final = "done"

A step may instead carry ``raw = "..."``: text returned verbatim, to test corrupt
or truncated provider output. Steps can also be chosen by what the run has seen:
``when_observed = "needs-repair"`` picks a step only if some observation contains
that text (used by the demo to issue exactly one repair); ``when_task`` and
``unless_task`` pick by the run's task text (a specialist's repair runs).
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

from corral.actors.providers.base import (
    Plan,
    PlanError,
    ProviderRequest,
    ProviderResponse,
    RepairCategory,
    ToolCall,
    ToolSchema,
    history_digest,
)
from corral.actors.providers.plan_parse import checked_plan_update
from corral.core import nesting


class ScriptError(ValueError):
    pass


def load_script(path: Path) -> dict[str, Any]:
    from corral.supervisor.spec.bounded_files import FileReadError, read_text_bounded

    try:
        text = read_text_bounded(path, "script")
    except FileReadError as exc:
        raise ScriptError(str(exc)) from None
    try:
        return parse_script_text(text, path.suffix)
    except ScriptError as exc:
        raise ScriptError(f"{path}: {exc}") from None


#: What a scripted step may say: its plan (``actions``, ``final``, or ``raw`` text),
#: and when it applies.
STEP_KEYS = frozenset(
    {"actions", "final", "planUpdate", "raw", "when_observed", "unless_observed", "when_task", "unless_task"}
)
#: Arrays and tables nest at most this deep in a script, checked before the parser
#: runs: both parsers recurse once per level, and a script nested 100,000 deep made
#: ``corral up`` die with a RecursionError traceback (issue 48).
MAX_SCRIPT_DEPTH = 64


def parse_script_text(text: str, suffix: str = ".toml") -> dict[str, Any]:
    try:
        if suffix == ".json":
            nesting.check_json(text, MAX_SCRIPT_DEPTH)
            data: dict[str, Any] = json.loads(text)
        else:
            nesting.check_toml(text, MAX_SCRIPT_DEPTH)
            data = tomllib.loads(text)
    except nesting.TooDeep as exc:
        raise ScriptError(f"script arrays or tables {exc}") from None
    except RecursionError:  # the depth check above should make this unreachable
        raise ScriptError("script is nested too deeply to parse") from None
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ScriptError(f"script is not valid {suffix.lstrip('.') or 'toml'}: {exc}") from None
    if not isinstance(data, dict):
        raise ScriptError("script must be a table (a JSON object)")
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps:
        raise ScriptError("script needs a non-empty [[steps]] list")
    for index, step in enumerate(steps):
        if not isinstance(step, dict):
            raise ScriptError(f"steps[{index}]: must be a table")
        unknown = set(step) - STEP_KEYS
        if unknown:
            # A misspelled condition would otherwise make the step apply always.
            raise ScriptError(f"steps[{index}]: unknown keys {sorted(unknown)} (known: {', '.join(sorted(STEP_KEYS))})")
    return data


class ScriptedProvider:
    name = "scripted"
    #: Re-issuing a request has no effect anywhere, so an interrupted one may be retried.
    idempotent_requests = True

    def __init__(self, script: dict[str, Any]) -> None:
        self.steps: list[dict[str, Any]] = list(script["steps"])
        self.reads_history = any("when_observed" in step or "unless_observed" in step for step in self.steps)
        reads_task = any("when_task" in step or "unless_task" in step for step in self.steps)
        #: The steps that apply to a task, in order, when no step reads the history:
        #: a turn then finds its step by index, not by a walk from the script's start
        #: (that walk grew with the loop: a quarter of a 400-loop agent's CPU).
        self._by_task: dict[str, list[dict[str, Any]]] = {}
        self._unconditional = not reads_task and not self.reads_history

    def _step_for(self, request: ProviderRequest) -> dict[str, Any] | None:
        if self._unconditional:
            return self.steps[request.loop_index] if 0 <= request.loop_index < len(self.steps) else None
        if not self.reads_history:
            applying = self._by_task.get(request.task)
            if applying is None:
                if len(self._by_task) >= TASKS_KEPT:
                    self._by_task.clear()  # a bound, not a policy: an agent sees a few tasks
                applying = self._by_task[request.task] = [
                    step for step in self.steps if _task_applies(step, request.task)
                ]
            return applying[request.loop_index] if 0 <= request.loop_index < len(applying) else None
        return self._walk(request)

    def _walk(self, request: ProviderRequest) -> dict[str, Any] | None:
        # Conditional steps are consumed by position like any other; a step whose
        # condition does not hold is skipped, which keeps the script deterministic
        # given the same observations.
        # Only conditions read the history, whose text grows every turn.
        seen = json.dumps(list(request.history))
        index = 0
        loop = 0
        while index < len(self.steps):
            step = self.steps[index]
            condition = step.get("when_observed")
            unless = step.get("unless_observed")
            applies = (
                (condition is None or condition in seen)
                and (unless is None or unless not in seen)
                and _task_applies(step, request.task)
            )
            if applies:
                if loop == request.loop_index:
                    return step
                loop += 1
            index += 1
        return None

    async def complete(self, request: ProviderRequest) -> ProviderResponse:
        step = self._step_for(request)
        if step is None:
            return ProviderResponse(json.dumps({"final": None, "exhausted": True}), {"scripted": True})
        if "raw" in step:
            return ProviderResponse(str(step["raw"]), {"scripted": True})
        body = {k: v for k, v in step.items() if k in ("actions", "final", "planUpdate")}
        return ProviderResponse(json.dumps(_substitute(body, request)), {"scripted": True})

    def prompt_text(self, request: ProviderRequest) -> str:
        """What stands for a system prompt in the run's transcript: a script reads none."""
        steps = len(self.steps)
        framing = f"(scripted provider for agent {request.agent_id}: it answers from its script of {steps} steps)"
        # The agent's instructions lead, as a model's prompt would show them.
        return f"{request.instructions}\n\n{framing}" if request.instructions else framing

    def parse(self, response: ProviderResponse, tools: tuple[ToolSchema, ...]) -> Plan:
        return parse_plan_json(response.text, tools)

    async def summarize(self, entries: tuple[dict[str, Any], ...]) -> str:
        """A deterministic summary (a script has no model to write one)."""
        return f"[scripted summary of {len(entries)} earlier entries] " + history_digest(list(entries), 600)


#: Tasks whose applying steps a provider keeps (one agent's runs).
TASKS_KEPT = 64


def _task_applies(step: dict[str, Any], task: str) -> bool:
    """Whether the step's task conditions (``when_task``, ``unless_task``) hold."""
    task_has = step.get("when_task")
    task_lacks = step.get("unless_task")
    return (task_has is None or task_has in task) and (task_lacks is None or task_lacks not in task)


_PLACEHOLDER = re.compile(r"\$\{([a-z0-9_-]+)[.:]([a-z0-9_]+)\}")


def _substitute(value: Any, request: ProviderRequest) -> Any:
    """Fill ``${artifact:N}`` (the N-th expected artifact named in the task) and
    ``${STATUS.FIELD}`` (FIELD of the latest observed item whose status is STATUS),
    so a static script can refer to ids that only exist at run time."""
    if isinstance(value, dict):
        return {key: _substitute(item, request) for key, item in value.items()}
    if isinstance(value, list):
        return [_substitute(item, request) for item in value]
    if not isinstance(value, str):
        return value
    return _PLACEHOLDER.sub(lambda match: _lookup(match.group(1), match.group(2), request), value)


def _lookup(scope: str, key: str, request: ProviderRequest) -> str:
    if scope == "artifact":
        for line in request.task.splitlines():
            if line.startswith("Expected artifacts: "):
                names = [name.strip() for name in line.split(":", 1)[1].split(",")]
                index = int(key)
                return names[index] if index < len(names) else ""
        return ""
    found = ""

    def walk(node: Any) -> None:
        nonlocal found
        if isinstance(node, dict):
            if node.get("status") == scope and isinstance(node.get(key), str):
                found = node[key]
            for item in node.values():
                walk(item)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(list(request.history))
    return found


def parse_plan_json(text: str, tools: tuple[ToolSchema, ...]) -> Plan:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        # A broken JSON plan is a JSON error; prose is not a plan at all (as plan_parse.py).
        category = RepairCategory.ARGUMENTS_JSON if text.lstrip().startswith("{") else RepairCategory.RESPONSE_SHAPE
        raise PlanError(category, f"plan is not JSON ({exc.msg} at {exc.pos})") from None
    if not isinstance(data, dict):
        raise PlanError(RepairCategory.RESPONSE_SHAPE, "plan is not a JSON object")
    if data.get("exhausted"):
        raise PlanError(RepairCategory.RESPONSE_SHAPE, "the script has no step for this loop")
    known = {tool.name for tool in tools}
    update = checked_plan_update(data.get("planUpdate"))  # seed 004 V1.17: beside the actions, or alone
    final = data.get("final")
    actions = data.get("actions") or []
    if isinstance(final, dict):
        # A table: an agent's typed output, as its JSON (the lane checks it against the schema).
        final = json.dumps(final, ensure_ascii=False)
    if final is not None and not isinstance(final, str):
        raise PlanError(RepairCategory.RESPONSE_SHAPE, "final must be a string (or a table: a typed output)")
    if not isinstance(actions, list):
        raise PlanError(RepairCategory.RESPONSE_SHAPE, "actions must be a list")
    calls = []
    for index, action in enumerate(actions):
        if not isinstance(action, dict) or not isinstance(action.get("tool"), str):
            raise PlanError(RepairCategory.CALL_IDENTITY, f"action {index} needs a tool name")
        if action["tool"] not in known:
            raise PlanError(RepairCategory.UNKNOWN_FUNCTION, f"unknown tool {action['tool'][:60]!r}")
        tool_input = action.get("input", {})
        if not isinstance(tool_input, dict):
            raise PlanError(RepairCategory.ARGUMENTS_SCHEMA, f"action {index}: input must be an object")
        calls.append(ToolCall(action["tool"], tool_input))
    return Plan(tuple(calls), final, plan_update=update)
