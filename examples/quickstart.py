"""A typed tool, a spec built in Python, a run and its reply, in one file. The
scripted provider plays the model: no model, no API key (docs/extending.md).

    python examples/quickstart.py [--dir DIR]
"""

import argparse
import tempfile

import corral


@corral.tool
def weather(city: str) -> str:
    """The current temperature in a city."""
    return f"{city}: -2.0 C"


SPEC = {"agents": [{"id": "assistant", "tools": ["weather"], "steps": [  # the scripted "model"'s two turns
    {"actions": [{"tool": "weather", "input": {"city": "Oslo"}}]},
    {"final": "It is -2.0 C in Oslo."},
]}]}

if __name__ == "__main__":  # the supervisor imports this file again for `weather`: keep the work under here
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", help="the project directory (default: a new temp dir)")
    base = parser.parse_args().dir or tempfile.mkdtemp(prefix="corral-quickstart-")
    spec = {**SPEC, "project": {"root": base}}
    with corral.Client.start(spec=spec, tools=[weather], home=f"{base}/.corral") as client:
        result = client.run("assistant", "How cold is it in Oslo?", timeout=60).check()
        print(f"{result.actions[0].tool}: {result.actions[0].phase}")
        print(f"reply: {result.final_reply}")
