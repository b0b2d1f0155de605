"""Spans to OpenTelemetry: each ``SpanRecord`` becomes a finished SDK span with
its own derived ids, handed to a span processor. Imported only when telemetry is
on (the ``telemetry`` extra).

The spans are made finished (``ReadableSpan``), not started through a tracer,
because their times and ids come from the ledger, not from the clock now. The
OTLP sink hands them to a ``BatchSpanProcessor``: its worker thread encodes and
sends them, so the supervisor's loop never waits for the collector.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from corral import __version__
from corral.supervisor.telemetry.span_projection import SpanKind as CorralKind
from corral.supervisor.telemetry.span_projection import SpanRecord
from corral.supervisor.telemetry.telemetry_config import TelemetryConfig

#: A whole tree is queued at once: a long run is thousands of spans, past the SDK's
#: default queue of 2,048, which drops what does not fit. ``OTEL_BSP_MAX_QUEUE_SIZE`` wins.
TREE_QUEUE_SPANS = 32_768
SCOPE = InstrumentationScope("corral.supervisor", __version__)
_KINDS = {CorralKind.INTERNAL: SpanKind.INTERNAL, CorralKind.CLIENT: SpanKind.CLIENT}


def readable_span(record: SpanRecord, resource: Resource) -> ReadableSpan:
    def context(span_id: int) -> SpanContext:
        return SpanContext(record.trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))

    return ReadableSpan(
        name=record.name,
        context=context(record.span_id),
        parent=context(record.parent_id) if record.parent_id is not None else None,
        resource=resource,
        attributes=dict(record.attributes),
        events=[Event(event.name, dict(event.attributes), event.at_ns) for event in record.events],
        kind=_KINDS[record.kind],
        status=Status(StatusCode.ERROR) if record.error else Status(StatusCode.OK),
        start_time=record.start_ns,
        end_time=record.end_ns,
        instrumentation_scope=SCOPE,
    )


class ProcessorSink:
    """A ``SpanSink`` (telemetry_service.py) over any span processor: the OTLP batch
    processor in a supervisor, a simple one over an in-memory exporter in tests."""

    def __init__(self, processor: SpanProcessor, resource: Resource) -> None:
        self.processor = processor
        self.resource = resource

    def emit(self, spans: Sequence[SpanRecord]) -> None:
        for record in spans:
            self.processor.on_end(readable_span(record, self.resource))

    def close(self) -> None:
        self.processor.shutdown()  # flushes what is queued (bounded by the export timeout)


def resource_for(service_name: str, swarm: str) -> Resource:
    """``service.name`` and the swarm's name, over ``OTEL_RESOURCE_ATTRIBUTES``."""
    return Resource.create({"service.name": service_name, "service.version": __version__, "corral.swarm": swarm})


def otlp_sink(config: TelemetryConfig, swarm: str) -> ProcessorSink:
    exporter = OTLPSpanExporter(endpoint=config.traces_url, headers=dict(config.headers) or None)
    queue = None if os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE") else TREE_QUEUE_SPANS
    processor = BatchSpanProcessor(exporter, max_queue_size=queue)
    return ProcessorSink(processor, resource_for(config.service_name, swarm))
