"""``corral chaos``: kill-and-restart chaos testing with an invariant report."""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from corral.chaos.runner import (
    TARGETS,
    Runner,
    Scenario,
    Terminated,
    demo_scenario,
    file_scenario,
    sigterm_as_interrupt,
)
from corral.cli.main import EXIT_FAILED, EXIT_USAGE, CliError, arguments, command, print_table
from corral.core import failpoints


def _chaos_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", default="demo", help="'demo' (default) or a swarm spec TOML with [chaos]")
    parser.add_argument(
        "--kills",
        type=int,
        default=20,
        help="total kills (random/both modes): random episodes of 1-3 kills run until exactly N kills happened",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of the random schedule (default: random)")
    parser.add_argument(
        "--targets",
        default="supervisor,agents,children",
        help=f"comma-separated subset of {','.join(TARGETS)}",
    )
    parser.add_argument(
        "--mode",
        choices=["failpoints", "random", "both"],
        default="both",
        help="every named failpoint once, seeded random instants, or both",
    )
    parser.add_argument("--failpoint", help="run only this failpoint (reproduce a failure)")
    parser.add_argument("--json", dest="json_path", help="write the report as JSON here")
    parser.add_argument(
        "--report",
        dest="html_path",
        help="write each episode's timeline (actor lifetimes, kills, restarts) as one standalone HTML/SVG file",
    )
    parser.add_argument("--keep", action="store_true", help="keep the episode directories")
    parser.add_argument("--quiet", action="store_true", help="only the final table")
    parser.add_argument(
        "--ledger",
        metavar="URL",
        help="run every episode on this shared PostgreSQL ledger (postgresql://...), each home a node of its own",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="with --ledger and --mode random: N nodes per episode, each episode on a database of its own on the"
        " URL's server (its user needs CREATEDB; dropped after the episode unless --keep), its runs submitted to"
        " one node and spread by the shared queue, the kills drawn among every node's processes",
    )


def schedule(scenario: Scenario, targets: tuple[str, ...], only: str | None) -> list[tuple[str, str]]:
    names = (
        [only]
        if only
        else [n for n in failpoints.KNOWN if _applies(n, scenario.spec_text)]
    )
    pairs = []
    for name in names:
        if "supervisor" in targets:
            pairs.append((name, "supervisor"))
        if "agents" in targets or "children" in targets:
            pairs.append((name, "agents"))
    return pairs


@command("chaos", "kill processes of a swarm at every failpoint and at random, then check every invariant")
@arguments(_chaos_args)
def cmd_chaos(args: argparse.Namespace) -> int:
    targets = tuple(t.strip() for t in args.targets.split(",") if t.strip())
    unknown = [t for t in targets if t not in TARGETS]
    if unknown or not targets:
        raise CliError(f"unknown targets {unknown}; choose from {', '.join(TARGETS)}", EXIT_USAGE)
    if args.failpoint and args.failpoint not in failpoints.KNOWN:
        raise CliError(f"unknown failpoint {args.failpoint!r}; known: {', '.join(failpoints.KNOWN)}", EXIT_USAGE)
    if args.kills < 0:
        raise CliError("--kills must be >= 0", EXIT_USAGE)
    try:
        scenario = demo_scenario() if args.scenario == "demo" else file_scenario(Path(args.scenario))
    except (OSError, ValueError) as exc:
        raise CliError(f"bad scenario: {exc}", EXIT_USAGE) from None
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    if args.ledger:
        from corral.supervisor.ledger.ledger_spec import LedgerSpecError, check_url

        try:
            check_url(args.ledger)
        except LedgerSpecError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
    runner = _runner(args, scenario, seed, targets)
    started = time.monotonic()
    print(f"corral chaos: scenario {scenario.name}, seed {seed}, mode {args.mode}, targets {','.join(targets)}",
          flush=True)
    interrupted: str | None = None
    try:
        with sigterm_as_interrupt():
            campaign(runner, scenario, targets, args, seed)
    except KeyboardInterrupt as exc:
        # Ctrl-C or SIGTERM (``timeout``, a cancelled CI job): the episode under way was
        # ended (its processes killed and reaped); report what ran.
        interrupted = "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"
        print(f"\ncorral chaos: interrupted ({interrupted}): the report of the episodes so far", flush=True)
    report = runner.report(time.monotonic() - started, interrupted=interrupted is not None)
    report["interrupted_by"] = interrupted
    report["mode"] = args.mode
    report["requested_kills"] = args.kills
    report["nodes"] = args.nodes
    if args.nodes > 1:
        report["episode_details"] = [
            {"episode": e.index, "database": e.nodes.database, "partitions": e.nodes.partitions,
             "ran_on": e.nodes.ran_on, "kills": [f"{k.victim}@{k.point}" for k in e.kills], "wall_s": e.wall_s}
            for e in runner.episodes if e.nodes is not None
        ]
    print_report(report)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(report, indent=2, sort_keys=True, default=str))
        print(f"report: {args.json_path}")
    if args.html_path:
        from corral.ui.pages import standalone_report

        verdict = "passed" if report["passed"] else "FAILED"
        Path(args.html_path).write_text(
            standalone_report(
                f"corral chaos, seed {seed}: {len(runner.episodes)} episodes, {verdict}",
                [
                    (f"episode {e.index} ({e.failpoint or e.mode}): {'PASS' if e.passed else 'FAIL'}", e.timeline_svg)
                    for e in runner.episodes
                ],
            )
        )
        print(f"timeline: {args.html_path}")
    if not args.keep and report["passed"]:
        import shutil

        shutil.rmtree(runner.workdir, ignore_errors=True)
    else:
        print(f"episodes kept in {runner.workdir}")
    if report["interrupted"]:
        return EXIT_TERMINATED if interrupted == "SIGTERM" else EXIT_INTERRUPTED
    return 0 if report["passed"] else EXIT_FAILED


def _runner(args: argparse.Namespace, scenario: Scenario, seed: int, targets: tuple[str, ...]) -> Runner:
    """One node per episode, or ``--nodes`` of them, each episode on a database of its own."""
    options: dict[str, Any] = {"seed": seed, "targets": targets, "verbose": not args.quiet,
                               "timelines": bool(args.html_path)}
    if args.nodes < 1:
        raise CliError("--nodes must be >= 1", EXIT_USAGE)
    if args.nodes == 1:
        return Runner(scenario, ledger_url=args.ledger, **options)
    if not args.ledger:
        raise CliError("--nodes needs --ledger postgresql://... (the nodes share a PostgreSQL server)", EXIT_USAGE)
    if args.mode != "random" or args.failpoint:
        raise CliError("--nodes runs --mode random only", EXIT_USAGE)
    from corral.chaos.cluster_runner import ClusterRunner
    from corral.chaos.episode_database import EpisodeDatabaseError, check_allowed

    try:
        check_allowed(args.ledger)
    except EpisodeDatabaseError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    return ClusterRunner(scenario, nodes=args.nodes, ledger_url=args.ledger, keep_databases=args.keep, **options)


#: Random episodes in a row without a kill after which the campaign stops: the run
#: ends before a kill can land, and "until N kills happened" would never come.
MAX_EPISODES_WITHOUT_A_KILL = 20
#: The exit code of a campaign cut short by Ctrl-C (128 + SIGINT, as a shell says).
EXIT_INTERRUPTED = 130
#: The exit code of a campaign cut short by SIGTERM (128 + SIGTERM).
EXIT_TERMINATED = 143


def campaign(runner: Runner, scenario: Scenario, targets: tuple[str, ...], args: argparse.Namespace,
             seed: int) -> None:
    """The episodes the options ask for, until they are done or the runner says the
    campaign must stop (an episode that failed before its first kill, with why)."""
    if args.mode in ("failpoints", "both") or args.failpoint:
        for name, target in schedule(scenario, targets, args.failpoint):
            runner.failpoint_episode(name, target)
            if runner.stopped:
                return
    if args.mode in ("random", "both") and not args.failpoint:
        rng = random.Random(seed)
        without = 0
        while (done := sum(len(e.kills) for e in runner.episodes)) < args.kills:
            # The draw comes first so a seed schedules the same episodes whatever
            # --kills is; only the last one is cut to land exactly on --kills.
            episode = runner.random_episode(kills=min(rng.randint(1, 3), args.kills - done))
            if runner.stopped:
                return
            without = 0 if episode.kills else without + 1
            if without >= MAX_EPISODES_WITHOUT_A_KILL:
                runner.stopped = (f"{without} random episodes in a row ended before any kill landed (the scenario's"
                                  f" run ends too soon to be killed); {done} of {args.kills} kills happened")
                return


def print_report(report: dict[str, Any]) -> None:
    print()
    print(f"== corral chaos: {report['scenario']} seed {report['seed']} ==")
    print_table(
        [
            ["episodes", str(report["episodes"])],
            ["kills", str(report["kills"])],
            *[[f"  kills: {t}", str(n)] for t, n in sorted(report["kills_by_target"].items())],
            ["supervisor restarts (recoveries)", str(report["supervisor_restarts"])],
            ["actor restarts", str(report["actor_restarts"])],
            ["reconciliations", str(report["reconciliations"])],
            ["runs", ", ".join(f"{k} {v}" for k, v in sorted(report["runs"].items()))],
            ["wall time", f"{report['wall_s']:.1f}s"],
        ],
        ["WHAT", "VALUE"],
    )
    print()
    print_table([[point, str(n)] for point, n in report["kills_by_point"].items()], ["KILL POINT", "KILLS"])
    print()
    _print_invariants(report["invariants"])
    for name, entry in report["invariants"].items():
        for failure in entry["failures"][:5]:
            print(f"FAIL {name}: {failure.get('detail')}")
            if "seed" in failure:
                if failure.get("failpoint"):
                    how = f"--mode failpoints --failpoint {failure['failpoint']}"
                else:
                    how = f"--mode {report.get('mode', 'random')} --kills {report.get('requested_kills', 1)}"
                print(
                    f"     reproduce: corral chaos --scenario {shlex.quote(report.get('scenario_argument', 'demo'))}"
                    f" --seed {report['seed']} {how}"
                    f" --targets {','.join(report['targets'])}   (episode {failure['episode']})"
                )
    print()
    not_exercised = report.get("not_exercised", [])
    if report.get("stopped"):
        print(_paint(f"campaign stopped: {report['stopped']}", "fail"))
    if report.get("interrupted"):
        by = report.get("interrupted_by") or "SIGINT"
        print(_paint(f"interrupted ({by}) after {report['episodes']} episodes: the report of those", "fail"))
    if not report["passed"] and not any(not entry["passed"] for entry in report["invariants"].values()):
        print(_paint("NOT PASSED: the campaign did not run what was asked", "fail"))
    elif not report["passed"]:
        print(_paint("INVARIANTS FAILED", "fail"))
    elif not_exercised:
        # Nothing failed, but a row that checked nothing is no pass: say which.
        print(_paint(f"NO INVARIANT FAILED; NOT EXERCISED: {'; '.join(not_exercised)}", "not exercised"))
    else:
        print(_paint("ALL INVARIANTS PASS", "pass"))


#: ANSI colours of a verdict on a terminal: green pass, red fail, yellow not exercised.
_COLOURS = {"pass": "32", "fail": "31", "not exercised": "33"}


def _paint(text: str, status: str) -> str:
    if not sys.stdout.isatty() or os.environ.get("NO_COLOR"):
        return text
    return f"\033[{_COLOURS[status]}m{text}\033[0m"


def _checked(entry: dict[str, Any]) -> str:
    """How many of what a row checked, and whose (the effects row: by tool)."""
    text = f"{entry['count']} {entry.get('unit', '')}".rstrip()
    breakdown = entry.get("breakdown") or {}
    if breakdown:
        text += ": " + ", ".join(f"{source} {n}" for source, n in sorted(breakdown.items()))
    return text


def _print_invariants(invariants: dict[str, dict[str, Any]]) -> None:
    """The invariant table; the status column is coloured after padding, so the
    escape codes never skew the column widths."""
    rows = [[entry.get("status", "pass" if entry["passed"] else "fail"), name, _checked(entry)]
            for name, entry in invariants.items()]
    header = ["", "INVARIANT", "CHECKED"]
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=False)]
    print("  ".join(cell.ljust(width) for cell, width in zip(header, widths, strict=False)).rstrip())
    for status, name, checked in rows:
        label = "not exercised" if status == "not exercised" else status.upper()
        cells = [_paint(label, status) + " " * (widths[0] - len(label)), name.ljust(widths[1]), checked]
        print("  ".join(cells).rstrip())


def _applies(failpoint: str, spec_text: str) -> bool:
    """Session, MCP and model failpoints only fire in scenarios that have sessions,
    MCP servers or local models."""
    layer = failpoint.split(".")[0]
    if layer == "session":
        return "session" in spec_text
    if layer == "mcp":
        return "mcp_servers" in spec_text
    if layer == "model":
        return '"local"' in spec_text
    if layer == "input":
        return "user.input_request" in spec_text
    if layer == "context":
        return "auto_compact_token_limit" in spec_text
    if layer == "durable-plan":
        return "planUpdate" in spec_text
    if layer == "preview":
        return "preview.validate" in spec_text  # a browser check: its own tests hold it
    if layer == "changeset":
        return "project.changeset" in spec_text or "project.restore" in spec_text
    if layer == "verify":
        return "project.verify" in spec_text
    if layer == "bridge":
        return "[bridge]" in spec_text  # the task bridge's own daemon
    # Chaos sends no steers and no goal controls, and runs no shared queue (one node
    # per home: two nodes taking one queued run is tests/test_pg_queue.py's).
    return layer not in ("steer", "goal", "queue")
