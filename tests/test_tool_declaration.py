"""Tools without ceremony (issue 38): ``@corral.tool def f(city: str) -> str`` has
its argument in the schema and runs; the context goes only where it is annotated;
a bad declaration, a ``tools`` glob that matches nothing and a tool the supervisor
cannot import are clear errors; the catalog holds what the spec's modules declare,
one function per name; ``Client.start`` takes the spec as a dict and the tools as
functions."""

from __future__ import annotations

import json
import sys
import tomllib
import types
from pathlib import Path
from typing import Any

import pytest

import corral
from corral.actors.tools.declare import ToolDeclarationError, declared_tool, user_tools_of
from corral.client_spec import ToolSourceError, start_spec, toml_text, tool_entries
from corral.supervisor.spec.swarm_spec import SpecError, load_spec, parse_spec

#: A tools module as a user writes one: no context, the context last, and one that
#: takes it positionally under another name.
TOOLS = '''
import corral

@corral.tool
def weather(city: str) -> str:
    """The temperature in a city."""
    return f"{city}: -2.0 C"

@corral.tool(effect="read", name="weather.forecast")
def forecast(city: str, days: int = 1, *, ctx: corral.ToolContext) -> dict:
    """A forecast."""
    return {"city": city, "days": days, "run": ctx.run_id}

@corral.tool(effect="read", name="weather.where")
def where(city: str, context: corral.ToolContext, /) -> str:
    """Where a run asked from."""
    return f"{city} from {context.agent_id}"
'''


@pytest.fixture
def tools_module(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """``qs_tools`` in a directory of its own, imported here as the caller's code is."""
    (short_tmp / "site").mkdir()
    (short_tmp / "site" / "qs_tools.py").write_text(TOOLS)
    monkeypatch.syspath_prepend(str(short_tmp / "site"))
    monkeypatch.delitem(sys.modules, "qs_tools", raising=False)
    import qs_tools  # type: ignore[import-not-found]

    module: types.ModuleType = qs_tools
    return module


def test_the_schema_comes_from_the_hints_and_the_context_from_its_annotation(tools_module: Any) -> None:
    catalog = user_tools_of([tools_module])
    assert sorted(catalog) == ["weather", "weather.forecast", "weather.where"]
    weather, forecast, where = (catalog[name] for name in ("weather", "weather.forecast", "weather.where"))
    assert weather.schema.input_schema["properties"] == {"city": {"type": "string"}}
    assert weather.schema.input_schema["required"] == ["city"] and weather.context is None
    assert weather.schema.effect_class == "external", "the safe default"
    assert set(forecast.schema.input_schema["properties"]) == {"city", "days"} and forecast.context == "ctx"
    assert forecast.schema.input_schema["required"] == ["city"]
    assert set(where.schema.input_schema["properties"]) == {"city"}
    assert (where.context, where.positional) == ("context", ("city", "context"))
    assert tools_module.weather("Oslo") == "Oslo: -2.0 C", "the decorator returns the function unchanged"
    assert declared_tool(tools_module.weather) is weather, "the declaration is on the function"
    assert user_tools_of([tools_module.forecast]) == {"weather.forecast": forecast}, "a function passed directly"


def _define(source: str) -> Any:
    namespace: dict[str, Any] = {"corral": corral, "__name__": "user_mod"}
    exec(source, namespace)  # the function as a module would define it
    return namespace["f"]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(city): pass", "tool bad.tool (user_mod.f): parameter 'city' needs a type annotation"),
        ("def f(ctx, city: str): pass", "parameter 'ctx' needs a type annotation"),
        (
            "def f(a: corral.ToolContext, b: corral.ToolContext): pass",
            "parameters 'a' and 'b' are both annotated ToolContext",
        ),
        ("def f(city: Nowhere): pass", "type hints cannot be evaluated (NameError"),
        ("def f(city: 'Nowhere'): pass", "cannot be described as JSON Schema: `f_arguments` is not fully defined"),
        ("def f(*cities: str): pass", "parameter 'cities': *args and **kwargs"),
    ],
)
def test_a_bad_declaration_names_the_tool_and_the_parameter(source: str, message: str) -> None:
    func = _define(source)
    with pytest.raises(ToolDeclarationError) as caught:
        corral.tool(name="bad.tool")(func)
    assert message in str(caught.value)
    assert declared_tool(func) is None and user_tools_of([func]) == {}, "nothing was declared"


def test_the_catalog_is_what_the_specs_modules_declare_one_function_per_name(
    tools_module: Any, short_tmp: Path
) -> None:
    site = short_tmp / "site"
    (site / "qs_again.py").write_text("from qs_tools import weather  # the same function, re-exported\n")
    (site / "qs_dupes.py").write_text("import corral\n@corral.tool\ndef weather(city: str) -> str:\n    return city\n")
    (site / "qs_builtin.py").write_text(
        'import corral\n@corral.tool(name="fs.read")\ndef mine(path: str) -> str:\n    return path\n'
    )
    # qs_tools is imported in this process, but no spec names it: nothing registered itself.
    assert parse_spec({}).user_tools == {}
    with pytest.raises(SpecError, match=r"policy\.weather: no tool 'weather'"):
        parse_spec({"policy": {"weather": "confirm"}})
    spec = parse_spec({"tools": {"modules": ["qs_tools", "qs_again"]}, "policy": {"weather": "confirm"}})
    assert sorted(spec.user_tools) == ["weather", "weather.forecast", "weather.where"]
    assert spec.user_tools["weather"].func is tools_module.weather
    # One name, two functions (two modules): refused where the catalog is built, naming both.
    with pytest.raises(SpecError) as caught:
        parse_spec({"tools": {"modules": ["qs_tools", "qs_dupes"]}})
    assert str(caught.value) == (
        "tools.modules: tool name 'weather' is declared twice: by qs_tools.weather and by qs_dupes.weather;"
        " give one of them another name="
    )
    with pytest.raises(SpecError, match=r"tools\.modules: tool fs\.read \(qs_builtin\.mine\): 'fs\.read' is a"
                       r" built-in tool's name: pick another"):
        parse_spec({"tools": {"modules": ["qs_builtin"]}})
    for name in ("qs_again", "qs_dupes", "qs_builtin"):
        sys.modules.pop(name, None)


def _agents(globs: list[str], **more: Any) -> dict[str, Any]:
    return {"agents": [{"id": "a", "tools": globs, "steps": [{"final": "x"}]}], **more}


#: The spec section naming the tools module: its tools are in the catalog because it does.
NAMED: dict[str, Any] = {"tools": {"modules": ["qs_tools"]}}


def test_a_tools_glob_or_policy_key_that_matches_nothing_is_a_spec_error_with_a_hint(
    tools_module: Any, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(short_tmp)
    with pytest.raises(SpecError, match=r"agents\[0\]\.tools\[1\]: no tool matches 'weathr\.\*'; did you mean"
                       r" 'weather\.\*'\?"):
        parse_spec(_agents(["fs.*", "weathr.*"], **NAMED))
    with pytest.raises(SpecError, match=r"no tool matches 'fs\.red'; did you mean 'fs\.read'\?"):
        parse_spec(_agents(["fs.red"]))
    with pytest.raises(SpecError, match=r"templates\[0\]\.tools\[0\]: no tool matches 'nothing\.\*'"):
        parse_spec({"templates": [{"id": "t", "tools": ["nothing.*"], "steps": [{"final": "x"}]}]})
    with pytest.raises(SpecError, match=r"policy\.weathr\.\*: no tool 'weathr\.\*'; did you mean 'weather\.\*'"):
        parse_spec({"policy": {"weathr.*": "confirm"}, **NAMED})
    with pytest.raises(SpecError, match=r"no tool matches 'mcp\.\*'"):
        parse_spec(_agents(["mcp.*"]))  # no MCP server is declared
    # Through Client.start, before anything exists: no home, the caller's dict as it was.
    bad = _agents(["weathr.*"])
    starting = corral.Client.start(spec=bad, tools=[tools_module.weather], home=short_tmp / "h")
    with pytest.raises(SpecError, match=r"did you mean 'weather\.\*'"), starting:
        pass
    assert not (short_tmp / "h").exists() and "project" not in bad and "tools" not in bad
    # What does match: a tool, a glob, and an MCP server's tools (known once it runs).
    server = {"mcp_servers": [{"id": "git", "command": ["true"]}]}
    parse_spec(_agents(["weather", "weather.*", "fs.read", "mcp.git.*", "mcp.*"], **server, **NAMED))


def test_a_tool_the_supervisor_cannot_import_by_name_is_refused_saying_why(
    tools_module: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tool_entries([tools_module.weather, tools_module, tools_module.forecast])[0] == ["qs_tools"]
    # A function of a script with no file to import again (`python -c`, a notebook).
    script = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", script)
    exec("import corral\n@corral.tool\ndef city(name: str) -> str:\n    return name\n", script.__dict__)
    with pytest.raises(ToolSourceError) as caught:
        tool_entries([script.city])
    text = str(caught.value)
    assert "'city' is defined in the script being run (__main__)" in text
    assert "the supervisor is another process" in text and "move the tool into a module" in text

    def local(city: str) -> str:
        return city

    with pytest.raises(ToolSourceError, match="inside another function cannot be imported by name"):
        tool_entries([corral.tool(name="local.tool")(local)])
    with pytest.raises(ToolSourceError, match=r"not declared as a tool: decorate it with @corral\.tool"):
        tool_entries([sys.exit])
    with pytest.raises(ToolSourceError, match=r"module 'types' has no @corral\.tool function"):
        tool_entries([types])


def test_a_spec_dict_becomes_toml_that_reads_back_the_same() -> None:
    spec = {"name": "odd \"quotes\" \\ \x7f \x01 é 🦀", "n": [1, 2.5, True], "t": {"a.b": {"c": []}}}
    assert tomllib.loads(toml_text(spec)) == spec
    with pytest.raises(SpecError, match=r"t\.x: a NoneType cannot be a spec value"):
        toml_text({"t": {"x": None}})


def test_a_parsed_spec_or_a_file_with_tools_keeps_its_paths_relative_to_its_file(
    tools_module: Any, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = short_tmp / "proj"
    project.mkdir()
    (project / "local_tools.py").write_text("import corral\n@corral.tool\ndef ping(text: str) -> str:\n    return text")
    spec_file = project / "swarm.toml"
    spec_file.write_text('[tools]\nmodules = ["./local_tools.py"]\n[[agents]]\nid = "a"\nsteps = [{ final = "x" }]\n')
    for spec, tools in ((load_spec(spec_file), []), (spec_file, [tools_module])):
        started = start_spec(short_tmp / "home", spec, tools)
        assert started.path == short_tmp / "home" / "client-spec.toml" and started.checked
        written = tomllib.loads(started.path.read_text())
        assert written["project"]["root"] == str(project.resolve())
        assert written["tools"]["modules"][0] == str((project / "local_tools.py").resolve())
        assert str(project.resolve()) in started.import_roots
    assert written["tools"]["modules"][1:] == ["qs_tools"]
    assert start_spec(short_tmp / "home", spec_file).path == spec_file, "a file alone is used as it is"
    # An MCP server's program is a bare name from PATH and its cwd absolute (seed 004
    # V1.22): neither is a spec path, so the dict's server is written as it was.
    monkeypatch.chdir(project)
    servers = {"mcp_servers": [{"id": "s", "command": ["python", "/abs/x.py"]}]}
    written = tomllib.loads(start_spec(short_tmp / "home", servers).path.read_text())  # type: ignore[union-attr]
    assert written["mcp_servers"] == [{"id": "s", "command": ["python", "/abs/x.py"]}]


def test_client_start_takes_a_spec_dict_and_tool_functions_and_runs_them(
    tools_module: Any, short_tmp: Path
) -> None:
    steps = [
        {"actions": [
            {"tool": "weather", "input": {"city": "Oslo"}},
            {"tool": "weather.forecast", "input": {"city": "Oslo", "days": 2}},
            {"tool": "weather.where", "input": {"city": "Oslo"}},
        ]},
        {"final": "done"},
    ]
    spec = {"project": {"root": str(short_tmp)}, "agents": [{"id": "a", "tools": ["weather*"], "steps": steps}]}
    tools = [tools_module.weather, tools_module.forecast, tools_module.where]
    with corral.Client.start(spec=spec, tools=tools, home=short_tmp / "home") as client:
        result = client.run("a", "weather", timeout=60).check()
        assert [(a.tool, a.phase) for a in result.actions] == [
            ("weather", "ok"), ("weather.forecast", "ok"), ("weather.where", "ok")
        ]
        text = json.dumps(client.call("show", run_id=result.run_id))
        # Each tool got its arguments, and the context where it was annotated.
        assert "Oslo: -2.0 C" in text and "Oslo from a" in text
        forecast = {"city": "Oslo", "days": 2, "run": result.run_id}
        assert json.dumps(f"weather.forecast: {json.dumps(forecast)}") in text
    written = tomllib.loads((short_tmp / "home" / "client-spec.toml").read_text())
    assert written["tools"]["modules"] == ["qs_tools"]
