"""Whether a due provider retry is still the request that failed (seed 004 V1.39:
"到期后先重新校验 … Provider 配置和重建请求指纹，再沿原 Session/run/loop/attempt 发出一个
物理请求"; V1.40: "请求、Provider 配置、Goal、steer 或项目 revision 任一稳定身份变化时，旧
sidecar 删除并记录仅含字段名的 retry_superseded 审计，随后同一 run 回到新 planning；不得
… 继续旧 attempt").

Pure: the identities in, the names of the parts that differ out. The ledger keeps
a failed request's identity (digests only) beside its retry (provider_store.py).
"""

from __future__ import annotations

import msgspec

from corral.mailbox.protocol import RequestIdentity

#: The parts, in the order the audit names them.
PARTS: tuple[str, ...] = RequestIdentity.__struct_fields__


def stored(identity: RequestIdentity | None) -> str | None:
    """The identity as the ledger keeps it (JSON of digests), or None."""
    return None if identity is None else msgspec.json.encode(identity).decode()


def changed_parts(kept: str, now: RequestIdentity) -> tuple[str, ...]:
    """The parts of the request about to be sent that differ from the one that
    failed (``kept``: its stored identity). A kept identity that no longer decodes
    counts as wholly changed: an unknown request is never sent as the old attempt."""
    try:
        before = msgspec.json.decode(kept, type=RequestIdentity)
    except msgspec.ValidationError:
        return PARTS
    except msgspec.DecodeError:
        return PARTS
    return tuple(part for part in PARTS if getattr(before, part) != getattr(now, part))
