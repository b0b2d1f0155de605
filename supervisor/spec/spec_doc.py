"""``docs/spec.md``, generated from the spec's pydantic models: every key, its type,
default, range and meaning, as the parser knows them.

    python -m corral.supervisor.spec.spec_doc > docs/spec.md

tests/test_spec_doc.py fails when the page is stale. The provider tables
(``[agents.openai]``, ``[agents.local]``, ``[[agents.steps]]``) are checked by
their providers, not by a pydantic model: their keys and defaults are read from
those providers' own dataclasses and key set, and their meanings are written
below; a key without one stops the generator, so none goes undocumented.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from annotated_types import MaxLen, MinLen
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from corral.supervisor.context.collaboration import POLICY_FILE, Policy
from corral.supervisor.spec.bounded_files import MAX_SPEC_FILE_BYTES
from corral.supervisor.spec.spec_base import MAX_STRING_CHARS, MIB, bare, bounds, choices, number
from corral.supervisor.spec.spec_models import SpecFile
from corral.supervisor.spec.swarm_spec import MAX_SPEC_DEPTH

HEADER = f"""# The swarm spec

<!-- Generated from the models in supervisor/spec/spec_models.py, mcp_spec.py, model_spec.py,
bridge_spec.py and collaboration.py by `python -m corral.supervisor.spec.spec_doc > docs/spec.md`.
Do not edit by hand: tests/test_spec_doc.py fails when this page is stale. -->

A swarm spec is a TOML file: `corral up --spec swarm.toml` (without `--spec`, a
home runs the spec of its last boot, or none). Every key is optional unless marked
required, and parsing is strict:

- a key that is not listed here is an error, with a suggestion when one is close
  (`actors[0]: unknown key 'restrat'; did you mean 'restart'?`);
- a value of the wrong type or out of its range is an error naming its place
  (`agents[1].max_repairs: must be a finite number between 0 and 100, got -5`);
- NaN and infinity are refused anywhere, and so is any string over
  {MAX_STRING_CHARS // 1024} KiB; arrays and inline tables nest at most {MAX_SPEC_DEPTH} deep;
- the file is read as a regular UTF-8 file of at most {MAX_SPEC_FILE_BYTES // MIB} MiB.

A bad spec stops `corral up` with that message before anything is created.

**Paths.** Every relative path in a spec is relative to the directory of the
spec file (for a spec given as data, the current directory): `[project] root`,
`[tools] modules`, a `script`, a model's `path`, `[chaos] effects_file`. `~`
is expanded, and a path is judged where it points: normalised, symlinks resolved.
Only the places agents work are relative to something else: an agent's
`workspace` lies inside the project root, and its `write_scopes` inside that
workspace. An MCP server's program is no path at all but a bare name found on
PATH outside the project, and its `cwd` an absolute directory outside the
project (seed 004 V1.22, docs/mcp.md).

```toml
name = "docs"

[project]
root = "project"

[[agents]]
id = "lead"
write_scopes = ["notes"]
  [[agents.steps]]
  actions = [{{ tool = "agent.delegate", input = {{ agent_id = "writer", task = "Draft the notes" }} }}]
  [[agents.steps]]
  final = "Notes delegated."

[[agents]]
id = "writer"
role = "specialist"
write_scopes = ["notes"]
  [[agents.steps]]
  actions = [{{ tool = "fs.write", input = {{ path = "notes/draft.md", content = "# Notes" }} }}]
  [[agents.steps]]
  final = "Draft written."
```
"""

#: What each key of a provider table means (the providers check the values).
OPENAI_KEYS = {
    "base_url": "The server's OpenAI-compatible API root (`http(s)://host:port/v1`), without credentials,"
    " query or fragment.",
    "model": "The model name the server serves.",
    "api_key_env": "The environment variable holding the API key; the agent's actor gets it despite the scrub.",
    "api_key_file": "A file holding only the key, mode 0600 or stricter; wins over `api_key_env`.",
    "timeout_s": "Seconds for one request: more than 0, at most 3600.",
    "max_response_bytes": "A longer response is refused (a positive integer).",
    "structured": "How the plan is asked for: `json_schema` (`response_format` with the plan's JSON schema;"
    " OpenAI, llama-server, vLLM, Ollama), `json_object` (llama-cpp-python's server), `tools` (native tool"
    " calls) or `none` (JSON in the text, not enforced); unset: `json_schema`, or what `native_tools` says.",
    "native_tools": "The older key: `true` is `structured = \"tools\"`, `false` is `\"none\"`; not with `structured`.",
    "max_string": "Bound on every string in a tool input in the plan schema, 1 to 100000; unset: open.",
    "max_reply": "Bound on the final reply in the plan schema, 1 to 100000; unset: open.",
    "max_actions": "Tool calls per answer the plan schema allows, 1 to 3.",
    "max_tool_calls": "After this many tool results the plan schema allows only the final reply (with `tools`:"
    " `tool_choice = \"none\"`), so a run ends; 0 to 1000; unset: no limit.",
    "temperature": "Sampling temperature, 0 to 2; unset: the server's.",
    "max_tokens": "Tokens of one reply (a positive integer); unset: the server's.",
    "plan_update": "Offer the model the durable plan update (seed 004 V1.17: `planUpdate` in the plan schema, the"
    " `update_agent_plan` function): default true; false for a model too small to finish a plan it starts, which then"
    " keeps none.",
    "reasoning_effort": "Not written here: the agent's `reasoning_effort` (above) is put here at load, and a key"
    " here is refused.",
    "stream": "Ask for server-sent events: a final reply's text streams to the event stream as it is"
    " generated (tool calls and plans never do).",
    "vision": "The model can look at images: `image.inspect` works, its images going with the next request as"
    " `image_url` data-URL parts (never into the ledger); unset: the tool refuses.",
    "web_search": "Set by the agent's `web_search`, not here (a spec that sets it here is refused): planning"
    " turns send `web_search_options: {}`.",
}
LOCAL_KEYS = {
    "model": "A `[[models]]` id, a packaged model (`smollm2`) or a `.gguf` path; bound at load to the model"
    " actor that serves it (declared with the `[[models]]` defaults if needed).",
    "temperature": "Sampling temperature, 0 to 2.",
    "repeat_penalty": "0.5 to 2. Above 1 discourages repetition, but also penalises copying the task"
    " (a path, say).",
    "seed": "The sampling seed, 0 to 2^31 - 1.",
    "max_string": "Bound on every string the model writes inside a tool input, 1 to 10000.",
    "max_reply": "Bound on the final reply, 1 to 20000.",
    "max_tool_calls": "After this many tool results the grammar allows only the final reply, so a run always"
    " ends; 0 to 1000.",
    "tool_choice": "`auto`, or `required`: the grammar allows only tool calls until `max_tool_calls`.",
    "optional_fields": "Offer a tool's optional input fields too (a small model tends to fill them with noise).",
    "timeout_s": "Seconds for one generation, queueing included; 0.1 to 86400.",
}
STEP_KEYS = {  # key: (type, meaning)
    "actions": ("array of tables", "The plan: an array of `{ tool = \"...\", input = { ... } }`. In strings,"
                " `${artifact:N}` is the N-th expected artifact of the task and `${STATUS.FIELD}` a field of the"
                " latest observed item with that status."),
    "final": ("string or table", "The final reply: the run ends with it. For an agent with `output`, a table:"
              " the output (checked against its schema like a model's)."),
    "planUpdate": ("table", "The plan as it now stands (seed 004 V1.17), beside `actions` or `final` or alone:"
                   " `{ explanation = \"...\", steps = [{ step = \"...\", status = \"pending\" }] }` (1 to 8"
                   " steps; pending, in_progress or completed). Control-plane metadata, not an action."),
    "raw": ("string", "Text returned as the model's reply, verbatim (to test corrupt or truncated output)."),
    "when_observed": ("string", "The step applies only once some observation of the run contains this text."),
    "unless_observed": ("string", "The step applies only while no observation contains this text."),
    "when_task": ("string", "The step applies only when the run's task contains this text."),
    "unless_task": ("string", "The step applies only when the run's task does not contain this text."),
}


def render() -> str:
    """The whole page."""
    out = [HEADER]
    top = _fields(SpecFile)
    scalars = [(name, info) for name, info in top if _section_of(info.annotation) is None]
    out.append("## Top-level keys\n")
    out += _table(scalars)
    for name, info in top:
        section = _section_of(info.annotation)
        if section is not None:
            out += _section(name, info.annotation, section)
    out += _collaboration()
    return "\n".join(out).rstrip() + "\n"


def _section(path: str, annotation: Any, kind: type[Any], level: int = 2) -> list[str]:
    many = get_origin(bare(annotation)) in (list, tuple)
    keyed = get_origin(bare(annotation)) is dict
    heading = f"[[{path}]]" if many else f"[{path}.<name>]" if keyed else f"[{path}]"
    out = [f"{'#' * level} `{heading}`\n", _doc(kind) + "\n"]
    fields = _fields(kind)
    out += _table([(name, info) for name, info in fields if _section_of(info.annotation) is None])
    if path == "agents":
        out += _providers()
    elif path == "templates":
        out.append("`script`, `steps`, `openai`, `local` and `provider_config` take the same keys as an"
                   " agent's (above).\n")
    for name, info in fields:
        nested = _section_of(info.annotation)
        if nested is not None:
            out += _section(f"{path}.{name}", info.annotation, nested, level + 1)
    return out


def _providers() -> list[str]:
    from corral.actors.providers.local import LocalConfig
    from corral.actors.providers.openai import OpenAIConfig
    from corral.actors.providers.scripted import STEP_KEYS as SCRIPT_KEYS

    out = ["### `[[agents.steps]]`\n", "One table per loop of a scripted agent: its plan and when it applies"
           " (the same keys as a script file's `[[steps]]`; docs/providers.md).\n"]
    if set(STEP_KEYS) != set(SCRIPT_KEYS):
        raise SystemExit(f"spec_doc: the step keys are {sorted(SCRIPT_KEYS)}; describe each in STEP_KEYS")
    out += _plain_table([(key, kind, "unset", meaning) for key, (kind, meaning) in STEP_KEYS.items()])
    for heading, config, meanings, text in (
        ("[agents.openai]", OpenAIConfig, OPENAI_KEYS, "An OpenAI-compatible chat completions server"
         " (docs/providers.md); checked at load, so a typo stops `corral up`. Never put the key itself here."),
        ("[agents.local]", LocalConfig, LOCAL_KEYS, "A GGUF model on this machine, through llama.cpp"
         " (docs/providers.md); checked at load."),
    ):
        out += [f"### `{heading}`\n", text + "\n"]
        hints = typing.get_type_hints(config)
        rows = [(f.name, _type(hints[f.name]), _default_of(f), _meaning(meanings, f.name))
                for f in dataclasses.fields(config)]
        out += _plain_table(rows)
    return out


def _collaboration() -> list[str]:
    return [f"## `{POLICY_FILE}`\n", "Not part of the spec: the project's collaboration policy, a JSON object"
            " written by `corral collaboration set` (docs/project-context.md). " + _doc(Policy)
            + " A missing file requires nothing; a broken one holds every root run to a first wave until"
            " it is fixed.\n", *_table(_fields(Policy))]


def _meaning(meanings: dict[str, str], key: str) -> str:
    if key not in meanings:
        raise SystemExit(f"spec_doc: no meaning written for {key!r}; add it to supervisor/spec/spec_doc.py")
    return meanings[key]


def _fields(kind: type[Any]) -> list[tuple[str, FieldInfo]]:
    """The keys of a section: ``id`` first, then its own, then its bases'."""
    fields: dict[str, FieldInfo] = getattr(kind, "__pydantic_fields__", {})
    order = [name for cls in kind.__mro__ for name in vars(cls).get("__annotations__", {}) if name in fields]
    order = list(dict.fromkeys(["id", *order] if "id" in fields else order))
    return [(name, fields[name]) for name in order]


def _section_of(annotation: Any) -> type[Any] | None:
    kind = bare(annotation)
    if get_origin(kind) in (list, tuple, dict):
        kind = bare(get_args(kind)[-1 if get_origin(kind) is dict else 0])
    return kind if isinstance(kind, type) and hasattr(kind, "__pydantic_fields__") else None


def _doc(kind: type[Any]) -> str:
    text = vars(kind).get("__doc__") or ""
    if not text or text.startswith(f"{kind.__name__}("):  # a dataclass's generated signature
        raise SystemExit(f"spec_doc: {kind.__name__} has no docstring")
    text = " ".join(text.split("\n\n")[0].split()).replace("``", "`")
    return re.sub(r"^`[^`]+`: (\w)", lambda match: match.group(1).upper(), text)  # the heading names it


def _table(fields: list[tuple[str, FieldInfo]]) -> list[str]:
    rows = []
    for name, info in fields:
        if not info.description:
            raise SystemExit(f"spec_doc: the field {name!r} has no description")
        rows.append((name, _type(info.annotation), _default(info), _allowed(info), info.description))
    return [
        "| key | type | default | allowed | meaning |",
        "|---|---|---|---|---|",
        *(f"| `{name}` | {kind} | {default} | {allowed} | {meaning} |" for name, kind, default, allowed, meaning
          in rows),
        "",
    ]


def _plain_table(rows: list[tuple[str, str, str, str]]) -> list[str]:
    return [
        "| key | type | default | meaning |",
        "|---|---|---|---|",
        *(f"| `{name}` | {kind} | {default} | {meaning} |" for name, kind, default, meaning in rows),
        "",
    ]


def _type(annotation: Any) -> str:
    kind = bare(annotation)
    origin = get_origin(kind)
    if origin in (Union, types.UnionType):  # `true`, `false` or "inherit", say
        return " or ".join(dict.fromkeys(_type(arg) for arg in get_args(kind) if arg is not type(None)))
    if origin is Literal or (isinstance(kind, type) and issubclass(kind, enum.Enum)):
        return "string"
    if origin in (list, tuple):
        return f"array of {_plural(get_args(kind)[0])}"
    if origin is dict:
        value = bare(get_args(kind)[1])
        return "table" if value is Any else f"table of {_plural(value)}"
    names = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "path"}
    if kind in names:
        return names[kind]
    return "table" if _section_of(kind) is not None else "any"


def _plural(annotation: Any) -> str:
    kind = _type(annotation)
    if kind.startswith("array of "):
        return "arrays" + kind.removeprefix("array")
    return {"table": "tables", "any": "values", "boolean": "booleans"}.get(kind, kind + "s")


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        return _literal(info.default_factory())  # type: ignore[call-arg]
    return "required" if info.default is PydanticUndefined else _literal(info.default)


def _default_of(item: dataclasses.Field[Any]) -> str:
    return "required" if item.default is dataclasses.MISSING else _literal(item.default)


def _literal(value: Any) -> str:
    """A default as TOML would write it."""
    if value is None:
        return "unset"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (list, tuple)):
        return f"`[{', '.join(json.dumps(item) for item in value)}]`"
    if isinstance(value, dict):
        return f"`{json.dumps(value) if value else '{}'}`"
    return f"`{json.dumps(value)}`"


def _allowed(info: FieldInfo) -> str:
    """The range, the values, the pattern or the length a field accepts."""
    kind = bare(info.annotation)
    if kind in (int, float):
        low, high = bounds(info)
        return f"{number(low)} to {number(high)}"
    values = choices(kind)
    if values:
        return ", ".join(f"`{value}`" for value in values)
    parts = []
    element = get_args(kind)[0] if get_origin(kind) in (list, tuple) else None
    for prefix, metadata in (("", info.metadata), ("each ", _metadata(element))):
        for item in metadata:
            pattern = getattr(item, "pattern", None)
            if pattern:
                parts.append(f"{prefix}`{pattern}`")
            if isinstance(item, MinLen) and item.min_length:
                parts.append(f"{prefix}not empty")
            if isinstance(item, MaxLen):
                unit = "entries" if element is not None and not prefix else "characters"
                parts.append(f"{prefix}at most {item.max_length} {unit}")
    entry = get_args(kind)[-1] if get_origin(kind) is dict else element
    if choices(entry):
        parts.append("each " + ", ".join(f"`{value}`" for value in choices(entry)))
    return "; ".join(parts)


def _metadata(annotation: Any) -> list[Any]:
    """The constraints inside ``Annotated[...]`` (of an array's entries)."""
    found: list[Any] = []
    while get_origin(annotation) is typing.Annotated:
        args = get_args(annotation)
        for item in args[1:]:
            found += getattr(item, "metadata", None) or [item]
        annotation = args[0]
    return found


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
