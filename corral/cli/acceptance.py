"""``corral acceptance``: the real-provider acceptance suite (docs/acceptance.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from corral.cli.main import EXIT_USAGE, CliError, arguments, command

DESCRIPTION = """Builds a disposable project and home, runs real agents on the model you configure (the packaged
local model by default, or any OpenAI-compatible server), SIGKILLs the supervisor at a named failpoint, and
judges every point from the ledger and the project's files. Each point is PASS, FAIL-model (the runtime held,
the model did not do the task), FAIL-runtime (an invariant, a leak, a duplicate, a crash) or BLOCKED (what is
missing is named). Exit code: 0 all PASS, 1 any FAIL, 2 BLOCKED and no FAIL."""


def _args(parser: argparse.ArgumentParser) -> None:
    from corral.acceptance.point_names import names

    parser.description = DESCRIPTION
    parser.add_argument("--suite", default="full", metavar="SUITE",
                        help="full (every point), reduced (the seven points one run covers: what `make test` runs),"
                             f" or one point: {', '.join(names()[2:])} (default: full)")
    parser.add_argument("--model", help="a packaged model (qwen2.5-coder-0.5b, the default; smollm2) or a .gguf file")
    parser.add_argument("--provider-url", help="an OpenAI-compatible server instead (http://host:port/v1);"
                        " its key, if it needs one, in $CORRAL_ACCEPTANCE_API_KEY")
    parser.add_argument("--provider-model", help="with --provider-url: the model name the server serves")
    parser.add_argument("--json", dest="json_path", metavar="FILE",
                        help="write the report (per point: verdict, reason, evidence paths and sha256s) here")
    parser.add_argument("--keep", action="store_true", help="keep the disposable project, homes and logs")


@command("acceptance", "the real-provider acceptance suite: PASS, FAIL-model, FAIL-runtime or BLOCKED per point")
@arguments(_args)
def cmd_acceptance(args: argparse.Namespace) -> int:
    from corral.acceptance.suite import Options, run_suite

    options = Options(args.suite, args.model, args.provider_url, args.provider_model, args.keep)
    console = Console(stderr=True)
    try:
        report = run_suite(options, console)
    except KeyError:
        raise CliError(f"unknown suite or point {args.suite!r} (corral acceptance --help lists them)",
                       EXIT_USAGE) from None
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    if args.json_path:
        path = Path(args.json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(report.model_dump_json(indent=2) + "\n")
    from corral.supervisor.runs.repair_histogram import line

    print(line(report.repair_histogram), file=sys.stdout)
    kept = f"; kept in {report.workdir}" if report.kept and report.workdir else ""
    print(f"acceptance {report.suite}: {report.verdict.value} on {report.provider}"
          f" ({report.wall_s:.0f}s, exit {report.exit_code}){kept}", file=sys.stdout)
    return report.exit_code
