"""Issue 50 §1: the agent<->supervisor seam is one typed protocol (mailbox/protocol/).

Read from the source with ``ast``, not by running anything:

- no method is registered or called by a string literal outside mailbox/protocol/:
  registrations key ``Supervisor.actor_methods`` by ``Method``, and the agent's
  own calls (``call``/``step_call``/``report``) name a ``Method``;
- every typed method's handler takes its typed record, never ``params: dict[str, Any]``;
- the methods still served untyped are exactly the ones listed here (the list only
  shrinks: a family converted to typed records leaves it).

And ``mypy --strict`` sees through the seam: a request with a misspelled or
mistyped field fails type checking.
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
CALLS = {"call", "step_call", "report"}

#: Served untyped (``Untyped``, through ``actor_methods``) until their family is converted.
NOT_YET_TYPED = {method for method in Method} - set(protocol._TYPED)


def _sources() -> list[Path]:
    found = []
    for package in PACKAGES:
        found += [p for p in (ROOT / package).rglob("*.py") if (ROOT / "mailbox" / "protocol") not in p.parents]
    return found


def _is_params_dict(arg: ast.arg) -> bool:
    return arg.arg == "params" and arg.annotation is not None and ast.unparse(arg.annotation) == "dict[str, Any]"


def test_no_method_is_named_by_a_string_outside_the_protocol() -> None:
    offences = []
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            # sup.actor_methods["x"] = ... / sup.actor_methods.update({"x": ...})
            if (
                isinstance(node, ast.Subscript)
                and ast.unparse(node.value).endswith("actor_methods")
                and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, str)
            ):
                offences.append(f"{where}: actor_methods[{node.slice.value!r}]")
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("actor_methods.update"):
                for arg in node.args:
                    if isinstance(arg, ast.Dict):
                        keys = [k.value for k in arg.keys if isinstance(k, ast.Constant)]
                        offences += [f"{where}: actor_methods key {key!r}" for key in keys]
            # the agent's own calls: lane.call("run.next_step") and the like
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in CALLS
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value in METHOD_NAMES
                and Method(node.args[0].value) not in NOT_YET_TYPED | _TOOL_CALLS_NOT_YET
            ):
                offences.append(f"{where}: {node.func.attr}({node.args[0].value!r})")
    assert not offences, "\n".join(offences)


#: Tools and workers that still call through ``ActorContext.call`` with a name.
_TOOL_CALLS_NOT_YET = NOT_YET_TYPED


def test_every_typed_method_handler_takes_its_typed_record() -> None:
    """The handlers supervisor/actor_dispatch.py calls take the typed record."""
    dispatch = ast.parse((ROOT / "supervisor" / "actor_dispatch.py").read_text())
    served = {
        node.func.attr
        for node in ast.walk(dispatch)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and ast.unparse(node.func.value) == "runs"
    }
    assert {"claim", "next_step", "action_begin", "action_finish", "action_finish_batch", "finalize", "fail"} <= served
    offences = []
    for path in [ROOT / "supervisor" / "runs" / "run_actor_methods.py"]:  # the class ``runs`` is
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef) and node.name in served:
                args = node.args.args
                if len(args) > 2 and args[1].arg == "slot" and _is_params_dict(args[2]):
                    offences.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name}(slot, params: dict)")
    assert not offences, "\n".join(offences)


def test_the_untyped_methods_are_the_ones_listed() -> None:
    """Every handler left with ``(slot, params: dict[str, Any])`` serves a method not
    typed yet; this count only goes down as families convert."""
    loose = 0
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef):
                args = node.args.args
                if len(args) > 2 and args[1].arg == "slot" and _is_params_dict(args[2]):
                    loose += 1
    assert Method.ACTION_FINISH not in NOT_YET_TYPED and Method.RUN_NEXT_STEP not in NOT_YET_TYPED
    assert loose <= UNTYPED_HANDLERS_AT_MOST, f"{loose} untyped handlers (at most {UNTYPED_HANDLERS_AT_MOST})"


#: The untyped ``(slot, params: dict[str, Any])`` handlers left (a ratchet, issue 50 §1).
#: Two of them are ``RunFeature.prepare_route`` and ``McpFeature.prepare_route``
#: (supervisor/runs/run_feature.py, issue 50 §3): they hand ``action.prepare``'s
#: params on, as the untyped ``PrepareRoute`` alias did, and are typed with it.
UNTYPED_HANDLERS_AT_MOST = 60

BAD_CALLER = """
from corral.mailbox.protocol import ActionBegin, ActionFinish, NextStep, encode

encode(ActionFinish(action_id="r/0/0", ok=True, outptu={"n": 1}))
encode(ActionBegin(action_id=7))
encode(NextStep(run_id="r", history_have="all"))
"""

GOOD_CALLER = """
from corral.mailbox.protocol import ActionBegin, ActionFinish, NextStep, encode

encode(ActionFinish(action_id="r/0/0", ok=True, output={"n": 1}))
encode(ActionBegin(action_id="r/0/0"))
encode(NextStep(run_id="r", history_have=3))
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


def test_mypy_strict_rejects_a_request_with_a_wrong_field(tmp_path: Path) -> None:
    good = _mypy(GOOD_CALLER, tmp_path / "good")
    assert good.returncode == 0, good.stdout + good.stderr
    bad = _mypy(BAD_CALLER, tmp_path / "bad")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert 'Unexpected keyword argument "outptu"' in bad.stdout, bad.stdout
    assert 'Argument "action_id" to "ActionBegin" has incompatible type "int"' in bad.stdout, bad.stdout
    assert 'Argument "history_have" to "NextStep" has incompatible type "str"' in bad.stdout, bad.stdout
