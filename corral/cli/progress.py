"""The live status line of a run on a terminal (``corral run --wait``, ``corral demo``).

Three parts, each with one job:

- ``reduce``: a pure reducer from the event stream (``corral events``) to a
  ``RunProgress``: the run's state, its step and tool, the tokens its model has
  generated so far and their rate, its children's states. Rates come from the
  events' own timestamps, never from the clock, so a recorded sequence always
  reduces to the same view.
- ``status_line`` / ``render``: what a person sees (plain text, and rich).
- ``watch_run``: follows the supervisor (events, the in-memory provider progress
  reports, and ``show`` when children appear) until the run ends or parks.

The provider's progress (tokens while a model generates) is not in the ledger:
the supervisor keeps the newest report of each run in memory and answers
``progress`` (supervisor/interactive/interactive_service.py). It enters the
reducer as a ``provider-progress`` event stamped with the time the supervisor
received it.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text

from corral.client import Client
from corral.client_types import DONE, PARKED, Event, RunResult
from corral.core.errors import RunTimeout
from corral.core.redact import redact_text
from corral.mailbox.control import ControlError
from corral.supervisor.runs.run_state import RunStatus

#: The states a ``run-<state>`` event names (the run state machine's own enum).
RUN_STATES = frozenset(status.value for status in RunStatus)
#: The kind of the pseudo-event a provider progress report becomes.
PROGRESS_KIND = "provider-progress"
#: How much of the streamed reply, and of the model's text, a view keeps.
TEXT_CHARS = 400
#: Events that give the run new children (``show`` then names them).
CHILD_KINDS = frozenset({"delegated", "group-spawned"})
#: How long one events poll waits for news: the progress reports are asked this often.
POLL_MS = 500
#: At most this many runs in one ``progress`` question (the supervisor's bound).
MAX_PROGRESS_RUNS = 100
#: Even with no event about it, the run's state is asked this often (a safety net).
RECHECK_S = 10.0


@dataclass(frozen=True)
class Generation:
    """One provider lifecycle of the run: what its model generated so far."""

    slot: str
    tokens: int = 0
    #: The first and newest progress report (supervisor time): the rate's span.
    first_at: float | None = None
    first_tokens: int = 0
    at: float | None = None
    done: bool = False

    @property
    def tokens_per_s(self) -> float | None:
        if self.first_at is None or self.at is None or self.at <= self.first_at:
            return None
        return (self.tokens - self.first_tokens) / (self.at - self.first_at)


@dataclass(frozen=True)
class RunProgress:
    run_id: str
    task: str = ""
    state: str = "pending"
    step: int = 0
    #: The tool of the run's newest action, and that action's phase.
    tool: str = ""
    tool_phase: str = ""
    generation: Generation | None = None
    #: The tail of the final reply as it streams.
    reply: str = ""
    #: Every run the events named, with its newest state (children are among them).
    runs: Mapping[str, str] = field(default_factory=dict)
    #: The run's children (delegations and isolated children), as ``show`` names them.
    children: tuple[str, ...] = ()

    @property
    def settled(self) -> bool:
        return self.state in DONE or self.state in PARKED

    def child_states(self) -> Counter[str]:
        return Counter(self.runs.get(child, "pending") for child in self.children)


def _tail(text: str) -> str:
    return text[-TEXT_CHARS:]


def reduce(view: RunProgress, event: Event) -> RunProgress:
    """``view`` after ``event``; events about other runs change only ``runs``."""
    kind, data, run_id = event.kind, event.data, view.run_id
    if kind.startswith("run-") and kind[4:] in RUN_STATES:
        view = replace(view, runs={**view.runs, event.subject: kind[4:]})
        return replace(view, state=kind[4:]) if event.subject == run_id else view
    if kind.startswith("action-") and data.get("run") == run_id:
        return replace(view, tool=str(data.get("tool", view.tool)), tool_phase=kind[len("action-"):])
    if event.subject != run_id:
        return view
    if kind == "run-created":
        return replace(view, task=str(data.get("task", "")))
    if kind in ("loop-advanced", "plan-committed"):
        return replace(view, step=int(data.get("loop", view.step)))
    if kind == "provider-request-started":
        return replace(view, generation=Generation(slot=str(data.get("slot", ""))))
    if kind == "provider-response-committed" and view.generation is not None:
        return replace(view, generation=replace(view.generation, done=True))
    if kind == PROGRESS_KIND:
        return _progress(view, event)
    if kind == "reply-delta":
        return replace(view, reply=_tail(view.reply + str(data.get("text", ""))))
    if kind == "reply-stream-restart":
        return replace(view, reply="")
    return view


def _progress(view: RunProgress, event: Event) -> RunProgress:
    data = event.data
    slot = str(data.get("slot", ""))
    current = view.generation
    if current is not None and (current.slot != slot or current.done):
        return view  # a late report of a lifecycle that is over
    if current is not None and current.at is not None and event.at <= current.at:
        return view  # the same report, asked again
    first_at = data.get("first_at", event.at)
    return replace(
        view,
        generation=Generation(
            slot=slot,
            tokens=int(data.get("tokens", 0)),
            first_at=float(first_at) if isinstance(first_at, int | float) else event.at,
            first_tokens=int(data.get("first_tokens", 0)),
            at=event.at,
        ),
    )


def reduce_all(view: RunProgress, events: Iterable[Event]) -> RunProgress:
    for event in events:
        view = reduce(view, event)
    return view


def progress_events(reply: Mapping[str, Any]) -> list[Event]:
    """The supervisor's ``progress`` answer as events for ``reduce``."""
    events = []
    for run_id, report in (reply.get("progress") or {}).items():
        if isinstance(report, dict) and isinstance(report.get("at"), int | float):
            row = {"cursor": -1, "kind": PROGRESS_KIND, "subject": run_id, "at": report["at"], "data": report}
            events.append(Event.from_row(row))
    return events


def with_children(view: RunProgress, shown: Mapping[str, Any]) -> RunProgress:
    """The children ``show`` names (its ``swarm`` section): delegated runs and
    isolated children."""
    swarm = shown.get("swarm") or {}
    found = [d.get("run_id") for d in swarm.get("delegations", [])]
    found += [c.get("run_id") for g in swarm.get("groups", []) for c in g.get("children", [])]
    children = tuple(dict.fromkeys(run for run in found if isinstance(run, str) and run))
    return replace(view, children=children)


def adds_children(view: RunProgress, event: Event) -> bool:
    return event.kind in CHILD_KINDS and event.data.get("parent_run") == view.run_id


def status_line(view: RunProgress) -> str:
    """One line: state, step, what is happening now, children."""
    parts = [view.state, f"step {view.step}"]
    generation = view.generation
    if generation is not None and not generation.done and generation.at is None:
        parts.append("model reading the prompt")
    elif generation is not None and not generation.done:
        rate = generation.tokens_per_s
        speed = f", {rate:.1f} tokens/s" if rate is not None else ""
        unit = "token" if generation.tokens == 1 else "tokens"
        parts.append(f"model generating: {generation.tokens} {unit}{speed}")
    elif view.tool:
        parts.append(f"tool {view.tool} {view.tool_phase}".rstrip())
    if view.children:
        counts = view.child_states()
        parts.append(
            f"children {len(view.children)}: " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        )
    return " · ".join(parts)


def render(view: RunProgress, *, verbose: bool = False) -> RenderableType:
    """The status line behind a spinner; ``verbose`` (the demo) adds the task and
    the model's words as they come."""
    line = Spinner("dots", text=_line(f"{view.run_id}  {status_line(view)}"))
    if not verbose:
        return line
    rows: list[RenderableType] = [line]
    if view.task:
        rows.append(_line(f"  task: {_one_line(view.task)}", style="dim"))
    # Only a final reply streams its words; a plan's tool calls are shown once
    # committed (the demo's event lines), never as the model writes them.
    if view.reply:
        rows.append(_line(f"  model: {_one_line(view.reply)[-200:]}", style="cyan"))
    return Group(*rows)


def _line(text: str, style: str = "") -> Text:
    """One terminal line: cut at the edge (a wrapped line would push the view up)."""
    return Text(text, style=style, no_wrap=True, overflow="ellipsis")


def _one_line(text: str) -> str:
    return " ".join(redact_text(text).split())


def stderr_console() -> Console:
    return Console(stderr=True)


def start_cursor(client: Client) -> int:
    """The event cursor now: a watch started from it sees every event of a run
    created after."""
    return int(client.status().get("cursor") or 0)


def watch_run(
    client: Client, run_id: str, since: int, timeout: float, console: Console, *, verbose: bool = False
) -> RunResult:
    """Follow ``run_id`` on a live status line until it ends or parks (as
    ``Client.wait`` does: ``RunTimeout`` after ``timeout`` seconds); the line goes
    away at the end, so what is printed next is what a non-terminal run prints.
    Whatever in the run's tree waits for a person is said above the line, naming
    the command that answers it (corral/cli/run_watch.py)."""
    from corral.cli.run_watch import TreeNotices

    view = RunProgress(run_id)
    tree = TreeNotices(client, run_id)  # what in the run's tree waits for a person, said above the line
    cursor = since
    deadline = time.monotonic() + timeout
    checked = time.monotonic()
    with Live(render(view, verbose=verbose), console=console, transient=True, refresh_per_second=8) as live:
        while True:
            reply = client.call("events", timeout=POLL_MS / 1000 + 15, since=cursor, wait_ms=POLL_MS)
            cursor = int(reply["cursor"])
            events = [Event.from_row(row) for row in reply["events"]]
            for notice in tree.notices(events):
                if notice.for_a_person:  # one whole line (the terminal wraps it): a command to copy
                    live.console.print(f"corral run: {notice.text}", markup=False, highlight=False, soft_wrap=True)
            view = reduce_all(view, events)
            if any(adds_children(view, event) for event in events):
                view = with_children(view, client.show(run_id).raw)
            view = reduce_all(view, _progress_of(client, run_id))
            live.update(render(view, verbose=verbose))
            if view.settled or time.monotonic() - checked >= RECHECK_S:
                checked = time.monotonic()
                state = client.call("wait", run_ids=[run_id], until="settled", wait_ms=0)
                if state["reached"]:
                    return client.show(run_id)
            if time.monotonic() >= deadline:
                raise RunTimeout(run_id, view.state, timeout)


def _progress_of(client: Client, run_id: str) -> list[Event]:
    try:
        return progress_events(client.call("progress", run_ids=[run_id]))
    except ControlError:
        return []  # a supervisor without progress reports: the line shows the rest


def format_call(tool: str, tool_input: Any, *, value_chars: int = 60) -> str:
    """``tool(key="value", ...)`` on one line, each value cut to ``value_chars``
    (the cut is marked), redacted on the way out."""
    if not isinstance(tool_input, dict):
        return f"{tool}({_one_line(json.dumps(tool_input, default=str))[:value_chars]})"
    parts = []
    for key, value in tool_input.items():
        shown = _one_line(json.dumps(value, ensure_ascii=False, default=str))
        parts.append(f"{key}={shown if len(shown) <= value_chars else shown[:value_chars] + '…'}")
    return f"{tool}({', '.join(parts)})"
