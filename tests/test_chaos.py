"""corral chaos: every failpoint once (bounded, in CI), the checker failing on a
deliberately broken build, and the full 200-kill soak (slow, `make chaos`)."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from corral.chaos.runner import Runner, demo_scenario
from corral.core import failpoints
from tests.harness import as_a_terminal_job, with_transport
from tests.test_crash_recovery import AGENT_KILLS, SUPERVISOR_KILLS
from tests.test_swarm import SWARM_FAILPOINTS

CHAOS = [sys.executable, "-m", "corral", "chaos"]


def _every_failpoint_once(workdir: Path, skip: set[str]) -> None:
    """Each failpoint of the demo once (but ``skip``), alternating supervisor and agent kills."""
    demo = demo_scenario()
    scenario = dataclasses.replace(demo, spec_text=with_transport(demo.spec_text))  # CORRAL_TRANSPORT
    runner = Runner(scenario, seed=11, targets=("supervisor", "agents"), workdir=workdir, verbose=False)
    layers = ("session.", "mcp.", "model.", "steer.", "input.", "bridge.", "durable-plan.", "context.", "changeset.",
              "verify.", "goal.", "queue.", "preview.", "git.", "command.", "control.")
    names = [name for name in failpoints.KNOWN if not name.startswith(layers) and name not in skip]
    assert names, "the sample kills somewhere"
    for index, name in enumerate(names):
        runner.failpoint_episode(name, "supervisor" if index % 2 == 0 else "agents")
    report = runner.report(0.0)
    failed = {name: entry["failures"] for name, entry in report["invariants"].items() if not entry["passed"]}
    assert failed == {}
    reached = {k.point for e in runner.episodes for k in e.kills}
    assert len(reached) >= len(names) - 2, f"failpoints never reached: {set(names) - reached}"
    assert report["supervisor_restarts"] >= 1 and report["actor_restarts"] >= 1


def test_every_failpoint_no_other_test_kills_at_keeps_every_invariant(short_tmp: Path) -> None:
    """Bounded CI sample: the demo's failpoints that no other test kills at. Each
    of the others is killed at, supervisor and caller, by tests/test_crash_recovery.py
    (effects, receipts and the one reply checked) or tests/test_swarm.py (every
    chaos invariant checked); `make chaos` runs them all here too."""
    _every_failpoint_once(short_tmp, set(SUPERVISOR_KILLS) | set(AGENT_KILLS) | set(SWARM_FAILPOINTS))


@pytest.mark.slow
def test_every_failpoint_once_keeps_every_invariant(short_tmp: Path) -> None:
    """Every failpoint of the demo under the chaos checker (`make chaos`)."""
    _every_failpoint_once(short_tmp, set())


#: The core failpoints on a PostgreSQL ledger: every one of them under `make chaos`;
#: in CI, one of each kind (an action's transition, the effect around it, a claim,
#: the ledger's own sync), which is what differs from SQLite, since every failpoint
#: already runs once on SQLite above.
PG_FAILPOINTS = ["action.after-prepared", "action.after-executing", "agent.before-effect", "agent.after-effect",
                 "action.after-terminal", "claim.after-commit", "finalize.after-prepared", "ledger.before-sync"]
PG_SAMPLE = ["action.after-executing", "agent.after-effect", "claim.after-commit", "ledger.before-sync"]


def _postgresql_failpoint_suite(workdir: Path, pg_url: str, names: list[str], random_kills: int) -> None:
    """The episodes on a shared PostgreSQL ledger (each home a node with its own
    partition): the failpoints, then seeded random kills; every invariant, the
    secrets scan over every row of each partition included."""
    runner = Runner(demo_scenario(), seed=5, targets=("supervisor", "agents"), workdir=workdir, verbose=False,
                    ledger_url=pg_url)
    for index, name in enumerate(names):
        runner.failpoint_episode(name, "supervisor" if index % 2 == 0 else "agents")
    runner.random_episode(kills=random_kills)
    report = runner.report(0.0)
    failed = {name: entry["failures"] for name, entry in report["invariants"].items() if not entry["passed"]}
    assert failed == {}
    assert "no secret in ledger, events, logs or report" in report["invariants"]
    assert all(e.checks for e in runner.episodes), "every episode was checked from its partition"
    assert report["supervisor_restarts"] >= 1


def test_the_failpoint_suite_holds_on_a_postgresql_ledger(short_tmp: Path, pg_url: str) -> None:
    _postgresql_failpoint_suite(short_tmp, pg_url, PG_SAMPLE, random_kills=1)


@pytest.mark.slow
def test_every_core_failpoint_holds_on_a_postgresql_ledger(short_tmp: Path, pg_url: str) -> None:
    _postgresql_failpoint_suite(short_tmp, pg_url, PG_FAILPOINTS, random_kills=2)


def test_a_build_that_commits_executing_after_the_effect_is_caught(short_tmp: Path) -> None:
    # The broken build is armed like a failpoint; chaos keeps it armed in every episode.
    env = {**os.environ, failpoints.ENV_VAR: "agent.effect-before-executing=on"}
    report_path = short_tmp / "report.json"
    result = subprocess.run(
        [*CHAOS, "--mode", "random", "--kills", "1", "--seed", "7", "--quiet", "--json", str(report_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 1, result.stdout[-2000:]
    report = json.loads(report_path.read_text())
    broken = report["invariants"]["side effect at most once, never before executing"]
    assert broken["passed"] is False
    # Which symptom the seeded kill meets first depends on where it lands: the effect
    # logged before its executing row, or the same effect run twice after the kill.
    details = [failure["detail"] for failure in broken["failures"]]
    assert any("before executing was committed" in d or "executed 2 times" in d for d in details), details
    assert "reproduce: corral chaos --scenario demo --seed 7 --mode random --kills 1" in result.stdout
    others = [name for name, entry in report["invariants"].items() if not entry["passed"]]
    assert others == ["side effect at most once, never before executing"], {
        name: report["invariants"][name]["failures"] for name in others
    }
    shutil.rmtree(report["workdir"], ignore_errors=True)


#: A swarm whose root drives one process session: start, stdin, poll, then one effect.
SESSION_SCENARIO = """
name = "terminal"
[project]
root = "project"
[chaos]
root_agent = "builder"
task = "Run the build in a terminal"
effects_file = "effects.log"
[sandbox]
mode = "allow-unsandboxed"
[[agents]]
id = "builder"
role = "root"
  [[agents.steps]]
    [[agents.steps.actions]]
    tool = "process.start"
    input = { program = "sh", args = ["-c", "echo building; read x; sleep 1; echo built"], timeout_s = 30 }
  [[agents.steps]]
  actions = [
    { tool = "process.stdin", input = { process_id = "${running.process_id}", data = "go", append_newline = true } },
    { tool = "process.poll", input = { process_id = "${running.process_id}", wait_ms = 3000 } },
  ]
  [[agents.steps]]
  actions = [{ tool = "effect.record", input = { label = "built" } }]
  [[agents.steps]]
  final = "built"
"""


def test_session_actors_are_a_chaos_target_of_their_own(short_tmp: Path) -> None:
    scenario = short_tmp / "terminal.toml"
    scenario.write_text(SESSION_SCENARIO)
    report_path = short_tmp / "report.json"
    argv = ["--scenario", str(scenario), "--targets", "sessions", "--mode", "random", "--kills", "3", "--seed", "3"]
    result = subprocess.run(
        [*CHAOS, *argv, "--quiet", "--json", str(report_path)], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout[-2000:]
    report = json.loads(report_path.read_text())
    # Every kill hit a session actor (proc-...), never the agent that owns it.
    assert report["kills_by_target"] == {"sessions": 3}
    assert all(entry["passed"] for entry in report["invariants"].values())
    # The supervisor, the fork server, the agent and the session actors were all checked.
    assert report["invariants"]["no process left alive"]["count"] >= 3 * 4
    shutil.rmtree(report["workdir"], ignore_errors=True)


@pytest.mark.parametrize(
    "argv",
    [
        ["--targets", "nobody"],
        ["--failpoint", "nope"],
        ["--kills", "-1"],
        ["--scenario", "/nonexistent.toml"],
        ["--ledger", "mysql://x/y"],
    ],
)
def test_bad_chaos_arguments_are_refused_clearly(argv: list[str]) -> None:
    result = subprocess.run([*CHAOS, *argv], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.startswith("corral: ")


@pytest.mark.slow
def test_full_soak_200_kills_all_targets(short_tmp: Path) -> None:
    report_path = short_tmp / "soak.json"
    result = subprocess.run(
        [*CHAOS, "--mode", "both", "--kills", "200", "--seed", "2026", "--quiet", "--json", str(report_path)],
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
    )
    report = json.loads(report_path.read_text())
    assert result.returncode == 0, result.stdout[-3000:]
    assert report["kills"] == 200
    assert all(entry["passed"] for entry in report["invariants"].values())


#: A swarm whose root calls an MCP server's external, read and idempotent tools.
#: The lab server records each execution in the chaos effects file with the
#: action id from the call's _meta, so the invariants count MCP side effects too.
MCP_SCENARIO = f"""
name = "mcp"
[project]
root = "project"
[chaos]
root_agent = "caller"
task = "Use the lab's tools"
effects_file = "effects.log"
[[mcp_servers]]
id = "lab"
command = ["python", "{Path(__file__).parent / 'mcp_servers' / 'lab_server.py'}"]
env = {{ LAB_EFFECTS = "effects.log" }}  # the server runs in the spec's directory
approval = "auto"
[[agents]]
id = "caller"
role = "root"
  [[agents.steps]]
  actions = [{{ tool = "mcp.lab.send", input = {{ to = "ops" }} }}]
  [[agents.steps]]
  actions = [
    {{ tool = "mcp.lab.peek", input = {{ item = "a" }} }},
    {{ tool = "mcp.lab.put", input = {{ item = "b", value = "c" }} }},
  ]
  [[agents.steps]]
  final = "called"
"""


def _scenario_runner(short_tmp: Path, name: str, spec_text: str) -> Runner:
    """A runner of the scenario ``spec_text``, episodes under ``short_tmp/w``."""
    from corral.chaos.runner import file_scenario

    spec = short_tmp / f"{name}.toml"
    spec.write_text(spec_text)
    return Runner(file_scenario(spec), seed=5, targets=("supervisor", "agents"), workdir=short_tmp / "w",
                  verbose=False)


def test_the_chaos_failpoint_suite_covers_mcp_calls(short_tmp: Path) -> None:
    runner = _scenario_runner(short_tmp, "mcp", MCP_SCENARIO)
    names = [name for name in failpoints.KNOWN if name.startswith("mcp.")]
    assert names == ["mcp.before-call", "mcp.after-call"]
    # The supervisor killed at each; the MCP actor killed at each (the caller
    # there) is tests/test_mcp_servers.py's test_sigkill_of_the_mcp_actor_mid_call,
    # for every effect class.
    for name in names:
        runner.failpoint_episode(name, "supervisor")
    report = runner.report(0.0)
    failed = {name: entry["failures"] for name, entry in report["invariants"].items() if not entry["passed"]}
    assert failed == {}
    assert {k.point for e in runner.episodes for k in e.kills} == set(names)
    assert report["invariants"]["side effect at most once, never before executing"]["count"] >= 2


#: The crash windows of a verified change (seed 004 V1.3, V1.12): between a
#: changeset's checkpoint and its first write (never replayed: it waits for a
#: person, nothing written), and right after a verification is recorded (the run
#: ends once, with the files written once and one verification).
CHANGESET_SCENARIO = """
name = "changeset"
[project]
root = "project"
verify = [["test", "-f", "a.txt"]]
[chaos]
root_agent = "writer"
task = "Change two files"
effects_file = "effects.log"
[sandbox]
mode = "allow-unsandboxed"
[[agents]]
id = "writer"
role = "root"
[agents.policy]
"project.changeset" = "auto"
  [[agents.steps]]
  actions = [{ tool = "project.changeset", input = { changes = [
    { operation = "create", path = "a.txt", content = "a" },
    { operation = "create", path = "b.txt", content = "b" },
  ] } }]
  [[agents.steps]]
  actions = [{ tool = "project.verify", input = {} }]
  [[agents.steps]]
  final = "changed"
"""


def test_the_chaos_failpoint_suite_covers_the_changeset_window(short_tmp: Path) -> None:
    runner = _scenario_runner(short_tmp, "changeset", CHANGESET_SCENARIO)
    runner.failpoint_episode("changeset.after-checkpoint", "agents")
    runner.failpoint_episode("verify.after-record", "supervisor")
    report = runner.report(0.0)
    failed = {name: entry["failures"] for name, entry in report["invariants"].items() if not entry["passed"]}
    assert failed == {}
    assert [sorted(k.point for k in e.kills) for e in runner.episodes] == [
        ["changeset.after-checkpoint"], ["verify.after-record"]]
    for episode in ("e000", "e001"):
        project = short_tmp / "w" / episode / "project"
        assert len(list((project.parent / ".corral" / "checkpoints" / "runs").glob("*/cp-*.json"))) == 1
        ledger = sqlite3.connect(project.parent / ".corral" / "ledger.db")
        try:
            changesets = ledger.execute("SELECT phase, error LIKE 'reconciled as failed%' FROM actions"
                                        " WHERE tool = 'project.changeset'").fetchall()
            verified = ledger.execute("SELECT status FROM project_verifications").fetchall()
            phases = ledger.execute("SELECT phase FROM actions WHERE tool = 'project.verify'").fetchall()
        finally:
            ledger.close()
        if episode == "e000":
            # Killed between its checkpoint and its first write: never replayed (seed 004
            # V1.3); it waited for a person (the campaign reconciles it as failed), with
            # its checkpoint, and nothing was written.
            assert changesets == [("failed", 1)], changesets
            assert not (project / "a.txt").exists() and not (project / "b.txt").exists()
            assert verified == [("failed",)], "the run went on; its verification saw no a.txt"
        else:
            assert (project / "a.txt").read_text() == "a" and (project / "b.txt").read_text() == "b"
            assert verified == [("passed",)] and phases == [("ok",)], episode


def test_kill_caller_with_no_caller_stays_armed_for_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A join delivery written by a timer or a control call has no actor to kill: the
    # window stays armed, so the chaos suite reaches it on the next actor's request.
    monkeypatch.setenv(failpoints.MARKER_DIR_ENV, str(tmp_path))
    failpoints.configure("join.after-delivery=kill-caller@once")
    victim = subprocess.Popen(["sleep", "60"])
    try:
        failpoints.hit("join.after-delivery")
        assert not (tmp_path / "join.after-delivery.fired").exists() and victim.poll() is None
        token = failpoints.caller_pid.set(victim.pid)
        try:
            failpoints.hit("join.after-delivery")
        finally:
            failpoints.caller_pid.reset(token)
        assert victim.wait(timeout=10) == -9
        assert (tmp_path / "join.after-delivery.fired").exists()
    finally:
        failpoints.configure("")
        victim.kill()
        victim.wait()


# -- issue 48, D.10: a scenario that cannot run stops the campaign; Ctrl-C reports -------------

#: A tools module outside the scenario's folder, named by a relative path.
OUTSIDE_TOOLS = (
    "import os\n\nimport corral\n\n"
    "if os.environ.get('REFUSE_IN_EPISODES') and os.environ.get('CORRAL_DECOY_TOKEN'):\n"
    "    # The chaos runner plants this decoy in every episode's environment only.\n"
    "    raise RuntimeError('this tools module refuses to load in a chaos episode')\n\n"
    "@corral.tool(effect='read', name='local.echo')\n"
    "def echo(ctx: corral.ToolContext, text: str) -> dict:\n"
    "    '''Echo.'''\n"
    "    return {'echo': text}\n"
)
OUTSIDE_SCENARIO = """
name = "outside"
[project]
root = "project"
[tools]
modules = ["../lib/outside_tools.py"]
[chaos]
root_agent = "writer"
task = "Echo, then record"
effects_file = "effects.log"
[sandbox]
mode = "allow-unsandboxed"
[[agents]]
id = "writer"
role = "root"
tools = ["local.*", "effect.record"]
  [[agents.steps]]
  actions = [{ tool = "local.echo", input = { text = "hello" } }]
  [[agents.steps]]
  actions = [{ tool = "effect.record", input = { label = "echoed" } }]
  [[agents.steps]]
  final = "echoed"
"""


def _outside_scenario(top: Path) -> Path:
    (top / "lib").mkdir()
    (top / "lib" / "outside_tools.py").write_text(OUTSIDE_TOOLS)
    (top / "scenario").mkdir()
    scenario = top / "scenario" / "swarm.toml"
    scenario.write_text(OUTSIDE_SCENARIO)
    return scenario


def _chaos(argv: list[str], env: dict[str, str] | None = None,
           timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CHAOS, *argv], capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, **(env or {})})


def test_a_scenarios_paths_resolve_in_episodes_as_they_did_at_load(short_tmp: Path) -> None:
    """A tools module named by a path relative to the scenario but outside its
    folder loads at the start, and in every episode too (each episode's own project
    and effects file stay the episode's)."""
    scenario = _outside_scenario(short_tmp)
    report_path = short_tmp / "report.json"
    result = _chaos(["--scenario", str(scenario), "--mode", "failpoints", "--failpoint", "action.after-executing",
                     "--targets", "supervisor", "--seed", "3", "--quiet", "--json", str(report_path),
                     "--keep"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    report = json.loads(report_path.read_text())
    assert report["episodes"] == 1 and report["runs"] == {"completed": 1}, report["runs"]
    assert report["invariants"]["every episode ran to its end"]["failures"] == []
    episode = Path(report["workdir"]) / "e000"
    effects = (episode / "effects.log").read_text().splitlines()
    assert len(effects) == 1 and "echoed" in effects[0], effects
    assert (episode / "project").is_dir()
    shutil.rmtree(report["workdir"], ignore_errors=True)


def test_an_episode_that_fails_before_its_first_kill_stops_the_campaign(short_tmp: Path) -> None:
    """Random mode runs episodes "until N kills happened": a scenario that loads at
    the start but cannot run in an episode never gets a kill. The first such
    episode stops the campaign, with the reason, a report and one episode kept."""
    scenario = _outside_scenario(short_tmp)
    report_path = short_tmp / "report.json"
    # Bounded only so that a runaway fails the test instead of hanging it.
    result = _chaos(["--scenario", str(scenario), "--mode", "random", "--kills", "50", "--seed", "3", "--quiet",
                     "--json", str(report_path)], env={"REFUSE_IN_EPISODES": "1"}, timeout=600)
    assert result.returncode == 1, result.stdout[-3000:]
    report = json.loads(report_path.read_text())
    assert report["episodes"] == 1 and report["kills"] == 0, (report["episodes"], report["kills"])
    assert report["passed"] is False and "refuses to load in a chaos episode" in report["stopped"], report["stopped"]
    assert "campaign stopped" in result.stdout and "refuses to load in a chaos episode" in result.stdout
    (failure,) = report["invariants"]["every episode ran to its end"]["failures"]
    assert failure["episode"] == 0 and "refuses to load" in failure["detail"]
    assert sorted(path.name for path in Path(report["workdir"]).iterdir()) == ["e000"], "one episode, kept"
    shutil.rmtree(report["workdir"], ignore_errors=True)
    # Its reproduce line names the scenario by its absolute path (not the file's stem),
    # and works as printed from another directory: the same failure again.
    (line,) = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("reproduce: ")]
    argv = shlex.split(line.removeprefix("reproduce: ").rsplit("   (episode", 1)[0])
    assert argv[:4] == ["corral", "chaos", "--scenario", str(scenario.resolve())], line
    elsewhere = short_tmp / "elsewhere"
    elsewhere.mkdir()
    again_path = short_tmp / "again.json"
    again = subprocess.run([sys.executable, "-m", "corral", *argv[1:], "--quiet", "--json", str(again_path)],
                           capture_output=True, text=True, timeout=600, check=False, cwd=elsewhere,
                           env={**os.environ, "REFUSE_IN_EPISODES": "1"})
    assert again.returncode == 1 and "cannot read spec" not in again.stdout + again.stderr, (
        again.stdout[-2000:], again.stderr[-2000:])
    again_report = json.loads(again_path.read_text())
    assert "refuses to load in a chaos episode" in again_report["stopped"], again_report["stopped"]
    shutil.rmtree(again_report["workdir"], ignore_errors=True)


def test_ctrl_c_writes_the_report_of_the_episodes_so_far(short_tmp: Path) -> None:
    """SIGINT mid-campaign: the episode under way is ended (its processes killed and
    reaped: the orphan check of this test covers them), and the report of what ran
    is printed and written, marked interrupted, with a non-zero exit."""
    _interrupted_campaign(short_tmp, signal.SIGINT, 130)


def test_sigterm_writes_the_report_of_the_episodes_so_far(short_tmp: Path) -> None:
    """Red team: SIGTERM (``timeout``, a cancelled CI job) ended the campaign with no
    report. It now does what Ctrl-C does: the episode under way is ended and reaped,
    the report so far is printed and written, the episodes are kept (and said
    where), and the exit is 143 (128 + SIGTERM, as a shell says)."""
    _interrupted_campaign(short_tmp, signal.SIGTERM, 143)


def _interrupted_campaign(short_tmp: Path, signum: signal.Signals, code: int) -> None:
    report_path = short_tmp / "report.json"
    process = subprocess.Popen(
        [*CHAOS, "--mode", "random", "--kills", "100000", "--seed", "5", "--json", str(report_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_a_terminal_job,
    )
    try:
        assert process.stdout is not None
        # Wait for an episode in which a kill landed to end (its line; a quick run can
        # end before any random kill reaches it), then interrupt the next one.
        for line in process.stdout:
            if line.startswith("  episode ") and "no kill reached" not in line:
                break
        else:
            raise AssertionError(f"no episode ran: {process.stderr.read() if process.stderr else ''}")
        process.send_signal(signum)
        rest, errors = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == code, (rest[-2000:], errors[-2000:])
    report = json.loads(report_path.read_text())
    assert report["interrupted"] is True and report["passed"] is False
    assert report["episodes"] >= 1 and report["kills"] >= 1
    assert f"interrupted ({signum.name})" in rest and f"report: {report_path}" in rest, rest[-2000:]
    assert f"episodes kept in {report['workdir']}" in rest, rest[-2000:]
    assert "Traceback" not in errors, errors[-2000:]
    shutil.rmtree(report["workdir"], ignore_errors=True)
