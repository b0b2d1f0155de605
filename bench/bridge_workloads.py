"""``bridge_handoffs``: discover -> claim -> start -> submit cycles per second
through the task bridge (JSON-RPC over HTTP, one fsync'd SQLite transaction per
command), with 1 and 8 concurrent clients, beside the bare-SQLite limit in the
same run (one fsync'd transaction per mutating command: three per cycle); and
with 1 client on a database that already holds 10,000 handed-off tasks, beside a
fresh one, as a ratio (a scan grew with the database: issue 32)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.durable_workloads import _sqlite_limit
from bench.harness import Context, Metrics, NotRun, Stats, workload

WORKERS = 8
COMMANDS_PER_CYCLE = 3
#: How many handed-off tasks the grown database holds, and the cycles of one batch
#: when it is measured against a fresh one.
GROWN_TASKS = 10_000
BATCH = 15


def _serve(ctx: Context, tokens: dict[str, str], db: Path | None = None) -> tuple[subprocess.Popen[str], str]:
    registration = ctx.tmp / "principals.json"
    registration.write_text(json.dumps({"principals": {n: {"token": t} for n, t in tokens.items()}}))
    registration.chmod(0o600)  # it holds the tokens: the bridge refuses it otherwise
    process = subprocess.Popen(
        [sys.executable, "-m", "corral", "bridge", "serve", "--db", str(db or ctx.tmp / f"bridge-{time.time_ns()}.db"),
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
            for _ in queues[name]:
                # What a worker does (actors/bridge_worker.py): find a task, then take it.
                task = client.call("task.discover", limit=1)["tasks"][0]
                claimed = client.call("assignment.claim", task_id=task["task_id"], expected_revision=task["revision"],
                                      binding_id=binding)
                run = client.call("run.start", task_id=task["task_id"], expected_revision=claimed["revision"],
                                  assignment_id=claimed["assignment"]["assignment_id"])
                client.call("run.submit", task_id=task["task_id"], expected_revision=run["revision"],
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


def _grow(db: Path, tasks: int, workers: list[str]) -> None:
    """A database that has handed off ``tasks`` tasks (create, grant, claim, start,
    submit each), written through the bridge's own store, every check included;
    without fsync, which is not what is measured here."""
    from corral.bridge.access import expire
    from corral.bridge.methods import METHODS
    from corral.bridge.store import Store

    store = Store(db, METHODS, expire)
    try:
        store.db.execute("PRAGMA synchronous = OFF")
        keys = (f"grow-{n:09d}" for n in itertools.count())
        bindings = {name: store.execute(name, "binding.enable", {"idempotency_key": next(keys)}, "grow")
                    ["binding"]["binding_id"] for name in workers}
        for n in range(tasks):
            name = workers[n % len(workers)]
            task = store.execute("owner", "task.create", {"title": "old", "publish": True,
                                                          "idempotency_key": next(keys)}, "grow")["task"]
            granted = store.execute("owner", "grant.create", {
                "task_id": task["task_id"], "expected_revision": task["revision"], "principal": name,
                "permissions": ["claim"], "idempotency_key": next(keys)}, "grow")
            claimed = store.execute(name, "assignment.claim", {
                "task_id": task["task_id"], "expected_revision": granted["revision"], "binding_id": bindings[name],
                "idempotency_key": next(keys)}, "grow")
            run = store.execute(name, "run.start", {
                "task_id": task["task_id"], "expected_revision": claimed["revision"],
                "assignment_id": claimed["assignment"]["assignment_id"], "idempotency_key": next(keys)}, "grow")
            store.execute(name, "run.submit", {
                "task_id": task["task_id"], "expected_revision": run["revision"], "run_id": run["run"]["run_id"],
                "result": {"summary": "done"}, "idempotency_key": next(keys)}, "grow")
    finally:
        store.close()


def _rates(ctx: Context, tokens: dict[str, str], workers: int, per_worker: int, rounds: int,
           db: Path | None = None) -> list[float]:
    process, url = _serve(ctx, tokens, db)
    try:
        return [_cycles_per_s(url, tokens, workers, per_worker) for _ in range(rounds)]
    finally:
        process.terminate()
        process.wait(timeout=20)


@workload("bridge_handoffs", group="corral", budget_s=300, quick_budget_s=150)
def bridge_handoffs(ctx: Context) -> Metrics:
    """Discover -> claim -> start -> submit cycles/s with 1 and 8 concurrent clients,
    the bare-SQLite limit (fsync'd transactions/s, / 3 per cycle), and 1 client on a
    database grown to 10,000 handed-off tasks beside a fresh one, as a ratio. Return
    {"cycles_per_s_1", "cycles_per_s_8", "sqlite_limit_cycles_per_s",
    "cycles_per_s_1_fresh", "cycles_per_s_1_at_10000_tasks", "ratio_10000_tasks_vs_fresh"}."""
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
        rates = _rates(ctx, tokens, workers, per_worker * (WORKERS // workers) // 2 or 1, rounds)
        ctx.metrics[f"cycles_per_s_{workers}"] = Stats.of(rates, "per s")
    # Grown against fresh, one client, both served at once and measured in short
    # alternating batches: the load of a shared machine drifts by 2x within a
    # minute, and each pair of batches sees the same drift. The grown database's
    # old tasks were all the workers'.
    ctx.check("before growing the database")
    grown = ctx.tmp / "grown.db"
    started = time.perf_counter()
    _grow(grown, GROWN_TASKS, [f"w{i}" for i in range(WORKERS)])
    ctx.note(f"bridge_handoffs: {GROWN_TASKS} tasks handed off in {time.perf_counter() - started:.0f} s to grow the"
             " database (no fsync)")
    fresh_process, fresh_url = _serve(ctx, tokens)
    grown_process, grown_url = _serve(ctx, tokens, grown)
    fresh_rates: list[float] = []
    grown_rates: list[float] = []
    try:
        for pair in range(ctx.reps(8, 16)):
            ctx.check("fresh against grown")
            # Each goes first in every other pair: a batch's writes still being
            # flushed slow the fsyncs of the batch after it.
            for url, rates in [(fresh_url, fresh_rates), (grown_url, grown_rates)][:: 1 if pair % 2 else -1]:
                rates.append(_cycles_per_s(url, tokens, 1, BATCH))
    finally:
        for process in (fresh_process, grown_process):
            process.terminate()
            process.wait(timeout=20)
    ctx.metrics["cycles_per_s_1_fresh"] = Stats.of(fresh_rates, "per s")
    ctx.metrics[f"cycles_per_s_1_at_{GROWN_TASKS}_tasks"] = Stats.of(grown_rates, "per s")
    ratios = [g / f for g, f in zip(grown_rates, fresh_rates, strict=True)]
    ctx.metrics[f"ratio_{GROWN_TASKS}_tasks_vs_fresh"] = Stats.of(ratios, "x")
    return ctx.metrics
