"""User providers (``module:Name`` or an entry-point name) get the same durable
request lifecycle as ``openai``: transient retries that survive a supervisor
SIGKILL, and no silent re-send of a request whose outcome was lost."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import corral
from tests.harness import Daemon, cli, ledger_rows, retry_due_while_down, show, wait_run
from tests.userpkg import write_entry_point, write_package


def _spec(base: Path, provider: str, config: str = "", retry_base_s: float = 0.05, retry_cap_s: float = 30.0) -> Path:
    (base / "ws").mkdir(exist_ok=True)
    spec = base / "swarm.toml"
    spec.write_text(f"""
[project]
root = "ws"
[[agents]]
id = "llm"
provider = "{provider}"
retry_base_s = {retry_base_s}
retry_cap_s = {retry_cap_s}
provider_config = {{ {config} }}
""")
    return spec


def test_a_reference_provider_next_to_the_spec_answers_a_run(short_tmp: Path) -> None:
    write_package(short_tmp)
    spec = _spec(short_tmp, "userpkg.llm:EchoLLM", 'prefix = "mine"')
    with corral.Client.start(spec=spec, home=short_tmp / "h") as client:
        result = client.run("llm", "say hi", timeout=60)
    assert (result.status, result.final_reply) == ("completed", "mine: say hi")
    rows = ledger_rows(short_tmp / "h", "SELECT provider FROM runs WHERE run_id = ?", result.run_id)
    assert rows == [{"provider": "userpkg.llm:EchoLLM"}]


def test_transient_errors_get_the_durable_retry_across_a_supervisor_sigkill(short_tmp: Path) -> None:
    write_package(short_tmp)
    calls = short_tmp / "calls"  # outside the ledger: how often complete() really ran
    # Every retry_at is an hour away: no retry fires by itself while the test runs, so
    # the SIGKILL and the restart never race a timer; the clock passes each retry_at
    # while the supervisor is down (`resume` never sends a retry early).
    config = f'fail_first = 2, calls_file = "{calls}"'
    spec = _spec(short_tmp, "userpkg.llm:EchoLLM", config, retry_base_s=3600, retry_cap_s=86_400)
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="llm", task="flaky")["run_id"]
        wait_run(daemon, run_id, {"waiting-for-provider-retry"})
        before = daemon.call("pending")["provider_retries"]
        assert [(r["slot"], r["attempt"]) for r in before] == [(f"{run_id}:0", 0)]
        assert before[0]["retry_at"] > time.time() + 3000
        daemon.kill_supervisor()
        daemon.up()
        assert daemon.call("pending")["provider_retries"] == before, "a restart never resets attempt or retry_at"
        assert show(daemon, run_id)["run"]["status"] == "waiting-for-provider-retry"
        assert calls.read_text() == "1", "no retry before its retry_at, across the restart"

        retry_due_while_down(daemon, run_id)
        daemon.up()
        wait_run(daemon, run_id, {"waiting-for-provider-retry"})  # its second transient failure
        assert calls.read_text() == "2"
        retry_due_while_down(daemon, run_id)
        daemon.up()
        shown = wait_run(daemon, run_id, {"completed", "failed"}, timeout=90)
        assert shown["run"]["status"] == "completed"
        assert shown["final_reply"] == "echo: flaky"
        assert [(r["attempt"], r["status"]) for r in shown["provider_requests"]] == [
            (0, "failed"),
            (1, "failed"),
            (2, "completed"),
        ]
        assert calls.read_text() == "3", "one physical request per lifecycle"
    finally:
        daemon.shutdown()


def test_a_lost_response_of_a_user_provider_is_never_resent(short_tmp: Path) -> None:
    write_package(short_tmp)
    calls = short_tmp / "calls"
    spec = _spec(short_tmp, "userpkg.llm:EchoLLM", f'calls_file = "{calls}"')
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up(env={"CORRAL_FAILPOINTS": "provider.before-handoff=kill@once"})
        run_id = daemon.call("run", agent_id="llm", task="answer")["run_id"]
        shown = wait_run(daemon, run_id, {"needs-reconciliation", "completed", "failed"})
        # Not declared idempotent_requests: the unknown outcome waits for a person.
        assert shown["run"]["status"] == "needs-reconciliation"
        assert [r["status"] for r in shown["provider_requests"]] == ["needs-reconciliation"]
        assert calls.read_text() == "1"
    finally:
        daemon.shutdown()


def test_an_installed_package_plugs_a_provider_in_by_entry_point_name(short_tmp: Path) -> None:
    site = short_tmp / "site"  # a pip-installed package: found through PYTHONPATH, not the spec
    write_package(site)
    write_entry_point(site, "corral.providers", "echo-llm", "userpkg.llm:EchoLLM")
    spec_dir = short_tmp / "proj"
    spec_dir.mkdir()
    spec = _spec(spec_dir, "echo-llm", 'prefix = "plugged"')
    daemon = Daemon(short_tmp / "h", spec, env={"PYTHONPATH": str(site)})
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="llm", task="by name")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["final_reply"] == "plugged: by name"
    finally:
        daemon.shutdown()


@pytest.mark.parametrize(
    ("provider", "message"),
    [
        ("userpkg.broken:Thing", "importing module 'userpkg.broken' for 'userpkg.broken:Thing' raised RuntimeError"),
        ("userpkg.llm:Missing", "module 'userpkg.llm' has no attribute 'Missing'"),
        ("userpkg.llm:NotAProvider", "class NotAProvider needs complete() and parse()"),
        ("nosuch.mod:X", "cannot import module 'nosuch.mod'"),
        ("not-installed", "unknown provider 'not-installed'"),
    ],
)
def test_a_provider_that_cannot_load_is_a_spec_error_at_up_and_nothing_starts(
    short_tmp: Path, provider: str, message: str
) -> None:
    write_package(short_tmp)
    home = short_tmp / "h"
    result = cli(home, "up", "--spec", str(_spec(short_tmp, provider)))
    assert result.returncode == 2, result.stderr
    assert "bad spec: agents[0].provider:" in result.stderr and message in result.stderr
    assert not (home / "endpoint.json").exists()
    with pytest.raises(corral.NotRunning):
        corral.Client.connect(home)
