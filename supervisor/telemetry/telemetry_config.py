"""Whether this supervisor exports traces, and where: the spec's ``[telemetry]``
first, then the standard ``OTEL_*`` variables of its environment.

Standard library only, and it never imports OpenTelemetry: with telemetry off
nothing of it is loaded. On but the ``telemetry`` extra missing is a clear error
at boot, never a traceback or a silent no-op.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from corral.core.errors import CorralError

if TYPE_CHECKING:
    from corral.supervisor.spec.spec_models import TelemetrySpec

DEFAULT_SERVICE_NAME = "corral"
#: What the ``telemetry`` extra brings (pyproject.toml).
EXTRA_MODULES = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOL_VARS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
TRACES_PATH = "/v1/traces"


class TelemetryUnavailable(CorralError):
    """Telemetry is asked for and cannot be had: the extra is not installed, or the
    environment asks for an exporter or protocol corral does not ship."""


@dataclass(frozen=True)
class TelemetryConfig:
    """How an on supervisor exports (off is no config at all)."""

    #: The traces URL; None: the exporter reads ``OTEL_EXPORTER_OTLP_*`` itself.
    traces_url: str | None
    service_name: str
    #: Exporter headers from the variable ``[telemetry] headers_env`` names (else the
    #: exporter reads ``OTEL_EXPORTER_OTLP_HEADERS``); secrets, never logged.
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)


def resolve(spec: TelemetrySpec, environ: Mapping[str, str]) -> TelemetryConfig | None:
    """The config of an on supervisor, or None (off)."""
    if spec.enabled is False or _true(environ.get("OTEL_SDK_DISABLED")):
        return None
    exporter = (environ.get("OTEL_TRACES_EXPORTER") or "otlp").strip().lower()
    if exporter == "none":
        return None
    from_env = any(environ.get(name) for name in ENDPOINT_VARS)
    if spec.enabled is None and not from_env:
        return None
    if exporter != "otlp":
        raise TelemetryUnavailable(
            f"OTEL_TRACES_EXPORTER={exporter!r}: corral exports traces over OTLP/HTTP only ('otlp' or 'none')"
        )
    protocol = next((environ[name] for name in PROTOCOL_VARS if environ.get(name)), "http/protobuf")
    if protocol != "http/protobuf":
        raise TelemetryUnavailable(
            f"OTLP protocol {protocol!r}: corral exports over 'http/protobuf' only (the collector's port 4318)"
        )
    missing = [name for name in EXTRA_MODULES if not _importable(name)]
    if missing:
        raise TelemetryUnavailable(
            f"telemetry is on ([telemetry] or OTEL_EXPORTER_OTLP_ENDPOINT) but {', '.join(missing)} is not"
            " installed: pip install 'corral[telemetry]', or set [telemetry] enabled = false"
        )
    headers: dict[str, str] = {}
    if spec.headers_env is not None:
        text = environ.get(spec.headers_env)
        if text is None:
            raise TelemetryUnavailable(f"[telemetry] headers_env names {spec.headers_env}, which is not set")
        headers = parse_headers(text, spec.headers_env)
    return TelemetryConfig(
        traces_url=spec.endpoint.rstrip("/") + TRACES_PATH if spec.endpoint else None,
        service_name=spec.service_name or environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME,
        headers=headers,
    )


def parse_headers(text: str, where: str) -> dict[str, str]:
    """``key=value,key2=value2`` (the ``OTEL_EXPORTER_OTLP_HEADERS`` form); an error
    names the variable, never its value."""
    headers: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TelemetryUnavailable(f"{where}: headers must be key=value pairs separated by commas")
        headers[key.strip()] = value.strip()
    return headers


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False
