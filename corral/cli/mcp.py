"""CLI for MCP servers: ``corral mcp list`` and ``corral mcp call``."""

from __future__ import annotations

import argparse
from typing import Any

from corral.cli.main import EXIT_FAILED, arguments, command, emit_json, json_object_arg, print_table, rpc


def _mcp_args(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="mcp_command", metavar="ACTION", required=True)
    listing = sub.add_parser("list", help="the servers, their state, tools, effects and fingerprints")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    call = sub.add_parser(
        "call",
        help="call one tool, for debugging: a run of its own, through policy and the ledger",
        description=(
            "Call one MCP tool as a durable action of a run of its own. Arguments are validated"
            " against the tool's schema first; a tool whose approval rule asks for confirmation"
            " needs --approve (you approve it, and the ledger records that you did)."
        ),
    )
    call.add_argument("server", metavar="SERVER", help="server id from [[mcp_servers]]")
    call.add_argument("tool", metavar="TOOL", help="the server's tool name (without mcp.SERVER.)")
    call.add_argument("--args", default="{}", help="the arguments as a JSON object (default: {})")
    call.add_argument("--approve", action="store_true", help="approve a tool that needs confirmation")
    call.add_argument("--json", action="store_true", help="machine-readable output")


@command("mcp", "MCP servers: list them, or call one tool for debugging")
@arguments(_mcp_args)
def cmd_mcp(args: argparse.Namespace) -> int:
    if args.mcp_command == "list":
        return _list(args)
    return _call(args)


def _list(args: argparse.Namespace) -> int:
    reply: dict[str, Any] = rpc(args, "mcp.list")
    if args.json:
        emit_json(reply)
        return 0
    servers = reply["servers"]
    if not servers:
        print("no MCP servers are declared ([[mcp_servers]] in the spec)")
        return 0
    for server in servers:
        info = server.get("server_info") or {}
        name = f" {info.get('name', '')} {info.get('version', '')}".rstrip()
        print(
            f"{server['id']}  {server['transport']}  {server['status']}  restarts {server['restarts']}"
            f"  catalog {server['fingerprint'][:16] or '-'}{name}"
        )
        if server.get("error"):
            # The cause, the server's log file and the last lines of its stderr.
            print("  error: " + str(server["error"]).replace("\n", "\n  "))
        rows = [
            [tool["full_name"], tool["effect"], tool["policy"], tool["fingerprint"][:16]] for tool in server["tools"]
        ]
        if rows:
            print_table(rows, ["  TOOL", "EFFECT", "POLICY", "FINGERPRINT"])
    return 0


def _call(args: argparse.Namespace) -> int:
    arguments_value = json_object_arg(args.args, "--args")
    reply: dict[str, Any] = rpc(
        args,
        "mcp.call",
        timeout=3700.0,
        server=args.server,
        tool=args.tool,
        arguments=arguments_value,
        approve=bool(args.approve),
    )
    if args.json:
        emit_json(reply)
    else:
        result = reply.get("result") or {}
        status = "ok" if reply.get("ok") and not result.get("is_error") else "failed"
        print(f"run {reply['run_id']}  action {reply['action_id']}  {status}")
        if reply.get("error"):
            print(f"  {reply.get('code', 'error')}: {reply['error']}")
        if result.get("text"):
            print(result["text"])
        if reply.get("sidecar"):
            print(f"  (full result: {reply['sidecar']}, {reply.get('bytes')} bytes)")
    ok = bool(reply.get("ok")) and not (reply.get("result") or {}).get("is_error")
    return 0 if ok else EXIT_FAILED
