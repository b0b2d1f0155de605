"""``bridge_handoffs``: claim -> start -> submit cycles per second through the task
bridge (JSON-RPC over HTTP, one fsync'd SQLite transaction per command), with 1
and 8 concurrent clients, beside the bare-SQLite limit in the same run (one
fsync'd transaction per command: three per cycle)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

from bench.durable_workloads import _sqlite_limit
from bench.harness import Context, Metrics, NotRun, Stats, workload

WORKERS = 8
COMMANDS_PER_CYCLE = 3


def _serve(ctx: Context, tokens: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    registration = ctx.tmp / "principals.json"
    registration.write_text(json.dumps({"principals": {n: {"token": t} for n, t in tokens.items()}}))
    process = subprocess.Popen(
        [sys.executable, "-m", "corral", "bridge", "serve", "--db", str(ctx.tmp / f"bridge-{time.time_ns()}.db"),
         "--listen", "127.0.0.1:0", "--principals", str(registration), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        process.wait(timeout=10)
        raise NotRun("corral bridge serve did not start")
    return process, json.loads(line)["url"]


def _cycles_per_s(url: str, tokens: dict[str, str], workers: int, per_worker: int) -> float:
    from corral.bridge import Client

    owner = Client(url, tokens["owner"])
    names = [f"w{i}" for i in range(workers)]
    queues: dict[str, list[str]] = {name: [] for name in names}
    for name in names:
        for _ in range(per_worker):
            task_id = owner.call("task.create", title="handoff", publish=True)["task"]["task_id"]
            owner.call("grant.create", task_id=task_id, expected_revision=1, principal=name, permissions=["claim"])
            queues[name].append(task_id)
    errors: list[str] = []

    def work(name: str) -> None:
        client = Client(url, tokens[name])
        binding = client.call("binding.enable")["binding"]["binding_id"]
        ready.wait()
        try:
            for task_id in queues[name]:
                claimed = client.call("assignment.claim", task_id=task_id, expected_revision=2, binding_id=binding)
                run = client.call("run.start", task_id=task_id, expected_revision=claimed["revision"],
                                  assignment_id=claimed["assignment"]["assignment_id"])
                client.call("run.submit", task_id=task_id, expected_revision=run["revision"],
                            run_id=run["run"]["run_id"], result={"summary": "done"})
        except Exception as exc:  # reported below, never hidden
            errors.append(f"{type(exc).__name__}: {exc}")

    ready = threading.Event()
    threads = [threading.Thread(target=work, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # every worker has its binding
    started = time.perf_counter()
    ready.set()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(errors[0])
    return workers * per_worker / elapsed


@workload("bridge_handoffs", group="corral", budget_s=240, quick_budget_s=120)
def bridge_handoffs(ctx: Context) -> Metrics:
    """Claim -> start -> submit cycles/s with 1 and 8 concurrent clients, and the
    bare-SQLite limit (fsync'd transactions/s, / 3 per cycle). Return
    {"cycles_per_s_1", "cycles_per_s_8", "sqlite_limit_cycles_per_s"}."""
    try:
        import corral.bridge  # noqa: F401
    except ImportError as exc:
        raise NotRun(f"corral is not importable: {exc}") from None
    tokens = {"owner": "owner-token-0123456789", **{f"w{i}": f"worker-{i}-token-0123456789" for i in range(WORKERS)}}
    limit = _sqlite_limit(ctx)
    ctx.metrics["sqlite_limit_cycles_per_s"] = Stats.single(limit / COMMANDS_PER_CYCLE, "per s")
    rounds = ctx.reps(2, 3)
    per_worker = ctx.reps(10, 30)
    for workers in (1, WORKERS):
        process, url = _serve(ctx, tokens)
        try:
            rates = [_cycles_per_s(url, tokens, workers, per_worker * (WORKERS // workers) // 2 or 1)
                     for _ in range(rounds)]
        finally:
            process.terminate()
            process.wait(timeout=20)
        ctx.metrics[f"cycles_per_s_{workers}"] = Stats.of(rates, "per s")
    return ctx.metrics


