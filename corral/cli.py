"""The ``corral`` command line."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corral import client
from corral.mailbox.control import ControlError, SupervisorGone
from corral.mailbox.errors import DeadlineExceeded
from corral.procs import wait_exit
from corral.supervisor import home as homes
from corral.supervisor.spec import SpecError, load_spec

EXIT_USAGE = 2
EXIT_BUSY = 3
EXIT_NOT_RUNNING = 4
EXIT_FAILED = 1

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


def rpc(args: argparse.Namespace, method: str, timeout: float = 10.0, **params: Any) -> Any:
    try:
        return client.call(home_of(args), method, timeout=timeout, **params)
    except homes.NotRunning as exc:
        raise CliError(str(exc), EXIT_NOT_RUNNING) from None
    except ControlError as exc:
        raise CliError(f"{exc.code}: {exc.message}") from None
    except (DeadlineExceeded, SupervisorGone) as exc:
        raise CliError(str(exc)) from None


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


@command("up", "start the supervisor for a home (detached into its own session)")
@arguments(_up_args)
def cmd_up(args: argparse.Namespace) -> int:
    home = home_of(args)
    try:
        homes.ensure_home(home)
    except homes.HomeError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    if args.spec:
        try:
            load_spec(Path(args.spec))  # fail before detaching, with the exact message
        except SpecError as exc:
            raise CliError(f"bad spec: {exc}", EXIT_USAGE) from None
    argv = [sys.executable, "-m", "corral.supervisor", "--home", str(home)]
    if args.spec:
        argv += ["--spec", str(Path(args.spec).absolute())]
    if args.foreground:
        from corral.supervisor.__main__ import main as daemon_main

        return daemon_main(argv[3:])
    if homes.is_locked(home):
        raise CliError(f"a supervisor is already running on {home} (`corral status`)", EXIT_BUSY)
    read_fd, write_fd = os.pipe()
    log_path = home / "logs" / "supervisor.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [*argv, "--ready-fd", str(write_fd)],
            pass_fds=[write_fd],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    os.close(write_fd)
    line = _read_line(read_fd, args.timeout)
    if line.startswith("ready "):
        endpoint = homes.read_endpoint(home)
        print(f"corral: supervisor up  pid={endpoint.pid}  boot={endpoint.boot_id}  home={home}")
        return 0
    if proc.poll() is None and not line:
        proc.kill()
    proc.wait()
    if line.startswith("error "):
        message = line[len("error ") :]
        raise CliError(message, EXIT_BUSY if "owns" in message else EXIT_USAGE)
    tail = log_path.read_text(errors="replace").splitlines()[-15:]
    raise CliError("supervisor did not become ready:\n  " + "\n  ".join(tail))


def _read_line(fd: int, timeout: float) -> str:
    import select

    deadline = time.monotonic() + timeout
    data = b""
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while b"\n" not in data:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready, _, _ = select.select([pipe], [], [], remaining)
            if not ready:
                break
            chunk = pipe.read(4096)
            if not chunk:
                break
            data += chunk
    return data.decode(errors="replace").strip()


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
    try:
        client.call(home, "down")
    except SupervisorGone:
        pass  # it went away before it could answer: the outcome we asked for
    except ControlError as exc:
        raise CliError(f"{exc.code}: {exc.message}") from None
    except DeadlineExceeded as exc:
        raise CliError(str(exc)) from None
    if not wait_exit(endpoint.pid, args.timeout):
        raise CliError(f"supervisor pid {endpoint.pid} still running after {args.timeout}s")
    print(f"corral: supervisor stopped (boot {endpoint.boot_id})")
    return 0


# -- status / ping / events ----------------------------------------------------------


def _json_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


@command("status", "show the supervision tree, actors and what is open")
@arguments(_json_arg)
def cmd_status(args: argparse.Namespace) -> int:
    status = rpc(args, "status")
    if args.json:
        emit_json(status)
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
            a["status"],
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
    if status.get("busy"):
        print("open: " + "; ".join(status["busy"]))
    return 0


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
    _json_arg(parser)


@command("events", "print the event stream (cursor-based; --follow to keep watching)")
@arguments(_events_args)
def cmd_events(args: argparse.Namespace) -> int:
    if args.since < 0:
        raise CliError("--since must be >= 0", EXIT_USAGE)
    cursor = args.since
    while True:
        reply = rpc(args, "events", timeout=40.0, since=cursor, wait_ms=25_000 if args.follow else 0)
        for event in reply["events"]:
            if args.json:
                print(json.dumps(event, sort_keys=True), flush=True)
            else:
                stamp = time.strftime("%H:%M:%S", time.localtime(event["at"]))
                data = " ".join(f"{k}={v}" for k, v in sorted(event["data"].items()))
                print(f"{event['cursor']:>6} {stamp} {event['kind']:<22} {event['subject']} {data}", flush=True)
        cursor = reply["cursor"]
        if not args.follow:
            return 0


# -- entry -------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="corral",
        description="corral: a supervised actor runtime for local LLM agent swarms.",
        epilog="The home defaults to $CORRAL_HOME, else ./.corral.",
    )
    parser.add_argument("--home", help="home directory (default: $CORRAL_HOME or ./.corral)")
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

    for module in ("corral.run_cli", "corral.swarm_cli", "corral.chaos_cli", "corral.mcp_cli"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
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


if __name__ == "__main__":
    sys.exit(main())
