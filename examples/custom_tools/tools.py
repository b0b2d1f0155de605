"""Two user tools: a read tool and an external one. Loaded by swarm.toml's
``[tools] modules = ["./tools.py"]``, in the supervisor and in every actor."""

from __future__ import annotations

import json
import time
from pathlib import Path

import corral

INVENTORY = {"apples": 12, "pears": 0, "plums": 40}


@corral.tool(effect="read", name="stock.lookup")
def lookup(ctx: corral.ToolContext, item: str) -> dict[str, object]:
    """How many of an item are in stock."""
    return {"item": item, "count": INVENTORY.get(item, 0)}


@corral.tool(effect="external", name="orders.place", timeout_s=10)
def place_order(ctx: corral.ToolContext, item: str, quantity: int, note: str = "") -> dict[str, object]:
    """Order more of an item from the supplier. Never runs twice for one action: after
    a crash mid-call corral asks a person (corral reconcile) instead of re-ordering."""
    if quantity <= 0:
        raise corral.ToolError("quantity must be positive")
    # The side effect: one line per order in the project's orders file.
    orders = Path(ctx.workspace) / "orders.jsonl"
    with orders.open("a") as handle:
        handle.write(json.dumps({"item": item, "quantity": quantity, "action": ctx.action_id, "at": time.time()}))
        handle.write("\n")
    return {"ordered": quantity, "item": item}
