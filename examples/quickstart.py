"""A typed tool, an agent with instructions and a typed output, a spec built in
Python, a run and its output, in one file. The scripted provider plays the model:
no model, no API key (docs/extending.md, docs/agents.md).

    python examples/quickstart.py [--dir DIR]
"""

import argparse
import tempfile

import pydantic

import corral


@corral.tool
def weather(city: str) -> str:
    """The current temperature in a city."""
    return f"{city}: -2.0 C"


class Forecast(pydantic.BaseModel):  # the run's typed output
    city: str
    temperature_c: float


SPEC = {"agents": [{
    "id": "assistant",
    "instructions": "You report the weather. Look it up with the weather tool; never guess.",
    "tools": ["weather"],
    "output": Forecast,
    "steps": [  # the scripted "model"'s two turns
        {"actions": [{"tool": "weather", "input": {"city": "Oslo"}}]},
        {"final": {"city": "Oslo", "temperature_c": -2.0}},
    ],
}]}

if __name__ == "__main__":  # the supervisor imports this file again for `weather`: keep the work under here
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", help="the project directory (default: a new temp dir)")
    base = parser.parse_args().dir or tempfile.mkdtemp(prefix="corral-quickstart-")
    spec = {**SPEC, "project": {"root": base}}
    with corral.Client.start(spec=spec, tools=[weather], home=f"{base}/.corral") as client:
        result = client.run("assistant", "How cold is it in Oslo?", timeout=60).check()
        print(f"{result.actions[0].tool}: {result.actions[0].phase}")
        print(f"output: {result.output!r}")
