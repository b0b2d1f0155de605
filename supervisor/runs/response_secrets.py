"""What the handoff does with a provider response that redaction would change
(seed 004, V1.41 and V1.43). Pure decisions; run_actor_methods.py does the I/O.

- **Refuse** (V1.43: "命中 ... 敏感 key ... 或结构化可执行路径/命令参数中的项目及
  其它绝对路径时，handoff 写入失败并进入 reconciliation"): a tool plan, an invalid
  plan or a response not yet parsed that holds a secret *value*
  (corral/core/secret_values.py), a plan whose command names an absolute path
  (:func:`command_paths`), or one that names the runtime's configuration, the
  supervisor's home (:func:`config_traces`: "配置痕迹"). Nothing of it is stored,
  not even redacted, and no raw copy is kept: its request waits for a person.
- **Filter** (V1.41: "响应落盘前会...依次过滤密钥、项目路径和其它绝对路径"): a
  text reply (a plan with a final reply and no action). Nothing acts on it, so it
  is stored filtered (:func:`filter_reply`: secrets, then the project's root as
  ``<project>``, then every other absolute path as ``<absolute-path>``) and no raw
  copy is kept anywhere.
- **Store**: nothing to hide, or only code that names a secret (``token =
  get_token()``). The ledger shows it redacted, and the raw copy a tool must act on
  waits in the private spool (supervisor/runs/sealed_input.py): issue 14's rule that
  redaction never rewrites what a tool writes.
"""

from __future__ import annotations

import enum
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral.actors.providers import thinking
from corral.actors.providers.plan_parse import VISIBLE_PARTS, visible_text
from corral.core.path_scrub import holds_host_path, names_absolute_path, scrub_paths
from corral.core.redact import redact, redact_text
from corral.core.secret_values import secret_values_in
from corral.supervisor.runs.run_store import run_options


class Handling(enum.Enum):
    STORE = "store"
    FILTER = "filter"
    REFUSE = "refuse"


#: The tools whose input names a program to run, its arguments and its directory
#: (V1.43's "结构化可执行路径/命令参数"); the fields that do.
EXECUTABLE_TOOLS = frozenset({"command.exec", "process.start"})
_EXECUTABLE_FIELDS = ("program", "cwd")


@dataclass(frozen=True)
class Verdict:
    handling: Handling
    #: What kinds of secret value a refused response held (rule names, never values).
    kinds: tuple[str, ...] = ()
    #: Where a refused plan's commands named an absolute path (``command.exec
    #: args[0]``: the field, never the path).
    paths: tuple[str, ...] = ()
    #: A refused response named the runtime's configuration (:func:`config_traces`).
    config: bool = False

    def reason(self) -> str:
        held = []
        if self.kinds:
            held.append(f"a secret value ({', '.join(self.kinds)})")
        if self.paths:
            held.append(f"an absolute path in a command's arguments ({', '.join(self.paths)})")
        if self.config:
            held.append("a trace of the runtime's configuration (the supervisor's home)")
        return (
            f"the provider's response held {' and '.join(held)}; nothing of it was"
            " stored (seed 004 V1.43): a person reconciles the request, which is then sent again"
        )


def command_paths(plan: object) -> tuple[str, ...]:
    """Where the plan's commands name the project's or any other absolute path: the
    program, the working directory or an argument that is one, whole or as an
    option's value (``--config=/etc/x``), or a script argument that names one
    (``sh -c "cat /etc/hostname"``: the seed's command takes no shell, so a script's
    paths are its arguments). Relative paths, URLs, ``/dev/null``, text that only
    holds a slash (``s/a/b/``, ``1/2``, ``</div>``) and routes under no top directory
    of the host (``/api/users``) are not (corral/core/path_scrub.py). The seed's
    exemption for source text covers the narrative fields (content, patch, plan,
    step, response), which this check never reads."""
    if not isinstance(plan, Mapping):
        return ()
    found: list[str] = []
    for index, action in enumerate(plan.get("actions") or ()):
        if not isinstance(action, Mapping) or action.get("tool") not in EXECUTABLE_TOOLS:
            continue
        tool_input = action.get("input")
        if not isinstance(tool_input, Mapping):
            continue
        where = f"action {index} {action['tool']}"
        for name in _EXECUTABLE_FIELDS:
            value = tool_input.get(name)
            if isinstance(value, str) and names_absolute_path(value):
                found.append(f"{where} {name}")
        args = tool_input.get("args")
        for position, arg in enumerate(args if isinstance(args, list) else ()):
            if isinstance(arg, str) and (names_absolute_path(arg) or holds_host_path(arg)):
                found.append(f"{where} args[{position}]")
    return tuple(found)


def text_only(plan: object) -> bool:
    """A parsed plan that is a reply and nothing else: no action acts on it."""
    return isinstance(plan, Mapping) and not plan.get("actions") and isinstance(plan.get("final"), str)


#: Where a Chat Completions message carries the model's reasoning beside its answer.
_REASONING_KEYS = ("reasoning_content", "reasoning")


def without_thinking(text: str) -> str:
    """A response with its thinking removed before anything of it is stored (V1.41:
    "响应落盘前会删除 thinking block"; V1.43: "去除 thinking 后的响应"): the
    ``<think>``/``<thinking>``/``<reasoning>`` blocks of a plain answer or of a Chat
    Completions message's content, and the message's reasoning fields. A content
    whose thinking tags are malformed is stored as ``thinking.MALFORMED``, a marker
    with none of its text (V1.43: "未闭合或孤立 thinking wrapper 不保存 thinking 正文"),
    which the parser refuses as it refused the answer. The parser reads blocks as
    this does (actors/providers/thinking.py), so the plan read from what is stored
    is the plan read from what came; a tool call's arguments are left as the model
    wrote them."""
    try:
        body = json.loads(text)
    except ValueError:
        return thinking.stored(text)
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
        return text  # a JSON plan: its strings are content
    changed = False
    for choice in body["choices"]:
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            continue
        for key in _REASONING_KEYS:
            if key in message:
                del message[key]
                changed = True
        content = message.get("content")
        if isinstance(content, list):
            # Parts: the parser reads the visible ones joined (reasoning parts never
            # are), and so is the content stored whenever it holds thinking.
            text = visible_text(content)
            if thinking.stored(text) != text.strip() or len(content) != sum(
                    isinstance(part, dict) and part.get("type") in VISIBLE_PARTS for part in content):
                message["content"] = thinking.stored(text)
                changed = True
        elif isinstance(content, str) and thinking.stored(content) != content.strip():
            message["content"] = thinking.stored(content)
            changed = True
    return json.dumps(body, ensure_ascii=False) if changed else text


def project_roots(run: Any) -> list[str]:
    """The run's project root as the model may spell it (as given, and resolved)."""
    workspace = run_options(run).get("workspace")
    if not isinstance(workspace, str) or not workspace:
        return []
    return sorted({workspace, os.path.realpath(workspace)})


def filter_reply(text: str, project_roots: Sequence[str]) -> str:
    """A text reply as it is stored: secrets, project paths, other absolute paths."""
    return scrub_paths(redact_text(text), project_roots)


def filter_reply_plan(plan: Mapping[str, Any], project_roots: Sequence[str]) -> Any:
    """A text-only plan as it is stored: redacted, its reply filtered."""
    shown = redact(plan)
    shown["final"] = scrub_paths(shown["final"], project_roots)
    return shown


def config_traces(home: str) -> tuple[str, ...]:
    """What of the runtime's own configuration a response must not name (V1.43:
    "命中 ... 配置痕迹 ... 时，handoff 写入失败"): the supervisor's home, where its
    ledger, its spool and its keys live (the seed's "正式配置路径"), as given and
    resolved. A model has no business there; a plan that names it is refused in any
    field, a file's content too, where a path elsewhere is only a command's concern."""
    if not home:
        return ()
    return tuple(sorted({home.rstrip("/"), os.path.realpath(home)} - {"", "/"}))


def _names_config(text: str, traces: Sequence[str]) -> bool:
    """Whether ``text`` names one of ``traces`` as a whole path (``/srv/h`` is not in
    ``/srv/hx``)."""
    return any(re.search(re.escape(trace) + r"(?![\w.\-~])", text) for trace in traces if trace in text)


def handoff_verdict(text: str, shown: str, plan: object, traces: Sequence[str] = ()) -> Verdict:
    """For a response ``text`` (``shown``: its redacted copy) and the plan the agent
    parsed from it (None: not carried, so not known yet); ``traces``: the runtime's
    configuration (:func:`config_traces`). A text reply is filtered even when no
    secret is in it: its paths are (V1.41), the home's among them."""
    if text_only(plan):
        return Verdict(Handling.FILTER)
    paths = command_paths(plan)
    config = _names_config(text, traces)
    if shown == text and not paths and not config:
        return Verdict(Handling.STORE)
    kinds = secret_values_in(text) if shown != text else ()
    return Verdict(Handling.REFUSE, kinds, paths, config) if kinds or paths or config else Verdict(Handling.STORE)


def plan_verdict(plan_json: str, plan: Mapping[str, object], changed: bool, traces: Sequence[str] = ()) -> Verdict:
    """For a plan about to commit (``plan_json``: its canonical JSON; ``changed``:
    redaction changes it). The response it came from passed ``handoff_verdict``; the
    plan is checked again because its arguments are decoded (an escape in the
    response may spell a secret, or the home, only once decoded)."""
    if text_only(plan):
        return Verdict(Handling.FILTER)
    paths = command_paths(plan)
    config = _names_config(plan_json, traces)
    if not changed and not paths and not config:
        return Verdict(Handling.STORE)
    kinds = secret_values_in(plan_json) if changed else ()
    return Verdict(Handling.REFUSE, kinds, paths, config) if kinds or paths or config else Verdict(Handling.STORE)
