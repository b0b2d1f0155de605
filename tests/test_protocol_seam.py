"""Issue 50 §1: the agent<->supervisor seam is one typed protocol (mailbox/protocol/).

Read from the source with ``ast``, not by running anything (the Done-when's check,
``test_the_typed_protocol_is_the_only_way_they_talk``): no actor-method handler
in supervisor/ takes ``params: dict[str, Any]``, and no method is named by a
string outside mailbox/protocol/ (nor called by ``Method`` with loose params,
nor served through an untyped table). Every method has its record.

And ``mypy --strict`` sees through the seam: a request with a misspelled or
mistyped field fails type checking, and so does reading a reply's field that its
record does not have (``ActorContext.ask`` returns the request's reply record).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from corral.mailbox import protocol
from corral.mailbox.protocol import Method

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("actors", "supervisor", "mailbox", "sandbox")
METHOD_NAMES = {method.value for method in Method}
#: The ``family.name`` methods: such a string is a method's (or a tool's) name.
DOTTED_NAMES = {name for name in METHOD_NAMES if "." in name}
CALLS = {"call", "step_call", "report"}

#: Methods without a request record (none: checked below).
NOT_YET_TYPED = {method for method in Method} - set(protocol._TYPED)


def _sources(root: Path = ROOT) -> list[Path]:
    found = []
    for package in PACKAGES:
        found += [p for p in (root / package).rglob("*.py") if (root / "mailbox" / "protocol") not in p.parents]
    return found


def _is_params_dict(arg: ast.arg) -> bool:
    return arg.arg == "params" and arg.annotation is not None and ast.unparse(arg.annotation) == "dict[str, Any]"


def test_every_method_has_its_record() -> None:
    """No method is left untyped: ``decode`` makes a record of each (there is no
    untyped way in, and no table of handlers keyed by name)."""
    assert not NOT_YET_TYPED, sorted(NOT_YET_TYPED)
    assert not hasattr(protocol, "Untyped")


def test_every_typed_method_handler_takes_its_typed_record() -> None:
    """The handlers supervisor/actor_dispatch.py calls take the typed record: the run
    layer's (``runs``) and those a step commits with its next step (``steps``:
    supervisor/runs/step_piggyback.py, e.g. ``finish`` for ``action.finish``)."""
    dispatch = ast.parse((ROOT / "supervisor" / "actor_dispatch.py").read_text())
    served = {
        node.func.attr
        for node in ast.walk(dispatch)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and ast.unparse(node.func.value) in ("runs", "steps")
    }
    assert {"claim", "next_step", "action_begin", "finish", "finalize", "fail"} <= served
    offences = []
    for path in [ROOT / "supervisor" / "runs" / name for name in ("run_actor_methods.py", "step_piggyback.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef) and node.name in served:
                args = node.args.args
                if len(args) > 2 and args[1].arg == "slot" and _is_params_dict(args[2]):
                    offences.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name}(slot, params: dict)")
    assert not offences, "\n".join(offences)


#: Where a string equal to a method's name is a tool's name, not the method's (the
#: tools ``goal.verdict``, ``mcp.call`` … share their method's
#: name): a tool's schema, the tool an action must be of, a table of tool names,
#: and the control plane's own methods (people's, not an actor's).
TOOL_NAME_CALLS = {"schema", "tool_action"}
TOOL_NAME_TABLES = {"control_methods"}


def _method_literals(path: Path, tree: ast.AST, root: Path) -> list[str]:
    """Every string naming an actor method outside mailbox/protocol/, but where it
    names a tool (``TOOL_NAME_CALLS``, a set or a map's key, ``TOOL_NAME_TABLES``)."""
    exempt: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if callee in TOOL_NAME_CALLS:
                exempt |= {id(arg) for arg in node.args}
        elif isinstance(node, ast.Set):
            exempt |= {id(element) for element in node.elts}
        elif isinstance(node, ast.Dict):
            exempt |= {id(key) for key in node.keys if key is not None and not _is_method_key(key)}
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value).split(".")[-1] in TOOL_NAME_TABLES:
            exempt.add(id(node.slice))
    return [
        f"{path.relative_to(root)}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in DOTTED_NAMES and id(node) not in exempt
    ]


def _is_method_key(key: ast.expr) -> bool:
    """``{"method": …}``'s key is a field name, never a tool's."""
    return isinstance(key, ast.Constant) and key.value == "method"


def _seam_offences(root: Path = ROOT) -> list[str]:
    """What the Done-when forbids (issue 50 §1), read from the source: an actor-method
    handler (it takes the calling ``slot``) in supervisor/ with a ``params:
    dict[str, Any]``; a method named by a string (``ctx.call("x")``, ``{"method":
    "x"}``, ``"family.name"`` anywhere) outside mailbox/protocol/; and the untyped
    way itself: a call by ``Method`` with loose params (``self.call(Method.X, **kw)``),
    ``Untyped``, ``actor_methods``."""
    offences = []
    for path in _sources(root):
        tree = ast.parse(path.read_text(), str(path))
        if path.is_relative_to(root / "supervisor"):
            for node in ast.walk(tree):
                if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef):
                    args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                    if any(a.arg == "slot" for a in args) and any(_is_params_dict(a) for a in args):
                        offences.append(f"{path.relative_to(root)}:{node.lineno}: {node.name}(slot, params: dict)")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "call"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and "ctx" in ast.unparse(node.func.value)
            ):
                offences.append(
                    f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node.func)}({node.args[0].value!r})"
                )
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in CALLS
                and node.args
                and ast.unparse(node.args[0]).startswith("Method.")
            ):
                offences.append(
                    f"{path.relative_to(root)}:{node.lineno}: {node.func.attr}({ast.unparse(node.args[0])}, …)"
                )
            if (
                isinstance(node, ast.Name | ast.alias) and getattr(node, "id", getattr(node, "name", "")) == "Untyped"
            ) or (isinstance(node, ast.Attribute) and node.attr == "actor_methods"):
                offences.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
        offences += _method_literals(path, tree, root)
    return offences


def test_the_typed_protocol_is_the_only_way_they_talk() -> None:
    """The Done-when's check (issue 50 §1): the typed protocol is the only way the
    agent and the supervisor talk (it counted 151 offences before the families
    were typed, and went down one family at a time)."""
    offences = _seam_offences()
    assert not offences, f"{len(offences)} offences:\n" + "\n".join(offences)


PLANTED = {
    "supervisor/x_service.py": """
from typing import Any
class X:
    async def poll(self, slot, params: dict[str, Any]) -> dict[str, Any]:
        return {}
    async def ok(self, slot, request: object) -> dict[str, Any]:
        return {}
    def control(self, params: dict[str, Any]) -> None:  # a control method: people's, no slot
        pass
def install(sup):
    sup.actor_methods[1] = X().poll
    sup.control_methods["session.poll"] = X().control  # a control method's name
""",
    "actors/x_tool.py": """
from corral.mailbox.protocol import Method, Untyped
SCHEMA = schema("plan.update", "a tool named as its method")
TOOLS = {"goal.verdict", "fs.read"}
async def run(ctx, lane):
    await ctx.call("session.poll", process_id="p")
    await ctx.call("whatever")
    await lane.step_call(Method.PLAN_COMMIT, plan={})
    body = {"method": "bench.sink", "params": {}}
""",
}


def test_the_seam_check_finds_each_kind_of_offence(tmp_path: Path) -> None:
    """The check itself, on planted source: each forbidden shape is found, and
    nothing that names a tool or a control method is."""
    for name, text in PLANTED.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "mailbox" / "protocol").mkdir(parents=True)
    (tmp_path / "mailbox" / "protocol" / "x.py").write_text('NAME = "session.poll"\n')  # the protocol's own
    found = sorted(_seam_offences(tmp_path))
    assert found == sorted(
        [
            "supervisor/x_service.py:4: poll(slot, params: dict)",
            "supervisor/x_service.py:11: sup.actor_methods",
            "actors/x_tool.py:2: Untyped",
            "actors/x_tool.py:6: ctx.call('session.poll')",
            "actors/x_tool.py:6: 'session.poll'",
            "actors/x_tool.py:7: ctx.call('whatever')",
            "actors/x_tool.py:8: step_call(Method.PLAN_COMMIT, …)",
            "actors/x_tool.py:9: 'bench.sink'",
        ]
    ), found


BAD_CALLER = """
from corral.actors.runtime import ActorContext
from corral.mailbox.protocol import ActionBegin, ActionFinish, NextStep, RunClaim, encode

encode(ActionFinish(action_id="r/0/0", ok=True, outptu={"n": 1}))
encode(ActionBegin(action_id=7))
encode(NextStep(run_id="r", history_have="all"))


async def read(ctx: ActorContext) -> None:
    claim = await ctx.ask(RunClaim())
    print(claim.runn)
    begun = await ctx.ask(ActionBegin(action_id="r/0/0"))
    print(begun.bgein)
    step = await ctx.ask(NextStep(run_id="r"))
    print(step.action_id)
"""

GOOD_CALLER = """
from corral.actors.runtime import ActorContext
from corral.mailbox.protocol import ActionBegin, ActionFinish, NextStep, RunClaim, encode
from corral.mailbox.steps import ExecuteStep

encode(ActionFinish(action_id="r/0/0", ok=True, output={"n": 1}))
encode(ActionBegin(action_id="r/0/0"))
encode(NextStep(run_id="r", history_have=3))


async def read(ctx: ActorContext) -> None:
    claim = await ctx.ask(RunClaim())
    print(claim.run)
    begun = await ctx.ask(ActionBegin(action_id="r/0/0"))
    print(begun.begin, begun.next)
    step = await ctx.ask(NextStep(run_id="r"))
    if isinstance(step, ExecuteStep):
        print(step.action_id)
"""


def _mypy(snippet: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """mypy --strict on a snippet, with the package's typecheck view (scripts/typecheck.sh)."""
    view = tmp_path / "view" / "corral"
    view.mkdir(parents=True)
    for entry in (ROOT / "corral").iterdir():
        (view / entry.name).symlink_to(entry)
    for package in PACKAGES:
        (view / package).symlink_to(ROOT / package)
    (tmp_path / "caller.py").write_text(snippet)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--follow-imports=silent",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(tmp_path / "caller.py"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "MYPYPATH": str(tmp_path / "view")},
        check=False,
    )


def test_mypy_strict_rejects_a_request_or_a_reply_with_a_wrong_field(tmp_path: Path) -> None:
    good = _mypy(GOOD_CALLER, tmp_path / "good")
    assert good.returncode == 0, good.stdout + good.stderr
    bad = _mypy(BAD_CALLER, tmp_path / "bad")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert 'Unexpected keyword argument "outptu"' in bad.stdout, bad.stdout
    assert 'Argument "action_id" to "ActionBegin" has incompatible type "int"' in bad.stdout, bad.stdout
    assert 'Argument "history_have" to "NextStep" has incompatible type "str"' in bad.stdout, bad.stdout
    # and through the replies: each is its record, a misspelled field fails.
    assert '"Claim" has no attribute "runn"' in bad.stdout, bad.stdout
    assert '"ActionBegun" has no attribute "bgein"' in bad.stdout, bad.stdout
    assert 'Item "DoneStep" of "DoneStep | ParkStep' in bad.stdout and 'no attribute "action_id"' in bad.stdout
