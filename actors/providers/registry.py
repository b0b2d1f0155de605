"""Provider construction by name, for agents and for recovery decisions.

A provider is named in a spec by one of:

* a built-in name: ``scripted``, ``openai``, ``local`` (a GGUF model actor);
* a ``module:Name`` reference to a user class or factory;
* a name registered by an installed package in the ``corral.providers`` entry
  point group (``[project.entry-points."corral.providers"] my-llm = "pkg.llm:MyProvider"``).

The class (or any callable) is called with the agent's ``provider_config`` table and
must return an object implementing ``corral.Provider``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from corral.actors.providers.base import Provider
from corral.actors.providers.scripted import ScriptedProvider
from corral.actors.user_code import entry_points_of, is_reference, load
from corral.core.errors import UserCodeError

BUILTIN_PROVIDERS = ("scripted", "openai", "local")
PROVIDERS = BUILTIN_PROVIDERS
ENTRY_POINT_GROUP = "corral.providers"

ProviderFactory = Callable[[dict[str, Any]], Provider]


def installed_providers() -> dict[str, str]:
    """Names registered by plugin packages -> their ``module:Name`` value."""
    return entry_points_of(ENTRY_POINT_GROUP)


@functools.cache
def resolve_factory(name: str) -> ProviderFactory:
    """The user class or factory behind a reference or an entry-point name."""
    if is_reference(name):
        target = load(name)
    else:
        registered = installed_providers()
        value = registered.get(name)
        if value is None:
            known = sorted({*BUILTIN_PROVIDERS, *registered})
            raise UserCodeError(
                f"unknown provider {name!r}: not built in, not a 'module:Name' reference, and no installed"
                f" package registers it in the {ENTRY_POINT_GROUP!r} entry points (known: {', '.join(known)})"
            )
        try:
            target = load(value)  # through the pinned loader, like any user reference
        except UserCodeError as exc:
            raise UserCodeError(f"provider {name!r} (entry point {value!r}) cannot be loaded: {exc}") from exc
    if not callable(target):
        raise UserCodeError(f"provider {name!r} resolves to a {type(target).__name__}, not a class or factory")
    if isinstance(target, type) and not all(callable(getattr(target, m, None)) for m in ("complete", "parse")):
        raise UserCodeError(
            f"provider {name!r}: class {target.__name__} needs complete() and parse() (corral.Provider)"
        )
    factory: ProviderFactory = target
    return factory


def make_provider(name: str, config: dict[str, Any]) -> Provider:
    if name == "scripted":
        return ScriptedProvider(config["script"])
    if name == "openai":
        from corral.actors.providers.openai import OpenAIConfig, OpenAIProvider

        return OpenAIProvider(OpenAIConfig.from_mapping(config))
    if name == "local":
        from corral.actors.providers.local import LocalConfig, LocalProvider

        return LocalProvider(LocalConfig.from_mapping(config))
    provider = resolve_factory(name)(dict(config))
    for method in ("complete", "parse"):
        if not callable(getattr(provider, method, None)):
            raise TypeError(f"provider {name!r} built a {type(provider).__name__} without {method}()")
    return provider


def is_idempotent(name: str) -> bool:
    """May an interrupted request be sent again? Only if sending has no effect.

    A user provider says so with a class attribute ``idempotent_requests = True``;
    the default is the safe answer (no: the request needs reconciliation)."""
    if name in BUILTIN_PROVIDERS:
        return name in ("scripted", "local")
    try:
        return getattr(resolve_factory(name), "idempotent_requests", False) is True
    except UserCodeError:
        return False
