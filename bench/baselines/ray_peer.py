"""Ray actors, the peer a user would most likely pick instead: a local Ray started with
``ray.init(num_cpus=2, include_dashboard=False)``, every address pinned to loopback
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes Ray's node address 127.0.0.1), usage
stats off, its temp dir under /tmp, shut down at the end."""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import time
from typing import Any

import psutil

from bench.harness import Context, Metrics, NotRun, Stats, repeat, time_calls, workload
from bench.procs import REPO_ROOT, descendants, uss_mib, wait_gone

CREATE_NS = (10, 50, 200)
READY_TIMEOUT_S = 300.0


def _is_loopback(ip: str) -> bool:
    try:
        addr = ipaddress.ip_address(ip.split("%")[0])
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)
    return bool(addr.is_loopback or (mapped is not None and mapped.is_loopback))


def _network_check(pids: list[int]) -> tuple[list[str], list[str]]:
    """(non-loopback connections or listeners, wildcard listeners) of ``pids``."""
    bad: list[str] = []
    wildcard: list[str] = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            conns = proc.net_connections(kind="inet")
            name = proc.name()
        except psutil.Error:
            continue
        for conn in conns:
            local = conn.laddr.ip if conn.laddr else ""
            if conn.raddr and not _is_loopback(conn.raddr.ip):
                bad.append(f"{name} -> {conn.raddr.ip}:{conn.raddr.port}")
            elif conn.status == psutil.CONN_LISTEN and local in ("0.0.0.0", "::"):
                wildcard.append(f"{name}:{conn.laddr.port}")
            elif local and local not in ("0.0.0.0", "::") and not _is_loopback(local):
                bad.append(f"{name} on {local}:{conn.laddr.port}")
    return bad, wildcard


@workload("ray", group="peers", budget_s=900, quick_budget_s=80, order=90)
def ray_peer(ctx: Context) -> Metrics:
    """Ray actors: call RTT, one-way calls, creation to ready, restart, USS, fan-out."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    old_pythonpath = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), old_pythonpath) if p)
    try:
        import ray
        import ray.exceptions
    except ImportError as exc:
        raise NotRun(f"ray not installed ({exc}); pip install 'ray[default]'") from exc

    from bench import _ray_actors

    before = set(descendants())
    out: Metrics = ctx.metrics
    t0 = time.perf_counter()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _temp_dir=str(ctx.tmp / "ray"),
        logging_level=logging.ERROR,
        log_to_driver=False,
    )
    out["init_s"] = Stats.single(time.perf_counter() - t0, "s")
    try:
        system_pids = [p for p in descendants() if p not in before]
        bad, wildcard = _network_check(system_pids)
        if bad:
            raise NotRun(f"Ray used a non-loopback address ({', '.join(bad[:3])})")
        if wildcard:
            ctx.note(f"Ray listens on the wildcard address: {', '.join(sorted(set(wildcard)))}")
        _measure(ctx, ray, _ray_actors, system_pids)
    finally:
        ray.shutdown()
        wait_gone([p for p in descendants() if p not in before], 20)
        if old_pythonpath is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_pythonpath
    ctx.note("Ray: one worker process per actor; worker start concurrency = num_cpus (2)")
    return out


def _measure(ctx: Context, ray: Any, mod: Any, system_pids: list[int]) -> None:
    """Record into ctx.metrics as it goes, so a timeout keeps what was measured."""
    out: Metrics = ctx.metrics
    echo_cls = ray.remote(mod.Echo)
    ray_error = ray.exceptions.RayError

    def get(refs: Any, timeout: float = 120.0) -> Any:
        return ray.get(refs, timeout=max(1.0, min(timeout, ctx.remaining())))

    def create(n: int) -> tuple[float, list[Any], list[int]]:
        t0 = time.perf_counter()
        actors = [echo_cls.remote() for _ in range(n)]
        get([a.ready.remote() for a in actors], READY_TIMEOUT_S)
        elapsed = time.perf_counter() - t0
        return elapsed, actors, [int(p) for p in get([a.pid.remote() for a in actors])]

    def destroy(actors: list[Any], pids: list[int]) -> None:
        for actor in actors:
            ray.kill(actor)
        wait_gone(pids, 60)

    # call round trip on one actor
    _, actors, pids = create(1)
    echo = actors[0]
    for label, size in (("64B", 64), ("4KiB", 4096)):
        payload = os.urandom(size)

        def ping(p: bytes = payload) -> None:
            get(echo.ping.remote(p))

        out[f"rtt_{label}"] = time_calls(
            ping,
            ctx.reps(300, 2_000),
            warmup=50,
            unit="µs",
            deadline=time.monotonic() + ctx.remaining() / 12,
        )

    # one-way: fire-and-forget calls, then one call that runs after all of them
    count = ctx.reps(2_000, 10_000)
    payload = os.urandom(64)

    def one_way() -> float:
        start = get(echo.counted.remote())
        t0 = time.perf_counter()
        for _ in range(count):
            echo.tell.remote(payload)
        got = get(echo.counted.remote())
        if got - start != count:
            raise RuntimeError("Ray lost one-way calls")
        return count / (time.perf_counter() - t0)

    out["oneway_msgs_per_s"] = repeat(
        one_way, ctx.reps(2, 5), unit="msgs/s",
        deadline=time.monotonic() + ctx.remaining() / 12,
    )
    destroy(actors, pids)
    out["system_uss_mib"] = Stats.single(
        uss_mib([p for p in system_pids if psutil.pid_exists(p)]), "MiB"
    )
    ctx.note(f"Ray's own processes at start: {len(system_pids)}")

    # creation of N actors to ready, and their idle USS
    live = 0
    for n in CREATE_NS:
        per = out.get("uss_mib_50") or out.get("uss_mib_10")
        if n > 10 and ctx.quick:
            why = "skipped in --quick (takes minutes here)" if n == 200 else "skipped in --quick"
            ctx.skip(f"create_{n}", why)
            ctx.skip(f"uss_mib_{n}", "skipped in --quick")
            continue
        if n == 200 and isinstance(per, Stats):
            need_gib = per.median * n * 1.5 / 1024 + 2
            avail_gib = psutil.virtual_memory().available / 2**30
            if avail_gib < need_gib:
                reason = f"needs ~{need_gib:.0f} GiB, {avail_gib:.0f} GiB available"
                ctx.skip("create_200", reason)
                ctx.skip("uss_mib_200", reason)
                continue
        reps = ctx.reps(1, {10: 3, 50: 2}.get(n, 1))
        times: list[float] = []
        for rep in range(reps):
            if ctx.remaining() < 30:
                break
            elapsed, actors, pids = create(n)
            times.append(elapsed)
            if rep == 0:
                out[f"uss_mib_{n}"] = Stats.single(uss_mib(pids) / n, "MiB")
            destroy(actors, pids)
        if times:
            out[f"create_{n}"] = Stats.of(times, "s")
            live = n
        else:
            ctx.skip(f"create_{n}", "out of time budget")
    out["max_live"] = live

    # SIGKILL the worker of a max_restarts=-1 actor; time until a new pid answers
    restartable = ray.remote(max_restarts=-1, max_task_retries=0)(mod.Echo)
    actor = restartable.remote()
    get(actor.ready.remote(), READY_TIMEOUT_S)
    samples: list[float] = []
    worker_pids: list[int] = []
    try:
        for _ in range(ctx.reps(3, 10)):
            if ctx.remaining() < 15:
                break
            old = int(get(actor.pid.remote()))
            worker_pids.append(old)
            t0 = time.perf_counter()
            os.kill(old, signal.SIGKILL)
            end = time.monotonic() + 60
            while True:
                try:
                    new = int(ray.get(actor.pid.remote(), timeout=max(0.1, end - time.monotonic())))
                    if new != old:
                        worker_pids.append(new)
                        break
                except ray_error:
                    pass
                if time.monotonic() > end:
                    raise TimeoutError("Ray actor did not come back within 60 s")
                time.sleep(0.001)
            samples.append((time.perf_counter() - t0) * 1e3)
    finally:
        ray.kill(actor)
        wait_gone(worker_pids, 30)
    if samples:
        out["restart_ms"] = Stats.of(samples, "ms")
    else:
        ctx.skip("restart_ms", "out of time budget")

    # fan-out/join: fresh actors (like isolated children), and pooled tasks
    for groups, key in ((1, "fanout_1x3_ms"), (10, "fanout_10x3_ms")):
        if ctx.quick and groups > 1:
            ctx.skip(key, "skipped in --quick")
            continue
        fan_samples: list[float] = []
        for _ in range(ctx.reps(2, 5 if groups == 1 else 2)):
            if ctx.remaining() < 20:
                break
            t0 = time.perf_counter()
            kids = [echo_cls.remote() for _ in range(groups * 3)]
            get([k.work.remote(i) for i, k in enumerate(kids)], READY_TIMEOUT_S)
            fan_samples.append((time.perf_counter() - t0) * 1e3)
            kid_pids = [int(p) for p in get([k.pid.remote() for k in kids])]
            destroy(kids, kid_pids)
        if fan_samples:
            out[key] = Stats.of(fan_samples, "ms")
        else:
            ctx.skip(key, "out of time budget")

    task = ray.remote(mod.work_task)
    get([task.remote(i) for i in range(6)], READY_TIMEOUT_S)  # warm the worker pool
    for groups, key in ((1, "tasks_1x3_ms"), (10, "tasks_10x3_ms")):

        def fan_tasks(groups: int = groups) -> float:
            t0 = time.perf_counter()
            get([task.remote(i) for i in range(groups * 3)])
            return (time.perf_counter() - t0) * 1e3

        out[key] = repeat(fan_tasks, ctx.reps(5, 20), unit="ms", warmup=1)
