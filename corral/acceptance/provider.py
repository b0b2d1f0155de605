"""Which model the suite runs on: the packaged local model (the default), another
packaged model or GGUF file, or an OpenAI-compatible server. Resolving it is the
suite's first step, so "no model configured" is reported (BLOCKED) before any
project, home or supervisor exists."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from corral.supervisor.models.model_spec import resolve_model_file
from corral.supervisor.spec.spec_base import SpecError

#: The packaged model the suite runs on by default (the demo's: `corral demo --model local`).
DEFAULT_MODEL = "qwen2.5-coder-0.5b"
#: The environment variable the spec names for an OpenAI-compatible server's key.
KEY_ENV = "CORRAL_ACCEPTANCE_API_KEY"


@dataclass(frozen=True)
class LocalModel:
    """A GGUF served by corral's own model actor (llama.cpp in-process)."""

    name: str
    file: Path

    def describe(self) -> str:
        return f"local model {self.name} ({self.file.name})"

    def models_table(self) -> str:
        return f'[[models]]\nid = "m"\npath = "{self.file}"\nn_threads = 2\nn_ctx = 2048\n'

    def agent_table(self, table: str, max_tool_calls: int, optional_fields: bool = False) -> str:
        """``optional_fields``: offer a tool's optional inputs (process.start's args)."""
        extra = "  optional_fields = true\n" if optional_fields else ""
        return (f'provider = "local"\n  [{table}.local]\n  model = "m"\n  tool_choice = "required"\n'
                f"  max_tool_calls = {max_tool_calls}\n  max_string = 200\n  max_reply = 120\n{extra}")

    @property
    def provider(self) -> str:
        return "local"


#: A provider call's timeout on a server: one CPU model server queues the calls of
#: every agent of a flow, so a call may wait minutes for its turn (a timeout there is
#: a transient failure the flows did not ask for).
SERVER_TIMEOUT_S = 900


@dataclass(frozen=True)
class ServerModel:
    """An OpenAI-compatible server (vLLM, Ollama, llama-server, a hosted API)."""

    url: str
    model: str
    #: ``[agents.openai] structured`` when the server needs it (llama-cpp-python's: json_object).
    structured: str = ""

    def describe(self) -> str:
        return f"OpenAI-compatible server, model {self.model}"

    def models_table(self) -> str:
        return ""

    def agent_table(self, table: str, max_tool_calls: int, optional_fields: bool = False) -> str:
        return (f'provider = "openai"\n  [{table}.openai]\n  base_url = "{self.url}"\n  model = "{self.model}"\n'
                f'  api_key_env = "{KEY_ENV}"\n  max_tool_calls = {max_tool_calls}\n  temperature = 0\n'
                f"  timeout_s = {SERVER_TIMEOUT_S}\n"
                + (f'  structured = "{self.structured}"\n' if self.structured else ""))

    @property
    def provider(self) -> str:
        return "openai"

    def through(self, url: str) -> ServerModel:
        """The same model behind another route (the fault proxy)."""
        return ServerModel(url, self.model, self.structured)


Provider = LocalModel | ServerModel


class NoModel(Exception):
    """No usable model: the suite reports every point BLOCKED with this reason."""


def resolve(model: str | None, url: str | None, server_model: str | None) -> Provider:
    """The provider the user asked for. Raises ``NoModel`` naming what is missing;
    ``ValueError`` for a bad combination of options (a usage error)."""
    if url is not None or server_model is not None:
        if model is not None:
            raise ValueError("--model is a local model; --provider-url/--provider-model name a server: not both")
        if not url or not server_model:
            raise ValueError("--provider-url and --provider-model go together")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--provider-url must be http(s)://host:port/v1, not {url!r}")
        return ServerModel(url.rstrip("/"), server_model)
    name = model or DEFAULT_MODEL
    if importlib.util.find_spec("llama_cpp") is None:
        raise NoModel("no model configured: llama-cpp-python is not installed (pip install 'corral[local]'),"
                      " and no --provider-url was given")
    try:
        path = resolve_model_file(name, Path.cwd())
    except (SpecError, OSError, ValueError) as exc:
        raise NoModel(f"no model configured: {name!r} is not a usable model ({exc})") from None
    return LocalModel(name, path)


def has_llama_server() -> bool:
    """Whether ``python -m llama_cpp.server`` can start (the ``local-server`` extra)."""
    try:
        return importlib.util.find_spec("llama_cpp.server") is not None
    except ModuleNotFoundError:
        return False
