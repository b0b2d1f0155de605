"""A model's thinking in the text of its answer (seed 004 V1.33, V1.41, V1.43).

Complete blocks go: ``<think>...</think>`` (and ``<thinking>``, ``<reasoning>``),
whatever their case, nested ones inside them ("可以移除完整、大小写不敏感且嵌套闭合的
<think>...</think> 块"). Anything else is malformed and fails closed: a block left
open, a close with no opening (its opening tag in the chat template, or lost), or a
block closed by another name or closed twice ("未闭合 / 错配 thinking 标签仍按
response-shape 失败关闭"; "未闭合或孤立 thinking wrapper … 不能被清洗成可执行计划").
Which text of a malformed answer was thought and which was meant cannot be told,
so none of it is kept: the stored response holds ``MALFORMED`` in its place, a
marker without the model's text that is itself malformed, so an answer read again
after a crash gets the same repair ("重放合成无正文协议标记并进入同一 repair").

Pure functions only: the parser (plan_parse.py) and the handoff that stores a
response (supervisor/runs/response_secrets.py) both use them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TAGS = ("think", "thinking", "reasoning")
_TAG = re.compile(rf"<(/?)({'|'.join(TAGS)})\b[^>]*>", re.I)
#: What a stored response holds instead of a malformed answer's text: a block
#: opened and never closed, with no word of the model's in it.
MALFORMED = "<think>[corral: a thinking tag not closed, not opened or mismatched; the text is not kept]"


@dataclass(frozen=True)
class Thinking:
    """An answer's text split from its thinking."""

    #: The text without its complete blocks ("" when malformed).
    answer: str
    #: The complete top-level blocks dropped, each whole (nested blocks inside).
    blocks: tuple[str, ...] = ()
    #: A tag left open, closed without an opening, or closed by another name.
    malformed: bool = False


def split(text: str) -> Thinking:
    """``text`` without its complete thinking blocks, or malformed."""
    open_names: list[str] = []
    kept: list[str] = []
    blocks: list[str] = []
    start = end = 0
    for tag in _TAG.finditer(text):
        closing, name = tag.group(1) == "/", tag.group(2).lower()
        if not closing:
            if not open_names:
                kept.append(text[end : tag.start()])
                start = tag.start()
            open_names.append(name)
            continue
        if not open_names or open_names[-1] != name:
            return Thinking("", (), True)
        open_names.pop()
        if not open_names:
            blocks.append(text[start : tag.end()])
            end = tag.end()
    if open_names:
        return Thinking("", (), True)
    kept.append(text[end:])
    return Thinking("".join(kept).strip(), tuple(blocks))


def stored(text: str) -> str:
    """``text`` as a response may keep it: without its thinking, or ``MALFORMED``."""
    found = split(text)
    return MALFORMED if found.malformed else found.answer
