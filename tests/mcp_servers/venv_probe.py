"""An MCP stdio server that tells which interpreter runs it.

tests/test_mcp_launch.py copies it into a fresh venv's site-packages under a
name only that venv can import, and starts it as ``<venv>/bin/python -m NAME``:
it starts at all only if corral runs the venv's python by the name written
(a symlink to the base interpreter), not the interpreter the link points to.
"""

from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("venv-probe")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def where() -> str:
    """sys.prefix of the interpreter serving this call."""
    return sys.prefix


if __name__ == "__main__":
    server.run("stdio")
