"""``corral ui``: the live web dashboard of a running swarm (see docs/ui.md)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from corral.cli.main import EXIT_NOT_RUNNING, EXIT_USAGE, CliError, arguments, command, home_of
from corral.supervisor.home import home_dir as homes

DEFAULT_PORT = 8470


def _ui_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port on 127.0.0.1 (default {DEFAULT_PORT}; 0: any free port)"
    )
    parser.add_argument("--json", action="store_true", help="print the endpoint (url, port, token) as one JSON line")


@command("ui", "serve the live dashboard of the running swarm on 127.0.0.1 (tree, runs, pending, timeline)")
@arguments(_ui_args)
def cmd_ui(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise CliError("--port must be 0..65535", EXIT_USAGE)
    home = home_of(args)
    try:
        homes.read_endpoint(home)
    except homes.HomeError as exc:
        raise CliError(
            f"no supervisor is running on {home}: {exc} (start one with `corral up`)", EXIT_NOT_RUNNING
        ) from None
    try:
        from corral.core import http_service
        from corral.ui import server
    except ImportError as exc:
        raise CliError(f"the dashboard needs starlette and hypercorn (pip install 'corral[ui]'): {exc}") from None
    try:
        sock = http_service.listen("127.0.0.1", args.port)
    except OSError as exc:
        raise CliError(f"{exc}; choose another with --port (0: any free port)", EXIT_USAGE) from None
    dashboard = server.Dashboard(home)
    port = sock.getsockname()[1]
    dashboard.origin = f"http://127.0.0.1:{port}"
    info = {"url": f"http://127.0.0.1:{port}/?token={dashboard.token}", "port": port, "token": dashboard.token,
            "pid": os.getpid()}
    endpoint = server.write_endpoint(home, info)

    def announce() -> None:
        if args.json:
            print(json.dumps(info), flush=True)
        else:
            print(f"corral ui: {info['url']}\n  (the token is also in {endpoint}, mode 0600; Ctrl-C stops)",
                  flush=True)

    try:
        http_service.run_until_signal(dashboard.app(), sock, announce)
    finally:
        with contextlib.suppress(OSError):
            sock.close()  # hypercorn closes the fd it served on; this is for an early exit
        with contextlib.suppress(FileNotFoundError):
            endpoint.unlink()
    print("corral ui: stopped", file=sys.stderr)
    return 0
