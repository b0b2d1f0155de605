"""``corral bridge``: the agent-task bridge daemon (see docs/bridge.md)."""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path

from corral.cli.main import EXIT_USAGE, CliError, arguments, command


def _bridge_args(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bridge_command", required=True)
    serve = sub.add_parser("serve", help="serve JSON-RPC 2.0 over HTTP on POST /rpc")
    serve.add_argument("--db", required=True, help="the bridge's SQLite database (created if missing)")
    serve.add_argument("--listen", default="127.0.0.1:8471", help="HOST:PORT (default 127.0.0.1:8471; port 0: any)")
    serve.add_argument("--principals", required=True,
                       help='registration file: {"principals": {"NAME": {"token": "..."}}} (keep it 0600)')
    serve.add_argument("--json", action="store_true", help="print the endpoint as one JSON line once listening")
    methods = sub.add_parser("methods", help="list the methods: parameters, idempotency, CAS, lease")
    methods.add_argument("--json", action="store_true",
                         help="every method's JSON Schemas (draft 2020-12): params, result, error")


@command("bridge", "the agent-task bridge: a JSON-RPC service for handing tasks between agent clients")
@arguments(_bridge_args)
def cmd_bridge(args: argparse.Namespace) -> int:
    from corral.bridge import server
    from corral.bridge.store import SchemaError

    if args.bridge_command == "methods":
        if args.json:
            from corral.bridge.methods import ERROR, METHODS

            print(json.dumps({name: {"params": m.params, "result": m.result, "error": ERROR, "mutating": m.mutating,
                                     "cas": m.cas, "lease_bound": m.lease_bound, "summary": m.summary}
                              for name, m in sorted(METHODS.items())}, indent=1, sort_keys=True))
        else:
            print(server.describe())
        return 0
    host, _, port_text = args.listen.rpartition(":")
    if not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise CliError(f"--listen must be HOST:PORT, not {args.listen!r}", EXIT_USAGE)
    try:
        principals = server.load_principals(Path(args.principals))
    except server.RegistrationError as exc:
        raise CliError(f"bad --principals: {exc}", EXIT_USAGE) from None
    from corral.core import http_service

    try:
        sock = http_service.listen(host, int(port_text))
    except OSError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    try:
        bridge = server.Bridge(Path(args.db), principals)
    except (SchemaError, sqlite3.Error) as exc:
        sock.close()
        raise CliError(f"bad --db {args.db}: {exc}", EXIT_USAGE) from None
    port = sock.getsockname()[1]
    info = {"url": f"http://{host}:{port}", "port": port, "db": str(args.db), "principals": sorted(principals.values())}

    def announce() -> None:
        print(json.dumps(info) if args.json else f"corral bridge: {info['url']}/rpc  db {args.db}", flush=True)

    try:
        http_service.run_until_signal(bridge.app(), sock, announce)
    finally:
        bridge.close()
    print("corral bridge: stopped", file=sys.stderr)
    return 0
