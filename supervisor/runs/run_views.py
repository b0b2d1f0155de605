"""What people read of runs (control methods): ``show``, ``runs``, ``wait``,
``pending`` and ``approval.show`` (what a person approves, whole:
supervisor/runs/approval_view.py). Read-only; the features add their sections
(each feature's ``show`` and ``pending``: supervisor/runs/run_feature.py), and a
cluster node shows a run of another partition (``ShowElsewhere``,
supervisor/cluster/node_service.py). ``show_record`` and ``recent_runs`` read a
ledger alone: a home's with no supervisor running reads through them too
(corral/offline_read.py)."""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import msgspec
import trio

from corral.actors.tools.base import Tool
from corral.core.redact import redact_text
from corral.supervisor.errors import BadRequest, NotFound
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.params import param_int, param_str
from corral.supervisor.runs import action_store, approval_view, repair_histogram, run_store, sealed_input
from corral.supervisor.runs.approval_diff import FileChange, Workspace, file_changes
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_output import output_model, output_of
from corral.supervisor.runs.run_state import NEEDS_PERSON, TERMINAL

#: What ``runs`` lists of each run's task and reason; ``show`` gives the whole text.
LIST_TEXT_CHARS = 300
#: How many runs one ``wait`` call may name.
WAIT_MAX_RUNS = 1000


#: The longest a ``wait`` may be asked to take (an hour); the node answers within 30 s.
MAX_WAIT_MS = 3_600_000


class WaitRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A ``wait`` call: the runs it waits for, the statuses that end it (``done``:
    ended; ``settled``: ended or waiting for a person) and how long at most."""

    run_ids: list[str]
    until: Literal["done", "settled"] = "settled"
    #: None (a JSON client's null) is the default, as it always was: no wait.
    wait_ms: Annotated[int, msgspec.Meta(ge=0, le=MAX_WAIT_MS)] | None = 0

    @classmethod
    def decode(cls, params: Mapping[str, Any]) -> WaitRequest:
        """The control call's parameters, their shape checked once: a
        ``bad-request`` naming the parameter (msgspec's ``$.until``) otherwise.
        Other parameters are left alone, as they always were."""
        try:
            return msgspec.convert(params, cls, strict=True)
        except msgspec.ValidationError as exc:
            raise BadRequest(f"wait: {exc}") from None


def wait_request(request: WaitRequest, max_runs: int) -> tuple[list[str], frozenset[str], int]:
    """A ``wait``'s request, checked for what its shape cannot say (a node's and the
    cluster front door's own bound on the runs, each a run id): the run ids (sorted,
    once each), the statuses that end the wait, and ``wait_ms``."""
    run_ids = request.run_ids
    if not 1 <= len(run_ids) <= max_runs:
        raise BadRequest(f"run_ids must be a list of 1 to {max_runs} run ids")
    if not all(run_store.RUN_ID.match(run_id) for run_id in run_ids):
        raise BadRequest("run_ids holds something that is not a run id")
    stop = frozenset(str(s) for s in (TERMINAL if request.until == "done" else TERMINAL | NEEDS_PERSON))
    return sorted(set(run_ids)), stop, request.wait_ms or 0


class ShowElsewhere(Protocol):
    """Where ``show`` looks for a run its own ledger does not hold."""

    async def show(self, run_id: str) -> dict[str, Any] | None:
        """The run as ``show_record`` shows it (and where it is), or None: not there either."""
        ...

    async def statuses(self, run_ids: list[str]) -> dict[str, str]:
        """The status of each of these runs held elsewhere (a run in a cluster's
        shared queue is pending); those it does not know are left out."""
        ...


#: ``wait`` reads runs held elsewhere (another node's partition, the shared queue)
#: this often: no commit of this ledger tells when they move.
ELSEWHERE_POLL_S = 0.25


#: What ``show`` tells of each action (and its ``traceback``, when its tool raised).
_ACTION_KEYS = (
    "action_id", "loop_index", "action_index", "tool", "phase", "policy", "fingerprint", "attempts", "reason",
    "error", "created_at", "executing_at", "finished_at",
)


def show_record(ledger: Ledger, run: Any) -> dict[str, Any]:
    """What ``show`` tells of a run (its row ``run``) from ``ledger`` alone: its
    actions, receipts, provider requests and final reply, without the features'
    sections (they read this supervisor's own partition)."""
    run_id = run["run_id"]
    data = {k: run[k] for k in run.keys() if k not in ("provider_config", "options")}  # noqa: SIM118 - sqlite3.Row is not a dict
    data["repairs"] = json.loads(run["repairs"])
    actions = [
        {**{k: row[k] for k in _ACTION_KEYS}, "traceback": _traceback_of(row["result"])}
        for row in ledger.all("SELECT * FROM actions WHERE run_id = ? ORDER BY loop_index, action_index", run_id)
    ]
    receipts = [dict(row) for row in ledger.all("SELECT * FROM receipts WHERE run_id = ? ORDER BY receipt_id", run_id)]
    requests = [
        {k: row[k] for k in ("slot", "attempt", "status", "error_kind", "error", "retry_at")}
        for row in ledger.all("SELECT * FROM provider_requests WHERE run_id = ? ORDER BY rowid", run_id)
    ]
    reply = ledger.one("SELECT text, created_at FROM replies WHERE run_id = ?", run_id)
    final = ledger.one("SELECT phase FROM finalizations WHERE run_id = ?", run_id)
    return {
        "run": data,
        "actions": actions,
        "receipts": receipts,
        "provider_requests": requests,
        "final_reply": reply["text"] if reply else None,
        # The agent's typed output, validated before its plan was committed (its reply is its JSON).
        "output": output_of(run["options"], reply["text"] if reply else None),
        "output_model": output_model(run["options"]),
        "instructions": _instructions_of(run_store.run_options(run)),
        "finalization": final["phase"] if final else None,
        # Seed 004 V1.33: the loops repaired, the second repairs, the eight categories zero-filled.
        "repair_histogram": repair_histogram.of_run(ledger, run),
    }


def _instructions_of(options: Mapping[str, Any]) -> dict[str, Any] | None:
    """The agent's own instructions the run was given (``{"text", "file"}``: the
    inline text, redacted, and the file each turn reads), or None. The options keep
    them as the spec gave them (the agent reads them), so the view redacts them."""
    given = options.get("instructions")
    if not isinstance(given, dict):
        return None
    text, file = given.get("text"), given.get("file")
    return {"text": redact_text(text) if isinstance(text, str) else "", "file": file if isinstance(file, str) else None}


def _traceback_of(result: str | None) -> str | None:
    """The traceback an action's tool raised with, as its record keeps it (or None)."""
    if not result:
        return None
    value = json.loads(result)
    trace = value.get("traceback") if isinstance(value, dict) else None
    return trace if isinstance(trace, str) else None


def recent_runs(ledger: Ledger) -> list[dict[str, Any]]:
    """What ``runs`` lists: the newest runs of ``ledger``, newest first, their task and
    reason cut short (``show`` gives the whole text)."""
    rows = ledger.all(
        "SELECT run_id, agent_id, kind, status, substr(reason, 1, ?) AS reason, substr(task, 1, ?) AS task,"
        " created_at FROM runs ORDER BY created_at DESC LIMIT 200",
        LIST_TEXT_CHARS,
        LIST_TEXT_CHARS,
    )
    return [dict(row) for row in rows]


class RunViews:
    def __init__(
        self,
        ledger: Ledger,
        features: RunFeatures,
        next_commit: Callable[[], Awaitable[None]],
        elsewhere: ShowElsewhere | None = None,
        *,
        home: Path | None = None,
        tools: Mapping[str, Tool] | None = None,
        policy: Callable[[Any], Mapping[str, str]] | None = None,
    ) -> None:
        self.ledger = ledger
        self.features = features
        #: Returns after the ledger's next commit (``wait`` re-reads then).
        self.next_commit = next_commit
        #: Where ``show`` looks for a run this ledger does not hold (None: nowhere).
        self.elsewhere = elsewhere
        #: The home (its spool holds the raw inputs a diff is computed from); None: no diffs.
        self.home = home
        #: The tool catalog (effect classes, sealed fields); MCP tools come from the run's pins.
        self.tools: Mapping[str, Tool] = tools or {}
        #: A run's effective policy per tool (RunCore.effective_policy); None: not shown.
        self.policy = policy
        #: Run status changes so far (a status hook counts them): ``wait`` re-reads
        #: its runs only after a commit that moved some run, not after every commit.
        self.status_moves = 0

    def on_status(self, ledger: Any, run_id: str, status: Any, reason: str | None) -> None:
        # Counted once committed: a ``wait`` that re-read its runs meanwhile (on
        # another connection of a ledger on a server) saw the run before the move.
        ledger.after_commit(self._status_moved)

    def _status_moved(self) -> None:
        self.status_moves += 1

    async def show(self, params: dict[str, Any]) -> dict[str, Any]:
        run_id = param_str(params, "run_id")
        try:
            run = run_store.get_run(self.ledger, run_id)
        except NotFound:
            # Not in this ledger: a run of another partition is shown read-only, so
            # no run becomes readable only with SQL.
            shown = await self.elsewhere.show(run_id) if self.elsewhere is not None else None
            if shown is None:
                raise
            return shown
        return {
            **show_record(self.ledger, run),
            **({"policy": self.policy(run)} if self.policy is not None else {}),
            **self.features.show(run_id),
        }

    async def runs(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"runs": recent_runs(self.ledger)}

    async def wait(self, params: dict[str, Any]) -> dict[str, Any]:
        """Block until every run in ``run_ids`` is done (``until="done"``) or done or
        waiting for a person (``"settled"``, the default), or ``wait_ms`` passed.
        It wakes on commits, in the supervisor: a client waits with one call and no
        ``show`` per event, so waiting takes no CPU from the runs it waits for."""
        wanted, stop, wait_ms = wait_request(WaitRequest.decode(params), WAIT_MAX_RUNS)
        marks = ",".join("?" * len(wanted))

        def statuses() -> dict[str, str]:
            rows = self.ledger.all(f"SELECT run_id, status FROM runs WHERE run_id IN ({marks})", *wanted)
            return {row["run_id"]: row["status"] for row in rows}

        seen = self.status_moves
        found = statuses()
        # A cluster node waits for runs of the cluster it does not hold too (one it
        # queued that another node took): read where they are, every poll.
        away = [run_id for run_id in wanted if run_id not in found]
        if away and self.elsewhere is not None:
            found.update(await self.elsewhere.statuses(away))
        missing = [run_id for run_id in wanted if run_id not in found]
        if missing:
            raise NotFound(f"no run {missing[0]!r}")
        with trio.move_on_after(min(wait_ms, 30_000) / 1000):
            while not all(status in stop for status in found.values()):
                if away and self.elsewhere is not None:
                    with trio.move_on_after(ELSEWHERE_POLL_S):
                        await self.next_commit()
                    found.update(statuses())
                    found.update(await self.elsewhere.statuses(away))
                    continue
                await self.next_commit()
                if self.status_moves != seen:
                    seen = self.status_moves
                    found = statuses()
        return {"runs": found, "reached": all(status in stop for status in found.values())}

    async def pending(self, params: dict[str, Any]) -> dict[str, Any]:
        waiting = self.ledger.all(
            "SELECT * FROM actions WHERE phase IN ('waiting-confirmation', 'needs-reconciliation') ORDER BY created_at"
        )
        requests = self.ledger.all(
            "SELECT slot, run_id, status, error_kind FROM provider_requests WHERE status = 'needs-reconciliation'"
        )
        retries = self.ledger.all(
            "SELECT r.run_id, p.slot, p.attempt, p.retry_at, p.error_kind FROM runs r JOIN provider_requests p"
            " ON p.run_id = r.run_id WHERE r.status = 'waiting-for-provider-retry' AND p.status = 'failed'"
            " AND p.retry_at IS NOT NULL ORDER BY p.retry_at"
        )
        # The first actions carry their approval view, a first page of each value
        # (the rest by ``approval.show``): the reply stays within one frame.
        previewed = waiting[: approval_view.MAX_PREVIEWS]
        views = await self._views(previewed, page=1, budget=approval_view.PREVIEW_BUDGET_CHARS)
        return {
            "actions": [
                {
                    **{
                        k: row[k] for k in ("action_id", "run_id", "agent_id", "tool", "phase", "fingerprint", "reason")
                    },
                    "input_summary": action_store.input_summary(row["tool"], json.loads(row["input"])),
                    "approval": views[index] if index < len(views) else None,
                }
                for index, row in enumerate(waiting)
            ],
            "provider_requests": [dict(row) for row in requests],
            "provider_retries": [dict(row) for row in retries],
            "runs": [
                dict(row)
                for row in self.ledger.all(
                    "SELECT run_id, agent_id, status, reason FROM runs WHERE status IN ('waiting-confirmation',"
                    " 'needs-reconciliation', 'waiting-for-provider-retry', 'waiting-for-join', 'needs-input')"
                )
            ],
            **self.features.pending(),
        }

    async def approval(self, params: dict[str, Any]) -> dict[str, Any]:
        """``approval.show``: page ``page`` of the approval view of one action (any
        phase; a file diff only for one that has not run)."""
        action_id = param_str(params, "action_id", limit=200)
        page = param_int(params, "page", 1, low=1, high=1_000_000)
        row = action_store.get_action(self.ledger, action_id)
        (shown,) = await self._views([row], page=page, budget=approval_view.VIEW_BUDGET_CHARS)
        return shown

    async def _views(self, rows: list[Any], *, page: int, budget: int) -> list[dict[str, Any]]:
        """The approval views of ``rows`` (action rows). The ledger is read here; the
        workspace files and the spool are read, and diffed, in a worker thread."""
        reads = [(row, self._workspace(row), row["raw_sha256"]) for row in rows]
        files = await trio.to_thread.run_sync(functools.partial(self._file_changes, reads))
        return [
            approval_view.view(
                row,
                effect=approval_view.effect_class(self.ledger, row, self.tools, self.features),
                sealed=approval_view.sealed_fields(row, self.tools),
                files=changes,
                page=page,
                budget=budget,
            )
            for row, changes in zip(rows, files, strict=True)
        ]

    def _workspace(self, row: Any) -> Workspace | None:
        if self.home is None or approval_view.has_run(row):
            return None
        options = json.loads(run_store.get_run(self.ledger, row["run_id"])["options"])
        if not options.get("workspace"):
            return None
        return Workspace(Path(options["workspace"]), tuple(options.get("write_scopes", ["."])), self.home)

    def _file_changes(self, reads: list[tuple[Any, Workspace | None, str | None]]) -> list[list[FileChange]]:
        """In a worker thread: each action's file changes, computed from its raw input
        (the spool's copy, when redaction changed the ledger's), masked in the diff."""
        changes: list[list[FileChange]] = []
        for row, where, digest in reads:
            if approval_view.has_run(row):
                changes.append([])
                continue
            tool_input = json.loads(row["input"])
            if digest and self.home is not None:
                name = sealed_input.raw_name(row["run_id"], "input", row["action_id"])
                try:
                    tool_input = json.loads(sealed_input.load(sealed_input.spool_dir(self.home), name, digest))
                except (sealed_input.SealedInputError, OSError, ValueError):
                    pass  # the ledger's masked copy: the diff may then differ where a secret was
            changes.append(file_changes(row["tool"], tool_input, where))
        return changes
