"""The shape of a structured question (seed 004, V1.23), judged without I/O.

A request holds 1-3 questions; each has a snake_case ``id`` unique in the request,
a ``header`` of at most 12 characters, a one-line ``question`` and 2-3
``options``, each a short ``label`` with one ``description``. An answer names
every question by id: one of its option labels, or free text (always allowed, as
the seed says; a stored request of an older version may say otherwise, and is
honoured). Everything here raises ``BadRequest``
with what is wrong, so bad input changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from corral.supervisor.errors import BadRequest

MIN_QUESTIONS, MAX_QUESTIONS = 1, 3
MIN_OPTIONS, MAX_OPTIONS = 2, 3
MAX_HEADER_CHARS = 12
MAX_QUESTION_CHARS = 300
MAX_LABEL_CHARS = 40
MAX_DESCRIPTION_CHARS = 200
MAX_FREE_TEXT_CHARS = 2000
MAX_RESPONSE_ID_CHARS = 100
_QUESTION_ID = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
_RESPONSE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")


def _line(value: Any, what: str, limit: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadRequest(f"{what} must be a non-empty string")
    if len(value) > limit:
        raise BadRequest(f"{what} is over {limit} characters")
    if "\n" in value or "\r" in value:
        raise BadRequest(f"{what} must be one line")
    return value.strip()


def check_questions(raw: Any) -> list[dict[str, Any]]:
    """The questions as stored: exactly the fields of the shape, each checked."""
    if not isinstance(raw, list) or not MIN_QUESTIONS <= len(raw) <= MAX_QUESTIONS:
        raise BadRequest(f"questions must be a list of {MIN_QUESTIONS} to {MAX_QUESTIONS} questions")
    checked: list[dict[str, Any]] = []
    for number, item in enumerate(raw, start=1):
        where = f"question {number}"
        if not isinstance(item, dict):
            raise BadRequest(f"{where} must be a map with id, header, question and options")
        unknown = sorted(set(item) - {"id", "header", "question", "options"})
        if unknown:
            raise BadRequest(f"{where} has unknown fields: {', '.join(unknown)}")
        qid = item.get("id")
        if not isinstance(qid, str) or not _QUESTION_ID.match(qid):
            raise BadRequest(f"{where}: id must be snake_case (a-z, 0-9, _; at most 40 characters)")
        if any(q["id"] == qid for q in checked):
            raise BadRequest(f"{where}: id {qid!r} is used twice")
        options = item.get("options")
        if not isinstance(options, list) or not MIN_OPTIONS <= len(options) <= MAX_OPTIONS:
            raise BadRequest(f"{where} ({qid}): options must be a list of {MIN_OPTIONS} to {MAX_OPTIONS} options")
        shaped: list[dict[str, str]] = []
        for option in options:
            if not isinstance(option, dict) or set(option) != {"label", "description"}:
                raise BadRequest(f"{where} ({qid}): each option is a map with exactly a label and a description")
            label = _line(option["label"], f"{where} ({qid}): an option's label", MAX_LABEL_CHARS)
            if any(o["label"] == label for o in shaped):
                raise BadRequest(f"{where} ({qid}): option {label!r} is listed twice")
            description = _line(option["description"], f"{where} ({qid}): an option's description",
                                MAX_DESCRIPTION_CHARS)
            shaped.append({"label": label, "description": description})
        checked.append({
            "id": qid,
            "header": _line(item.get("header"), f"{where} ({qid}): header", MAX_HEADER_CHARS),
            "question": _line(item.get("question"), f"{where} ({qid}): question", MAX_QUESTION_CHARS),
            "options": shaped,
        })
    return checked


def check_response_id(raw: Any) -> str:
    if not isinstance(raw, str) or not 1 <= len(raw) <= MAX_RESPONSE_ID_CHARS or not _RESPONSE_ID.match(raw):
        raise BadRequest(
            f"response_id must be 1 to {MAX_RESPONSE_ID_CHARS} characters of letters, digits, '_', '.', ':' or '-'"
        )
    return raw


def check_answers(questions: list[dict[str, Any]], raw: Any, free_text: bool) -> dict[str, str]:
    """Every question answered by id, with one of its labels (or free text if allowed)."""
    if not isinstance(raw, dict):
        raise BadRequest("answers must be a map of question id to answer")
    ids = [q["id"] for q in questions]
    unknown = sorted(set(raw) - set(ids))
    if unknown:
        named = ", ".join(map(repr, unknown))
        raise BadRequest(f"no question {named} in this request (its questions: {', '.join(ids)})")
    missing = [qid for qid in ids if qid not in raw]
    if missing:
        raise BadRequest(f"every question needs an answer; missing: {', '.join(missing)}")
    answers: dict[str, str] = {}
    for question in questions:
        value = raw[question["id"]]
        labels = [option["label"] for option in question["options"]]
        if isinstance(value, str) and value in labels:
            answers[question["id"]] = value
        elif free_text:
            answers[question["id"]] = _line(value, f"the answer to {question['id']}", MAX_FREE_TEXT_CHARS)
        else:
            raise BadRequest(f"the answer to {question['id']} must be one of: {', '.join(labels)}")
    return answers


def simple_answers(questions: list[dict[str, Any]], text: Any) -> dict[str, str]:
    """``corral answer RUN TEXT``: the one question of a one-question request."""
    if len(questions) != 1:
        ids = ", ".join(q["id"] for q in questions)
        raise BadRequest(f"this request has {len(questions)} questions ({ids}): answer each, e.g. --answer ID=LABEL")
    return {questions[0]["id"]: text}


def request_id(run_id: str, action_id: str, fingerprint: str) -> str:
    """Derived from the action, so neither the model nor a client chooses it."""
    digest = hashlib.sha256(json.dumps([run_id, action_id, fingerprint]).encode()).hexdigest()
    return f"req-{digest[:24]}"


def answers_digest(answers: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(answers, sort_keys=True).encode()).hexdigest()
