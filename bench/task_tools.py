"""The user tools of the ``real_model_tasks`` bench: a fixed weather service and a
chat whose posts land in a file of the agent's workspace, where the host reads them.

Loaded by the bench's spec as a file (``[tools] modules``), in the supervisor and in
every actor, so it imports nothing from ``bench``.
"""

from __future__ import annotations

import json
from pathlib import Path

import corral

#: What ``weather.get`` answers, in °C: fixed, so the host knows what to look for.
TEMPERATURES_C = {"oslo": -2.0, "bergen": 4.5, "paris": 11.0}
#: The file ``chat.post`` appends to, one JSON object per post, in the workspace.
POSTS_FILE = "posts.jsonl"


@corral.tool(name="weather.get", effect="read")
def weather_get(city: str) -> dict[str, object]:
    """The current temperature in a city, in degrees Celsius."""
    key = city.strip().lower()
    if key not in TEMPERATURES_C:
        raise corral.ToolError(f"no weather for {city!r}; known cities: {', '.join(c.title() for c in TEMPERATURES_C)}")
    return {"city": key.title(), "temperature_c": TEMPERATURES_C[key]}


@corral.tool(name="chat.post")
def chat_post(ctx: corral.ToolContext, channel: str, text: str) -> dict[str, object]:
    """Post a message to a chat channel (such as #ops)."""
    with (Path(ctx.workspace) / POSTS_FILE).open("a") as handle:
        handle.write(json.dumps({"channel": channel, "text": text}) + "\n")
    return {"posted": True, "channel": channel}
