"""The bench's probes (supervisor/probes.py serves them, only when a spec asks):
a sink that counts one-way tells, its count and its reset."""

from __future__ import annotations

from typing import ClassVar

import msgspec

from corral.mailbox.protocol.base import Ack, Method, Request


class SinkCount(msgspec.Struct, frozen=True):
    """``bench.sink_count``'s reply: the tells counted since the last reset."""

    count: int


class BenchSink(Request[Ack], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``bench.sink`` (a tell): counted, never stored; ``payload`` (ignored) gives it its size."""

    METHOD: ClassVar[Method] = Method.BENCH_SINK
    payload: str = ""


class BenchSinkCount(Request[SinkCount], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``bench.sink_count``: how many ``bench.sink`` tells the supervisor counted."""

    METHOD: ClassVar[Method] = Method.BENCH_SINK_COUNT


class BenchSinkReset(Request[Ack], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``bench.sink_reset``: the count back to 0."""

    METHOD: ClassVar[Method] = Method.BENCH_SINK_RESET


#: The probes' requests (the package's ``TypedRequest`` includes them).
ProbeRequest = BenchSink | BenchSinkCount | BenchSinkReset
