"""An agent defined as a Pydantic AI user defines one: its own instructions and a
typed output (a pydantic model), on a real model on the CPU: Qwen2.5-Coder-0.5B-
Instruct by default, loaded once by a supervised model actor (needs the `local`
extra: make demo-local, or pip install 'corral[local]'). The model's final answer
is held to the output's schema by its grammar, and checked again by pydantic.

    python examples/typed_output/forecast.py [--dir DIR] [--model NAME]
"""

import argparse
import tempfile

import pydantic

import corral


class Forecast(pydantic.BaseModel):
    """The typed output: what the run returns, validated."""

    city: str
    temperature_c: float


@corral.tool
def weather(city: str) -> str:
    """The current temperature in a city."""
    return f"{city}: -2.0 C"


INSTRUCTIONS = (
    "You are a weather reporter. Look the temperature up with the weather tool, then report the city"
    " and its temperature in degrees Celsius exactly as the tool gave it."
)


def spec(base: str, model: str) -> dict[str, object]:
    # One tool call, then only the output is allowed (max_tool_calls): the run ends.
    local = {"model": model, "tool_choice": "required", "max_tool_calls": 1}
    agent = {"id": "reporter", "provider": "local", "tools": ["weather"], "local": local,
             "instructions": INSTRUCTIONS, "output": Forecast}
    return {"project": {"root": base}, "agents": [agent]}


if __name__ == "__main__":  # the supervisor imports this file again for the tool and the model
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", help="the project directory (default: a new temp dir)")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="a packaged model or a .gguf path")
    args = parser.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="corral-typed-")
    with corral.Client.start(spec=spec(base, args.model), tools=[weather], home=f"{base}/.corral") as client:
        result = client.run("reporter", "How cold is it in Oslo?", timeout=600).check()
        for action in result.actions:
            print(f"{action.tool}: {action.phase}")
        forecast = result.output
        print(f"output: {type(forecast).__name__} {forecast.model_dump_json()}")
        print(f"reply: {result.final_reply}")
