"""The figures: each pairs corral's value with the baselines measured in the same run.

A figure's ``corral`` Ref names a workload registered in ``bench.corral_workloads``
(workload name == figure name) and the metric that workload must return. Baselines
refer to the workloads in ``bench.baselines``. ``reference`` is the denominator of the
headline ratio (the first of the listed labels that has a value). The targets are
issue 6's.
"""

from __future__ import annotations

from bench.figure_records import CurveSpec, FigureSpec, Target, curve, figure

NOT_TIMED_THREADS = "not run: Pykka has no supervision or restart (threads in one process)"
NOT_TIMED_THESPIAN = "not run: Thespian has no automatic restart (parent gets ChildActorExited)"

RTT_BASELINES = {
    "raw pynng Req/Rep": "pynng_reqrep.rtt_{size}",
    "raw pynng Req/Rep, trio": "pynng_reqrep_trio.rtt_{size}",
    "multiprocessing.Pipe": "mp_pipe.rtt_{size}",
    "Ray actor call": "ray.rtt_{size}",
    "Thespian ask (TCP)": "thespian.rtt_{size}",
    "Pykka ask (threads)": "pykka.rtt_{size}",
}


def _rtt(name: str, what: str, size: str, label: str) -> None:
    figure(
        FigureSpec(
            name=name,
            metric=f"request RTT {what}, {label} payload, p50",
            unit="µs",
            corral=f"{name.removesuffix('_4k')}.rtt_{size}",
            baselines={k: v.format(size=size) for k, v in RTT_BASELINES.items()},
            reference=("raw pynng Req/Rep",),
            targets=(Target("ratio<=", 1.5),),
            target_text="<= 1.5x raw pynng Req/Rep",
        )
    )


_rtt("rtt_actor_supervisor", "actor<->supervisor", "64B", "64 B")
_rtt("rtt_actor_supervisor_4k", "actor<->supervisor", "4KiB", "4 KiB")
_rtt("rtt_actor_actor", "actor<->actor via routing", "64B", "64 B")
_rtt("rtt_actor_actor_4k", "actor<->actor via routing", "4KiB", "4 KiB")

THROUGHPUT_BASELINES = {
    "raw pynng Push/Pull": "pynng_pushpull.msgs_per_s",
    "raw pynng Push/Pull, batched x64": "pynng_pushpull.batched_msgs_per_s",
    "multiprocessing.Pipe": "mp_pipe.msgs_per_s",
    "Ray one-way calls": "ray.oneway_msgs_per_s",
    "Thespian tell (TCP)": "thespian.oneway_msgs_per_s",
    "Pykka tell (threads)": "pykka.oneway_msgs_per_s",
}

figure(
    FigureSpec(
        name="oneway_throughput",
        metric="one-way messages, 64 B, unbatched",
        unit="msgs/s",
        corral="oneway_throughput.msgs_per_s",
        baselines=THROUGHPUT_BASELINES,
        reference=("raw pynng Push/Pull",),
        higher_is_better=True,
    )
)
figure(
    FigureSpec(
        name="oneway_throughput_batched",
        metric="one-way messages, 64 B, with batching",
        unit="msgs/s",
        corral="oneway_throughput_batched.msgs_per_s",
        baselines=THROUGHPUT_BASELINES,
        reference=("raw pynng Push/Pull",),
        targets=(Target("ratio>=", 2.0),),
        target_text=">= 2x raw unbatched Push/Pull",
        higher_is_better=True,
    )
)


def _spawn_baselines(n: int) -> dict[str, str]:
    out = {
        "bare forkserver": f"mp_start.forkserver_{n}",
        "bare forkserver, lean": f"mp_start.forkserver_lean_{n}",
        "bare spawn": f"mp_start.spawn_{n}",
        "fork+exec python": f"mp_start.exec_{n}",
        "Ray actors": f"ray.create_{n}",
        "Thespian actors": f"thespian.create_{n}",
        "Pykka actors (threads)": f"pykka.create_{n}",
    }
    if n >= 1000:
        out["bare spawn"] = "not run: not measured at 1,000 (see the 200 point)"
        out["fork+exec python"] = "not run: not measured at 1,000 (see the 200 point)"
        out["Ray actors"] = "not run: 1,000 Ray workers do not fit here (see idle_uss_200)"
    return out


figure(
    FigureSpec(
        name="spawn_50",
        metric="start 50 echo actors until each answered ready",
        unit="s",
        corral="spawn_50.ready_s",
        baselines=_spawn_baselines(50),
        reference=("bare forkserver",),
    )
)
figure(
    FigureSpec(
        name="spawn_200",
        metric="start 200 echo actors until each answered ready",
        unit="s",
        corral="spawn_200.ready_s",
        baselines=_spawn_baselines(200),
        reference=("bare forkserver",),
        targets=(Target("ratio<=", 2.0), Target("below", label="Ray actors")),
        target_text="<= 2x bare forkserver 200, and faster than Ray",
    )
)
figure(
    FigureSpec(
        name="spawn_1000",
        metric="start 1,000 echo actors until each answered ready",
        unit="s",
        corral="spawn_1000.ready_s",
        baselines=_spawn_baselines(1000),
        reference=("bare forkserver",),
        note="lean = without multiprocessing's O(N^2) per-start polling of live children; "
        "the 1,000-live-actors target is checked by scaling_curve",
    )
)
figure(
    FigureSpec(
        name="restart_latency",
        metric="SIGKILL of an actor to its replacement answering, p50",
        unit="ms",
        corral="restart_latency.restart_ms",
        baselines={
            "bare forkserver (sentinel + start)": "mp_start.restart_ms",
            "Ray max_restarts=-1": "ray.restart_ms",
            "Thespian": NOT_TIMED_THESPIAN,
            "Pykka": NOT_TIMED_THREADS,
        },
        reference=("Ray max_restarts=-1",),
        targets=(Target("value<=", 50.0),),
        target_text="p50 <= 50 ms",
    )
)
figure(
    FigureSpec(
        name="idle_uss_200",
        metric="memory per idle actor at 200 actors (USS)",
        unit="MiB",
        corral="idle_uss_200.uss_mib",
        baselines={
            "Ray actor @200": "ray.uss_mib_200",
            "Ray actor @50": "ray.uss_mib_50",
            "Ray actor @10": "ray.uss_mib_10",
            "bare forkserver child @200": "mp_start.uss_mib_200",
            "Thespian actor @200": "thespian.uss_mib_200",
            "Pykka actor @200 (thread)": "pykka.uss_mib_200",
        },
        reference=("Ray actor @200", "Ray actor @50", "Ray actor @10"),
        targets=(Target("value<=", 10.0),),
        target_text="<= 10 MiB per actor",
    )
)


def _fanout(name: str, groups: int) -> None:
    figure(
        FigureSpec(
            name=name,
            metric=f"fan out {groups} group(s) of 3 children, join all results",
            unit="ms",
            corral=f"{name}.join_ms",
            baselines={
                "bare forkserver children": f"mp_start.fanout_{groups}x3_ms",
                "Ray fresh actors": f"ray.fanout_{groups}x3_ms",
                "Ray tasks (pooled workers)": f"ray.tasks_{groups}x3_ms",
                "Thespian fresh actors": f"thespian.fanout_{groups}x3_ms",
                "Pykka fresh actors (threads)": f"pykka.fanout_{groups}x3_ms",
            },
            reference=("bare forkserver children",),
        )
    )


_fanout("fanout_join_1x3", 1)
_fanout("fanout_join_10x3", 10)

figure(
    FigureSpec(
        name="durable_transitions_1",
        metric="durable transitions committed per second, 1 actor",
        unit="per s",
        corral="durable_transitions_1.per_s",
        baselines={
            "SQLite WAL sync=FULL, 1/commit": "sqlite_wal.full_1",
            "SQLite WAL sync=NORMAL, 1/commit": "sqlite_wal.normal_1",
        },
        reference=("SQLite WAL sync=FULL, 1/commit",),
        higher_is_better=True,
    )
)
figure(
    FigureSpec(
        name="durable_transitions_8",
        metric="durable transitions committed per second, 8 actors at once",
        unit="per s",
        corral="durable_transitions_8.per_s",
        baselines={
            "SQLite WAL sync=FULL, 8/commit": "sqlite_wal.full_group8",
            "SQLite WAL sync=NORMAL, 8/commit": "sqlite_wal.normal_group8",
            "SQLite WAL sync=FULL, 1/commit": "sqlite_wal.full_1",
        },
        reference=("SQLite WAL sync=FULL, 8/commit",),
        higher_is_better=True,
    )
)
figure(
    FigureSpec(
        name="failpoint_check_cost",
        metric="cost of one disabled failpoint check",
        unit="ns",
        corral="failpoint_check_cost.ns_per_check",
        baselines={
            "guarded Python call": "pycall.guarded_call_ns",
            "empty Python call": "pycall.empty_call_ns",
            "dict.get on empty dict": "pycall.dict_get_ns",
            "os.environ.get": "pycall.environ_get_ns",
        },
        reference=("guarded Python call",),
    )
)
figure(
    FigureSpec(
        name="scaling_curve",
        metric="live echo actors reached (all ready at once)",
        unit="actors",
        corral="scaling_curve.max_live",
        baselines={
            "bare forkserver": "mp_start.max_live",
            "Ray actors": "ray.max_live",
            "Thespian actors": "thespian.max_live",
            "Pykka actors (threads)": "pykka.max_live",
        },
        reference=("bare forkserver",),
        targets=(Target("value>=", 1000),),
        target_text="1,000 live actors on this machine",
        higher_is_better=True,
        note="the curves below show how start time, memory and RTT grow with N",
    )
)

SCALE_NS = (10, 50, 200, 1000)

curve(
    CurveSpec(
        name="scaling_ready",
        title="time until N actors are all ready",
        unit="s",
        xs=SCALE_NS,
        series={
            "corral": "scaling_curve.ready_s_{n}",
            "bare forkserver": "mp_start.forkserver_{n}",
            "bare forkserver, lean": "mp_start.forkserver_lean_{n}",
            "bare spawn": "mp_start.spawn_{n}",
            "fork+exec python": "mp_start.exec_{n}",
            "Ray actors": "ray.create_{n}",
            "Thespian actors": "thespian.create_{n}",
            "Pykka (threads)": "pykka.create_{n}",
        },
    )
)
curve(
    CurveSpec(
        name="scaling_uss",
        title="USS per idle actor with N actors live",
        unit="MiB",
        xs=SCALE_NS,
        series={
            "corral": "scaling_curve.uss_mib_{n}",
            "bare forkserver": "mp_start.uss_mib_{n}",
            "Ray actors": "ray.uss_mib_{n}",
            "Thespian actors": "thespian.uss_mib_{n}",
            "Pykka (threads)": "pykka.uss_mib_{n}",
        },
    )
)
curve(
    CurveSpec(
        name="scaling_rtt",
        title="actor<->supervisor RTT p50 with N actors live",
        unit="µs",
        xs=SCALE_NS,
        series={"corral": "scaling_curve.rtt_us_{n}"},
    )
)
figure(
    FigureSpec(
        name="mcp_call_overhead",
        metric="what corral adds to one MCP tool call (loop step minus a built-in step minus the direct SDK call)",
        unit="ms",
        corral="mcp_call_overhead.overhead_ms",
        baselines={
            "direct SDK call (same run)": "mcp_call_overhead.direct_sdk_ms",
            "durable loop step, built-in fs.list": "mcp_call_overhead.builtin_loop_ms",
            "durable loop step, MCP call": "mcp_call_overhead.mcp_loop_ms",
        },
        targets=(Target("value<=", 2.0),),
        target_text="<= 2 ms",
    )
)
figure(
    FigureSpec(
        name="user_tool_overhead",
        metric="a user read tool (@corral.tool) per loop step, minus the built-in fs.read in the same run",
        unit="ms",
        corral="user_tool_overhead.overhead_ms",
        baselines={
            "durable loop step, built-in fs.read": "user_tool_overhead.builtin_loop_ms",
            "durable loop step, user tool": "user_tool_overhead.user_loop_ms",
        },
        targets=(Target("value<=", 1.0),),
        target_text="<= 1 ms",
    )
)
figure(
    FigureSpec(
        name="real_model_swarm",
        metric="corral's share of wall time with 8 agents on one real model (SmolLM2-135M, CPU), per token",
        unit="%",
        corral="real_model_swarm.overhead_pct_8",
        baselines={
            "1 agent": "real_model_swarm.overhead_pct_1",
            "2 agents": "real_model_swarm.overhead_pct_2",
            "4 agents": "real_model_swarm.overhead_pct_4",
        },
        targets=(Target("value<=", 2.0),),
        target_text="<= 2 %",
    )
)
figure(
    FigureSpec(
        name="real_model_tasks",
        metric="small tool tasks a packaged model completes, judged by their effect (Qwen2.5-Coder-0.5B, CPU)",
        unit="%",
        corral="real_model_tasks.success_rate_qwen2.5-coder-0.5b",
        baselines={"SmolLM2-135M": "real_model_tasks.success_rate_smollm2"},
        higher_is_better=True,
        target_text="(no target: the 0.5B model should complete the two-step tasks, issue 38)",
    )
)
figure(
    FigureSpec(
        name="durable_actions",
        metric="durable read actions per second through the full loop, 64 agents (scripted, fs.list)",
        unit="per s",
        corral="durable_actions.actions_per_s_64",
        baselines={
            "corral, 1 agent": "durable_actions.actions_per_s_1",
            "corral, 8 agents": "durable_actions.actions_per_s_8",
            "DBOS @DBOS.step on SQLite, 8 threads": "durable_actions.dbos_steps_per_s_8",
            "DBOS, 1 thread": "durable_actions.dbos_steps_per_s_1",
            "LangGraph SqliteSaver steps, 8 threads": "durable_actions.langgraph_steps_per_s_8",
            "LangGraph, 1 thread": "durable_actions.langgraph_steps_per_s_1",
            "bare SQLite, 1 fsync'd transaction per transition": "durable_actions.sqlite_limit_per_s",
        },
        targets=(Target("value>=", 3000.0),),
        target_text=">= 1,000/s for 1 agent, >= 3,000/s at 64 agents, ahead of DBOS and LangGraph",
    )
)
figure(
    FigureSpec(
        name="ui_tree_1000",
        metric="corral ui: the actor tree of 1,000 live actors rendered in Chromium (to load)",
        unit="s",
        corral="ui_dashboard.tree_1000_rendered_s",
        baselines={
            "served (one HTTP GET)": "ui_dashboard.tree_1000_served_s",
            "served, USS not cached yet": "ui_dashboard.tree_1000_served_cold_s",
        },
        targets=(Target("value<=", 1.0),),
        target_text="served and rendered in under 1 s",
    )
)
figure(
    FigureSpec(
        name="ui_stream",
        metric="corral ui: live stream events/s received under a 5,000 events/s load",
        unit="per s",
        corral="ui_dashboard.stream_events_per_s",
        baselines={"the load, as committed": "ui_dashboard.stream_emitted_per_s"},
        targets=(Target("value>=", 4500.0),),
        target_text="keeps up with 5,000 events/s, no gap in the cursors (stream_gaps = 0)",
    )
)
figure(
    FigureSpec(
        name="bridge_handoffs",
        metric="task bridge: discover -> claim -> start -> submit cycles per second, 8 concurrent clients",
        unit="per s",
        corral="bridge_handoffs.cycles_per_s_8",
        baselines={
            "1 client": "bridge_handoffs.cycles_per_s_1",
            "bare SQLite, 3 fsync'd transactions per cycle": "bridge_handoffs.sqlite_limit_cycles_per_s",
        },
        reference=("bare SQLite, 3 fsync'd transactions per cycle",),
        higher_is_better=True,
        target_text="(no target: the ratio to the disk's limit)",
    )
)
figure(
    FigureSpec(
        name="durable_actions_postgres",
        metric="durable read actions per second on a shared PostgreSQL ledger, 64 agents on one node",
        unit="per s",
        corral="durable_actions_postgres.actions_per_s_pg1_64",
        baselines={
            "SQLite ledger, 64 agents (same run)": "durable_actions_postgres.actions_per_s_sqlite_64",
            "PostgreSQL, two nodes, 32 agents each": "durable_actions_postgres.actions_per_s_pg2_64",
            "PostgreSQL, 1 agent": "durable_actions_postgres.actions_per_s_pg1_1",
            "SQLite, 1 agent": "durable_actions_postgres.actions_per_s_sqlite_1",
            "PostgreSQL, 8 agents": "durable_actions_postgres.actions_per_s_pg1_8",
            "PostgreSQL, two nodes, 4 agents each": "durable_actions_postgres.actions_per_s_pg2_8",
            "PostgreSQL, three nodes, 21 agents each": "durable_actions_postgres.actions_per_s_pg3_64",
            "PostgreSQL, three nodes, 2 agents each": "durable_actions_postgres.actions_per_s_pg3_8",
            "SQLite, 8 agents": "durable_actions_postgres.actions_per_s_sqlite_8",
            "bare PostgreSQL, 1 synchronous commit per transition": "durable_actions_postgres.postgres_limit_per_s",
        },
        reference=("SQLite ledger, 64 agents (same run)",),
        higher_is_better=True,
        target_text="(no target: beside SQLite and the server's own limit, same run)",
    )
)
