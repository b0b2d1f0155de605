"""The ``corral`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from corral import __version__
from corral.cli.parser import Parser
from corral.client import Client
from corral.client_start import SupervisorStartError, ledger_env, start_supervisor
from corral.core.errors import LedgerDoorError, LedgerLost, RunTimeout
from corral.mailbox.control import ControlError, SupervisorGone
from corral.mailbox.errors import DeadlineExceeded
from corral.supervisor.home import home_dir as homes
from corral.supervisor.home.home_placement import check_placement, project_root_in, project_root_of
from corral.supervisor.ledger.ledger_spec import LedgerSpecError
from corral.supervisor.spec.swarm_spec import SpecError, SwarmSpec, load_spec

EXIT_USAGE = 2
EXIT_BUSY = 3
EXIT_NOT_RUNNING = 4
EXIT_FAILED = 1

#: What ``corral --ledger URL`` does from a host with no node (the cluster's front
#: door, supervisor/cluster/front_door.py); every other command needs a node's home.
REMOTE_COMMANDS = ("run", "wait", "show", "pending", "approve", "deny", "cancel", "status", "ping")

Command = Callable[[argparse.Namespace], int]
_COMMANDS: dict[str, tuple[Command, Callable[[argparse.ArgumentParser], None], str]] = {}


def command(name: str, help_text: str) -> Callable[[Command], Command]:
    def register(func: Command) -> Command:
        setup = getattr(func, "_setup", lambda parser: None)
        _COMMANDS[name] = (func, setup, help_text)
        return func

    return register


def arguments(setup: Callable[[argparse.ArgumentParser], None]) -> Callable[[Command], Command]:
    def attach(func: Command) -> Command:
        func._setup = setup  # type: ignore[attr-defined]
        return func

    return attach


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def home_of(args: argparse.Namespace) -> Path:
    return homes.resolve_home(args.home)


@contextmanager
def cli_errors() -> Iterator[None]:
    """Client errors as CLI errors with their exit codes."""
    try:
        yield
    except homes.NotRunning as exc:
        raise CliError(str(exc), EXIT_NOT_RUNNING) from None
    except ControlError as exc:
        usage = exc.code == "needs-a-node"  # asked of a cluster's database, for what only a node does
        raise CliError(f"{exc.code}: {exc.message}", EXIT_USAGE if usage else EXIT_FAILED) from None
    except LedgerDoorError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    except (DeadlineExceeded, SupervisorGone, RunTimeout, LedgerLost) as exc:
        raise CliError(str(exc)) from None


@contextmanager
def open_client(args: argparse.Namespace) -> Iterator[Client]:
    """The commands are a thin layer on ``corral.Client``: on a node's home, or
    (``corral --ledger URL``) on the cluster's database, from a host with no node."""
    with cli_errors():
        url = getattr(args, "cluster_ledger", None)
        with Client.cluster(url) if url else Client.connect(home_of(args)) as connected:
            yield connected


@contextmanager
def open_reader(args: argparse.Namespace) -> Iterator[Client]:
    """For the read commands (``show``, ``runs``, ``events``, ``intent receipts``):
    through the supervisor while one holds the home, else from its ledger, read-only
    (``Client.reading``). ``say_where_read`` after the read. A ledger read behind its
    high-water mark is warned of on stderr, whether the read answered or was refused
    (a run the damage dropped is ``not-found``)."""
    if getattr(args, "cluster_ledger", None):
        with open_client(args) as remote:
            yield remote
        return
    with cli_errors(), Client.reading(home_of(args)) as connected:
        try:
            yield connected
        finally:
            if connected.ledger_behind is not None:
                from corral.offline_read import warning_text

                print(warning_text(connected.home, connected.ledger_behind), file=sys.stderr)


def say_where_read(client: Client, args: argparse.Namespace) -> None:
    """One line on stderr when the answer came from the ledger with no supervisor
    running (``--json`` carries ``read_from`` instead)."""
    if client.read_ledger and not args.json:
        print(f"corral: read from the ledger of {client.home}: no supervisor is running", file=sys.stderr)


def rpc(args: argparse.Namespace, method: str, timeout: float = 10.0, **params: Any) -> Any:
    with open_client(args) as connected:
        return connected.call(method, timeout=timeout, **params)


def json_object_arg(text: str, what: str) -> dict[str, Any]:
    """A command-line argument that must be a JSON object (a usage error otherwise)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{what} is not JSON: {exc.msg} at {exc.pos}", EXIT_USAGE) from None
    if not isinstance(value, dict):
        raise CliError(f"{what} must be a JSON object", EXIT_USAGE)
    return value


def emit_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def print_table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=False)]
    for line in [header, *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=False)).rstrip())


# -- up / down ---------------------------------------------------------------------


def _up_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", help="swarm spec (TOML); default: the one the last boot ran")
    parser.add_argument("--foreground", action="store_true", help="run in this terminal, do not detach")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for readiness")
    parser.add_argument(
        "--ledger",
        metavar="URL",
        help="a shared PostgreSQL ledger (postgresql://USER@HOST/DB): this supervisor becomes a node of the"
        " swarm on it; default: [ledger] url in the spec, then what this home used last, then its SQLite file",
    )
    parser.add_argument("--node", help="this node's id (default: [ledger] node, else from the host name and home)")


@command("up", "start the supervisor for a home (detached into its own session)")
@arguments(_up_args)
def cmd_up(args: argparse.Namespace) -> int:
    home = home_of(args)
    spec = Path(args.spec) if args.spec else None
    # Loaded once, here: before the home, so a bad spec leaves nothing behind.
    loaded = _check_spec(spec) if spec is not None else None
    if loaded is not None:
        from corral.supervisor.spec.provider_keys import key_warnings

        for warning in key_warnings(loaded, os.environ):  # a key the spec names, unset: said now, not as a 401
            print(f"corral up: warning: {warning}", file=sys.stderr)
    try:
        # Before anything is created: a home inside the project (or around it) is refused.
        check_placement(home, project_root_in(loaded) if loaded is not None else project_root_of(None, home))
        homes.ensure_home(home)
    except homes.HomeError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    if args.foreground:
        from corral.client_start import supervisor_argv
        from corral.supervisor.__main__ import main as daemon_main

        if args.ledger:
            os.environ.update(ledger_env(args.ledger))
        argv = supervisor_argv(home, spec, args.node)
        return daemon_main(argv[argv.index("corral.supervisor") + 1 :])  # the daemon's own arguments
    try:
        start_supervisor(home, spec, args.timeout, ledger=args.ledger, node=args.node, checked=loaded is not None)
    except SpecError as exc:
        raise CliError(f"bad spec: {exc}", EXIT_USAGE) from None
    except LedgerSpecError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    except SupervisorStartError as exc:
        raise CliError(str(exc), EXIT_BUSY if exc.busy else EXIT_USAGE) from None
    endpoint = homes.read_endpoint(home)
    print(f"corral: supervisor up  pid={endpoint.pid}  boot={endpoint.boot_id}  home={home}")
    return 0


def _check_spec(spec: Path) -> SwarmSpec:
    try:
        return load_spec(spec)  # fail before starting, with the exact message
    except SpecError as exc:
        raise CliError(f"bad spec: {exc}", EXIT_USAGE) from None


def _down_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the exit")


@command("down", "stop the supervisor gracefully (actors stop by their shutdown specs)")
@arguments(_down_args)
def cmd_down(args: argparse.Namespace) -> int:
    home = home_of(args)
    try:
        endpoint = homes.read_endpoint(home)
    except homes.NotRunning:
        print(f"corral: no supervisor running on {home}")
        return 0
    with cli_errors(), Client.connect(home) as connected:
        stopped = connected.down(args.timeout)
    if not stopped:
        raise CliError(f"supervisor pid {endpoint.pid} still running after {args.timeout}s")
    print(f"corral: supervisor stopped (boot {endpoint.boot_id})")
    return 0


# -- status / ping / events ----------------------------------------------------------


def json_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


@command("status", "show the supervision tree, actors and what is open")
@arguments(json_arg)
def cmd_status(args: argparse.Namespace) -> int:
    try:
        with open_client(args) as connected:
            status = connected.status()
    except CliError as exc:
        if exc.code == EXIT_NOT_RUNNING:
            _say_why_the_node_stopped(home_of(args))
            _say_if_the_ledger_is_behind(home_of(args))
        raise
    if args.json:
        emit_json(status)
        return 0
    if status.get("remote"):  # a client of the cluster's database: the cluster, no node's tree
        print(f"cluster at {status['ledger']}")
        _print_cluster_tables(status["cluster"])
        return 0
    print(
        f"home {status['home']}  boot {status['boot_id']}  pid {status['pid']}  up {status['uptime_s']:.1f}s"
        f"  launch {status['launch']}"
    )
    rows = [
        [
            a["id"],
            a["group"],
            a["template"],
            a["status"] if a.get("stalled_s") is None else f"{a['status']} (stalled {a['stalled_s']:.0f}s)",
            str(a["pid"] or "-"),
            str(a["restarts"]),
            "-" if a["last_exit"] is None else str(a["last_exit"]),
        ]
        for a in status["actors"]
    ]
    print_table(rows, ["ACTOR", "GROUP", "TEMPLATE", "STATUS", "PID", "RESTARTS", "LAST EXIT"])
    for group in status["groups"]:
        if group["status"] != "running":
            print(f"group {group['id']}: {group['status']} — {group['reason']}")
    for server in status.get("mcp", []):
        detail = f"{server['tools']} tools, catalog {server['fingerprint'] or '-'}"
        error = f" — {server['error']}" if server["error"] else ""
        print(f"mcp {server['id']}: {server['status']}, {detail}{error}")
    if status.get("cluster"):
        _print_cluster(status["cluster"])
    if status.get("degraded"):
        # The reason says what is degraded: a failing ledger (read-only, new work
        # refused), a lost database connection, a stalled fork server (spawns wait).
        print(f"DEGRADED: {status['degraded']}")
    if status.get("busy"):
        print("open: " + "; ".join(status["busy"]))
    return 0


def _say_why_the_node_stopped(home: Path) -> None:
    """A cluster node that stopped itself left a note in its home: why, and what to do."""
    from corral.supervisor.cluster import node_stop

    note = node_stop.read(home)
    if note is not None:
        print(f"{node_stop.describe(note)}\nto resume it: {note['advice']}", file=sys.stderr)


def _say_if_the_ledger_is_behind(home: Path) -> None:
    """With no supervisor: a ledger behind its high-water mark lost committed work
    (``corral up`` will refuse it); say so, and what to do, before anything else is read."""
    from corral.offline_read import HomeHeld, LedgerReader, warning_text

    try:
        behind = LedgerReader(home).check()
    except (HomeHeld, homes.NotRunning, ControlError):
        return  # a supervisor took the home, or there is no ledger: nothing to judge here
    if behind is not None:
        print(warning_text(home, behind), file=sys.stderr)


def _print_cluster(cluster: dict[str, Any]) -> None:
    """Every node of a shared ledger, and who holds which partition."""
    print(f"\nnode {cluster['node']}  partition {cluster['partition']} (epoch {cluster['epoch']})  {cluster['ledger']}")
    _print_cluster_tables(cluster)
    if cluster.get("dormant"):
        print(f"held by this node with no supervisor (their runs are over): {', '.join(cluster['dormant'])}")
    for refused in cluster.get("adoption_refused") or []:
        print(f"NOT ADOPTED: partition {refused['partition']} has schema {refused['schema']}, newer than this"
              f" corral's ({refused['supported']}): {refused['advice']}")


def _print_cluster_tables(cluster: dict[str, Any]) -> None:
    """The nodes, the partitions, and per node its runs and capacity with the
    cluster's totals and the shared queue's depth."""

    def lease(left: float | None) -> str:
        return "-" if left is None else (f"{left:.1f}s left" if left >= 0 else f"expired {-left:.1f}s ago")

    print_table(
        [[n["node_id"], n["host"], str(n["pid"]), n["status"], lease(n["lease_left_s"])] for n in cluster["nodes"]],
        ["NODE", "HOST", "PID", "STATUS", "HEARTBEAT LEASE"],
    )
    print_table(
        [[p["name"], p["holder"], str(p["epoch"]), p["adopted_from"] or "-", lease(p["lease_left_s"])]
         for p in cluster["partitions"]],
        ["PARTITION", "HELD BY", "EPOCH", "ADOPTED FROM", "LEASE"],
    )
    load = cluster.get("load") or {}
    if load.get("nodes"):
        def cap(node: dict[str, Any]) -> str:
            c = node.get("capacity")
            return "-" if not c else f"{c['max_runs']} runs, {c['max_runs_per_agent']} per agent"

        totals = load["totals"]
        print_table(
            [[n["node"], str(n["in_flight"]), str(n.get("waiting", 0)), str(n["unfinished"]), cap(n)]
             for n in load["nodes"]]
            + [["(cluster)", str(totals["in_flight"]), str(totals.get("waiting", 0)), str(totals["unfinished"]),
                f"{totals['max_runs']} runs"]],
            ["NODE", "RUNS IN FLIGHT", "WAITING THERE", "RUNS UNFINISHED", "CAPACITY"],
        )
        print(f"shared queue: {load['queue_depth']} run(s) waiting for a node with room")


@command("ping", "check that the supervisor answers")
def cmd_ping(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    reply = rpc(args, "ping")
    elapsed = (time.perf_counter() - start) * 1000
    print(f"pong from pid {reply['pid']} boot {reply['boot_id']} in {elapsed:.2f} ms")
    return 0


def _events_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", type=int, default=0, help="cursor to start after (default: 0)")
    parser.add_argument("--follow", action="store_true", help="keep waiting for new events")
    json_arg(parser)


@command("events", "print the event stream (cursor-based; --follow to keep watching)")
@arguments(_events_args)
def cmd_events(args: argparse.Namespace) -> int:
    if args.since < 0:
        raise CliError("--since must be >= 0", EXIT_USAGE)
    # What has happened can be read from the ledger; what happens next needs a supervisor.
    with open_client(args) if args.follow else open_reader(args) as connected:
        for event in connected.events(args.since, follow=args.follow):
            if args.json:
                print(json.dumps(event.raw, sort_keys=True), flush=True)
            else:
                stamp = time.strftime("%H:%M:%S", time.localtime(event.at))
                data = " ".join(f"{k}={v}" for k, v in sorted(event.data.items()))
                print(f"{event.cursor:>6} {stamp} {event.kind:<22} {event.subject} {data}", flush=True)
        say_where_read(connected, args)
    return 0


# -- entry -------------------------------------------------------------------------


def build_parser() -> Parser:
    parser = Parser(
        prog="corral",
        description="corral: a supervised actor runtime for local LLM agent swarms.",
        epilog="The home defaults to $CORRAL_HOME, else ./.corral. Shell completion: corral completion --help.",
    )
    parser.add_argument("--home", help="home directory (default: $CORRAL_HOME or ./.corral)")
    parser.add_argument(
        "--ledger", dest="cluster_ledger", metavar="URL",
        help="from a host with no node: talk to a cluster's PostgreSQL (postgresql://USER@HOST/DB; the password from"
        f" PGPASSWORD or ~/.pgpass) for {', '.join(REMOTE_COMMANDS)} (docs/scale-out.md, \"The front door\")",
    )
    parser.add_argument("--version", action="version", version=f"corral {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _load_extra_commands()
    for name, (func, setup, help_text) in _COMMANDS.items():
        child = sub.add_parser(name, help=help_text, description=help_text)
        child.add_argument("--home", help=argparse.SUPPRESS, default=argparse.SUPPRESS)
        setup(child)
        child.set_defaults(func=func)
    return parser


def _load_extra_commands() -> None:
    import importlib

    commands = (
        "run", "approvals", "swarm", "chaos", "actor", "mcp", "doctor", "chat", "ui", "bridge", "collaboration",
        "transcript", "completion", "goal", "acceptance",
    )
    for module in (f"corral.cli.{name}" for name in commands):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_command_line(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    if getattr(args, "cluster_ledger", None) and args.command not in REMOTE_COMMANDS:
        print(f"corral: `{args.command}` needs a node: run it on a node's host (with --ledger: "
              f"{', '.join(REMOTE_COMMANDS)})", file=sys.stderr)
        return EXIT_USAGE
    try:
        code: int = args.func(args)
        return code
    except CliError as exc:
        print(f"corral: {exc}", file=sys.stderr)
        return exc.code
    except homes.HomeError as exc:
        print(f"corral: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `corral runs | head`: the reader is gone, which is not an error of ours.
        # Point stdout at /dev/null so the interpreter's final flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
