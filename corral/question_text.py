"""A structured question (``user.input_request``, seed 004 V1.23) for a terminal.

One pure renderer, used by ``corral pending``, ``corral chat`` and anything else
that shows a request as lines of text: each question with its header, its
options with their descriptions, and the command that answers them. Text from
the model is shown through :func:`corral.approval_text.printable`, so control
characters cannot move a terminal's cursor.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from typing import Any

from corral.approval_text import printable


def stable_response_id(request_id: str, answers: dict[str, str] | None, text: str | None) -> str:
    """A client's response id for an answer, derived from the request and what it
    says: sending the same answer again is the same response (a repeat), and it
    can never be taken for an answer to another request."""
    body = json.dumps({"request": request_id, "answers": answers, "text": text}, sort_keys=True)
    return "resp-" + hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def answer_command(request: dict[str, Any]) -> str:
    """The ``corral answer`` line that answers ``request`` (first option of each question)."""
    parts = ["corral", "answer", str(request["run_id"])]
    if request.get("request_id"):
        parts += ["--request", str(request["request_id"])]
    for question in request.get("questions") or []:
        first = question["options"][0]["label"] if question.get("options") else "TEXT"
        parts += ["--answer", f"{question['id']}={first}"]
    return " ".join(shlex.quote(part) for part in parts)


def render_question(request: dict[str, Any]) -> list[str]:
    """``request`` as ``pending()["questions"]`` holds it, as lines (no trailing newlines)."""
    questions = request.get("questions") or []
    head = f"{request['run_id']}  needs-input  {len(questions)} question(s)"
    if request.get("request_id"):
        head += f"  request {request['request_id']}"
    if request.get("agent_id"):
        head += f"  (agent {printable(str(request['agent_id']))})"
    lines = [head]
    for question in questions:
        lines.append(f"  [{printable(str(question['header']))}] {printable(str(question['question']))}"
                     f"  (id {question['id']})")
        for number, option in enumerate(question.get("options") or [], start=1):
            lines.append(f"    {number}. {printable(str(option['label']))} - {printable(str(option['description']))}")
    if request.get("free_text"):
        lines.append("  (free text is also accepted as an answer)")
    lines.append(f"  answer: {answer_command(request)}")
    return lines
