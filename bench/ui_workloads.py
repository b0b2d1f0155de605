"""``ui_dashboard``: the dashboard's speed (issue 21).

* The actor tree of 1,000 live actors: served (one HTTP GET of the page) and
  rendered (Chromium loads it, to its ``load`` event), p50 over repetitions.
* The live stream under 5,000 ledger events/s (``bench.emit_events``): an SSE
  reader counts the events and checks that the cursors have no gap, and measures
  how far behind the commit each event arrives.
"""

from __future__ import annotations

import http.client
import itertools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.corral_workloads import _call, _echo_spec, _wait_all_ready, supervisor
from bench.harness import Context, Metrics, NotRun, Stats, workload

CHROMIUM = "/usr/bin/chromium"
TREE_ACTORS = 1000
STREAM_RATE = 5000
STREAM_SECONDS = 5


@contextmanager
def _dashboard(home: Path) -> Iterator[dict[str, Any]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "corral", "--home", str(home), "ui", "--port", "0", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            raise NotRun("corral ui did not start (the ui extra: starlette, hypercorn)")
        yield json.loads(line)
    finally:
        process.terminate()
        process.wait(timeout=20)


def _get(info: dict[str, Any], path: str) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", info["port"], timeout=30)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {info['token']}"})
        reply = conn.getresponse()
        body = reply.read()
        if reply.status != 200:
            raise RuntimeError(f"GET {path}: {reply.status}")
        return body
    finally:
        conn.close()


def _tree(ctx: Context, metrics: Metrics) -> None:
    reps = ctx.reps(3, 7)
    with supervisor(ctx, _echo_spec(TREE_ACTORS)) as home:
        _wait_all_ready(home, TREE_ACTORS, 180)
        with _dashboard(home) as info:
            started = time.perf_counter()
            _get(info, "/")  # cold: the USS of 1,000 processes is read, then cached for 5 s
            metrics["tree_1000_served_cold_s"] = Stats.single(time.perf_counter() - started, "s")
            served = []
            for _ in range(reps):
                started = time.perf_counter()
                page = _get(info, "/")
                served.append(time.perf_counter() - started)
            if page.count(b'data-actor="') != TREE_ACTORS:
                raise RuntimeError("the tree page does not list every actor")
            metrics["tree_1000_served_s"] = Stats.of(served, "s")
            try:
                from playwright.sync_api import sync_playwright
            except ImportError:
                ctx.skip("tree_1000_rendered_s", "playwright is not installed (the dev extra)")
                return
            if not Path(CHROMIUM).exists():
                ctx.skip("tree_1000_rendered_s", "Debian's chromium is not installed")
                return
            rendered = []
            with sync_playwright() as driver:
                browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                try:
                    page_view = browser.new_page()
                    page_view.goto(info["url"])
                    for _ in range(reps):
                        started = time.perf_counter()
                        page_view.goto(info["url"], wait_until="load")
                        rendered.append(time.perf_counter() - started)
                    if page_view.locator("[data-actor]").count() != TREE_ACTORS:
                        raise RuntimeError("Chromium did not render every actor")
                finally:
                    browser.close()
            metrics["tree_1000_rendered_s"] = Stats.of(rendered, "s")


def _stream(ctx: Context, metrics: Metrics) -> None:
    total = STREAM_RATE * STREAM_SECONDS
    with supervisor(ctx, _echo_spec(1)) as home:
        _wait_all_ready(home, 1, 60)
        with _dashboard(home) as info:
            since = int(_call(home, "status")["cursor"])
            received: list[tuple[int, float, float]] = []
            failure: list[str] = []

            def read() -> None:
                conn = http.client.HTTPConnection("127.0.0.1", info["port"], timeout=30)
                try:
                    conn.request("GET", f"/api/stream?since={since}",
                                 headers={"Authorization": f"Bearer {info['token']}"})
                    reply = conn.getresponse()
                    while len(received) < total:
                        line = reply.fp.readline()
                        if not line:
                            failure.append("the stream ended")
                            return
                        if line.startswith(b"data: {"):
                            event = json.loads(line[6:])
                            if event["kind"] == "bench-load":
                                received.append((int(event["cursor"]), float(event["at"]), time.time()))
                except Exception as exc:  # reported, never hidden
                    failure.append(f"{type(exc).__name__}: {exc}")
                finally:
                    conn.close()

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            started = time.perf_counter()
            emitted = _call(home, "bench.emit_events", timeout=STREAM_SECONDS * 4 + 30, n=total, rate=STREAM_RATE)
            reader.join(timeout=60)
            wall = time.perf_counter() - started
            if failure or len(received) != total:
                raise RuntimeError(f"the stream delivered {len(received)} of {total}: {failure}")
            cursors = [cursor for cursor, _, _ in received]
            gaps = sum(1 for a, b in itertools.pairwise(cursors) if b != a + 1)
            metrics["stream_events_per_s"] = Stats.single(total / wall, "per s")
            metrics["stream_emitted_per_s"] = Stats.single(total / float(emitted["elapsed_s"]), "per s")
            metrics["stream_gaps"] = Stats.single(float(gaps), "gaps")
            metrics["stream_lag_ms"] = Stats.of([(got - at) * 1000 for _, at, got in received], "ms")


@workload("ui_dashboard", group="corral", budget_s=300, quick_budget_s=200)
def ui_dashboard(ctx: Context) -> Metrics:
    """The tree page of 1,000 actors served and rendered; the live stream at
    5,000 events/s. Return {"tree_1000_served_cold_s", "tree_1000_served_s", "tree_1000_rendered_s",
    "stream_events_per_s", "stream_emitted_per_s", "stream_gaps", "stream_lag_ms"}."""
    _tree(ctx, ctx.metrics)
    _stream(ctx, ctx.metrics)
    return ctx.metrics
