"""Provider construction by name, for agents and for recovery decisions."""

from __future__ import annotations

from typing import Any

from corral.actors.providers.base import Provider
from corral.actors.providers.scripted import ScriptedProvider

PROVIDERS = ("scripted", "openai")


def make_provider(name: str, config: dict[str, Any]) -> Provider:
    if name == "scripted":
        return ScriptedProvider(config["script"])
    if name == "openai":
        from corral.actors.providers.openai import OpenAIConfig, OpenAIProvider

        return OpenAIProvider(OpenAIConfig.from_mapping(config))
    raise ValueError(f"unknown provider {name!r}")


def is_idempotent(name: str) -> bool:
    """May an interrupted request be sent again? Only if sending has no effect."""
    return name == "scripted"
