"""MCP servers as supervised tool sources: the spec section, catalogs and pins, the calls."""
