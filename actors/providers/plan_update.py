"""The plan update a model's answer may carry (seed 004 V1.17): ``planUpdate`` beside
``actions`` in a JSON answer, the ``update_agent_plan`` function with native
function calls. It is control-plane metadata, not a tool action ("planUpdate 是
Runtime 控制面元数据，不是白名单工具 action"): no policy, no approval, no project
revision. Its shape is checked when the answer is parsed (``arguments-schema``);
its rules against the plan as it stands (supervisor/longtask/plan_store.py) when
the answer is committed (``plan-semantics``)."""

from __future__ import annotations

from typing import Any

#: The seed's bounds: 1 to 8 steps, bounded titles and explanation.
MAX_STEPS = 8
MAX_TITLE_CHARS = 200
MAX_EXPLANATION_CHARS = 1000
STATUSES = ("pending", "in_progress", "completed")
#: The key of a JSON answer, and the native function, that carry the update.
ANSWER_KEY = "planUpdate"
FUNCTION = "update_agent_plan"
DESCRIPTION = (
    f"Your plan as it now stands (no action: it runs nothing): an explanation and 1 to {MAX_STEPS} steps with"
    " distinct titles, each pending, in_progress (at most one) or completed. A completed step stays completed; one"
    " you leave out is kept. The run cannot finish while a step is not completed. Give it at the start, when real"
    " progress changes it, and with the final reply."
)

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "explanation": {"type": "string", "minLength": 1, "maxLength": MAX_EXPLANATION_CHARS},
        "steps": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_STEPS,
            "items": {
                "type": "object",
                "properties": {
                    "step": {"type": "string", "minLength": 1, "maxLength": MAX_TITLE_CHARS},
                    "status": {"type": "string", "enum": list(STATUSES)},
                },
                "required": ["step", "status"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["explanation", "steps"],
    "additionalProperties": False,
}
