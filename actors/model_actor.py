"""The ``model`` template: one actor loads one GGUF model and serves generations.

Every agent whose provider is ``local`` and names this model sends its requests
here (relayed by the supervisor, which also waits for this actor after a restart).
llama.cpp contexts are not reentrant, so requests queue on a fair lock and run
one at a time in a worker thread; the trio side stays free to answer heartbeats,
and a request's queueing and generation time are measured separately.

The actor holds no durable state: a generation is not an effect, and a request
lost with this process (killed mid-generation) is re-sent by the agent's durable
provider lifecycle as a transient failure.
"""

from __future__ import annotations

import json
import logging
import os
import time
from functools import partial
from typing import Any

import trio

from corral.actors.providers.reply_stream import FinalReplyDecoder, ReplyDeltas
from corral.actors.runtime import ActorContext, ask_best_effort, serve_requests
from corral.core import failpoints
from corral.core.model_threads import generation_threads
from corral.core.redact import summarize
from corral.mailbox.envelope import Envelope
from corral.mailbox.protocol import ModelFailed, ModelReady

log = logging.getLogger("corral.model")

EXIT_LOAD_FAILED = 4
#: The failpoint fires at this sampled token: well inside a generation.
MID_GENERATION_TOKEN = 3


class GenerationError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class LoadedModel:
    """One llama.cpp model; ``generate`` blocks (call it from a worker thread)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from llama_cpp import Llama

        started = time.monotonic()
        self.n_threads = generation_threads(int(spec["n_threads"]), os.environ)
        # Any: llama_cpp's message TypedDicts would only be cast to here.
        self.llama: Any = Llama(
            model_path=spec["path"],
            n_threads=self.n_threads,
            n_ctx=int(spec["n_ctx"]),
            n_batch=512,
            seed=0,
            verbose=False,
        )
        self.n_ctx = int(spec["n_ctx"])
        self.model_id = str(spec["id"])
        self.load_s = time.monotonic() - started

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(self.llama.tokenize(text.encode("utf-8"), add_bos=False, special=False)) for text in texts]

    def generate(self, request: dict[str, Any], on_text: Any = None) -> dict[str, Any]:
        """``on_text(str)``, if given, receives the answer's text as it is sampled
        (from this worker thread)."""
        import codecs

        from llama_cpp import LlamaGrammar  # type: ignore[attr-defined]

        grammar = LlamaGrammar.from_json_schema(json.dumps(request["schema"]), verbose=False)
        started = time.monotonic()
        first: list[float] = []
        prompt_length: list[int] = []
        text = codecs.getincrementaldecoder("utf-8")(errors="replace")

        def watch_tokens(tokens: Any, scores: Any) -> Any:
            # Called once per sampled token: the first call is the time to first
            # token, and a crash window inside generation for the kill tests.
            first.append(time.monotonic())
            if not prompt_length:
                prompt_length.append(len(tokens))
            elif on_text is not None and len(tokens) > prompt_length[0]:
                # The token sampled at the previous call is now the last input.
                on_text(text.decode(self.llama.detokenize([int(tokens[-1])])))
            if len(first) == MID_GENERATION_TOKEN:
                failpoints.hit("model.mid-generation")
            return scores

        try:
            body: Any = self.llama.create_chat_completion(
                messages=request["messages"],
                grammar=grammar,
                max_tokens=int(request["max_tokens"]),
                temperature=float(request["temperature"]),
                repeat_penalty=float(request["repeat_penalty"]),
                seed=int(request["seed"]),
                logits_processor=[watch_tokens],
            )
        except ValueError as exc:
            if "context window" in str(exc) or "exceed" in str(exc):
                raise GenerationError(
                    "context-full", f"the conversation no longer fits the model's context (n_ctx {self.n_ctx}): {exc}"
                ) from None
            raise GenerationError("model-error", summarize(str(exc), 300)) from None
        finished = time.monotonic()
        usage = body.get("usage") or {}
        completion_tokens = int(usage.get("completion_tokens", 0))
        model_s = finished - started
        decode_s = finished - first[0] if first else model_s
        # A Chat Completions body, with llama.cpp server's "timings" for the time the
        # model took; it is committed as the response, so the ledger keeps both.
        return {
            "id": body.get("id", ""),
            "object": "chat.completion",
            "model": self.model_id,
            "choices": body.get("choices", []),
            "usage": {"prompt_tokens": int(usage.get("prompt_tokens", 0)), "completion_tokens": completion_tokens},
            "timings": {
                "model_ms": round(model_s * 1000, 3),
                "ttft_ms": round(((first[0] if first else finished) - started) * 1000, 3),
                "tokens_per_s": round(completion_tokens / decode_s, 2) if decode_s > 0 else 0.0,
            },
        }


async def run(ctx: ActorContext) -> int:
    spec: dict[str, Any] = ctx.params["model"]
    model_id = str(spec["id"])
    try:
        model = await trio.to_thread.run_sync(LoadedModel, spec)
    except Exception as exc:  # an import or load failure: reported, then a crash exit
        message = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, ImportError):
            message = "llama-cpp-python is not installed; install the local extra (make demo-local)"
        log.error("model %s cannot load: %s", model_id, summarize(message, 300))
        await ask_best_effort(ctx, ModelFailed(model=model_id, error=summarize(message, 500)))
        return EXIT_LOAD_FAILED
    await ctx.ask(ModelReady(model=model_id, load_s=round(model.load_s, 3), n_ctx=model.n_ctx))
    log.info("model %s loaded in %.2f s with %d thread(s)", model_id, model.load_s, model.n_threads)
    turn = trio.Lock()  # fair: requests are served in arrival order
    async with trio.open_nursery() as nursery:
        await serve_requests(ctx, nursery, {"generate": partial(_generate, ctx, model, turn),
                                            "count_tokens": partial(_count_tokens, ctx, model)})
        nursery.cancel_scope.cancel()
    return 0


async def _count_tokens(ctx: ActorContext, model: LoadedModel, envelope: Envelope) -> None:
    """Token counts by the model's own tokenizer (context compaction asks): the
    vocabulary only, so it need not wait for a generation in progress."""
    texts = envelope.body.get("texts")
    if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
        await ctx.channel.reply_error(envelope, "bad-request", "texts must be a list of strings")
        return
    counts = await trio.to_thread.run_sync(model.count_tokens, texts)
    await ctx.channel.reply(envelope, {"counts": counts})


async def _generate(ctx: ActorContext, model: LoadedModel, turn: trio.Lock, envelope: Envelope) -> None:
    arrived = time.monotonic()
    stream = envelope.body.get("stream")
    on_text = None
    deltas: ReplyDeltas | None = None
    if isinstance(stream, dict):
        # Only a final reply's text streams (the decoder drops a plan of tool calls).
        deltas = ReplyDeltas(ctx, str(stream.get("run_id", "")), str(stream.get("slot", "")))
        decoder = FinalReplyDecoder()

        def on_text(piece: str) -> None:
            visible = decoder.feed(piece)
            if visible:
                trio.from_thread.run(deltas.add, visible)
                failpoints.hit("model.mid-reply")
            # Every token counts (a plan's too); a report crosses to trio at most twice a second.
            if deltas.count(1):
                trio.from_thread.run(deltas.report_progress)

    async with turn:
        queued_ms = round((time.monotonic() - arrived) * 1000, 3)
        try:
            answer = await trio.to_thread.run_sync(model.generate, envelope.body, on_text)
        except GenerationError as exc:
            await ctx.channel.reply_error(envelope, exc.code, str(exc))
            return
    if deltas is not None:
        await deltas.finish()
    answer["timings"]["queue_ms"] = queued_ms
    await ctx.channel.reply(envelope, answer)
