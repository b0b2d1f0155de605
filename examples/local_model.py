"""The quickstart's two tools on a real model: Qwen2.5-Coder-0.5B-Instruct on the
CPU, loaded once by a supervised model actor (needs the `local` extra: make
demo-local, or pip install 'corral[local]'). No API key, nothing leaves the machine.

    python examples/local_model.py [--dir DIR] [--model NAME]
"""

import argparse
import json
import tempfile
from pathlib import Path

import corral


@corral.tool
def weather(city: str) -> str:
    """The current temperature in a city."""
    return f"{city}: -2.0 C"


@corral.tool
def post(ctx: corral.ToolContext, channel: str, text: str) -> str:
    """Post a message to a chat channel, such as #ops."""
    with (ctx.workspace / "posted.jsonl").open("a") as log:  # the "chat": a file in the project
        log.write(json.dumps({"channel": channel, "text": text}) + "\n")
    return f"posted to {channel}"


def spec(base: str, model: str) -> dict[str, object]:
    # tool_choice "required" until both calls are made, then only the reply is
    # allowed (max_tool_calls): every answer is a valid plan, and the run ends.
    local = {"model": model, "tool_choice": "required", "max_tool_calls": 2}
    agent = {"id": "assistant", "provider": "local", "tools": ["weather", "post"], "local": local}
    return {"project": {"root": base}, "agents": [agent]}


if __name__ == "__main__":  # the supervisor imports this file again for the tools
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", help="the project directory (default: a new temp dir)")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="a packaged model or a .gguf path")
    args = parser.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="corral-local-")
    task = "Find the temperature in Oslo, post it to #ops, and tell me what you posted."
    with corral.Client.start(spec=spec(base, args.model), tools=[weather, post], home=f"{base}/.corral") as client:
        result = client.run("assistant", task, timeout=600).check()
        for action in result.actions:
            print(f"{action.tool}: {action.phase}")
        posted = Path(base, "posted.jsonl")
        print(f"posted: {posted.read_text().strip() if posted.exists() else '(nothing)'}")
        print(f"reply: {result.final_reply}")
