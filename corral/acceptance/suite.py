"""Runs a suite: resolve the provider (BLOCKED when there is none), build the
workspace, judge each point in order, print one line per point as it finishes,
write the report, clean up (unless kept) and reap every process."""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from corral.acceptance import points as suite_points
from corral.acceptance.host import Host
from corral.acceptance.provider import KEY_ENV, NoModel, Provider, resolve
from corral.acceptance.report import EXIT_FAIL, Evidence, PointResult, Report, Verdict, overall
from corral.acceptance.workspace import DECOY_ENV, Workspace
from corral.core.redact import redact_text
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs.repair_histogram import histogram, merged, of_run

_STYLE = {Verdict.PASS: "green", Verdict.FAIL_MODEL: "yellow", Verdict.FAIL_RUNTIME: "red", Verdict.BLOCKED: "magenta"}


@dataclass(frozen=True)
class Options:
    suite: str
    model: str | None = None
    provider_url: str | None = None
    provider_model: str | None = None
    keep: bool = False
    #: Where the disposable directory goes (default: the system's temporary directory).
    parent: Path | None = None


def run_suite(options: Options, console: Console) -> Report:
    """``KeyError`` for an unknown suite or point, ``ValueError`` for bad provider
    options: usage errors, before anything is created."""
    selected = suite_points.select(options.suite)
    started = time.monotonic()
    try:
        provider = resolve(options.model, options.provider_url, options.provider_model)
    except NoModel as exc:
        blocked = [_blocked(point, str(exc)) for point in selected]
        for result in blocked:
            _print(console, result)
        return _report(options, "none", blocked, "", False, started, [], histogram({}, {}))
    workspace = Workspace.create(options.parent)
    host = Host(_environment(workspace, provider), workspace.root / "logs")
    ctx = suite_points.Context(workspace, host, provider)
    results: list[PointResult] = []
    leftovers: list[int] = []
    repairs = histogram({}, {})
    try:
        for point in selected:
            if point.after_the_runs and results and all(r.verdict is Verdict.BLOCKED for r in results) \
                    and not point.evidence(ctx):
                # Nothing ran (every flow named what it lacks): nothing to judge is no failure, and no pass.
                result = _blocked(point, "nothing ran for it to check: every point before it was blocked")
            else:
                result = _judge(point, ctx)
            results.append(result)
            _print(console, result)
    finally:
        leftovers = host.close()
        repairs = suite_repairs(ctx.homes)  # the supervisors are down: their ledgers are read offline
        kept = options.keep or not workspace.remove()
    return _report(options, provider.describe(), results, str(workspace.root), kept, started, leftovers, repairs)


def suite_repairs(homes: list[Path]) -> dict[str, Any]:
    """Every run's repairs in the suite's homes, through the one aggregator ``corral
    show`` uses (seed 004 V1.33: "完整报告和失败 partial report 使用同一聚合器"). A home
    whose ledger cannot be read adds nothing (its point says why)."""
    from corral.offline_read import LedgerReader

    def runs(ledger: Ledger) -> list[dict[str, Any]]:
        return [of_run(ledger, run) for run in ledger.all("SELECT * FROM runs")]

    shown: list[dict[str, Any]] = []
    for home in homes:
        try:
            shown += LedgerReader(home).read(runs)
        except Exception:  # a held or unreadable home: the report is written whatever one home holds
            continue
    return merged(shown)


def _environment(workspace: Workspace, provider: Provider) -> dict[str, str]:
    env = dict(os.environ)
    env[DECOY_ENV] = workspace.decoys.env_key
    # A server that needs no key (a local one) still gets a value: the spec names the variable.
    env.setdefault(KEY_ENV, "no-key-needed")
    env["NO_PROXY"] = env["no_proxy"] = ",".join(
        filter(None, [env.get("NO_PROXY", ""), "127.0.0.1,localhost,::1"]))
    return env


def _judge(point: suite_points.Point, ctx: suite_points.Context) -> PointResult:
    started = time.monotonic()
    try:
        judged = point.judge(ctx)
        evidence = [Evidence.of(path) for path in point.evidence(ctx) if path.exists()]
    except Exception as exc:  # a crash of the suite's own flow is a runtime failure, reported, never hidden
        detail = redact_text("".join(traceback.format_exception_only(exc)).strip())
        return PointResult(name=point.name, title=point.title, seed=point.seed, verdict=Verdict.FAIL_RUNTIME,
                           reason=f"the point crashed: {detail[:500]}", wall_s=time.monotonic() - started)
    return PointResult(name=point.name, title=point.title, seed=point.seed, verdict=judged.verdict,
                       reason=judged.reason, evidence=evidence, facts=dict(judged.facts),
                       wall_s=round(time.monotonic() - started, 2))


def _blocked(point: suite_points.Point, reason: str) -> PointResult:
    return PointResult(name=point.name, title=point.title, seed=point.seed, verdict=Verdict.BLOCKED, reason=reason)


def _print(console: Console, result: PointResult) -> None:
    style = _STYLE[result.verdict]
    console.print(f"[{style}]{result.verdict.value:<12}[/{style}] {result.name:<20} {result.reason}"
                  f" [dim]({result.wall_s:.1f}s)[/dim]", highlight=False, soft_wrap=True)


def _report(options: Options, provider: str, results: list[PointResult], workdir: str, kept: bool,
            started: float, leftovers: list[int], repairs: dict[str, Any]) -> Report:
    verdict, code = overall(results)
    note = suite_points.REDUCED_NOTE if options.suite == "reduced" else ""
    if leftovers:
        verdict, code = Verdict.FAIL_RUNTIME, EXIT_FAIL
        note = f"{note}; processes outlived the suite: {leftovers}".lstrip("; ")
    leaks = next((int(r.facts["secret_leak_count"]) for r in results if "secret_leak_count" in r.facts), None)
    return Report(suite=options.suite, suite_note=note, provider=provider, verdict=verdict, exit_code=code,
                  secret_leak_count=leaks, points=results, repair_histogram=repairs, workdir=workdir, kept=kept,
                  wall_s=round(time.monotonic() - started, 2))
