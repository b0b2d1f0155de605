"""The provider part of a spec: ``provider = ...`` and its settings, checked at
``corral up`` (a broken script, config, model file or user provider stops it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corral.supervisor.models.model_spec import ModelRegistry
from corral.supervisor.spec.spec_base import SpecError, spec_path
from corral.supervisor.spec.spec_models import ProviderKeys


def provider_settings(
    where: str, table: ProviderKeys, base: Path, models: ModelRegistry, inherited_effort: str = "default",
    inherited_search: bool = False,
) -> dict[str, Any]:
    """The provider's settings table, as the run will get it. ``inherited_effort``:
    the spec's top-level ``reasoning_effort``, for a table that sets none;
    ``inherited_search`` its top-level ``web_search``, for a table that inherits it."""
    from corral.actors.providers.scripted import ScriptError, load_script, parse_script_text

    provider = table.provider
    if provider in ("scripted", "openai", "local") and table.provider_config is not None:
        raise SpecError(f"{where}.provider_config: only for user providers; {provider} is configured by its own keys")
    if provider != "openai" and table.reasoning_effort not in (None, "default"):
        raise SpecError(f"{where}.reasoning_effort: only an openai provider takes one; {provider} takes `default`")
    searching = inherited_search if table.web_search == "inherit" else bool(table.web_search)
    if searching and provider != "openai":
        who = getattr(table, "id", where)
        raise SpecError(f"{where}.web_search: {who!r} has web search on, but its provider {provider!r} cannot search"
                        " the web (only an openai provider can); set web_search = false")
    if provider == "scripted":
        if table.steps is not None:
            script: dict[str, Any] = {"steps": table.steps}
            try:
                parse_script_text(json.dumps(script), ".json")
            except ScriptError as exc:
                raise SpecError(f"{where}.steps: {exc}") from None
        elif table.script is not None:
            try:
                script = load_script(spec_path(base, table.script))
            except ScriptError as exc:
                raise SpecError(f"{where}.script: {exc}") from None
        else:
            raise SpecError(f"{where}: a scripted provider needs `script = FILE` or inline [[...steps]]")
        return {"script": script}
    if provider == "openai":
        from corral.actors.providers.base import ProviderError
        from corral.actors.providers.openai import OpenAIConfig

        config = dict(table.openai or {})
        if "reasoning_effort" in config:
            raise SpecError(f"{where}.openai.reasoning_effort: set it on the agent (`reasoning_effort = ...`)")
        effort = table.reasoning_effort or inherited_effort
        if effort != "default":
            config["reasoning_effort"] = effort
        if "web_search" in config:
            raise SpecError(f"{where}.openai.web_search: set it on the agent (`web_search = true`)")
        if searching:
            config["web_search"] = True
        try:
            OpenAIConfig.from_mapping(config)  # exact errors now, not at the first request
        except (ProviderError, ValueError, TypeError) as exc:
            raise SpecError(f"{where}.openai: {exc}") from None
        return dict(config)
    if provider == "local":
        return _local_provider(where, table.local or {}, models)
    return _user_provider(where, table.provider_config or {}, base, provider)


def _local_provider(where: str, table: dict[str, Any], models: ModelRegistry) -> dict[str, Any]:
    """``[agents.local]``, checked now; its ``model`` is bound to a model actor's id
    (a missing or non-GGUF file stops ``corral up`` here)."""
    from corral.actors.providers.base import ProviderError
    from corral.actors.providers.local import LocalConfig

    config = dict(table)
    try:
        LocalConfig.from_mapping(config)
        config["model"] = models.bind(f"{where}.local", str(config.get("model", LocalConfig.model)))
    except (ProviderError, ValueError, TypeError) as exc:  # SpecError is a ValueError
        raise SpecError(f"{where}.local: {exc}" if not str(exc).startswith(where) else str(exc)) from None
    return config


def _user_provider(where: str, config: dict[str, Any], base: Path, provider: str) -> dict[str, Any]:
    """A ``module:Name`` reference or an entry-point name, imported now so that a
    broken one is a spec error at ``corral up`` and nothing starts."""
    from corral.actors.providers.registry import resolve_factory
    from corral.core.errors import UserCodeError

    try:
        resolve_factory(provider)  # found in the spec's directory by file (spec_resolve.parse added it)
    except UserCodeError as exc:
        raise SpecError(f"{where}.provider: {exc}") from None
    return dict(config)
