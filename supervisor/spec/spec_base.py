"""What every spec section shares: the one ``SpecError``, the pydantic settings
of a section, and the one formatter that turns pydantic's ``ValidationError``
into a message naming the exact place.

Each section of a swarm spec (and the collaboration policy file) is a frozen
pydantic dataclass: its keys, types, defaults and ranges are stated once, in its
fields, and ``docs/spec.md`` is generated from them. The messages keep the
wording corral has always used, whichever section they come from::

    agents[1].max_repairs: must be a finite number between 0 and 100, got -5
    actors[0]: unknown key 'restrat'; did you mean 'restart'?
    spec.supervisor.heartbeat_s: NaN and infinity are not accepted
"""

from __future__ import annotations

import difflib
import enum
import functools
import math
import types
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Generic, Literal, TypeVar, Union, cast, get_args, get_origin

from corral.core.errors import CorralError

if TYPE_CHECKING:  # imported where used: `corral status` imports SpecError and parses no spec
    from pydantic import ConfigDict, TypeAdapter
    from pydantic.fields import FieldInfo
    from pydantic_core import ErrorDetails, PydanticCustomError

T = TypeVar("T")

#: Every section: an unknown key is an error, and so are NaN and infinity. Its
#: validator is built when first used: at import, twenty of them cost ~100 ms of
#: CPU in every process that imports the spec, most of which never parses one.
SECTION: ConfigDict = {"extra": "forbid", "allow_inf_nan": False, "defer_build": True}
#: No string in a spec may exceed this (a 50 MB name once broke every `status`).
MAX_STRING_CHARS = 256 * 1024
MIB = 1024 * 1024


class SpecError(CorralError, ValueError):
    """A spec that cannot run; the message names the exact place. Nothing started."""


def problem(text: str) -> PydanticCustomError:
    """Raised by a section's own check: the formatter prefixes the place."""
    from pydantic_core import PydanticCustomError

    return PydanticCustomError("spec", "{text}", {"text": text})


def check_values(node: Any, where: str = "spec") -> None:
    """NaN and infinity nowhere; no string past MAX_STRING_CHARS, wherever it is
    (free-form tables such as an actor's ``params`` included)."""
    if isinstance(node, float) and not math.isfinite(node):
        raise SpecError(f"{where}: NaN and infinity are not accepted")
    if isinstance(node, str) and len(node) > MAX_STRING_CHARS:
        raise SpecError(f"{where}: a string of {len(node)} characters; the limit is {MAX_STRING_CHARS}")
    if isinstance(node, dict):
        for key, item in node.items():
            check_values(item, f"{where}.{key}")
    elif isinstance(node, list):
        for index, item in enumerate(node):
            check_values(item, f"{where}[{index}]")


def spec_path(base: Path, value: str) -> Path:
    """A path written in a spec, as the spec means it: the one rule for every path
    key (``[project] root``, ``[tools] modules``, a script, a model file, ...): relative to ``base``, the spec file's
    directory (the current directory for a spec given as data), ``~`` expanded,
    then normalised with symlinks resolved, so what is judged is where it points."""
    return (base / Path(value).expanduser()).resolve()


def did_you_mean(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


class Reader(Generic[T]):
    """One section's validator, built on first use and kept (building one costs
    milliseconds), and the root its places are named from: ``spec`` for a whole
    swarm spec (whose sections are named bare: ``supervisor.heartbeat_s``, but
    ``spec.name``), ``mcp_servers[0]`` for one table read alone, or nothing for a
    file of its own."""

    def __init__(self, kind: type[T], root: str = "", *, bare_sections: bool = False) -> None:
        self.kind = kind
        self.root = root
        self.bare_sections = bare_sections

    @functools.cached_property
    def adapter(self) -> TypeAdapter[T]:
        from pydantic import TypeAdapter

        return TypeAdapter(self.kind)

    def read(self, data: Any, root: str | None = None) -> T:
        from pydantic import ValidationError

        try:
            return self.adapter.validate_python(data)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            # An unknown key first: a misspelled `idd` also makes `id` missing.
            first = min(range(len(errors)), key=lambda i: (errors[i]["type"] not in _UNKNOWN_KEY, i))
            raise SpecError(self.message(errors[first], self.root if root is None else root)) from None

    def message(self, error: ErrorDetails, root: str) -> str:
        kind, loc, value = error["type"], tuple(error["loc"]), error.get("input")
        if kind in _UNKNOWN_KEY:
            known = sorted(_fields(_type_at(self.kind, loc[:-1])[0]))
            return _join(self._place(root, loc[:-1], parent=True),
                         f"unknown key {loc[-1]!r}{did_you_mean(str(loc[-1]), known)}")
        if kind in _MISSING:
            return _join(self._place(root, loc[:-1], parent=True), f"missing {loc[-1]}")
        where = self._place(root, loc, parent=False)
        ctx = error.get("ctx") or {}
        if kind == "spec":
            return _join(where, str(ctx["text"]))
        if kind in _TYPES:
            return _join(where, f"expected {_TYPES[kind]}, got {type(value).__name__}")
        if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
            low, high = bounds(_type_at(self.kind, loc)[1])
            return _join(where, f"must be a finite number between {number(low)} and {number(high)}, got {value}")
        if kind == "finite_number":
            return _join(where, "NaN and infinity are not accepted")
        if kind in ("enum", "literal_error"):
            return _join(where, f"{_shown(value)} is not one of {', '.join(choices(_type_at(self.kind, loc)[0]))}")
        if kind == "string_pattern_mismatch":
            return _join(where, f"{_shown(value)} must match {ctx['pattern']}")
        if kind == "string_too_long":
            return _join(where, f"at most {ctx['max_length']} characters")
        if kind == "too_long":
            return _join(where, f"at most {ctx['max_length']} entries")
        if kind in ("string_too_short", "too_short"):
            return _join(where, "must not be empty")
        return _join(where, error["msg"])

    def _place(self, root: str, loc: tuple[Any, ...], *, parent: bool) -> str:
        text = "" if self.bare_sections and loc and (parent or len(loc) > 1) else root
        for part in loc:
            if part == "[key]":  # pydantic's mark for a table's key, not its value
                text += " (the key)"
            else:
                text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
        return text


_UNKNOWN_KEY = ("extra_forbidden", "unexpected_keyword_argument")
_MISSING = ("missing", "missing_argument", "missing_keyword_only_argument")
_TYPES = {
    "int_type": "int", "int_parsing": "int", "int_from_float": "int",
    "float_type": "float", "float_parsing": "float",
    "string_type": "str", "bool_type": "bool", "bool_parsing": "bool",
    "dict_type": "dict", "dataclass_type": "dict", "dataclass_exact_type": "dict", "model_type": "dict",
    "model_attributes_type": "dict", "list_type": "list", "tuple_type": "list", "iterable_type": "list",
}


def _shown(value: Any) -> str:
    """A refused value as the message quotes it: a 256 KiB one is cut."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _join(where: str, text: str) -> str:
    return f"{where}: {text}" if where else text


def number(value: float) -> str:
    """A bound as a spec would write it: 1048576, not 1.04858e+06."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def bare(kind: Any) -> Any:
    """The type under ``Annotated[...]`` and ``X | None``."""
    while True:
        origin = get_origin(kind)
        if origin is Annotated:
            kind = get_args(kind)[0]
        elif origin in (Union, types.UnionType):
            rest = [arg for arg in get_args(kind) if arg is not type(None)]
            if len(rest) != 1:
                return kind
            kind = rest[0]
        else:
            return kind


def _fields(kind: Any) -> dict[str, FieldInfo]:
    fields: dict[str, FieldInfo] = getattr(kind, "__pydantic_fields__", None) or {}
    return fields


def _type_at(kind: Any, loc: tuple[Any, ...]) -> tuple[Any, FieldInfo | None]:
    """The type at ``loc`` inside ``kind``, and the field that declares it (None for
    an entry of an array or table)."""
    info: FieldInfo | None = None
    for part in loc:
        kind = bare(kind)
        fields = _fields(kind)
        if isinstance(part, str) and part in fields:
            info = fields[part]
            kind = info.annotation
        elif isinstance(part, int) and get_origin(kind) in (list, tuple):
            kind, info = get_args(kind)[0], None
        elif get_origin(kind) is dict:
            kind, info = get_args(kind)[1], None
        else:
            return None, None
    return bare(kind), info


def bounds(info: FieldInfo | None) -> tuple[float, float]:
    """A numeric field's inclusive range, from its ``Field(ge=..., le=...)``."""
    from annotated_types import Ge, Gt, Le, Lt

    low, high = -math.inf, math.inf
    for item in info.metadata if info is not None else ():
        if isinstance(item, Ge | Gt):
            low = float(cast(float, item.ge if isinstance(item, Ge) else item.gt))
        elif isinstance(item, Le | Lt):
            high = float(cast(float, item.le if isinstance(item, Le) else item.lt))
    return low, high


def choices(kind: Any) -> list[str]:
    """The values a ``Literal`` or an enum field takes, as a spec writes them."""
    kind = bare(kind)
    if get_origin(kind) is Literal:
        return [str(arg) for arg in get_args(kind)]
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return [str(member.value) for member in kind]
    return []
