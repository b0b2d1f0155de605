"""Compaction on the supervisor (supervisor/longtask/compaction.py): the provider step sees
the compacted view; past the limit the agent is asked to compact first
(``do: compact``); ``context.compacted`` records a summary once per covered range;
``corral compact RUN`` asks for one now."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec

from corral.mailbox.protocol import Compacted, ContextCompacted
from corral.mailbox.steps import CompactStep, DoneStep, ParkStep, ProviderStep
from corral.supervisor.errors import BadRequest, NotFound
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.longtask import compaction, compaction_memo, compaction_requests
from corral.supervisor.models.model_service import MAX_COUNT_TEXTS, ModelService
from corral.supervisor.params import param_str
from corral.supervisor.runs import response_secrets, run_store
from corral.supervisor.runs.run_feature import RunFeature
from corral.supervisor.runs.run_service import RunService
from corral.supervisor.runs.run_state import TERMINAL, RunStatus

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor
    from corral.supervisor.tree.supervision_tree import ActorSlot

MAX_SUMMARY_CHARS = 8000


def _observations(ledger: Ledger, run_id: str) -> list[tuple[int, dict[str, Any]]]:
    rows = ledger.all("SELECT seq, data FROM observations WHERE run_id = ? ORDER BY seq", run_id)
    return [(int(row["seq"]), json.loads(row["data"])) for row in rows]


def latest(ledger: Ledger, run_id: str) -> dict[str, Any] | None:
    row = ledger.one("SELECT * FROM compactions WHERE run_id = ? ORDER BY to_seq DESC LIMIT 1", run_id)
    return dict(row) if row is not None else None


def _limits(ledger: Ledger, run_id: str) -> dict[str, Any]:
    try:
        run = run_store.get_run(ledger, run_id)  # kept: the step just read it
    except NotFound:
        return {}
    context = run_store.run_options(run).get("context")
    return dict(context) if isinstance(context, Mapping) else {}


#: No tokenizer gives a token less than one byte, and a character is at most 4 UTF-8
#: bytes: 4 tokens per character bounds any model's count from above.
_MAX_TOKENS_PER_CHAR = 4


def fixed_tokens(ledger: Ledger, run_id: str) -> int:
    """What every request of the run carries besides its history, estimated (seed 004
    V1.21: "按消息、multimodal 文本和 function schema 的规范序列化字符数做保守 token 估算"):
    its task, and the system prompt and tool catalog (the function schemas) its latest
    turn was sent, as the agent recorded them for the transcript (transcript_store.py).
    Before a run's first turn only the task is known."""
    run = ledger.one("SELECT task FROM runs WHERE run_id = ?", run_id)
    tokens = compaction.estimate_tokens(run["task"]) if run is not None else 0
    sent = ledger.one(
        "SELECT system_sha256, catalog_sha256 FROM provider_requests WHERE run_id = ? AND request_kind = 'tool-plan'"
        " AND (system_sha256 IS NOT NULL OR catalog_sha256 IS NOT NULL) ORDER BY rowid DESC LIMIT 1",
        run_id,
    )
    if sent is not None:
        for row in ledger.all("SELECT text FROM transcript_blobs WHERE sha256 IN (?, ?)",
                              sent["system_sha256"] or "", sent["catalog_sha256"] or ""):
            tokens += compaction.estimate_tokens(row["text"])
    return tokens


def _surely_within(ledger: Ledger, run_id: str, limits: dict[str, Any], fixed: int = 0) -> bool:
    """Whether the run's observations, with ``fixed`` tokens beside them, are within
    both limits on any tokenizer (one aggregate read, so a short run under the
    default limits costs no count)."""
    row = ledger.one("SELECT COALESCE(SUM(LENGTH(data)), 0) AS total, COALESCE(MAX(LENGTH(data)), 0) AS widest"
                     " FROM observations WHERE run_id = ?", run_id)
    if row is None:
        return True
    auto, tool_output = limits.get("auto_compact"), limits.get("tool_output")
    return ((not auto or int(row["total"]) * _MAX_TOKENS_PER_CHAR + fixed <= auto)
            and (not tool_output or int(row["widest"]) * _MAX_TOKENS_PER_CHAR <= tool_output))


def over_limit_reason(tokens: int, limit: int) -> str:
    """Why a turn still over the auto limit with nothing left to fold is not sent (seed
    004 V1.21: "重建后仍超阈值或没有新的可压缩 prefix 时失败关闭并给出配置/新 Session 建议")."""
    return (f"context over its limit: the next request is estimated at {tokens} tokens, past"
            f" auto_compact_token_limit {limit}, and only the newest {compaction.KEEP_RECENT} observations"
            " (never folded) follow the last summary; not sent. Raise the agent's auto_compact_token_limit"
            " (and context_window), lower tool_output_token_limit, or start a new run")


def _compact_step(step: ProviderStep, todo: dict[str, Any]) -> CompactStep:
    return CompactStep(loop=step.loop, from_seq=todo["from_seq"], to_seq=todo["to_seq"], entries=todo["entries"],
                       tokens_before=todo["tokens_before"])


class CompactionService:
    def __init__(self, ledger: Ledger, runs: RunService, models: ModelService) -> None:
        self.ledger = ledger
        #: Checks that a compaction comes from the run's own agent.
        self.runs = runs
        #: A local model's own tokenizer, for the counts a view is cut by.
        self.models = models
        #: What is kept of each run between its provider turns, in memory only (a
        #: restart starts empty and reads each run once): compaction_memo.py.
        self._memos: dict[str, compaction_memo.RunMemo] = {}

    def _fail_closed(self, run_id: str, tokens: int, limit: int) -> DoneStep:
        """The run fails rather than send a request known to be over its limit."""
        self.forget(run_id)
        run_store.set_run_status(self.ledger, run_id, RunStatus.FAILED, self.runs.features,
                                 over_limit_reason(tokens, limit))
        return DoneStep(status=RunStatus.FAILED.value)

    def _begin_compaction(self, run_id: str, step: CompactStep) -> CompactStep | ParkStep:
        """The summary request's lifecycle, begun before the agent sends it
        (compaction_requests.py); the run parks when the last one was lost unsure."""
        begun = compaction_requests.begin(self.ledger, run_id, step.loop, step.to_seq, self.runs.features)
        if isinstance(begun, compaction_requests.Parked):
            self.forget(run_id)
            return ParkStep(status=RunStatus.NEEDS_RECONCILIATION.value)
        return msgspec.structs.replace(step, slot=begun.slot)

    async def shape_provider_step(
        self, run_id: str, step: ProviderStep
    ) -> ProviderStep | CompactStep | DoneStep | ParkStep:
        """The provider's view of the run, or first a compaction when it is too long."""
        ledger = self.ledger
        limits = _limits(ledger, run_id)
        requested = ledger.one("SELECT 1 FROM compaction_requests WHERE run_id = ?", run_id) is not None
        if not limits.get("auto_compact") and not limits.get("tool_output") and not requested:
            return step  # this agent has no token budget: the full history, as before
        previous = latest(ledger, run_id)
        if requested:
            # Rare (a person asked): planned afresh, and what was kept is not trusted after.
            self.forget(run_id)
            return await self._shape_afresh(run_id, step, limits, previous)
        memo = self._memos.get(run_id)
        fixed = fixed_tokens(ledger, run_id)
        if memo is None and previous is None and _surely_within(ledger, run_id, limits, fixed):
            return step  # far below both limits: nothing to fold or cut, no count needed
        model = self._local_model(run_id)
        key = compaction_memo.key_of(limits, previous, model)
        if memo is None or memo.key != key:
            if memo is not None and previous is None and _surely_within(ledger, run_id, limits, fixed):
                self.forget(run_id)  # the limits changed: checked again, as for a new memo
                return step
            # Past the limits once, past them for good under the same key: observations
            # only grow, so the memo's existence answers ``_surely_within`` from here on.
            memo = self._memos[run_id] = compaction_memo.RunMemo(key, previous)
        rows = ledger.all("SELECT seq, data FROM observations WHERE run_id = ? AND seq > ? ORDER BY seq",
                          run_id, memo.last_seq)
        new = memo.add_rows(rows)
        by_model = await self._count_new(memo, model, new)
        memo.extend_shown(by_model)
        count = memo.count(by_model)
        auto = limits.get("auto_compact")
        tokens = memo.tokens(count) + fixed
        if auto and tokens > auto:
            todo = compaction.plan(memo.observations, previous, limits, count=count, overhead=fixed)
            if todo is None:
                return self._fail_closed(run_id, tokens, int(auto))
            return self._begin_compaction(run_id, _compact_step(step, todo))
        return msgspec.structs.replace(step, history=memo.view())

    async def _shape_afresh(self, run_id: str, step: ProviderStep, limits: dict[str, Any],
                            previous: dict[str, Any] | None) -> ProviderStep | CompactStep | DoneStep | ParkStep:
        observations = _observations(self.ledger, run_id)
        count = await self._counter(run_id, observations, previous)
        fixed = fixed_tokens(self.ledger, run_id)
        todo = compaction.plan(observations, previous, limits, requested=True, count=count, overhead=fixed)
        if todo is not None:
            return self._begin_compaction(run_id, _compact_step(step, todo))
        view = compaction.view(observations, previous, limits.get("tool_output"), count)
        tokens, auto = sum(count(entry) for entry in view) + fixed, limits.get("auto_compact")
        if auto and tokens > auto:
            return self._fail_closed(run_id, tokens, int(auto))
        return msgspec.structs.replace(step, history=view)

    def forget(self, run_id: str) -> None:
        """Drop what is kept of a run (it ended, compacted, or cannot be trusted)."""
        self._memos.pop(run_id, None)

    def _local_model(self, run_id: str) -> str | None:
        """The local GGUF model whose tokenizer counts the run's tokens, or None."""
        try:
            row = run_store.get_run(self.ledger, run_id)  # kept: the step just read it
        except NotFound:
            return None
        if row["provider"] != "local":
            return None
        model = json.loads(row["provider_config"]).get("model")
        return model if isinstance(model, str) else None

    async def _count_new(self, memo: compaction_memo.RunMemo, model: str | None,
                         new: list[compaction_memo.Observation]) -> bool:
        """Whether this turn counts by the model's tokenizer (else the estimate, as
        ``_counter`` falls back): one request, for the texts it has not counted yet."""
        if model is None:
            return False
        summary = memo.summary_entry()
        if memo.text_total + (summary is not None) > MAX_COUNT_TEXTS:
            return False  # more texts than one count request takes: the estimate, as ``_counter``
        texts = [text for _, entry in (memo.observations if not memo.by_model else new)
                 for text in compaction_memo.texts_of(entry)]
        if summary is not None:
            texts.append(compaction.text_of(summary))
        texts = list(dict.fromkeys(text for text in texts if text not in memo.known))
        counts = await self.models.count_tokens(model, texts)
        if counts is None:
            return False
        memo.known.update(zip(texts, counts, strict=True))
        return True

    async def _counter(self, run_id: str, observations: list[tuple[int, dict[str, Any]]],
                       previous: dict[str, Any] | None) -> compaction.Count:
        """The model's own token counts for a local GGUF (one request to its actor for
        every text the view may count), else the estimate."""
        row = self.ledger.one("SELECT provider, provider_config FROM runs WHERE run_id = ?", run_id)
        if row is None or row["provider"] != "local":
            return compaction.estimate_tokens
        model = json.loads(row["provider_config"]).get("model")
        texts: list[str] = []
        for _, entry in observations:
            texts.append(compaction.text_of(entry))
            if "output" in entry:
                texts.append(compaction.text_of(entry["output"]))
        if previous is not None:
            texts.append(compaction.text_of({"role": "summary", "text": previous["summary"],
                                             "covers": [int(previous["from_seq"]), int(previous["to_seq"])]}))
        counts = await self.models.count_tokens(str(model), texts) if isinstance(model, str) else None
        if counts is None:
            return compaction.estimate_tokens
        known = dict(zip(texts, counts, strict=True))

        def count(value: Any) -> int:
            text = compaction.text_of(value)
            return known[text] if text in known else compaction.estimate_tokens(value)

        return count

    async def compacted(self, slot: ActorSlot, request: ContextCompacted) -> Compacted:
        """``context.compacted``: the agent's summary of a run's older turns, once per
        covered range (its reply carries the next step: supervisor/actor_dispatch.py)."""
        run_id, to_seq, summary = request.run_id, request.to_seq, request.summary
        self.runs.check_owner(slot, run_id)
        if not summary.strip() or len(summary) > MAX_SUMMARY_CHARS:
            raise BadRequest(f"summary must be 1 to {MAX_SUMMARY_CHARS} characters")
        ledger = self.ledger
        if ledger.one("SELECT 1 FROM compactions WHERE run_id = ? AND to_seq = ?", run_id, to_seq) is None:
            previous = latest(ledger, run_id)
            if previous is not None and to_seq <= int(previous["to_seq"]):
                raise BadRequest(f"observations up to {previous['to_seq']} are already compacted")
            if ledger.one("SELECT 1 FROM observations WHERE run_id = ? AND seq = ?", run_id, to_seq) is None:
                raise BadRequest(f"run {run_id} has no observation {to_seq}")
            observations = _observations(ledger, run_id)
            before = sum(compaction.estimate_tokens(e) for e in compaction.view(observations, previous, None))
            # Filtered before it is stored, as a text reply is (seed 004 V1.41: "响应落盘
            # 前会...依次过滤密钥、项目路径和其它绝对路径").
            roots = response_secrets.project_roots(run_store.get_run(ledger, run_id))
            summary = response_secrets.filter_reply(summary.strip(), roots)
            entry = {"from_seq": 1, "to_seq": to_seq, "summary": summary}
            after = sum(compaction.estimate_tokens(e) for e in compaction.view(observations, entry, None))
            with ledger.tx() as db:
                db.execute(
                    "INSERT INTO compactions (run_id, from_seq, to_seq, summary, tokens_before, tokens_after,"
                    " created_at) VALUES (?, 1, ?, ?, ?, ?, ?)",
                    (run_id, to_seq, summary, before, after, time.time()),
                )
                db.execute("DELETE FROM compaction_requests WHERE run_id = ?", (run_id,))
                if request.slot is not None:  # its request completes with the summary, in one commit
                    compaction_requests.complete(ledger, db, run_id, request.slot)
                ledger.event("context-compacted", run_id, from_seq=1, to_seq=to_seq, tokens_before=before,
                             tokens_after=after)
            self.forget(run_id)  # its key changed with the new row: what was kept is stale
            ledger.failpoint("context.after-compact")
        elif request.slot is not None:
            with ledger.tx() as db:  # the summary is stored already (a replay): only its request is left
                compaction_requests.complete(ledger, db, run_id, request.slot)
        return Compacted(to_seq=to_seq)

    async def request(self, params: dict[str, Any]) -> dict[str, Any]:
        """``corral compact RUN``: the run compacts before its next provider turn."""
        run_id = param_str(params, "run_id", limit=64)
        if self.ledger.one("SELECT 1 FROM runs WHERE run_id = ?", run_id) is None:
            raise NotFound(f"no run {run_id!r}")
        with self.ledger.tx() as db:
            db.execute("INSERT OR IGNORE INTO compaction_requests (run_id, created_at) VALUES (?, ?)",
                       (run_id, time.time()))
            self.ledger.event("compaction-requested", run_id)
        self.forget(run_id)
        return {"run_id": run_id, "requested": True,
                "note": "the run compacts before its next provider turn (if it has older turns to fold)"}

    def show_section(self, run_id: str) -> dict[str, Any]:
        """The run's context as numbers only (seed 004 V1.21: "估算 token、最近真实 usage、阈值、
        压缩次数和时间，不显示被压缩正文"): the next request's estimate (its view and what every
        request carries), the auto limit, the latest planning answer's reported usage,
        and the compactions."""
        ledger = self.ledger
        compactions = [
            {k: row[k] for k in ("from_seq", "to_seq", "tokens_before", "tokens_after", "created_at")}
            for row in ledger.all("SELECT * FROM compactions WHERE run_id = ? ORDER BY to_seq", run_id)
        ]
        limits = _limits(ledger, run_id)
        seen = compaction.view(_observations(ledger, run_id), latest(ledger, run_id), limits.get("tool_output"))
        answered = ledger.one(
            "SELECT response FROM provider_requests WHERE run_id = ? AND request_kind = 'tool-plan'"
            " AND response IS NOT NULL ORDER BY rowid DESC LIMIT 1",
            run_id,
        )
        usage = _usage(answered["response"]) if answered is not None else {}
        return {
            "estimated_input_tokens": sum(compaction.estimate_tokens(entry) for entry in seen)
            + fixed_tokens(ledger, run_id),
            "auto_compact_token_limit": limits.get("auto_compact"),
            "last_prompt_tokens": usage.get("prompt_tokens"),
            "last_completion_tokens": usage.get("completion_tokens"),
            "compaction_revision": len(compactions),
            "last_compacted_at": compactions[-1]["created_at"] if compactions else None,
            "compactions": compactions,
        }


def _usage(response: str) -> dict[str, int]:
    """The token counts a Chat Completions answer reported (``usage``), if any."""
    try:
        body = json.loads(response)
    except ValueError:
        return {}
    counts = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(counts, dict):
        return {}
    return {key: value for key, value in counts.items() if isinstance(value, int) and not isinstance(value, bool)}


class CompactionFeature(RunFeature):
    """Context compaction in runs: a provider step gets its view of the history,
    or a compaction first; ``show`` shows the context's state."""

    def __init__(self, service: CompactionService) -> None:
        self.service = service

    async def shape_provider(self, run_id: str, step: ProviderStep) -> ProviderStep | CompactStep | DoneStep | ParkStep:
        return await self.service.shape_provider_step(run_id, step)

    def show(self, run_id: str) -> Mapping[str, Any]:
        return {"context": self.service.show_section(run_id)}

    def on_status(self, ledger: Ledger, run_id: str, status: RunStatus, reason: str | None) -> None:
        """A run that ended keeps nothing in memory (after the commit: a rolled-back
        status change ends nothing)."""
        if status in TERMINAL:
            ledger.after_commit(partial(self.service.forget, run_id))


def install(sup: Supervisor) -> CompactionService:
    service = CompactionService(sup.ledger, sup.runs, sup.models)
    sup.methods.compaction = service
    sup.control_methods["compact"] = service.request
    return service
