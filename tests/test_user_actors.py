"""User actor templates (``module:Name``) supervised like the built-ins: real
supervisors, real actor processes, SIGKILL, restart intensity."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

import corral
from corral.supervisor.spec.swarm_spec import SpecError, parse_spec
from tests.harness import actor_running, running
from tests.userpkg import write_package


def _actor(status: dict[str, Any], actor_id: str) -> dict[str, Any]:
    return next(a for a in status["actors"] if a["id"] == actor_id)


def _spec(template: str, *, group: str = "", actor_id: str = "counter", extra: str = "") -> str:
    return f"""
{group}
[[actors]]
id = "{actor_id}"
template = "{template}"
{extra}
"""


@pytest.mark.parametrize("launch", ["forkserver", "exec"])
def test_a_user_actor_answers_and_restarts_fresh_after_sigkill(short_tmp: Path, launch: str) -> None:
    write_package(short_tmp)  # next to the spec: on the import path of every actor
    spec = (
        f'[supervisor]\nlaunch = "{launch}"\n'
        + _spec("userpkg.actors:Counter", extra="params = { start = 10 }")
        + _spec("userpkg.actors:plain", actor_id="plain")
    )
    with running(short_tmp / "h", spec) as daemon:
        daemon.wait_until(actor_running("counter"), what="counter running")
        with corral.Client.connect(daemon.home) as client:
            assert client.ask("counter", {"op": "add", "n": 5})["count"] == 15
            first = client.ask("counter", {"op": "add", "n": 1})
            assert first["count"] == 16 and first["incarnation"] == 1
            assert client.ask("plain", {"x": 1}) == {"plain": True, "got": {"x": 1}}

            os.kill(first["pid"], signal.SIGKILL)
            status = daemon.wait_until(actor_running("counter", incarnation=2), what="counter restarted")
            assert _actor(status, "counter")["restarts"] == 1
            second = client.ask("counter", {"op": "add", "n": 0})
            # A new process with fresh state from start(): the restart really happened.
            assert second["pid"] != first["pid"]
            assert (second["count"], second["incarnation"]) == (10, 2)


def test_an_exception_in_handle_ask_answers_the_asker_then_crashes_the_actor(short_tmp: Path) -> None:
    write_package(short_tmp)
    with running(short_tmp / "h", _spec("userpkg.actors:Counter")) as daemon:
        daemon.wait_until(actor_running("counter"), what="counter running")
        with corral.Client.connect(daemon.home) as client:
            with pytest.raises(corral.ControlError) as caught:
                client.ask("counter", {"op": "crash"})
            assert "ValueError: asked to crash" in caught.value.message
            status = daemon.wait_until(actor_running("counter", incarnation=2), what="counter restarted")
            assert _actor(status, "counter")["last_exit"] == 1


@pytest.mark.parametrize(
    ("template", "code", "logged"),
    [
        ("userpkg.broken:Thing", 3, "RuntimeError: boom at import"),
        ("userpkg.actors:Missing", 3, "has no attribute 'Missing'"),
        ("userpkg.actors:NOT_A_TEMPLATE", 3, "a template must be a subclass of corral.Actor"),
        ("nosuchpkg.mod:Thing", 3, "no module named 'nosuchpkg'"),
        ("userpkg.actors:FailsAtStart", 4, "RuntimeError: no database at start"),
    ],
)
def test_a_template_that_cannot_load_or_start_counts_against_restart_intensity(
    short_tmp: Path, template: str, code: int, logged: str
) -> None:
    write_package(short_tmp)
    group = '[[groups]]\nid = "users"\nmax_restarts = 2\nperiod_s = 30'
    spec = _spec(template, group=group, actor_id="bad", extra='group = "users"')
    with running(short_tmp / "h", spec) as daemon:
        status = daemon.wait_until(
            lambda s: next(g for g in s["groups"] if g["id"] == "users")["status"] == "escalated",
            what="group escalated",
        )
        group_row = next(g for g in status["groups"] if g["id"] == "users")
        assert f"bad exited with {code}" in group_row["reason"]
        assert _actor(status, "bad")["restarts"] == 2
        log = (daemon.home / "logs" / "bad.log").read_text()
        assert logged in log and template in log


def test_provider_config_belongs_to_user_providers_only() -> None:
    agent = {"id": "w", "provider": "scripted", "steps": [{"final": "x"}], "provider_config": {"a": 1}}
    with pytest.raises(SpecError, match=r"agents\[0\]\.provider_config: only for user providers"):
        parse_spec({"agents": [agent]})


def test_spec_accepts_references_and_rejects_bad_templates_by_name() -> None:
    spec = parse_spec({"actors": [{"id": "a", "template": "pkg.mod:Klass"}]})
    assert spec.actor("a").template == "pkg.mod:Klass"
    with pytest.raises(SpecError, match=r"actors\[0\]\.template: unknown template 'nope'.*'package.module:Name'"):
        parse_spec({"actors": [{"id": "a", "template": "nope"}]})
    for bad in ("pkg.mod:", ":Klass", "pkg..mod:K", "pkg.mod:K:L", "pkg mod:K"):
        with pytest.raises(SpecError, match="is not a reference of the form"):
            parse_spec({"actors": [{"id": "a", "template": bad}]})


def test_corral_ask_talks_to_a_user_actor_and_refuses_bad_input(short_tmp: Path) -> None:
    from tests.harness import cli

    write_package(short_tmp)
    with running(short_tmp / "h", _spec("userpkg.actors:Counter", extra="params = { start = 1 }")) as daemon:
        daemon.wait_until(actor_running("counter"), what="counter running")
        ok = cli(daemon.home, "ask", "counter", '{"op": "add", "n": 2}')
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["count"] == 3
        for bad, message in (("[1]", "must be a JSON object"), ("{op", "not JSON")):
            refused = cli(daemon.home, "ask", "counter", bad)
            assert refused.returncode == 2 and message in refused.stderr
        missing = cli(daemon.home, "ask", "nobody", "{}")
        assert missing.returncode == 1 and "not-found" in missing.stderr
        assert json.loads(cli(daemon.home, "ask", "counter", "{}").stdout)["count"] == 3, "bad input changed nothing"
