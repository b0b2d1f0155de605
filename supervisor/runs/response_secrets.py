"""What the handoff does with a provider response that redaction would change
(seed 004, V1.41 and V1.43). A pure decision; run_actor_methods.py does the I/O.

- **Refuse** (V1.43: "命中 ... 敏感 key ... 时，handoff 写入失败并进入
  reconciliation"): a tool plan, an invalid plan or a response not yet parsed that
  holds a secret *value* (corral/core/secret_values.py). Nothing of it is stored,
  not even redacted, and no raw copy is kept: its request waits for a person.
- **Filter** (V1.41: "响应落盘前会...依次过滤密钥"): a text reply (a plan with a
  final reply and no action). Nothing acts on it, so it is stored redacted and no
  raw copy is kept anywhere.
- **Store**: nothing to hide, or only code that names a secret (``token =
  get_token()``). The ledger shows it redacted, and the raw copy a tool must act on
  waits in the private spool (supervisor/runs/sealed_input.py): issue 14's rule that
  redaction never rewrites what a tool writes.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from corral.core.secret_values import secret_values_in


class Handling(enum.Enum):
    STORE = "store"
    FILTER = "filter"
    REFUSE = "refuse"


@dataclass(frozen=True)
class Verdict:
    handling: Handling
    #: What kinds of secret value a refused response held (rule names, never values).
    kinds: tuple[str, ...] = ()

    def reason(self) -> str:
        return (
            f"the provider's response held a secret value ({', '.join(self.kinds)}); nothing of it was"
            " stored (seed 004 V1.43): a person reconciles the request, which is then sent again"
        )


def text_only(plan: object) -> bool:
    """A parsed plan that is a reply and nothing else: no action acts on it."""
    return isinstance(plan, Mapping) and not plan.get("actions") and isinstance(plan.get("final"), str)


def handoff_verdict(text: str, shown: str, plan: object) -> Verdict:
    """For a response ``text`` (``shown``: its redacted copy) and the plan the agent
    parsed from it (None: not carried, so not known yet)."""
    if shown == text:
        return Verdict(Handling.STORE)
    if text_only(plan):
        return Verdict(Handling.FILTER)
    kinds = secret_values_in(text)
    return Verdict(Handling.REFUSE, kinds) if kinds else Verdict(Handling.STORE)


def plan_verdict(plan_json: str, plan: Mapping[str, object], changed: bool) -> Verdict:
    """For a plan about to commit (``plan_json``: its canonical JSON; ``changed``:
    redaction changes it). The response it came from passed ``handoff_verdict``; the
    plan is checked again because its arguments are decoded (an escape in the
    response may spell a secret only once decoded)."""
    if not changed:
        return Verdict(Handling.STORE)
    if text_only(plan):
        return Verdict(Handling.FILTER)
    kinds = secret_values_in(plan_json)
    return Verdict(Handling.REFUSE, kinds) if kinds else Verdict(Handling.STORE)
