"""The step protocol between an agent and the supervisor, shared by both processes.

``run.next_step`` (and the ``next`` a step's reply carries) answers one ``Step``:
what the agent does next, derived by the supervisor from committed ledger rows
alone (supervisor/runs/next_step.py). ``action.begin`` answers a
``Begun``: whether the agent may start the side effect, in its own vocabulary
(``Begin``), never confused with a step.

On the wire these are plain maps with string values; ``Do`` and ``Begin`` are
``StrEnum``s, so a member compares equal to the string that crossed the wire.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal, NotRequired, TypedDict


class Do(StrEnum):
    """The kinds of step, one handler each in the agent."""

    DONE = "done"
    PARK = "park"
    FINALIZE = "finalize"
    PARSE = "parse"
    PROVIDER = "provider"
    PREPARE = "prepare"
    EXECUTE = "execute"
    COMPACT = "compact"


class DoneStep(TypedDict):
    """The run ended (``status``: its terminal status)."""

    do: Literal[Do.DONE]
    status: str


class ParkStep(TypedDict):
    """The run waits (a person, a join, a retry): the lane stops until woken."""

    do: Literal[Do.PARK]
    status: str


class FinalizeStep(TypedDict):
    """The plan's final reply, to finalize (a root run) or hand back (a child)."""

    do: Literal[Do.FINALIZE]
    reply: str | None


class ParseStep(TypedDict):
    """A response handed off without its plan: parse it now."""

    do: Literal[Do.PARSE]
    slot: str
    response: str | None
    raw_sha256: NotRequired[str | None]
    loop: int


class ProviderStep(TypedDict):
    """Ask the provider for this loop's plan. ``begun``: the request's lifecycle,
    begun by the supervisor with this reply; ``history`` from ``history_from``:
    the observations the agent does not hold yet (without ``history_from``: a
    shaped view, e.g. after compaction, sent whole)."""

    do: Literal[Do.PROVIDER]
    loop: int
    task: NotRequired[str]
    history: NotRequired[list[dict[str, Any]]]
    history_from: NotRequired[int]
    begun: NotRequired[dict[str, Any]]


class PrepareStep(TypedDict):
    """Prepare action ``index`` of loop ``loop``'s committed plan."""

    do: Literal[Do.PREPARE]
    loop: int
    index: int
    tool: str
    input: dict[str, Any]
    plan_raw_sha256: NotRequired[str | None]


class BatchEntry(TypedDict):
    """A read that follows an ``execute`` step's action, prepared and begun with it."""

    action_id: str
    tool: str
    input: dict[str, Any]


class ExecuteStep(TypedDict):
    """Run an action. ``begun``: ``executing`` is committed already (the agent starts
    the effect without ``action.begin``); ``batch``: reads begun with it, run in
    plan order (at once when ``parallel``)."""

    do: Literal[Do.EXECUTE]
    action_id: str
    tool: str
    input: dict[str, Any]
    phase: str
    raw_sha256: NotRequired[str | None]
    begun: NotRequired[bool]
    batch: NotRequired[list[BatchEntry]]
    parallel: NotRequired[bool]


class CompactStep(TypedDict):
    """Summarize the run's older turns (supervisor/longtask/compaction.py) up to ``to_seq``."""

    do: Literal[Do.COMPACT]
    loop: int
    from_seq: int
    to_seq: int
    entries: list[dict[str, Any]]
    tokens_before: int


Step = DoneStep | ParkStep | FinalizeStep | ParseStep | ProviderStep | PrepareStep | ExecuteStep | CompactStep


class Begin(StrEnum):
    """``action.begin``'s answer: run the effect now, wait (parked), or skip it
    (it was denied, or already ended)."""

    EXECUTE = "execute"
    PARK = "park"
    SKIP = "skip"


class Begun(TypedDict):
    begin: Begin
    phase: str
