"""OpenTelemetry traces (issue 34, item 3): a finished run tree as spans.

One real swarm (a delegation, an isolated child, an MCP call that waits for a
person's approval) runs under a supervisor that exports over OTLP/HTTP to a
receiver started here; the spans that arrived are decoded, and the same ledger is
projected again in this process onto the SDK's in-memory exporter. Both must give
the run tree's shape, and neither may hold a tool's arguments or a secret.
"""

from __future__ import annotations

import contextlib
import gzip
import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from corral.supervisor.ledger.ledger_spec import open_for_reading
from corral.supervisor.spec.swarm_spec import parse_spec
from corral.supervisor.telemetry import telemetry_config
from corral.supervisor.telemetry.otel_sink import ProcessorSink, resource_for
from corral.supervisor.telemetry.span_projection import project, span_id_of, trace_id_of
from corral.supervisor.telemetry.telemetry_config import TelemetryUnavailable
from corral.supervisor.telemetry.tree_rows import read_tree
from tests.harness import Daemon, ledger_rows, wait_run

LAB = Path(__file__).parent / "mcp_servers" / "lab_server.py"
#: A secret value (a GitHub token's shape), code naming a secret and a plain value:
#: none may reach a span. The plain value and the code are tool arguments (redaction
#: still hides the code). The secret is a file's content, which the helper and the
#: drafter read: a plan holding a secret value fails its handoff closed (seed 004
#: V1.43), so it comes in as the seed lets it, as a tool's observation.
SECRET = "ghp_" + "Zq7TLw2Rk9Xv4Nb8Hs6Jd3Fp1Gc5Ym0Ae2Wu"
CODE_SECRET = "token = vault.read_token()"
PLAIN = "plain-argument-marker-5521"
TOKEN_FILE = "ref/token.txt"

SWARM = f"""
name = "traced"
[project]
root = "ws"
[limits]
max_children_per_call = 2
max_depth = 1

[[mcp_servers]]
id = "lab"
command = ["python", "{LAB}"]
env = {{ LAB_EFFECTS = "lab.log" }}
approval = "confirm"
call_timeout_s = 20

[[agents]]
id = "lead"
role = "root"
write_scopes = ["out"]
  # The MCP call first: once the lead delegated it only orchestrates (seed 004 V1.32).
  [[agents.steps]]
  actions = [{{ tool = "mcp.lab.send", input = {{ to = "{PLAIN}", body = "{CODE_SECRET} {PLAIN}" }} }}]
  [[agents.steps]]
  actions = [
    {{ tool = "agent.delegate", input = {{ agent_id = "helper", task = "{PLAIN}", expected_artifacts = ["n/n.md"] }} }},
    {{ tool = "agent.spawn_isolated", input = {{ children = [
        {{ template = "drafter", task = "Draft", expected_artifacts = ["d/d.md"], write_scopes = ["d"] }} ] }} }},
  ]
  [[agents.steps]]
  actions = [{{ tool = "agent.run_status", input = {{}} }}]
  [[agents.steps]]
  final = "done"

[[agents]]
id = "helper"
role = "specialist"
write_scopes = ["n"]
  [[agents.steps]]
  raw = "{{ not json"
  unless_observed = "arguments-json"
  [[agents.steps]]
  actions = [{{ tool = "fs.read", input = {{ path = "{TOKEN_FILE}" }} }}]
  [[agents.steps]]
  actions = [{{ tool = "fs.write", input = {{ path = "n/n.md", content = "{CODE_SECRET} {PLAIN}" }} }}]
  [[agents.steps]]
  final = "noted"

[[templates]]
id = "drafter"
  [[templates.steps]]
  actions = [{{ tool = "fs.read", input = {{ path = "{TOKEN_FILE}" }} }}]
  [[templates.steps]]
  actions = [{{ tool = "fs.write", input = {{ path = "${{artifact:0}}", content = "{CODE_SECRET}" }} }}]
  [[templates.steps]]
  final = "drafted"
"""


class _Receiver(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP collector's traces endpoint: keeps every decoded request."""

    received: list[ExportTraceServiceRequest]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path != "/v1/traces":
            self.send_response(404)
        else:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            self.received.append(request)
            self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def otlp_receiver() -> Iterator[tuple[str, list[ExportTraceServiceRequest]]]:
    received: list[ExportTraceServiceRequest] = []
    handler = type("Handler", (_Receiver,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _as_hex(value: int, size: int) -> str:
    return value.to_bytes(size, "big").hex()


def _check_tree(spans: list[dict[str, Any]], runs: list[dict[str, Any]], spawned: dict[str, str]) -> None:
    """The spans' parent links follow the run tree: one trace, each child's and
    delegate's run under the action that made it, every action under its run's step,
    the MCP call under its action, the approval's wait present."""
    by_id = {span["span_id"]: span for span in spans}
    assert len(by_id) == len(spans), "span ids are unique"
    (root,) = (run for run in runs if run["kind"] == "root")
    assert {span["trace_id"] for span in spans} == {_as_hex(trace_id_of(root["run_id"]), 16)}
    run_spans = {span["attributes"]["corral.run.id"]: span for span in spans if span["name"].startswith("run ")}
    assert set(run_spans) == {run["run_id"] for run in runs}
    assert run_spans[root["run_id"]]["parent"] is None
    for run in runs:
        if run["kind"] == "root":
            continue
        parent = by_id[run_spans[run["run_id"]]["parent"]]
        assert parent["name"] in ("action agent.delegate", "action agent.spawn_isolated"), parent["name"]
        assert parent["attributes"]["corral.action.id"] == spawned[run["run_id"]]
        assert by_id[by_id[parent["parent"]]["parent"]] is run_spans[run["parent_run_id"]]
    for span in spans:
        if span["name"].startswith(("action ", "chat")):
            step = by_id[span["parent"]]
            assert step["name"].startswith("step "), (span["name"], step["name"])
            assert by_id[step["parent"]]["name"].startswith("run ")
    (mcp,) = (span for span in spans if span["name"].startswith("mcp "))
    assert mcp["name"] == "mcp lab/send"
    assert mcp["attributes"]["corral.mcp.server"] == "lab" and mcp["attributes"]["corral.mcp.tool"] == "send"
    action = by_id[mcp["parent"]]
    assert action["name"] == "action mcp.lab.send"
    assert action["attributes"]["corral.effect"] == "external" and action["attributes"]["corral.policy"] == "confirm"
    phases = ("waiting-confirmation", "approved", "executing", "ok")
    assert [event for event in action["events"] if event in phases] == list(phases)
    (wait,) = (span for span in spans if span["name"] == "approval wait")
    assert wait["parent"] == action["span_id"] and wait["attributes"]["corral.approval.decision"] == "approved"
    assert wait["start"] <= wait["end"] <= mcp["start"]
    turns = [span for span in spans if span["name"].startswith("chat")]
    assert turns and all("corral.turn.slot" in t["attributes"] for t in turns)
    # The helper's first answer did not parse: its turn says why, and the next one is a repair.
    (repaired,) = (t for t in turns if "corral.turn.repair" in t["attributes"])
    assert repaired["attributes"]["corral.turn.repair"] == "arguments-json", repaired["attributes"]
    assert by_id[repaired["parent"]]["parent"] == run_spans[_run_of_agent(runs, "helper")]["span_id"]
    for span in spans:
        shown = json.dumps(span)
        assert SECRET not in shown and CODE_SECRET not in shown and PLAIN not in shown, span["name"]


def _run_of_agent(runs: list[dict[str, Any]], agent_id: str) -> str:
    (run_id,) = (run["run_id"] for run in runs if run["agent_id"] == agent_id)
    return str(run_id)


def _decoded(received: list[ExportTraceServiceRequest]) -> list[dict[str, Any]]:
    out = []
    for request in received:
        for resource_spans in request.resource_spans:
            service = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
            assert service["service.name"] == "corral-test" and service["corral.swarm"] == "traced"
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    out.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex() or None,
                            "start": span.start_time_unix_nano,
                            "end": span.end_time_unix_nano,
                            "attributes": {kv.key: _value(kv.value) for kv in span.attributes},
                            "events": [event.name for event in span.events],
                        }
                    )
    return out


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


def _in_memory(home: Path, root_run_id: str, effects: dict[str, str]) -> list[dict[str, Any]]:
    exporter = InMemorySpanExporter()
    sink = ProcessorSink(SimpleSpanProcessor(exporter), resource_for("corral-test", "traced"))
    with contextlib.closing(open_for_reading(home)) as ledger:
        tree = read_tree(ledger, root_run_id)
        assert tree is not None
        sink.emit(project(tree, lambda action: effects.get(action["tool"])))
    sink.close()
    return [
        {
            "name": span.name,
            "trace_id": _as_hex(span.context.trace_id, 16),
            "span_id": _as_hex(span.context.span_id, 8),
            "parent": _as_hex(span.parent.span_id, 8) if span.parent else None,
            "start": span.start_time,
            "end": span.end_time,
            "attributes": dict(span.attributes or {}),
            "events": [event.name for event in span.events],
        }
        for span in exporter.get_finished_spans()
    ]


def test_a_swarm_run_is_one_trace_whose_parent_links_are_the_run_tree(short_tmp: Path) -> None:
    (short_tmp / "ws" / TOKEN_FILE).parent.mkdir(parents=True)
    (short_tmp / "ws" / TOKEN_FILE).write_text(f"token {SECRET}\n")
    spec = short_tmp / "swarm.toml"
    spec.write_text(SWARM)
    with otlp_receiver() as (url, received):
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_SERVICE_NAME": "corral-test", "NO_PROXY": "127.0.0.1"}
        daemon = Daemon(short_tmp / "h", spec, env)
        try:
            daemon.up()
            run_id = daemon.call("run", agent_id="lead", task="trace this")["run_id"]
            shown = wait_run(daemon, run_id, {"waiting-confirmation", "failed"})
            (waiting,) = (a for a in shown["actions"] if a["phase"] == "waiting-confirmation")
            daemon.call("continue_action", action_id=waiting["action_id"], decision="approve")
            shown = wait_run(daemon, run_id, {"completed", "failed"})
            assert shown["run"]["status"] == "completed", shown["run"]
        finally:
            daemon.shutdown()  # a graceful down flushes the exporter's queue
        runs = ledger_rows(
            daemon.home, "SELECT run_id, agent_id, kind, status, parent_run_id FROM runs ORDER BY created_at"
        )
        assert sorted((run["kind"], run["status"]) for run in runs) == [
            ("child", "completed"),
            ("delegation", "completed"),
            ("root", "completed"),
        ]
        spawned = {
            row["run_id"]: row["parent_action_id"]
            for row in ledger_rows(daemon.home, "SELECT run_id, parent_action_id FROM delegations")
            + ledger_rows(
                daemon.home,
                "SELECT c.run_id, g.parent_action_id FROM children c JOIN isolated_groups g USING (group_id)",
            )
        }
        # The plain marker is in the ledger's copy of the arguments: its absence from
        # the spans is not for want of something to leak.
        assert any(PLAIN in row["input"] for row in ledger_rows(daemon.home, "SELECT input FROM actions"))
        # The secret went through the run: both reads saw the file (their results keep
        # it redacted), and nothing was refused on its account.
        reads = ledger_rows(daemon.home, "SELECT phase, result FROM actions WHERE tool = 'fs.read'")
        assert [row["phase"] for row in reads] == ["ok", "ok"], reads
        assert all("[redacted]" in row["result"] and SECRET not in row["result"] for row in reads), reads
        exported = _decoded(received)
        _check_tree(exported, runs, spawned)
        # The same ledger, projected again here: the same spans with the same ids.
        effects = {"mcp.lab.send": "external"}
        again = _in_memory(daemon.home, run_id, effects)
        _check_tree(again, runs, spawned)
        assert {(s["span_id"], s["parent"], s["name"]) for s in again} == {
            (s["span_id"], s["parent"], s["name"]) for s in exported
        }
        assert span_id_of(f"run:{run_id}").to_bytes(8, "big").hex() in {s["span_id"] for s in exported}
        tokens = [s for s in exported if s["name"].startswith("chat")]
        assert all(s["attributes"]["corral.turn.status"] == "completed" for s in tokens)


def _spec(**table: Any) -> Any:
    return parse_spec({"telemetry": table}).telemetry


def test_the_spec_and_the_otel_variables_decide_and_a_missing_extra_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert telemetry_config.resolve(_spec(), {}) is None, "off unless asked for"
    on = telemetry_config.resolve(_spec(), endpoint)
    assert on is not None and on.traces_url is None and on.service_name == "corral"
    assert telemetry_config.resolve(_spec(enabled=False), endpoint) is None
    assert telemetry_config.resolve(_spec(), {**endpoint, "OTEL_SDK_DISABLED": "true"}) is None
    assert telemetry_config.resolve(_spec(enabled=True), {"OTEL_TRACES_EXPORTER": "none"}) is None
    table = _spec(enabled=True, endpoint="http://collector:4318/", service_name="swarm", headers_env="HDRS")
    config = telemetry_config.resolve(table, {"HDRS": f"authorization=Bearer {SECRET}"})
    assert config is not None and config.traces_url == "http://collector:4318/v1/traces"
    assert config.service_name == "swarm" and config.headers == {"authorization": f"Bearer {SECRET}"}
    assert SECRET not in repr(config)
    with pytest.raises(TelemetryUnavailable, match="HDRS, which is not set"):
        telemetry_config.resolve(table, {})
    with pytest.raises(TelemetryUnavailable, match="OTLP/HTTP only"):
        telemetry_config.resolve(_spec(enabled=True), {"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(TelemetryUnavailable, match="'grpc'"):
        telemetry_config.resolve(_spec(enabled=True), {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    # The extra not installed: find_spec of a module set to None raises, as for a missing one.
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http", None)
    with pytest.raises(TelemetryUnavailable, match=r"pip install 'corral\[telemetry\]'"):
        telemetry_config.resolve(_spec(enabled=True), {})


def test_with_telemetry_off_the_supervisor_never_imports_opentelemetry() -> None:
    probe = (
        "import sys, corral.supervisor.daemon, corral.supervisor.telemetry.telemetry_service;"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.strip() == "[]"
