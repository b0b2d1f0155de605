"""``python -m bench``: corral's benchmarks next to the raw limits and the peers.

Everything is imported inside main(): multiprocessing's spawn re-imports this
module in every spawned child (as __mp_main__), and the bare-spawn baseline must not
pay for the harness.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys
    from pathlib import Path

    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="""\
Measure corral's figures (request RTT, one-way throughput, spawn to ready,
restart latency, idle memory, fan-out/join, durable transitions, scaling to
1,000 actors) next to the raw limits (pynng, multiprocessing, SQLite) and the
peers (Ray, Thespian, Pykka), all in the same run. Prints the machine, every
measurement (median, p99, min, n), the scaling curves, each figure with its
baselines, ratios and target, and a summary. Run it from the repository root.""",
        epilog="""\
--only takes workload, figure, curve or group names (limits, corral, peers),
comma-separated; a figure name runs corral's workload and every baseline it is
compared with (see --list). A peer that cannot run shows as "not run: reason".
--quick cuts repetitions and skips the 1,000-process and 50/200-Ray-actor
points (the baselines take about a minute on an idle 2-core machine); the full
run takes about 15 minutes, most of it Ray creating 200 actors and Thespian
creating 1,000.

examples:
  python -m bench --quick
  python -m bench --json bench/results/latest.json     # also writes latest.png
  python -m bench --only rtt_actor_supervisor,spawn_200 --json /tmp/b.json
  python -m bench --only limits""",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, fewer points")
    parser.add_argument(
        "--only", metavar="NAME[,NAME]", help="run only these workloads/figures/curves/groups"
    )
    parser.add_argument(
        "--json", metavar="PATH", type=Path,
        help="write the results as JSON here (and the scaling plot next to it, as .png)",
    )
    parser.add_argument(
        "--plot", metavar="PATH", type=Path,
        help="write the scaling plot here (default: next to --json)",
    )
    parser.add_argument("--no-plot", action="store_true", help="do not write the PNG plot")
    parser.add_argument(
        "--wait-quiet", metavar="SECONDS", type=float, default=0.0,
        help="first wait up to SECONDS for the machine to be under 15%% CPU busy",
    )
    parser.add_argument("--list", action="store_true", help="list workloads and figures, exit")
    args = parser.parse_args(argv)

    from bench import report, runner
    from bench.figure_records import CURVES, FIGURES
    from bench.harness import WORKLOADS

    runner.load_workloads()

    if args.list:
        print("workloads (group, name: what it measures):")
        for w in runner.ordered(WORKLOADS):
            print(f"  {w.group:7} {w.name:26} {w.doc}")
        print("figures (name: metric [unit]; target):")
        for spec in FIGURES.values():
            target = f"; target {spec.target_text}" if spec.target_text else ""
            print(f"  {spec.name:26} {spec.metric} [{spec.unit}]{target}")
        print("curves:")
        for cspec in CURVES.values():
            print(f"  {cspec.name:26} {cspec.title} [{cspec.unit}]")
        return 0

    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    try:
        runner.select(only)
    except KeyError as exc:
        names = sorted({*WORKLOADS, *FIGURES, *CURVES, "limits", "corral", "peers"})
        parser.error(f"unknown name {exc.args[0]!r}; known: {', '.join(names)}")

    run = runner.run(only, quick=args.quick, quiet_wait_s=args.wait_quiet)

    plot_note: str | None = None
    plot_path = args.plot or (args.json.with_suffix(".png") if args.json else None)
    if plot_path is not None and not args.no_plot and run.curves:
        title = f"corral bench, {'quick' if args.quick else 'full'} run"
        plot_note = report.write_plot(plot_path, run.curves, title)
    report.emit(report.render(run))
    if plot_note:
        print(f"plot: {plot_note}")
    if args.json:
        doc = report.finite(report.to_json(run, sys.argv[1:] if argv is None else argv, plot_note))
        report.write_json(args.json, doc)
        print(f"json: {args.json}")
    leftovers = sum(len(r.leftovers) for r in run.results.values())
    if leftovers:
        print(f"warning: {leftovers} leftover process(es) were killed; see the notes",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
