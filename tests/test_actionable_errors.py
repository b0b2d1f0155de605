"""Errors a person can act on (issue 49, section 4): a raising tool keeps its
traceback (redacted, bounded, the user's frames) and reads "raised", never
"refused"; unknown tool names in scripts are caught at load with did-you-mean; a
missing or refused API key names its variable; ``corral run --wait`` without a
terminal says what it waits for; refused work is no evidence."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pexpect
import psutil
import pytest

from fake_openai import FakeOpenAIServer, Reply
from loopback_http import serve_in_thread
from tests.harness import CORRAL, Daemon, as_a_terminal_job, cli, running, wait_run

RAISING_TOOLS = '''
import corral


def _read_settings(path):
    with open(path) as handle:  # the user's own frame, where the error comes from
        return handle.read()


def _call_api(depth):
    if depth:
        return _call_api(depth - 1)
    raise RuntimeError("the api said 503 token=hunter2hunter2 " + "x" * 200_000)


@corral.tool(name="cfg.load", effect="read")
def load(ctx: corral.ToolContext, path: str) -> str:
    """Read a settings file."""
    return _read_settings(path)


@corral.tool(name="api.call", effect="read")
def call(ctx: corral.ToolContext, depth: int) -> str:
    """Call the API."""
    return _call_api(depth)
'''

RAISING_SPEC = """
[project]
root = "ws"
[tools]
modules = ["./raising_tools.py"]
[[agents]]
id = "writer"
tools = ["cfg.*", "api.*"]
[[agents.steps]]
actions = [{ tool = "cfg.load", input = { path = "/nonexistent/settings.toml" } }]
[[agents.steps]]
actions = [{ tool = "api.call", input = { depth = 400 } }]
[[agents.steps]]
final = "done"
"""


@pytest.fixture
def raising(short_tmp: Path) -> Path:
    (short_tmp / "ws").mkdir()
    (short_tmp / "raising_tools.py").write_text(RAISING_TOOLS)
    return short_tmp


def test_a_raising_tool_keeps_its_traceback_and_reads_raised_not_refused(raising: Path) -> None:
    spec = raising / "home-spec.toml"
    with running(raising / "home", RAISING_SPEC) as daemon:
        assert daemon.spec == spec
        run_id = daemon.call("run", agent_id="writer", task="load")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert [a["phase"] for a in shown["actions"]] == ["failed", "failed"]
        missing, deep = shown["actions"]
        # The user's frames, from their tool down to where it raised; none of corral's or trio's.
        trace = missing["traceback"]
        assert trace.startswith("Traceback (most recent call last):"), trace
        assert "raising_tools.py" in trace and "_read_settings" in trace and "in load" in trace
        assert "FileNotFoundError" in trace and "/nonexistent/settings.toml" in trace
        assert "declare.py" not in trace and "trio" not in trace
        # Redacted (the secret is in the message and in the source line) and bounded
        # (400 frames and a 200 KB message).
        deep_trace = deep["traceback"]
        assert "_call_api" in deep_trace and "RuntimeError" in deep_trace
        assert "hunter2hunter2" not in deep_trace and len(deep_trace) <= 8000
        assert "hunter2hunter2" not in json.dumps(shown)
        # A crash reads as one: "raised", never "refused" (a policy's word).
        for receipt in shown["receipts"]:
            assert "raised" in receipt["result_summary"] and "refused" not in receipt["result_summary"]
        for action in shown["actions"]:
            assert "refused" not in (action["error"] or "")

        text = cli(daemon.home, "show", run_id)
        assert text.returncode == 0, text.stderr
        assert "_read_settings" in text.stdout and "Traceback" in text.stdout
        assert "refused" not in text.stdout
        as_json = json.loads(cli(daemon.home, "show", run_id, "--json").stdout)
        assert as_json["actions"][0]["traceback"] == trace
        transcript = cli(daemon.home, "transcript", run_id)
        assert transcript.returncode == 0, transcript.stderr
        assert "_read_settings" in transcript.stdout and "refused" not in transcript.stdout
        assert "hunter2hunter2" not in transcript.stdout + text.stdout

        from corral.ui import pages

        page = pages.run(shown)
        assert "_read_settings" in page and "hunter2hunter2" not in page


# --- unknown tool names in scripts: at load, with did-you-mean -------------------------

def _scripted_spec(steps: str, tools: str = '["fs.*"]') -> str:
    return f"""
[project]
root = "ws"
[[agents]]
id = "writer"
tools = {tools}
{steps}
"""


def test_a_spec_step_naming_an_unknown_tool_stops_corral_up_with_did_you_mean(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    spec = short_tmp / "swarm.toml"
    spec.write_text(_scripted_spec(
        '[[agents.steps]]\nactions = [{ tool = "fs.list", input = {} }, { tool = "fs.wirte", input = {} }]\n'
        '[[agents.steps]]\nfinal = "done"\n'
    ))
    result = cli(short_tmp / "home", "up", "--spec", str(spec))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "agents[0].steps[0].actions[1].tool: no tool 'fs.wirte'; did you mean 'fs.write'?" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (short_tmp / "home" / "endpoint.json").exists()
    # A script file is checked the same way, and a known tool the agent is not given
    # (it would be "unknown" to this agent at run time) is named as such.
    (short_tmp / "script.toml").write_text('[[steps]]\nactions = [{ tool = "command.exec", input = {} }]\n')
    spec.write_text(_scripted_spec('script = "script.toml"'))
    result = cli(short_tmp / "home", "up", "--spec", str(spec))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert ("agents[0].script: steps[0].actions[0].tool: 'command.exec' is not one of this agent's tools"
            in result.stderr)


def test_run_script_naming_an_unknown_tool_is_refused_with_did_you_mean(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    good = '[[agents.steps]]\nfinal = "done"\n'
    with running(short_tmp / "home", _scripted_spec(good)) as daemon:
        script = short_tmp / "bad.toml"
        script.write_text('[[steps]]\nactions = [{ tool = "fs.raed", input = { path = "a" } }]\n'
                          '[[steps]]\nfinal = "x"\n')
        result = cli(daemon.home, "run", "--agent", "writer", "--task", "t", "--script", str(script))
        assert result.returncode != 0, result.stdout
        assert "steps[0].actions[0].tool: no tool 'fs.raed'; did you mean 'fs.read'?" in result.stderr
        assert daemon.call("runs")["runs"] == []  # nothing started
        # A placeholder or a declared MCP server's tool is judged at run time, as before.
        script.write_text('[[steps]]\nactions = [{ tool = "fs.read", input = { path = "a" } }]\n'
                          '[[steps]]\nfinal = "x"\n')
        ok = cli(daemon.home, "run", "--agent", "writer", "--task", "t", "--script", str(script))
        assert ok.returncode == 0, ok.stderr


# --- a missing or refused API key names its variable ----------------------------------

KEY_VAR = "CORRAL_H49_TEST_KEY"
KEY_VALUE = "sk-h49decoyKEY0123456789abcdefghij"


def _openai_spec(tmp: Path, url: str) -> Path:
    (tmp / "ws").mkdir(exist_ok=True)
    spec = tmp / "spec.toml"
    spec.write_text(f"""
[project]
root = "ws"
[[agents]]
id = "llm"
provider = "openai"
max_provider_retries = 0
[agents.openai]
base_url = "{url}"
model = "fake-model"
api_key_env = "{KEY_VAR}"
timeout_s = 5
""")
    return spec


def test_corral_up_names_an_unset_api_key_variable(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_VAR, raising=False)
    spec = _openai_spec(short_tmp, "http://127.0.0.1:9/v1")
    result = cli(short_tmp / "home", "up", "--spec", str(spec))
    try:
        assert result.returncode == 0, (result.stdout, result.stderr)
        assert f"agents[0].openai.api_key_env: ${KEY_VAR} is not set" in result.stderr, result.stderr
    finally:
        assert cli(short_tmp / "home", "down").returncode == 0
    # With the variable set there is nothing to say.
    result = cli(short_tmp / "home", "up", "--spec", str(spec), env={KEY_VAR: KEY_VALUE})
    try:
        assert result.returncode == 0 and KEY_VAR not in result.stderr, result.stderr
    finally:
        assert cli(short_tmp / "home", "down").returncode == 0
    # The Python API starts a supervisor through the same check.
    import corral

    with pytest.warns(UserWarning, match=rf"\${KEY_VAR} is not set"), corral.Client.start(spec, home=short_tmp / "h2"):
        pass


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_key_is_said_as_such_naming_its_variable(short_tmp: Path, status: int) -> None:
    server = FakeOpenAIServer([Reply(status=status, body={"error": {"message": "Incorrect API key provided"}})])
    with serve_in_thread(server) as url:
        daemon = Daemon(short_tmp / "h", _openai_spec(short_tmp, url), env={KEY_VAR: KEY_VALUE})
        try:
            daemon.up()
            run_id = daemon.call("run", agent_id="llm", task="hi")["run_id"]
            shown = wait_run(daemon, run_id, {"failed"})
            reason = shown["run"]["reason"]
            assert f"the server refused the key in ${KEY_VAR}" in reason, reason
            assert f"HTTP {status}" in reason and KEY_VALUE not in json.dumps(shown)
        finally:
            daemon.shutdown()


# --- corral run --wait says what it waits for -----------------------------------------

DELEGATING_SPEC = """
[project]
root = "ws"
[[agents]]
id = "lead"
role = "root"
  [[agents.steps]]
  [[agents.steps.actions]]
  tool = "agent.delegate"
    [agents.steps.actions.input]
    agent_id = "researcher"
    task = "Survey"
    acceptance_criteria = ["one"]
    expected_artifacts = ["research/s"]
  [[agents.steps]]
  actions = [{ tool = "agent.run_status", input = {} }]
  [[agents.steps]]
  final = "all done"
[[agents]]
id = "researcher"
role = "specialist"
write_scopes = ["research"]
  [agents.policy]
  "fs.write" = "confirm"
  [[agents.steps]]
  actions = [{ tool = "fs.write", input = { path = "research/s", content = "# Survey" } }]
  [[agents.steps]]
  final = "Survey written."
"""
APPROVE = re.compile(r"corral approve (act-[0-9a-f]+)")


def test_run_wait_without_a_terminal_says_the_run_id_each_state_and_who_must_act(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    with running(short_tmp / "home", DELEGATING_SPEC) as daemon:
        argv = [*CORRAL, "--home", str(daemon.home), "run", "--agent", "lead", "--task", "plan", "--wait", "--json",
                "--timeout", "300"]
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
            assert proc.stderr is not None
            first = proc.stderr.readline()  # at once, before anything happens
            run_id = re.search(r"run-[0-9a-f]+", first)
            assert run_id is not None, first
            seen = [first]
            action = None
            for line in proc.stderr:  # the child's approval is named as it starts to wait
                seen.append(line)
                found = APPROVE.search(line)
                if found is not None:
                    action = found.group(1)
                    break
            assert action is not None, "".join(seen)
            assert "corral pending" in seen[-1], seen[-1]
            assert cli(daemon.home, "approve", action).returncode == 0
            # Not communicate(): it reads the pipes' descriptors and would drop the
            # lines the loop above already buffered (the child's own state line
            # comes in the same write as its approval line).
            with ThreadPoolExecutor(1) as pool:
                assert proc.stdout is not None
                result = pool.submit(proc.stdout.read)
                rest = proc.stderr.read()
                out = result.result()
            proc.wait()
        assert proc.returncode == 0, (out, "".join(seen) + rest)
        shown = json.loads(out)  # stdout stays the result alone
        assert shown["run"]["run_id"] == run_id.group(0) and shown["run"]["status"] == "completed"
        said = "".join(seen) + rest
        # One line per state change of the run (and of the tree's runs).
        assert f"{run_id.group(0)} running" in said and f"{run_id.group(0)} completed" in said, said
        assert "waiting-confirmation" in said, said


def test_run_wait_on_a_terminal_names_the_command_a_waiting_child_needs(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    with running(short_tmp / "home", DELEGATING_SPEC) as daemon:
        child = pexpect.spawn(
            sys.executable,
            ["-m", "corral", "--home", str(daemon.home), "run", "--agent", "lead", "--task", "plan", "--wait",
             "--timeout", "300"],
            encoding="utf-8", timeout=300, env={**os.environ, "TERM": "xterm"}, dimensions=(40, 200),
        )
        try:
            child.expect(APPROVE)
            action = child.match.group(1)
            assert cli(daemon.home, "approve", action).returncode == 0
            child.expect(pexpect.EOF)
        finally:
            child.close(force=True)
        assert child.exitstatus == 0, child.before


# --- refused work is not evidence ------------------------------------------------------

REFUSED_WORK_SPEC = """
[project]
root = "ws"
[[agents]]
id = "lead"
role = "root"
  [[agents.steps]]
  actions = [
    { tool = "agent.delegate", input = { agent_id = "researcher", task = "Survey", acceptance_criteria = ["one"] } },
    { tool = "agent.spawn_isolated", input = { join_mode = "all", children = [
        { template = "reader", task = "Read", acceptance_criteria = "one", write_scopes = ["r"] },
    ] } },
  ]
  [[agents.steps]]
  actions = [{ tool = "agent.run_status", input = {} }]
  [[agents.steps]]
  final = "all done"
[[agents]]
id = "researcher"
role = "specialist"
write_scopes = ["research"]
  [agents.policy]
  "fs.write" = "deny"
  [[agents.steps]]
  actions = [{ tool = "fs.write", input = { path = "research/s.md", content = "# Survey" } }]
  [[agents.steps]]
  final = "Survey written."
[[templates]]
id = "reader"
  [[templates.steps]]
  actions = [{ tool = "fs.read", input = { path = "no-such-file.md" } }]
  [[templates.steps]]
  final = "Read it."
"""


def test_a_delivery_whose_every_action_was_refused_or_failed_is_not_evidence(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    with running(short_tmp / "home", REFUSED_WORK_SPEC) as daemon:
        run_id = daemon.call("run", agent_id="lead", task="plan")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        (delegation,) = shown["swarm"]["delegations"]
        child_run = delegation["run_id"]
        assert [a["phase"] for a in wait_run(daemon, child_run, {"completed", "failed"})["actions"]] == ["denied"]
        result = delegation["result"]
        assert result["status"] == "needs-repair", result  # not "evidence-ready": nothing it did stands
        assert "refused" in result["error"] and "1 refused" in result["error"], result
        ((child,),) = [group["children"] for group in shown["swarm"]["groups"]]
        reader = daemon.call("show", run_id=child["run_id"])
        assert [a["phase"] for a in reader["actions"]] == ["failed"]
        assert reader["run"]["status"] == "failed" and "1 failed" in reader["run"]["reason"], reader["run"]


# --- corral demo owns what it started ------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stopping_the_demo_stops_its_supervisor_and_every_process_it_started(
    short_tmp: Path, signum: signal.Signals
) -> None:
    demo_dir = short_tmp / "demo"
    # The root's first action holds in its agent, so the demo is mid-run when stopped.
    env = {**os.environ, "CORRAL_FAILPOINTS": "agent.before-effect=block",
           "CORRAL_FAILPOINT_DIR": str(short_tmp / "fp")}
    argv = [sys.executable, "-m", "corral", "demo", "--dir", str(demo_dir), "--quiet"]
    # Its own process group, as a shell gives a foreground job: Ctrl-C goes to the group.
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          start_new_session=True, preexec_fn=as_a_terminal_job) as proc:
        assert proc.stdout is not None
        said = proc.stdout.readline()  # printed once its supervisor is up
        assert said.startswith("corral demo: project"), said + proc.stderr.read() if proc.stderr else said
        home = demo_dir / ".corral"
        supervisor = psutil.Process(json.loads((home / "endpoint.json").read_text())["pid"])
        tree = [supervisor, *supervisor.children(recursive=True)]
        assert len(tree) >= 2, tree  # the supervisor and its actors
        os.killpg(proc.pid, signum)
        proc.communicate(timeout=120)
    assert proc.returncode in (-signum, 128 + signum), proc.returncode  # it ends by the signal, after cleaning up
    _gone, alive = psutil.wait_procs(tree, timeout=30)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], [p.cmdline() for p in alive]
    assert not (home / "endpoint.json").exists()


def test_the_local_demo_gives_up_by_the_model_s_measured_pace_not_a_fixed_600_s() -> None:
    from corral.cli.demo_budget import FIRST_TURN_S, FLOOR_S, TURN_TOKENS, DemoBudget

    budget = DemoBudget(last_progress=0.0)
    assert not budget.expired(FIRST_TURN_S) and budget.expired(FIRST_TURN_S + 1)  # loading: the first-turn allowance
    # A slow machine (2 tokens/s) that keeps generating is never given up on, even past 600 s...
    budget.observe(100.0, tokens=10, tokens_per_s=2.0)
    allowance = budget.allowance()
    assert allowance > FIRST_TURN_S and allowance >= TURN_TOKENS / 2.0
    for second in range(200, 3000, 100):
        budget.observe(float(second), tokens=second)
        assert not budget.expired(float(second))
    # ...and gives up once nothing moved for as long as a whole turn takes at that pace.
    budget.observe(3000.0, tokens=2900)  # no new token since the last poll: no progress
    assert not budget.expired(2900.0 + allowance) and budget.expired(2900.0 + allowance + 1)
    # A fast model that hangs is given up on within the floor, not after ten minutes.
    fast = DemoBudget(last_progress=0.0)
    fast.observe(5.0, events=3, tokens=50, tokens_per_s=500.0)
    assert fast.allowance() == FLOOR_S and fast.expired(5.0 + FLOOR_S + 1)
    # An event (a tool ran, a run changed state) is progress too.
    fast.observe(100.0, events=1, tokens=50)
    assert not fast.expired(100.0 + FLOOR_S)


def test_every_kind_of_waiting_for_a_person_names_its_command() -> None:
    from corral.cli.run_watch import TreeNotices
    from corral.client_types import Event

    def event(kind: str, subject: str, **data: str) -> Event:
        return Event(0, kind, subject, 0.0, data)

    tree = TreeNotices(client=None, root="run-1")  # type: ignore[arg-type]  # no child: show is never asked
    said = tree.notices([
        event("run-running", "run-1"),
        event("action-waiting-confirmation", "act-1", run="run-1", tool="fs.write"),
        event("action-needs-reconciliation", "act-2", run="run-1", tool="mail.send"),
        event("run-needs-input", "run-1"),
        event("action-waiting-confirmation", "act-9", run="run-other", tool="fs.write"),  # not this tree
        event("run-needs-input", "run-1"),  # no change: nothing said again
    ])
    assert [n.for_a_person for n in said] == [False, True, True, False, True]
    assert "corral approve act-1" in said[1].text and "corral deny act-1" in said[1].text
    assert "corral reconcile act-2 --as ok|failed" in said[2].text
    assert said[3].text == "run-1 needs-input" and "corral answer run-1" in said[4].text
    assert all("act-9" not in n.text for n in said)
