"""corral's side of every figure. PLUG POINT: fill these in as corral's API lands.

Each function below is a workload whose name is the figure's name (see
``bench.figures``); it returns the metrics that figure reads, under exactly the keys
listed in its docstring. How to write one:

    @workload("rtt_actor_supervisor", group="corral", budget_s=120, quick_budget_s=20)
    def rtt_actor_supervisor(ctx: Context) -> Metrics:
        require_corral()
        ...start a supervisor with its home under ctx.tmp (short, for ipc:// paths)...
        samples = [...]  # µs per round trip; or Stats from bench.harness.time_calls
        return {"rtt_64B": Stats.of(samples, "µs"), "rtt_4KiB": Stats.of(..., "µs")}

Rules (the same as for the baselines):
- Return ``Metrics`` (dict[str, Stats | float | int | bool]). A Stats is compared by
  its median; a plain number is one sample. Units are converted within time units
  (ns/µs/ms/s) and size units (B/KiB/MiB), so Stats.of(samples, "ms") for a figure
  in µs is fine. Repeat enough for a median and p99: use ``ctx.reps(quick, full)``.
- Stay within ``ctx.deadline`` (``ctx.remaining()`` s left); the runner interrupts a
  workload past it with WorkloadTimeout and reports "timed out". Record into
  ``ctx.metrics`` as you go (and return it) to keep what was measured if that
  happens. Under --quick the whole corral group should take ~40 s or less, so that
  ``python -m bench --quick`` stays under 2 minutes on 2 cores.
- Stop everything you start (``corral down``, then wait) in a ``finally``; the
  runner then kills and reports whatever is left (it is a subreaper, so detached
  daemons are seen too).
- Raise ``NotRun(reason)`` when it cannot run; ``ctx.skip(metric, reason)`` for one
  metric (e.g. under --quick); ``ctx.note(text)`` for a note in the table.
- Use the same payloads as the baselines: 64 B and 4 KiB (os.urandom).
"""

from __future__ import annotations

import importlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from bench.harness import Context, Metrics, NotRun, Stats, workload

# ---- CORRAL_AVAILABLE: is corral importable? ----------------------------------------
try:
    importlib.import_module("corral.supervisor.daemon")
except ImportError as exc:
    CORRAL_AVAILABLE = False
    CORRAL_MISSING = f"corral failed to import: {exc}"
else:
    CORRAL_AVAILABLE = True
    CORRAL_MISSING = ""
# --------------------------------------------------------------------------------------


def require_corral() -> None:
    """Raise NotRun while corral cannot be imported."""
    if not CORRAL_AVAILABLE:
        raise NotRun(CORRAL_MISSING)


# -- running a supervisor for a workload -----------------------------------------------

_homes = itertools.count(1)


def _echo_spec(n: int) -> str:
    # Intensity far above what a benchmark causes: restarts are measured, not limited.
    # The probes: the supervisor's sink for one-way tells, the ledger event emitter.
    return f"""[supervisor]
probes = true
[[groups]]
id = "bench"
max_restarts = 100000
period_s = 1
[[actors]]
id = "{'e-1' if n == 1 else 'e'}"
template = "echo"
count = {n}
group = "bench"
"""


@contextmanager
def supervisor(ctx: Context, spec_text: str, up_args: tuple[str, ...] = ()) -> Iterator[Path]:
    """A supervisor on ``spec_text`` in a new home (``up_args``: more ``corral up``
    flags, e.g. a shared ledger), stopped afterwards."""
    require_corral()
    base = ctx.tmp / f"c{next(_homes)}"
    (base / "ws").mkdir(parents=True)
    spec = base / "swarm.toml"
    spec.write_text(spec_text)
    home = base / "h"
    up = subprocess.run([sys.executable, "-m", "corral", "--home", str(home), "up", "--spec", str(spec),
                         "--timeout", "120", *up_args], capture_output=True, text=True, check=False, timeout=180)
    if up.returncode != 0:
        raise NotRun(f"corral up failed: {up.stderr.strip()[:200]}")
    try:
        yield home
    finally:
        subprocess.run([sys.executable, "-m", "corral", "--home", str(home), "down", "--timeout", "60"],
                       capture_output=True, check=False, timeout=120)


def _call(home: Path, method: str, timeout: float = 60, **params: Any) -> Any:
    from corral import client

    return client.call(home, method, timeout=timeout, **params)


def _ask(home: Path, actor: str, body: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    reply: dict[str, Any] = _call(home, "request_actor", timeout=timeout + 5, actor_id=actor, body=body,
                                  timeout_s=timeout)
    return reply


def _events(home: Path) -> list[dict[str, Any]]:
    from corral import client

    return client.all_events(home)


def _wait_all_ready(home: Path, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    cursor = 0
    while True:
        actors = _call(home, "status")["actors"]
        if sum(1 for a in actors if a["status"] == "running") >= n:
            return
        if time.monotonic() > deadline:
            raise NotRun(f"only part of {n} actors became ready within {timeout}s")
        cursor = _call(home, "events", since=cursor, wait_ms=1000)["cursor"]


def _launch_to_ready_s(home: Path) -> float:
    """First actor-started to last actor-ready, from the supervisor's own clock."""
    events = _events(home)
    started = [e["at"] for e in events if e["kind"] == "actor-started"]
    ready = [e["at"] for e in events if e["kind"] == "actor-ready"]
    return float(max(ready) - min(started))


def _uss_mib(home: Path) -> float:
    pids = [a["pid"] for a in _call(home, "status")["actors"] if a["pid"]]
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_full_info().uss
        except psutil.Error:
            continue
    return total / len(pids) / 2**20 if pids else 0.0


# -- messaging -------------------------------------------------------------------------


def _rtt(ctx: Context, target: str, actors: int) -> Metrics:
    with supervisor(ctx, _echo_spec(actors)) as home:
        _wait_all_ready(home, actors, 60)
        n = ctx.reps(300, 3000)
        _ask(home, "e-1", {"op": "bench_rtt", "target": target, "n": 100, "size": 64})  # warm-up
        for size, key in ((64, "rtt_64B"), (4096, "rtt_4KiB")):
            samples = _ask(home, "e-1", {"op": "bench_rtt", "target": target, "n": n, "size": size})["us"]
            ctx.metrics[key] = Stats.of(samples, "µs")
    ctx.note("timed inside the actor; actor<->actor goes through the supervisor's router (two hops)"
             if target != "supervisor" else "timed inside the actor, one hop to the supervisor and back")
    return ctx.metrics


@workload("rtt_actor_supervisor", group="corral", budget_s=120, quick_budget_s=20)
def rtt_actor_supervisor(ctx: Context) -> Metrics:
    """Request RTT actor<->supervisor. Return {"rtt_64B": Stats(µs), "rtt_4KiB": Stats(µs)}."""
    return _rtt(ctx, "supervisor", 1)


@workload("rtt_actor_actor", group="corral", budget_s=120, quick_budget_s=20)
def rtt_actor_actor(ctx: Context) -> Metrics:
    """Request RTT actor<->actor through corral's routing.
    Return {"rtt_64B": Stats(µs), "rtt_4KiB": Stats(µs)}."""
    return _rtt(ctx, "e-2", 2)


def _throughput(ctx: Context, batch: int) -> Metrics:
    with supervisor(ctx, _echo_spec(1)) as home:
        _wait_all_ready(home, 1, 60)
        n = ctx.reps(5000, 50000)
        rates = []
        for _ in range(ctx.reps(2, 5)):
            result = _ask(home, "e-1", {"op": "bench_tells", "n": n, "batch": batch, "size": 64}, timeout=300)
            rates.append(result["n"] / result["elapsed_s"])
            ctx.check("throughput")
        ctx.metrics["msgs_per_s"] = Stats.of(rates, "msgs/s")
    ctx.note(f"actor -> supervisor tells, 64 B, {'batches of ' + str(batch) if batch > 1 else 'one per frame'},"
             " counted by the supervisor")
    return ctx.metrics


@workload("oneway_throughput", group="corral", budget_s=90, quick_budget_s=15)
def oneway_throughput(ctx: Context) -> Metrics:
    """One-way tells, 64 B, no batching. Return {"msgs_per_s": Stats(msgs/s)}."""
    return _throughput(ctx, 1)


@workload("oneway_throughput_batched", group="corral", budget_s=90, quick_budget_s=15)
def oneway_throughput_batched(ctx: Context) -> Metrics:
    """One-way tells, 64 B, with corral's batching. Return {"msgs_per_s": Stats(msgs/s)}."""
    return _throughput(ctx, 64)


# -- processes ---------------------------------------------------------------------------


def _spawn(ctx: Context, n: int, reps: int) -> Metrics:
    samples = []
    for _ in range(reps):
        with supervisor(ctx, _echo_spec(n)) as home:
            _wait_all_ready(home, n, ctx.remaining())
            samples.append(_launch_to_ready_s(home))
        ctx.check(f"spawn {n}")
    ctx.metrics["ready_s"] = Stats.of(samples, "s")
    ctx.note("first launch to last hello, from the supervisor's event clock (fork server, pipelined)")
    return ctx.metrics


@workload("spawn_50", group="corral", budget_s=120, quick_budget_s=20)
def spawn_50(ctx: Context) -> Metrics:
    """Start 50 echo actors until each answered ready. Return {"ready_s": Stats(s)}."""
    return _spawn(ctx, 50, ctx.reps(1, 3))


@workload("spawn_200", group="corral", budget_s=180, quick_budget_s=30)
def spawn_200(ctx: Context) -> Metrics:
    """Start 200 echo actors until each answered ready. Return {"ready_s": Stats(s)}."""
    return _spawn(ctx, 200, ctx.reps(1, 3))


@workload("spawn_1000", group="corral", budget_s=300, quick_budget_s=5)
def spawn_1000(ctx: Context) -> Metrics:
    """Start 1,000 echo actors until each answered ready (skipped under --quick:
    ctx.skip("ready_s", "skipped in --quick")). Return {"ready_s": Stats(s)}."""
    if ctx.quick:
        ctx.skip("ready_s", "skipped in --quick")
        return ctx.metrics
    return _spawn(ctx, 1000, 1)


@workload("restart_latency", group="corral", budget_s=120, quick_budget_s=20)
def restart_latency(ctx: Context) -> Metrics:
    """SIGKILL an echo actor; time until its replacement answers a request.
    Return {"restart_ms": Stats(ms)}."""
    with supervisor(ctx, _echo_spec(1)) as home:
        _wait_all_ready(home, 1, 60)
        samples = []
        for _ in range(ctx.reps(5, 30)):
            pid = _ask(home, "e-1", {"op": "stats"})["pid"]
            start = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            while True:
                try:
                    answer = _ask(home, "e-1", {"op": "stats"}, timeout=0.5)
                except Exception:
                    continue
                if answer["pid"] != pid:
                    break
            samples.append((time.perf_counter() - start) * 1000)
            ctx.check("restart")
            # Past the intensity period, so each kill is an isolated first crash
            # (restarted at once); repeated crashes back off by design.
            time.sleep(1.1)
        ctx.metrics["restart_ms"] = Stats.of(samples, "ms")
    ctx.note("isolated crashes (1.1 s apart): kill, pidfd exit, fork, child boot, hello, first answer")
    return ctx.metrics


@workload("idle_uss_200", group="corral", budget_s=180, quick_budget_s=30)
def idle_uss_200(ctx: Context) -> Metrics:
    """Memory per idle echo actor (USS via psutil) with 200 live.
    Return {"uss_mib": float(MiB)}."""
    with supervisor(ctx, _echo_spec(200)) as home:
        _wait_all_ready(home, 200, ctx.remaining())
        ctx.metrics["uss_mib"] = _uss_mib(home)
    return ctx.metrics


# -- swarms ----------------------------------------------------------------------------


def _fanout_spec(parents: int) -> str:
    agents = "".join(f"""
[[agents]]
id = "p{i}"
  [[agents.steps]]
  actions = [{{ tool = "agent.spawn_isolated", input = {{ children = [
    {{ template = "quick", task = "a", write_scopes = ["p{i}/a"] }},
    {{ template = "quick", task = "b", write_scopes = ["p{i}/b"] }},
    {{ template = "quick", task = "c", write_scopes = ["p{i}/c"] }} ] }} }}]
  [[agents.steps]]
  actions = [{{ tool = "agent.run_status", input = {{}} }}]
  [[agents.steps]]
  final = "joined"
""" for i in range(parents))
    return f"""
[project]
root = "ws"
[supervisor]
synchronous = "full"
[[templates]]
id = "quick"
  [[templates.steps]]
  final = "done"
{agents}"""


def _fanout(ctx: Context, parents: int, rounds: int) -> Metrics:
    samples = []
    rows_per_join = []
    with supervisor(ctx, _fanout_spec(parents)) as home:
        _wait_all_ready(home, parents, 60)
        for _ in range(rounds):
            runs = [_call(home, "run", agent_id=f"p{i}", task="fan out")["run_id"] for i in range(parents)]
            deadline = time.monotonic() + ctx.remaining()
            while any(_call(home, "show", run_id=r)["run"]["status"] not in ("completed", "failed") for r in runs):
                if time.monotonic() > deadline:
                    raise NotRun("fan-out runs did not finish in the budget")
                time.sleep(0.02)
            events = _events(home)
            for run_id in runs:
                shown = _call(home, "show", run_id=run_id)
                group = shown["swarm"]["groups"][0]["group_id"]
                spawned = next(e["at"] for e in events if e["kind"] == "group-spawned" and e["subject"] == group)
                claim = shown["swarm"]["claims"][0]["claim_id"]
                claimed = next(e["at"] for e in events if e["kind"] == "claim-committed" and e["subject"] == claim)
                samples.append((claimed - spawned) * 1000)
                rows_per_join.append(_rows_for_group(home, group))
            ctx.check("fan-out")
    ctx.metrics["join_ms"] = Stats.of(samples, "ms")
    ctx.metrics["ledger_rows_per_join"] = float(sum(rows_per_join) / len(rows_per_join))
    ctx.note("spawn committed to claim committed, 3 children each, synchronous=FULL")
    return ctx.metrics


def _rows_for_group(home: Path, group_id: str) -> int:
    import sqlite3

    db = sqlite3.connect(f"file:{home / 'ledger.db'}?mode=ro", uri=True)
    try:
        children = [r[0] for r in db.execute("SELECT run_id FROM children WHERE group_id = ?", (group_id,))]
        marks = ",".join("?" * len(children))
        count = 1 + len(children)  # the group and its children
        count += db.execute(f"SELECT COUNT(*) FROM runs WHERE run_id IN ({marks})", children).fetchone()[0]
        count += db.execute("SELECT COUNT(*) FROM deliveries WHERE source_id = ?", (group_id,)).fetchone()[0]
        count += db.execute(f"SELECT COUNT(*) FROM provider_requests WHERE run_id IN ({marks})",
                            children).fetchone()[0]
        count += db.execute(f"SELECT COUNT(*) FROM plans WHERE run_id IN ({marks})", children).fetchone()[0]
        return int(count)
    finally:
        db.close()


@workload("fanout_join_1x3", group="corral", budget_s=90, quick_budget_s=15)
def fanout_join_1x3(ctx: Context) -> Metrics:
    """One parent spawns 3 isolated children and joins their results.
    Return {"join_ms": Stats(ms)}."""
    return _fanout(ctx, 1, ctx.reps(2, 8))


@workload("fanout_join_10x3", group="corral", budget_s=120, quick_budget_s=20)
def fanout_join_10x3(ctx: Context) -> Metrics:
    """10 parents each spawn 3 isolated children, all joined.
    Return {"join_ms": Stats(ms)}."""
    return _fanout(ctx, 10, ctx.reps(1, 2))


def _transitions_spec(agents: int, steps: int) -> str:
    step = '  [[agents.steps]]\n  actions = [' + ", ".join(
        '{ tool = "fs.list", input = { path = "." } }' for _ in range(3)) + "]\n"
    blocks = "".join(f'\n[[agents]]\nid = "a{i}"\n' + step * steps + '  [[agents.steps]]\n  final = "ok"\n'
                     for i in range(agents))
    return f'[project]\nroot = "ws"\n[supervisor]\nsynchronous = "full"\n{blocks}'


def _transitions(ctx: Context, agents: int) -> Metrics:
    steps = ctx.reps(5, 20)
    rates = []
    with supervisor(ctx, _transitions_spec(agents, steps)) as home:
        _wait_all_ready(home, agents, 60)
        for _ in range(ctx.reps(1, 3)):
            start = time.perf_counter()
            runs = [_call(home, "run", agent_id=f"a{i}", task="transitions")["run_id"] for i in range(agents)]
            while any(_call(home, "show", run_id=r)["run"]["status"] not in ("completed", "failed") for r in runs):
                time.sleep(0.01)
            elapsed = time.perf_counter() - start
            # prepared, executing and ok per action: each one an fsync'd commit before the next step
            rates.append(agents * steps * 3 * 3 / elapsed)
            ctx.check("transitions")
    ctx.metrics["per_s"] = Stats.of(rates, "per s")
    ctx.note("prepared -> executing -> ok per action through the real agent/supervisor loop, synchronous=FULL")
    return ctx.metrics


@workload("durable_transitions_1", group="corral", budget_s=90, quick_budget_s=15)
def durable_transitions_1(ctx: Context) -> Metrics:
    """Ledger transitions committed per second by the supervisor for 1 actor.
    Return {"per_s": Stats(per s)}."""
    return _transitions(ctx, 1)


@workload("durable_transitions_8", group="corral", budget_s=90, quick_budget_s=15)
def durable_transitions_8(ctx: Context) -> Metrics:
    """Ledger transitions per second with 8 actors asking at once.
    Return {"per_s": Stats(per s)}."""
    return _transitions(ctx, 8)


@workload("failpoint_check_cost", group="corral", budget_s=30, quick_budget_s=5)
def failpoint_check_cost(ctx: Context) -> Metrics:
    """ns per ``corral.core.failpoints.hit(name)`` with CORRAL_FAILPOINTS unset.
    Return {"ns_per_check": Stats(ns)}."""
    require_corral()
    from corral.core import failpoints

    failpoints.configure("")
    n = 200_000
    samples = []
    for _ in range(ctx.reps(3, 15)):
        start = time.perf_counter_ns()
        for _ in range(n):
            failpoints.hit("action.after-prepared")
        samples.append((time.perf_counter_ns() - start) / n)
    ctx.metrics["ns_per_check"] = Stats.of(samples, "ns")
    return ctx.metrics


@workload("scaling_curve", group="corral", budget_s=600, quick_budget_s=40)
def scaling_curve(ctx: Context) -> Metrics:
    """Grow to N = 10, 50, 200, 1000 live echo actors (1000 skipped under --quick).
    Return {"max_live": int, and for each N reached: "ready_s_{N}": Stats(s),
    "uss_mib_{N}": float(MiB), "rtt_us_{N}": Stats(µs) (actor<->supervisor, 64 B)}."""
    sizes = (10, 50, 200) if ctx.quick else (10, 50, 200, 1000)
    ctx.metrics["max_live"] = 0
    for n in sizes:
        if ctx.remaining() < 30:
            ctx.skip(f"ready_s_{n}", "out of budget")
            break
        with supervisor(ctx, _echo_spec(n)) as home:
            _wait_all_ready(home, n, ctx.remaining())
            ctx.metrics[f"ready_s_{n}"] = Stats.single(_launch_to_ready_s(home), "s")
            ctx.metrics[f"uss_mib_{n}"] = _uss_mib(home)
            samples = _ask(home, "e-1", {"op": "bench_rtt", "target": "supervisor", "n": ctx.reps(200, 1000)})["us"]
            ctx.metrics[f"rtt_us_{n}"] = Stats.of(samples, "µs")
            ctx.metrics["max_live"] = n
    return ctx.metrics


# -- MCP (issue 25) --------------------------------------------------------------------


def _mcp_spec(steps: int) -> str:
    def agent(agent_id: str, tool: str, args: str) -> str:
        step = f'  [[agents.steps]]\n  actions = [{{ tool = "{tool}", input = {args} }}]\n'
        return f'\n[[agents]]\nid = "{agent_id}"\n' + step * steps + '  [[agents.steps]]\n  final = "ok"\n'

    return (
        '[project]\nroot = "ws"\n'
        '[[mcp_servers]]\nid = "time"\ncommand = ["python", "-m", "mcp_server_time"]\napproval = "auto"\n'
        + agent("via-mcp", "mcp.time.get_current_time", '{ timezone = "UTC" }')
        + agent("builtin", "fs.list", '{ path = "." }')
    )


def _per_call_ms(home: Path, agent: str, steps: int) -> float:
    start = time.perf_counter()
    run_id = _call(home, "run", agent_id=agent, task="mcp overhead")["run_id"]
    while (status := _call(home, "show", run_id=run_id)["run"]["status"]) not in ("completed", "failed"):
        time.sleep(0.005)
    if status != "completed":
        raise RuntimeError(f"{agent} run {run_id} {status}")
    return (time.perf_counter() - start) * 1000 / steps


def _direct_sdk_ms(calls: int) -> float:
    import trio
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    async def measure() -> float:
        params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_server_time"])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            await session.call_tool("get_current_time", {"timezone": "UTC"})  # warm
            start = time.perf_counter()
            for _ in range(calls):
                await session.call_tool("get_current_time", {"timezone": "UTC"})
            return (time.perf_counter() - start) * 1000 / calls

    result: float = trio.run(measure)
    return result


@workload("mcp_call_overhead", group="corral", budget_s=120, quick_budget_s=40)
def mcp_call_overhead(ctx: Context) -> Metrics:
    """What corral adds to an MCP call: a durable ``mcp.time.get_current_time`` per call
    through the agent loop, minus the same loop around a built-in ``fs.list`` (the
    durable action itself), minus the same call made directly with the SDK client.
    Return {"overhead_ms": Stats(ms), "mcp_loop_ms": Stats(ms), "builtin_loop_ms": Stats(ms),
    "direct_sdk_ms": Stats(ms)}."""
    try:
        import mcp  # noqa: F401
        import mcp_server_time  # noqa: F401
    except ImportError as exc:
        raise NotRun(f"the mcp SDK or mcp-server-time is not installed: {exc}") from None
    steps = ctx.reps(5, 20)
    via_mcp, builtin, direct, overhead = [], [], [], []
    with supervisor(ctx, _mcp_spec(steps)) as home:
        _wait_all_ready(home, 3, 60)
        deadline = time.monotonic() + 30
        while _call(home, "mcp.list")["servers"][0]["status"] != "ready" and time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in range(ctx.reps(2, 5)):
            via_mcp.append(_per_call_ms(home, "via-mcp", steps + 1))
            builtin.append(_per_call_ms(home, "builtin", steps + 1))
            direct.append(_direct_sdk_ms(steps))
            overhead.append(via_mcp[-1] - builtin[-1] - direct[-1])
            ctx.check("mcp")
    ctx.metrics["overhead_ms"] = Stats.of(overhead, "ms")
    ctx.metrics["mcp_loop_ms"] = Stats.of(via_mcp, "ms")
    ctx.metrics["builtin_loop_ms"] = Stats.of(builtin, "ms")
    ctx.metrics["direct_sdk_ms"] = Stats.of(direct, "ms")
    ctx.note("per loop step (provider turn, plan, prepare, executing, result, receipt), synchronous=FULL")
    return ctx.metrics


# -- user tools (issue 15) ---------------------------------------------------------------

_USER_READ_TOOL = '''
import hashlib

import corral


@corral.tool(effect="read", name="bench.read")
def read(ctx: corral.ToolContext, path: str) -> dict:
    """Read a file of the workspace (what fs.read does, as a user tool)."""
    data = (ctx.workspace / path).read_bytes()
    return {"path": path, "content": data.decode(), "sha256": hashlib.sha256(data).hexdigest()}
'''


def _user_tool_spec(steps: int, module: Path) -> str:
    def agent(agent_id: str, tool: str) -> str:
        step = f'  [[agents.steps]]\n  actions = [{{ tool = "{tool}", input = {{ path = "data.txt" }} }}]\n'
        return f'\n[[agents]]\nid = "{agent_id}"\n' + step * steps + '  [[agents.steps]]\n  final = "ok"\n'

    return (
        f'[project]\nroot = "ws"\n[tools]\nmodules = ["{module}"]\n'
        + agent("user-tool", "bench.read")
        + agent("builtin", "fs.read")
    )


@workload("user_tool_overhead", group="corral", budget_s=120, quick_budget_s=30)
def user_tool_overhead(ctx: Context) -> Metrics:
    """A user read tool (@corral.tool) through the agent loop against the built-in
    fs.read in the same run: what the user-tool mechanism adds per call.
    Return {"overhead_ms": Stats(ms), "user_loop_ms": Stats(ms), "builtin_loop_ms": Stats(ms)}."""
    steps = ctx.reps(5, 20)
    module = ctx.tmp / "bench_user_tools.py"
    module.write_text(_USER_READ_TOOL)
    user, builtin, overhead = [], [], []
    with supervisor(ctx, _user_tool_spec(steps, module)) as home:
        (home.parent / "ws" / "data.txt").write_text("x" * 4096)
        _wait_all_ready(home, 2, 60)
        for _ in range(ctx.reps(2, 5)):
            user.append(_per_call_ms(home, "user-tool", steps + 1))
            builtin.append(_per_call_ms(home, "builtin", steps + 1))
            overhead.append(user[-1] - builtin[-1])
            ctx.check("user tools")
    ctx.metrics["overhead_ms"] = Stats.of(overhead, "ms")
    ctx.metrics["user_loop_ms"] = Stats.of(user, "ms")
    ctx.metrics["builtin_loop_ms"] = Stats.of(builtin, "ms")
    ctx.note("per loop step (provider turn, plan, prepare, executing, result, receipt), synchronous=FULL")
    return ctx.metrics
