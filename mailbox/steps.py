"""The step protocol between an agent and the supervisor, shared by both processes.

``run.next_step`` (and the ``next`` a step's reply carries) answers one ``Step``:
what the agent does next, derived by the supervisor from committed ledger rows
alone (supervisor/runs/next_step.py). ``action.begin`` answers a ``Begun``:
whether the agent may start the side effect, in its own vocabulary (``Begin``),
never confused with a step.

Each kind of step is a msgspec record tagged by its ``do`` (``{"do": "execute",
...}`` on the wire): the supervisor builds the record, the reply is encoded from
it, and the agent checks the reply back into its record as it arrives
(``ActorContext.ask``), so a step with a missing or mistyped field is a clear
protocol error there, never a ``KeyError`` deep inside the lane. The tags are
plain strings (msgspec takes no enum member as a tag); ``DO`` names each record's
kind as a ``Do``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar, TypedDict

import msgspec


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


class _Step(msgspec.Struct, tag_field="do", kw_only=True, omit_defaults=True):
    """What every step shares: its tag (``do``) on the wire. Mutable: the supervisor
    completes a step before it leaves (a provider step's history, a begun action)."""

    DO: ClassVar[Do]


class DoneStep(_Step, tag="done"):
    """The run ended (``status``: its terminal status)."""

    DO: ClassVar[Do] = Do.DONE
    status: str


class ParkStep(_Step, tag="park"):
    """The run waits (a person, a join, a retry): the lane stops until woken."""

    DO: ClassVar[Do] = Do.PARK
    status: str


class FinalizeStep(_Step, tag="finalize"):
    """The plan's final reply, to finalize (a root run) or hand back (a child)."""

    DO: ClassVar[Do] = Do.FINALIZE
    reply: str | None


class ParseStep(_Step, tag="parse"):
    """A response handed off without its plan: parse it now."""

    DO: ClassVar[Do] = Do.PARSE
    slot: str
    response: str | None
    loop: int
    #: The raw response's digest (supervisor only: replaced by the raw text before it leaves).
    raw_sha256: str | None = None


class ProviderBegun(msgspec.Struct, kw_only=True):
    """A provider request's lifecycle, begun (``provider.begin``'s reply, or with a step)."""

    slot: str
    attempt: int


class ProviderStep(_Step, tag="provider"):
    """Ask the provider for this loop's plan. ``begun``: the request's lifecycle,
    begun by the supervisor with this reply; ``history`` from ``history_from``:
    the observations the agent does not hold yet (without ``history_from``: a
    shaped view, e.g. after compaction, sent whole)."""

    DO: ClassVar[Do] = Do.PROVIDER
    loop: int
    task: str = ""
    history: list[dict[str, Any]] | None = None
    history_from: int | None = None
    begun: ProviderBegun | None = None
    #: The run is past its claims (every delegation's receipt claimed, nothing of its
    #: swarm open): this turn closes the work, and never searches the web (seed 004 V1.20).
    closing: bool = False


class PrepareStep(_Step, tag="prepare"):
    """Prepare action ``index`` of loop ``loop``'s committed plan."""

    DO: ClassVar[Do] = Do.PREPARE
    loop: int
    index: int
    tool: str
    input: dict[str, Any]
    #: The raw plan's digest (supervisor only: replaced by the raw input before it leaves).
    plan_raw_sha256: str | None = None


class BatchEntry(msgspec.Struct, kw_only=True):
    """A read that follows an ``execute`` step's action, prepared and begun with it."""

    action_id: str
    tool: str
    input: dict[str, Any]


class ExecuteStep(_Step, tag="execute"):
    """Run an action. ``begun``: ``executing`` is committed already (the agent starts
    the effect without ``action.begin``); ``batch``: reads begun with it, run in
    plan order (at once when ``parallel``)."""

    DO: ClassVar[Do] = Do.EXECUTE
    action_id: str
    tool: str
    input: dict[str, Any]
    phase: str
    #: The raw input's digest (supervisor only: replaced by the raw input before it leaves).
    raw_sha256: str | None = None
    begun: bool = False
    batch: list[BatchEntry] = []
    parallel: bool = False


class CompactStep(_Step, tag="compact"):
    """Summarize the run's older turns (supervisor/longtask/compaction.py) up to ``to_seq``."""

    DO: ClassVar[Do] = Do.COMPACT
    loop: int
    from_seq: int
    to_seq: int
    entries: list[dict[str, Any]]
    tokens_before: int
    #: The summary request's provider lifecycle, begun by the supervisor with this step
    #: (supervisor/longtask/compaction_requests.py): the agent reports its end on this slot.
    slot: str | None = None


Step = DoneStep | ParkStep | FinalizeStep | ParseStep | ProviderStep | PrepareStep | ExecuteStep | CompactStep


class Begin(StrEnum):
    """``action.begin``'s answer: run the effect now, wait (parked), or skip it
    (it was denied, or already ended)."""

    EXECUTE = "execute"
    PARK = "park"
    SKIP = "skip"


class Stepped(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The reply of a step method (supervisor/runs/step_piggyback.py): ``next``, the
    run's next step, when the request said ``want_next``; each method's own reply
    adds its fields."""

    next: Step | None = None


class Begun(TypedDict):
    """The action store's verdict on beginning an action (supervisor/runs/action_store.py)."""

    begin: Begin
    phase: str


class ActionBegun(Stepped, kw_only=True):
    """``action.begin``'s reply: may the effect start (``begin``), the action's phase."""

    begin: Begin
    phase: str
