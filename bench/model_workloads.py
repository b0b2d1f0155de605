"""``real_model_swarm``: N agents share one real model (SmolLM2-135M on the CPU).

For N = 1, 2, 4, 8 agents, N runs start at once; each is one durable provider turn
(run, claim, provider lifecycle, the model actor's generation under the plan
grammar, handoff, plan, final reply). Then, in the same run of the bench, the same
N prompts with the same grammar go to llama-cpp-python driven directly, in the
order the model actor served them. corral's overhead is what its wall time adds
to the direct wall time, as a share of its own.

Beside both, the server route (issue 38): the same N agents on the ``openai``
provider with ``structured = "json_object"`` against ``python -m llama_cpp.server``
on the same GGUF, started by the bench: the HTTP path a user's vLLM or Ollama takes.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.corral_workloads import _call, _wait_all_ready, supervisor
from bench.harness import Context, Metrics, NotRun, Stats, workload
from bench.llama_server import ServerFailed, llama_server

AGENT_COUNTS = (1, 2, 4, 8)
TOPICS = ("rivers", "bridges", "clocks", "gardens", "ships", "maps", "lamps", "roads")


def _spec(n: int) -> str:
    agents = "".join(
        f'\n[[agents]]\nid = "a{i}"\nprovider = "local"\ntools = []\n  [agents.local]\n  model = "smollm2"\n'
        "  max_reply = 160\n"
        for i in range(n)
    )
    return f'[project]\nroot = "ws"\n[[models]]\nid = "smollm2"\nn_threads = 2\n{agents}'


def _server_spec(n: int, base_url: str) -> str:
    """The same agents on the ``openai`` provider, the plan schema sent to the server."""
    agents = "".join(
        f'\n[[agents]]\nid = "a{i}"\nprovider = "openai"\ntools = []\n  [agents.openai]\n'
        f'  base_url = "{base_url}"\n  model = "smollm2"\n  api_key_env = "CORRAL_BENCH_NO_KEY"\n'
        '  structured = "json_object"\n  max_reply = 160\n  max_tokens = 200\n  temperature = 0.0\n'
        for i in range(n)
    )
    return f'[project]\nroot = "ws"\n{agents}'


@contextlib.contextmanager
def _llama_server(model: Path) -> Iterator[str]:
    """bench/llama_server.py's server on ``model``; NotRun when the local-server extra
    is missing or it never answers."""
    try:
        import fastapi  # noqa: F401  (llama_cpp.server's own dependency)
    except ImportError as exc:
        raise NotRun(f"llama_cpp.server needs the local-server extra: {exc}") from None
    with tempfile.TemporaryDirectory(prefix="llama-") as logs:
        try:
            with llama_server(model, Path(logs) / "server.log") as base_url:
                yield base_url
        except ServerFailed as exc:
            raise NotRun(str(exc)) from None


def _server_rounds(ctx: Context, base_url: str, n: int, rounds: int) -> None:
    """The ``server_*`` metrics for N agents: the same tasks through llama_cpp.server."""
    walls, tps = [], []
    with supervisor(ctx, _server_spec(n, base_url)) as home:
        _wait_all_ready(home, n, 120)
        _corral_round(home, 1)  # warm, as for the model actor
        for _ in range(rounds):
            ctx.check(f"real_model_swarm server n={n}")
            result = _corral_round(home, n)
            served = _responses(home, result["run_ids"])
            tokens = sum(int(entry["usage"]["completion_tokens"]) for entry in served)
            walls.append(result["wall_s"])
            tps.append(tokens / result["wall_s"])
    ctx.metrics[f"server_tokens_per_s_{n}"] = Stats.of(tps, "tok/s")
    ctx.metrics[f"server_wall_s_{n}"] = Stats.of(walls, "s")


def _task(i: int) -> str:
    return f"Write one sentence about {TOPICS[i % len(TOPICS)]}."


def _prompt(agent_id: str, task: str) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
    """The messages, schema and token budget the agent's provider sends (no tools:
    one turn, the final reply)."""
    from corral.actors.providers.base import ProviderRequest
    from corral.actors.providers.local import LocalConfig, answer_schema, chat_messages
    from corral.actors.providers.local_schema import max_tokens_for

    config = LocalConfig(max_reply=160)
    request = ProviderRequest("run-bench", agent_id, task, 0, (), ())
    schema = answer_schema(config, request)
    return chat_messages(request, schema), schema, max_tokens_for(schema)


def _corral_round(home: Path, n: int) -> dict[str, Any]:
    started = time.time()
    run_ids = [_call(home, "run", agent_id=f"a{i}", task=_task(i))["run_id"] for i in range(n)]
    cursor = 0
    while True:
        # Blocking on the event stream, not polling: the bench must not take CPU
        # from the model (two threads on two cores) while it measures.
        status = {run["run_id"]: run["status"] for run in _call(home, "runs")["runs"] if run["run_id"] in run_ids}
        if any(value in ("failed", "cancelled") for value in status.values()):
            raise RuntimeError(f"runs ended badly: {status}")
        if sum(value == "completed" for value in status.values()) == len(run_ids):
            break
        cursor = _call(home, "events", since=cursor, wait_ms=2000)["cursor"]
    shown = [_call(home, "show", run_id=run_id) for run_id in run_ids]
    if any(view["usage"]["format_repairs"] for view in shown):
        raise RuntimeError("a run needed a format repair despite the grammar")
    finished = max(float(view["run"]["updated_at"]) for view in shown)
    return {"wall_s": finished - started, "run_ids": run_ids}


def _responses(home: Path, run_ids: list[str]) -> list[dict[str, Any]]:
    """Each run's committed answer with its timings, in the order they were served."""
    import sqlite3

    db = sqlite3.connect(f"file:{home / 'ledger.db'}?mode=ro", uri=True)
    try:
        marks = ",".join("?" * len(run_ids))
        rows = db.execute(
            f"SELECT r.agent_id, r.task, p.response, p.started_at FROM provider_requests p JOIN runs r"
            f" ON r.run_id = p.run_id WHERE p.run_id IN ({marks}) AND p.response IS NOT NULL ORDER BY p.finished_at",
            run_ids,
        ).fetchall()
    finally:
        db.close()
    return [{"agent_id": agent, "task": task, **json.loads(response)} for agent, task, response, _ in rows]


def _direct(llama: Any, prompts: list[tuple[list[dict[str, Any]], dict[str, Any], int]]) -> dict[str, Any]:
    """The same prompts, served one after another as one shared model must."""
    from llama_cpp import LlamaGrammar

    started = time.perf_counter()
    ttfts, tokens = [], 0
    for messages, schema, max_tokens in prompts:
        first: list[float] = []

        def tick(_tokens: Any, scores: Any, first: list[float] = first) -> Any:
            if not first:
                first.append(time.perf_counter())
            return scores

        body = llama.create_chat_completion(
            messages=messages,
            grammar=LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False),
            max_tokens=max_tokens,
            temperature=0.0,
            repeat_penalty=1.0,
            seed=0,
            logits_processor=[tick],
        )
        tokens += int(body["usage"]["completion_tokens"])
        # Queue included: what the k-th of N simultaneous requests waits for.
        ttfts.append(((first[0] if first else time.perf_counter()) - started) * 1000)
    return {"wall_s": time.perf_counter() - started, "ttft_ms": ttfts, "tokens": tokens}


@workload("real_model_swarm", group="corral", budget_s=900, quick_budget_s=300)
def real_model_swarm(ctx: Context) -> Metrics:
    """N = 1, 2, 4, 8 agents share one SmolLM2-135M model actor on the CPU, each run
    one provider turn; beside llama-cpp-python driven directly with the same prompts
    and grammar in the same bench run; and the same agents through llama_cpp.server
    (the openai provider's route). Return, per N, {"tokens_per_s_{n}",
    "direct_tokens_per_s_{n}", "ttft_ms_{n}", "direct_ttft_ms_{n}", "overhead_pct_{n}",
    "server_tokens_per_s_{n}", "server_wall_s_{n}"}."""
    try:
        from llama_cpp import Llama
    except ImportError as exc:
        raise NotRun(f"llama-cpp-python is not installed (make demo-local installs it): {exc}") from None
    from corral.supervisor.models.model_spec import packaged_model_file

    llama = Llama(model_path=str(packaged_model_file("smollm2")), n_threads=2, n_ctx=2048, n_batch=512, seed=0,
                  verbose=False)
    rounds = ctx.reps(1, 3)
    counts = AGENT_COUNTS[:3] if ctx.quick else AGENT_COUNTS
    for n in counts:
        walls, direct_walls, ttft, direct_ttft, tps, direct_tps, shares = [], [], [], [], [], [], []
        with supervisor(ctx, _spec(n)) as home:
            _wait_all_ready(home, n + 1, 120)
            _corral_round(home, 1)  # warm: the model's first request after load
            for _ in range(rounds):
                ctx.check(f"real_model_swarm n={n}")
                result = _corral_round(home, n)
                served = _responses(home, result["run_ids"])
                prompts = [_prompt(entry["agent_id"], entry["task"]) for entry in served]
                direct = _direct(llama, prompts)
                tokens = sum(int(entry["usage"]["completion_tokens"]) for entry in served)
                if tokens != direct["tokens"]:
                    ctx.note(f"n={n}: corral generated {tokens} tokens, direct {direct['tokens']} (same prompts)")
                walls.append(result["wall_s"])
                direct_walls.append(direct["wall_s"])
                tps.append(tokens / result["wall_s"])
                direct_tps.append(direct["tokens"] / direct["wall_s"])
                ttft += [entry["timings"]["queue_ms"] + entry["timings"]["ttft_ms"] for entry in served]
                direct_ttft += direct["ttft_ms"]
                # Per token, so a different answer length does not count as overhead.
                corral_per_token = result["wall_s"] / max(tokens, 1)
                direct_per_token = direct["wall_s"] / max(direct["tokens"], 1)
                shares.append(100 * (corral_per_token - direct_per_token) / corral_per_token)
        ctx.metrics[f"tokens_per_s_{n}"] = Stats.of(tps, "tok/s")
        ctx.metrics[f"direct_tokens_per_s_{n}"] = Stats.of(direct_tps, "tok/s")
        ctx.metrics[f"ttft_ms_{n}"] = Stats.of(ttft, "ms")
        ctx.metrics[f"direct_ttft_ms_{n}"] = Stats.of(direct_ttft, "ms")
        ctx.metrics[f"overhead_pct_{n}"] = Stats.of(shares, "%")
        ctx.metrics[f"wall_s_{n}"] = Stats.of(walls, "s")
        ctx.metrics[f"direct_wall_s_{n}"] = Stats.of(direct_walls, "s")
    with _llama_server(packaged_model_file("smollm2")) as base_url:
        for n in counts:
            _server_rounds(ctx, base_url, n, rounds)
    ctx.note("server_*: the same agents on the openai provider, structured = json_object, via llama_cpp.server")
    ctx.note("TTFT includes queueing behind the other agents' requests (one model, one request at a time)")
    ctx.note("overhead: corral's wall time per generated token minus the direct one, as a share of corral's")
    return ctx.metrics
