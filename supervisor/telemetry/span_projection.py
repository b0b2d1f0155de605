"""A finished run tree as spans: a pure function of its ledger rows (tree_rows.py).

Telemetry is a projection of the ledger, not instrumentation through the code:
the rows already hold every start and end, so the spans are computed once, when
the root run is final, and nothing is counted on the hot path. The tree::

    run <agent>                              the root run
    └─ step <loop>                           one loop of the run: its turns and actions
       ├─ chat <model>                       a provider turn (tokens, repair)
       └─ action <tool>                      phases as span events, effect, policy
          ├─ approval wait                   waiting-confirmation -> the decision
          ├─ tool <tool> | mcp <server>/<t>  the call itself (executing -> outcome)
          └─ run <agent>                     a child or delegate this action made

Ids are derived from the run and action ids (SHA-256), so the same tree exported
twice, after a restart or by another supervisor, has the same trace and span ids.

Attributes hold names, ids, counts and classes only, never a tool's arguments or
results, a task, a reply or a reason; every string still goes through the one
redaction path (corral/core/redact.py).
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.core.redact import redact_text
from corral.supervisor.mcp.mcp_spec import split_tool_name
from corral.supervisor.telemetry.tree_rows import ACTION_EVENT_PREFIX, REPAIR_EVENT, TreeRows

AttributeValue = str | int | float | bool
#: An action's effect class (read, idempotent, external), from its row; None: not known.
EffectOf = Callable[[Any], "str | None"]
#: Action phases that end an approval's wait.
DECISIONS = {"approved": "approved", "denied": "denied", "failed": "failed"}


class SpanKind(enum.StrEnum):
    INTERNAL = "internal"
    #: A call out of the supervisor: a model, an MCP server.
    CLIENT = "client"


@dataclass(frozen=True)
class SpanEvent:
    name: str
    at_ns: int
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)


@dataclass(frozen=True)
class SpanRecord:
    """One span, as any exporter can take it (otel_sink.py makes an OpenTelemetry one)."""

    name: str
    trace_id: int
    span_id: int
    parent_id: int | None
    start_ns: int
    end_ns: int
    attributes: Mapping[str, AttributeValue]
    events: tuple[SpanEvent, ...] = ()
    error: bool = False
    kind: SpanKind = SpanKind.INTERNAL


def trace_id_of(root_run_id: str) -> int:
    return _derived(b"corral-trace\x00" + root_run_id.encode(), 16)


def span_id_of(key: str) -> int:
    """``run:<id>``, ``step:<run>:<loop>``, ``turn:<slot>``, ``action:<id>``,
    ``approval:<id>`` or ``tool:<id>``."""
    return _derived(b"corral-span\x00" + key.encode(), 8)


def _derived(seed: bytes, size: int) -> int:
    value = int.from_bytes(hashlib.sha256(seed).digest()[:size], "big")
    return value or 1  # zero is the invalid id


def _ns(at: Any) -> int:
    return int(float(at) * 1e9)


def _attributes(**values: AttributeValue | None) -> dict[str, AttributeValue]:
    """Attribute names are written with ``__`` for ``.``; None is left out and every
    string is redacted."""
    out: dict[str, AttributeValue] = {}
    for key, value in values.items():
        if value is None:
            continue
        out[key.replace("__", ".")] = redact_text(value) if isinstance(value, str) else value
    return out


def project(tree: TreeRows, effect_of: EffectOf) -> list[SpanRecord]:
    """Every span of ``tree``: runs, steps, turns, actions, approvals and calls,
    parents before their children."""
    return _Projection(tree, effect_of).spans()


class _Projection:
    def __init__(self, tree: TreeRows, effect_of: EffectOf) -> None:
        self.tree = tree
        self.effect_of = effect_of
        self.trace_id = trace_id_of(tree.root_run_id)
        self.repair_of_slot: dict[str, str] = {}
        self.phases: dict[str, list[tuple[float, str]]] = {}
        for at, kind, subject, data in tree.events:
            if kind == REPAIR_EVENT:
                found = _json(data)
                if isinstance(found.get("slot"), str) and isinstance(found.get("category"), str):
                    self.repair_of_slot[found["slot"]] = found["category"]
            elif kind.startswith(ACTION_EVENT_PREFIX):
                self.phases.setdefault(subject, []).append((at, kind[len(ACTION_EVENT_PREFIX) :]))
        self.action_ids = {row["action_id"] for row in tree.actions}
        self.out: list[SpanRecord] = []

    def spans(self) -> list[SpanRecord]:
        for run in self.tree.runs:
            self._run(run)
        return self.out

    def _span(self, key: str, name: str, parent: int | None, start: Any, end: Any, **rest: Any) -> int:
        span_id = span_id_of(key)
        start_ns = _ns(start)
        self.out.append(
            SpanRecord(
                name=redact_text(name),
                trace_id=self.trace_id,
                span_id=span_id,
                parent_id=parent,
                start_ns=start_ns,
                end_ns=max(start_ns, _ns(end)),
                **rest,
            )
        )
        return span_id

    def _run(self, run: Any) -> None:
        run_id = run["run_id"]
        spawner = self.tree.spawned_by.get(run_id)
        if spawner in self.action_ids:
            parent: int | None = span_id_of(f"action:{spawner}")
        elif run["parent_run_id"]:
            parent = span_id_of(f"run:{run['parent_run_id']}")
        else:
            parent = None
        repairs = json.loads(run["repairs"] or "{}")
        config = _json(run["provider_config"])
        run_span = self._span(
            f"run:{run_id}",
            f"run {run['agent_id']}",
            parent,
            run["created_at"],
            run["ended_at"] or run["updated_at"],
            attributes=_attributes(
                corral__run__id=run_id,
                corral__run__kind=run["kind"],
                corral__run__status=run["status"],
                corral__run__depth=int(run["depth"]),
                corral__run__loops=int(run["loop_index"]),
                corral__run__repairs=sum(n for n in repairs.values() if isinstance(n, int)),
                corral__agent__id=run["agent_id"],
                corral__parent_run__id=run["parent_run_id"],
                corral__spawned_by__action_id=spawner,
                corral__delegation__id=self.tree.delegation_of.get(run_id),
                gen_ai__system=run["provider"],
                gen_ai__request__model=config.get("model") if isinstance(config.get("model"), str) else None,
            ),
            error=run["status"] != "completed",
        )
        loops: dict[int, tuple[list[Any], list[Any]]] = {}
        for request in self.tree.requests:
            if request["run_id"] == run_id:
                loops.setdefault(int(request["loop_index"]), ([], []))[0].append(request)
        for action in self.tree.actions:
            if action["run_id"] == run_id:
                loops.setdefault(int(action["loop_index"]), ([], []))[1].append(action)
        for loop, (requests, actions) in sorted(loops.items()):
            starts = [r["started_at"] for r in requests] + [a["created_at"] for a in actions]
            ends = [r["finished_at"] or r["started_at"] for r in requests] + [_action_end(a) for a in actions]
            step = self._span(
                f"step:{run_id}:{loop}",
                f"step {loop}",
                run_span,
                min(starts),
                max(ends),
                attributes=_attributes(
                    corral__run__id=run_id,
                    corral__loop_index=loop,
                    corral__step__turns=len(requests),
                    corral__step__actions=len(actions),
                ),
            )
            for request in requests:
                self._turn(step, run, config, request)
            for action in actions:
                self._action(step, action)

    def _turn(self, step: int, run: Any, config: dict[str, Any], request: Any) -> None:
        body = _json(request["response"]) if request["response"] else {}
        usage = _map(body.get("usage"))
        requested = config.get("model") if isinstance(config.get("model"), str) else None
        answered = body.get("model") if isinstance(body.get("model"), str) else None
        model = answered or requested
        timings = _map(body.get("timings"))
        repair = self.repair_of_slot.get(request["slot"])
        self._span(
            f"turn:{request['slot']}",
            f"chat {model}" if model else "chat",
            step,
            request["started_at"],
            request["finished_at"] or request["started_at"],
            attributes=_attributes(
                gen_ai__operation__name="chat",
                gen_ai__system=run["provider"],
                gen_ai__request__model=requested,
                gen_ai__response__model=answered,
                gen_ai__usage__input_tokens=_count(usage.get("prompt_tokens")),
                gen_ai__usage__output_tokens=_count(usage.get("completion_tokens")),
                corral__turn__slot=request["slot"],
                corral__turn__attempt=int(request["attempt"]),
                corral__turn__status=request["status"],
                corral__turn__error_kind=request["error_kind"],
                corral__turn__repair=repair,
                corral__turn__model_ms=_number(timings.get("model_ms")),
            ),
            error=request["status"] not in ("completed",) or repair is not None,
            kind=SpanKind.CLIENT,
        )

    def _action(self, step: int, action: Any) -> None:
        the_id = action["action_id"]
        tool = action["tool"]
        phases = self.phases.get(the_id, [])
        action_span = self._span(
            f"action:{the_id}",
            f"action {tool}",
            step,
            action["created_at"],
            _action_end(action),
            attributes=_attributes(
                corral__action__id=the_id,
                corral__action__phase=action["phase"],
                corral__action__attempts=int(action["attempts"]),
                corral__action__index=int(action["action_index"]),
                corral__tool=tool,
                corral__effect=self.effect_of(action),
                corral__policy=action["policy"],
                gen_ai__tool__name=tool,
            ),
            events=tuple(SpanEvent(phase, _ns(at)) for at, phase in phases),
            error=action["phase"] not in ("ok",),
        )
        waited = next((at for at, phase in phases if phase == "waiting-confirmation"), None)
        if waited is not None:
            decided = next(
                ((at, phase) for at, phase in phases if at >= waited and phase in DECISIONS), None
            )
            self._span(
                f"approval:{the_id}",
                "approval wait",
                action_span,
                waited,
                decided[0] if decided else _action_end(action),
                attributes=_attributes(
                    corral__action__id=the_id,
                    corral__approval__decision=DECISIONS[decided[1]] if decided else "none",
                ),
                error=decided is None or decided[1] != "approved",
            )
        if action["executing_at"] is not None:
            server, name = split_tool_name(tool) or (None, None)
            self._span(
                f"tool:{the_id}",
                f"mcp {server}/{name}" if server else f"tool {tool}",
                action_span,
                action["executing_at"],
                action["finished_at"] or action["updated_at"],
                attributes=_attributes(
                    corral__action__id=the_id,
                    corral__tool=tool,
                    corral__mcp__server=server,
                    corral__mcp__tool=name,
                    rpc__system="mcp" if server else None,
                ),
                error=action["phase"] != "ok",
                kind=SpanKind.CLIENT if server else SpanKind.INTERNAL,
            )


def _action_end(action: Any) -> Any:
    return action["finished_at"] or action["updated_at"] or action["created_at"]


def _json(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

