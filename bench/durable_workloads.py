"""``durable_actions``: durable read actions per second, corral beside its peers.

corral: scripted agents (no think time) whose every plan is three ``fs.list``
actions, through the whole durable loop (provider lifecycle, plan, prepared,
executing, ok, receipt), at 1, 8 and 64 agents. In the same run:

* the bare-SQLite limit on this disk (one fsync'd transaction per transition);
* DBOS Transact on SQLite: ``@DBOS.step`` calls per second (each step a directory
  listing) in 50-step workflows, from 1 and 8 threads;
* LangGraph with ``SqliteSaver``: checkpointed steps per second (each a directory
  listing), from 1 and 8 threads.

The peers run in their own processes, their own SQLite files, with
``synchronous = FULL`` set on every connection they open and checked (corral's
ledger runs FULL too: group commit, no reply before the fsync covering it).

CPU per action, beside the rates: corral's supervisor and every process under it
(agents, fork server), user + system time from /proc over each round, per action
(``cpu_ms_per_action_{n}``; the supervisor's share ``supervisor_cpu_ms_per_action_{n}``);
each peer's own process CPU over each round, per step (``{peer}_cpu_ms_per_step_{t}``).
It depends less on the machine's load than the rates do.

Telemetry: the 8-agent figure again on a supervisor that exports every finished
run's trace over OTLP/HTTP (``[telemetry]``, docs/telemetry.md) to a loopback
endpoint that drops it (bench/otlp_drop.py), beside the same figure with
telemetry off, same run: ``telemetry_on_ratio_8`` is on / off.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from bench.corral_workloads import _call, _wait_all_ready, supervisor
from bench.harness import Context, Metrics, NotRun, Stats, workload
from bench.otlp_drop import otlp_drop

AGENT_COUNTS = (1, 8, 64)
PER_PLAN = 3
#: What one action costs in ledger transitions: prepared, executing, ok.
TRANSITIONS_PER_ACTION = 3
#: SQLite's ``PRAGMA synchronous`` value for FULL: every peer runs with it, as corral does.
FULL = 2
#: The agent count of the telemetry on/off pair.
TELEMETRY_AGENTS = 8

DBOS_SCRIPT = r"""
import json, os, sys, threading, time
from dbos import DBOS
from sqlalchemy import event
from sqlalchemy.engine import Engine
path, listing, threads, steps, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
synchronous = []

@event.listens_for(Engine, "connect")
def full_sync(dbapi_conn, record):
    # The same durability as corral's: fsync at every commit (SQLite's FULL).
    dbapi_conn.execute("PRAGMA synchronous=FULL")
    synchronous.append(dbapi_conn.execute("PRAGMA synchronous").fetchone()[0])

DBOS(config={"name": "bench", "system_database_url": f"sqlite:///{path}", "run_admin_server": False})

@DBOS.step()
def list_dir() -> int:
    return len(os.listdir(listing))

@DBOS.workflow()
def workflow(n: int) -> int:
    return sum(list_dir() for _ in range(n))

DBOS.launch()
workflow(2)
rates, cpu = [], []
for _ in range(rounds):
    start, used = time.perf_counter(), time.process_time()
    workers = [threading.Thread(target=workflow, args=(steps,)) for _ in range(threads)]
    for w in workers: w.start()
    for w in workers: w.join()
    rates.append(threads * steps / (time.perf_counter() - start))
    cpu.append((time.process_time() - used) / (threads * steps))
DBOS.destroy()
print(json.dumps({"rates": rates, "cpu_s_per_step": cpu, "synchronous": sorted(set(synchronous))}))
"""

LANGGRAPH_SCRIPT = r"""
import json, os, sqlite3, sys, threading, time
from typing import TypedDict
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
path, listing, threads, steps, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])

class State(TypedDict):
    i: int
    n: int

def step(state: State) -> dict:
    os.listdir(listing)
    return {"i": state["i"] + 1}

graph = StateGraph(State)
graph.add_node("step", step)
graph.add_edge(START, "step")
graph.add_conditional_edges("step", lambda s: END if s["i"] >= steps else "step")
conn = sqlite3.connect(path, check_same_thread=False)
saver = SqliteSaver(conn)
saver.setup()  # its own pragmas (WAL) first, then the same durability as corral's
conn.execute("PRAGMA synchronous=FULL")
app = graph.compile(checkpointer=saver)
counter = [0]

def run() -> None:
    counter[0] += 1
    config = {"configurable": {"thread_id": f"t{counter[0]}-{threading.get_ident()}"}, "recursion_limit": steps + 10}
    app.invoke({"i": 0, "n": steps}, config)

run()
rates, cpu = [], []
for _ in range(rounds):
    start, used = time.perf_counter(), time.process_time()
    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers: w.start()
    for w in workers: w.join()
    rates.append(threads * steps / (time.perf_counter() - start))
    cpu.append((time.process_time() - used) / (threads * steps))
sync = conn.execute("PRAGMA synchronous").fetchone()[0]
print(json.dumps({"rates": rates, "cpu_s_per_step": cpu, "synchronous": [sync]}))
"""


def _spec(agents: int, loops: int, telemetry: str = "") -> str:
    """``telemetry``: an OTLP endpoint to export traces to; empty: telemetry off,
    whatever ``OTEL_*`` the bench's environment holds."""
    step = "  [[agents.steps]]\n  actions = [" + ", ".join(
        '{ tool = "fs.list", input = { path = "." } }' for _ in range(PER_PLAN)
    ) + "]\n"
    blocks = "".join(
        f'\n[[agents]]\nid = "a{i}"\n' + step * loops + '  [[agents.steps]]\n  final = "ok"\n' for i in range(agents)
    )
    traces = f'enabled = true\nendpoint = "{telemetry}"' if telemetry else "enabled = false"
    return f'[project]\nroot = "ws"\n[supervisor]\nsynchronous = "full"\n[telemetry]\n{traces}\n{blocks}'


def _tree_cpu_s(home: Path) -> tuple[float, float]:
    """CPU seconds (user + system, from /proc) used so far by the home's supervisor
    and by every process under it (agents, forkserver): (supervisor, the rest)."""
    sup = psutil.Process(int(_call(home, "ping")["pid"]))
    own = sup.cpu_times()
    rest = 0.0
    for child in sup.children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue  # gone meanwhile: not one of the long-lived agents
        rest += times.user + times.system
    return own.user + own.system, rest


def _corral_rate(home: Path, agents: int, loops: int, cpu: list[tuple[float, float]] | None = None) -> float:
    """Actions per second of one round; ``cpu``: gets the round's CPU milliseconds per
    action, (supervisor, agents), measured over the round."""
    before = _tree_cpu_s(home) if cpu is not None else (0.0, 0.0)
    start = time.perf_counter()
    run_ids = {_call(home, "run", agent_id=f"a{i}", task="durable")["run_id"] for i in range(agents)}
    # One blocking ``wait`` in the supervisor (it wakes on commits): the driver takes
    # no CPU from the runs while they run.
    while True:
        reply = _call(home, "wait", timeout=40, run_ids=sorted(run_ids), until="settled", wait_ms=30_000)
        if reply["reached"]:
            break
    elapsed = time.perf_counter() - start
    bad = {run_id: status for run_id, status in reply["runs"].items() if status != "completed"}
    if bad:
        raise RuntimeError(f"a run ended badly: {bad}")
    actions = agents * loops * PER_PLAN
    if cpu is not None:
        after = _tree_cpu_s(home)
        cpu.append(((after[0] - before[0]) * 1e3 / actions, (after[1] - before[1]) * 1e3 / actions))
    return actions / elapsed


def _telemetry_on(ctx: Context, agents: int, loops: int, rounds: int, off: list[float]) -> None:
    """The same figure with every finished run exported as a trace; ``off``: its rates
    with telemetry off, just measured."""
    try:
        import opentelemetry.sdk  # noqa: F401 - the telemetry extra
    except ImportError as exc:
        ctx.skip(f"actions_per_s_{agents}_telemetry", f"the telemetry extra is not installed: {exc}")
        return
    rates = []
    with otlp_drop() as (endpoint, received), supervisor(ctx, _spec(agents, loops, endpoint)) as home:
        _wait_all_ready(home, agents, 120)
        for _ in range(rounds):
            ctx.check(f"durable_actions n={agents}, telemetry on")
            rates.append(_corral_rate(home, agents, loops))
    if received.requests == 0:
        raise RuntimeError("telemetry on, yet no trace reached the endpoint")
    on = Stats.of(rates, "per s")
    ctx.metrics[f"actions_per_s_{agents}_telemetry"] = on
    ctx.metrics[f"telemetry_on_ratio_{agents}"] = Stats.single(on.median / Stats.of(off, "per s").median, "ratio")
    ctx.note(
        f"telemetry: {agents} agents exporting each finished run's trace (OTLP/HTTP to a loopback endpoint that"
        f" drops it: {received.requests} exports, {received.bytes // 1024} KiB) beside telemetry off, same run"
    )


def _sqlite_limit(ctx: Context) -> float:
    """One fsync'd (synchronous=FULL) transaction per transition: UPDATE + INSERT."""
    conn = sqlite3.connect(ctx.tmp / "limit.sqlite3", isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.executescript(
            "CREATE TABLE a (id TEXT PRIMARY KEY, phase TEXT); CREATE TABLE e (k INTEGER PRIMARY KEY, b BLOB);"
            "INSERT INTO a VALUES ('x', 'prepared');"
        )
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < 1.0:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE a SET phase = ? WHERE id = 'x'", (str(done),))
            conn.execute("INSERT INTO e (b) VALUES (?)", (b"x" * 200,))
            conn.execute("COMMIT")
            done += 1
        return done / (time.perf_counter() - start)
    finally:
        conn.close()


def _peer(ctx: Context, name: str, script: str, module: str, threads: int, steps: int, rounds: int) -> dict[str, Any]:
    """The peer's {"rates": steps/s per round, "cpu_s_per_step": its process CPU per
    step per round, "synchronous": the SQLite synchronous levels its connections ran}."""
    try:
        __import__(module)
    except ImportError as exc:
        raise NotRun(f"{module} is not installed (the bench extra): {exc}") from None
    path = ctx.tmp / f"{name}-{threads}.sqlite3"
    listing = ctx.tmp / "listing"
    listing.mkdir(exist_ok=True)
    result = subprocess.run(
        [sys.executable, "-c", script, str(path), str(listing), str(threads), str(steps), str(rounds)],
        capture_output=True,
        text=True,
        timeout=max(30.0, ctx.remaining()),
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{name}: {result.stderr.strip()[-400:]}")
    measured: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    if measured["synchronous"] != [FULL]:
        raise RuntimeError(f"{name} ran with synchronous={measured['synchronous']}, not FULL ({FULL})")
    return measured


@workload("durable_actions", group="corral", budget_s=600, quick_budget_s=150)
def durable_actions(ctx: Context) -> Metrics:
    """Durable read actions/s through the full loop at 1, 8 and 64 agents, beside the
    bare-SQLite limit, DBOS steps/s and LangGraph checkpointed steps/s (1 and 8
    threads), same run, with the CPU each spends per action (step). Return
    {"actions_per_s_{n}", "transitions_per_s_{n}", "cpu_ms_per_action_{n}",
    "supervisor_cpu_ms_per_action_{n}", "sqlite_limit_per_s",
    "{dbos,langgraph}_steps_per_s_{1,8}", "{dbos,langgraph}_cpu_ms_per_step_{1,8}"}."""
    rounds = ctx.reps(1, 3)
    limit = _sqlite_limit(ctx)
    ctx.metrics["sqlite_limit_per_s"] = Stats.single(limit, "per s")
    counts = AGENT_COUNTS if not ctx.quick else (1, 8)
    for agents in counts:
        # At least the same loops per agent at every count: with fewer, the 64-agent
        # figure measured starting 64 runs more than running their actions. One agent
        # runs more of them (300 actions, not 60), so that starting its run and the
        # first wake-up weigh as little as with eight.
        loops = max(ctx.reps(8, 20), ctx.reps(40, 100) // agents)
        rates = []
        cpu: list[tuple[float, float]] = []
        with supervisor(ctx, _spec(agents, loops)) as home:
            _wait_all_ready(home, agents, 120)
            for _ in range(rounds):
                ctx.check(f"durable_actions n={agents}")
                rates.append(_corral_rate(home, agents, loops, cpu))
        ctx.metrics[f"actions_per_s_{agents}"] = Stats.of(rates, "per s")
        ctx.metrics[f"cpu_ms_per_action_{agents}"] = Stats.of([s + a for s, a in cpu], "ms")
        ctx.metrics[f"supervisor_cpu_ms_per_action_{agents}"] = Stats.of([s for s, _ in cpu], "ms")
        ctx.metrics[f"transitions_per_s_{agents}"] = Stats.of(
            [rate * TRANSITIONS_PER_ACTION for rate in rates], "per s"
        )
        if agents == TELEMETRY_AGENTS:
            _telemetry_on(ctx, agents, loops, rounds, rates)
    for threads in (1, 8):
        for name, script, module in (
            ("dbos", DBOS_SCRIPT, "dbos"),
            ("langgraph", LANGGRAPH_SCRIPT, "langgraph.checkpoint.sqlite"),
        ):
            try:
                measured = _peer(ctx, name, script, module, threads, 50, rounds)
            except (NotRun, RuntimeError, subprocess.TimeoutExpired, KeyError, ValueError) as exc:
                ctx.skip(f"{name}_steps_per_s_{threads}", str(exc)[:200])
                continue
            ctx.metrics[f"{name}_steps_per_s_{threads}"] = Stats.of(measured["rates"], "per s")
            ctx.metrics[f"{name}_cpu_ms_per_step_{threads}"] = Stats.of(
                [cpu_s * 1e3 for cpu_s in measured["cpu_s_per_step"]], "ms"
            )
    ctx.note(f"corral: {PER_PLAN} fs.list actions per plan, scripted provider, synchronous=FULL (group commit:"
             " no reply before the fsync covering its commit)")
    ctx.note("transitions: prepared, executing, ok per action; SQLite limit: one fsync'd transaction each")
    ctx.note("peers: on SQLite with synchronous=FULL (checked on their connections), in their own process;"
             " each step lists a directory")
    ctx.note("CPU per action: corral's supervisor and every process under it (agents, forkserver), user + system"
             " from /proc over each round; peers: their process CPU over each round / steps"
             + _cpu_summary(ctx.metrics))
    return ctx.metrics


def _cpu_summary(metrics: Metrics) -> str:
    """``: corral 1 agent 0.9 ms, ...``: the CPU figures side by side, for the note."""
    shown = [
        f"{label} {value.median:.2f} ms"
        for key, label in (
            ("cpu_ms_per_action_1", "corral 1 agent"),
            ("cpu_ms_per_action_8", "corral 8 agents"),
            ("langgraph_cpu_ms_per_step_1", "LangGraph 1 thread"),
            ("langgraph_cpu_ms_per_step_8", "LangGraph 8 threads"),
            ("dbos_cpu_ms_per_step_1", "DBOS 1 thread"),
            ("dbos_cpu_ms_per_step_8", "DBOS 8 threads"),
        )
        if isinstance(value := metrics.get(key), Stats)
    ]
    return ": " + ", ".join(shown) if shown else ""


def ratios(metrics: dict[str, Any]) -> dict[str, float]:
    """The share of the SQLite limit each corral figure reaches."""
    limit = metrics["sqlite_limit_per_s"]["median"]
    return {
        key: metrics[key]["median"] / limit for key in metrics if key.startswith("transitions_per_s_") and limit > 0
    }
