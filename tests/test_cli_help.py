"""A CLI that helps (issue 38, item 5): did-you-mean for commands, options and
agent ids; ``chat`` with no agent takes the spec's root agent and lists the roots
when there are several; ``deny`` says "denied"; shell completion from the argparse
tree; ``--version``.

Everything argparse decides is tested in this process, with no supervisor; what
the supervisor decides (agent ids, roots, deny) shares one supervisor."""

from __future__ import annotations

import importlib.metadata
import subprocess
from pathlib import Path

import pytest

import corral
from corral.cli.main import EXIT_FAILED, EXIT_USAGE, main
from corral.supervisor.errors import BadRequest
from corral.supervisor.runs.run_core import root_agent
from corral.supervisor.spec.swarm_spec import SwarmSpec, parse_spec
from tests.harness import running, wait_run


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The real CLI in this process; a usage error from argparse exits, as it does in a shell."""
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


# -- argparse: commands, options, --version, completion ------------------------------


def test_an_unknown_command_names_the_closest_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = _cli(capsys, "stat")
    assert code == EXIT_USAGE
    assert "unknown command 'stat'; did you mean 'status'?" in err
    # A subcommand's own commands too.
    code, _out, err = _cli(capsys, "mcp", "lst")
    assert code == EXIT_USAGE and "unknown command 'lst'; did you mean 'list'?" in err
    # Nothing close: where the list is.
    code, _out, err = _cli(capsys, "xyzzy")
    assert code == EXIT_USAGE and "unknown command 'xyzzy' (`corral --help` lists them)" in err


def test_an_unknown_option_is_named_with_the_closest_before_a_missing_required_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _out, err = _cli(capsys, "run", "--agnet", "x")
    assert code == EXIT_USAGE
    assert "unknown option '--agnet'; did you mean '--agent'?" in err
    assert "required" not in err
    # Before the command: corral's own options.
    code, _out, err = _cli(capsys, "--hoem", str(tmp_path), "status")
    assert code == EXIT_USAGE and "unknown option '--hoem'; did you mean '--home'?" in err
    # Matched without the dashes every option shares: --since is not close to --intent.
    code, _out, err = _cli(capsys, "run", "--agent", "x", "--since", "1")
    assert code == EXIT_USAGE and "unknown option '--since' (`corral run --help` lists them)" in err
    # An abbreviation and a negative number are what argparse takes them for: the
    # command itself refuses -1, with its own message.
    code, _out, err = _cli(capsys, "--home", str(tmp_path / "h"), "events", "--sin", "-1")
    assert code == EXIT_USAGE and err == "corral: --since must be >= 0\n"


def test_version_is_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = _cli(capsys, "--version")
    assert code == 0
    assert out == f"corral {corral.__version__}\n"
    assert corral.__version__ == importlib.metadata.version("corral")


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts_come_from_the_parser(
    shell: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _err = _cli(capsys, "completion", shell)
    assert code == 0
    # Every command and its options, from the same tree the commands are parsed with.
    assert "status" in out and "agent" in out and "completion" in out
    if shell == "fish":
        assert "complete -c corral -n '__fish_use_subcommand' -a status -d 'show the supervision tree" in out
        assert "complete -c corral -n '__fish_seen_subcommand_from run' -l agent -r" in out
    if shell == "bash":
        script = tmp_path / "corral.bash"
        script.write_text(out)
        # It parses, and completes `corral sta` to `status` in a real bash.
        probe = (
            f"source {script}; COMP_WORDS=(corral sta); COMP_CWORD=1; COMP_LINE='corral sta'; COMP_POINT=10;"
            ' spec=$(complete -p corral); function=${spec##*-F }; ${function%% *}; echo "${COMPREPLY[@]}"'
        )
        done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["status"]


# -- the supervisor: agent ids, the root agent, deny ----------------------------------


def test_the_root_agent_is_the_one_agent_no_one_delegates_to(tmp_path: Path) -> None:
    steps = [{"final": "done"}]
    source = str(tmp_path / "spec.toml")

    def spec(*agents: dict[str, str]) -> SwarmSpec:
        return parse_spec({"agents": [{**agent, "steps": steps} for agent in agents]}, source)

    lead = root_agent(spec({"id": "lead"}, {"id": "helper", "role": "specialist"}))
    assert lead.id == "lead"
    with pytest.raises(BadRequest, match="the swarm spec has no root agent \\(its agents: helper\\); name one"):
        root_agent(spec({"id": "helper", "role": "specialist"}))
    with pytest.raises(BadRequest, match="the swarm spec has no agents"):
        root_agent(spec())


SPEC = """
name = "cli-help"
[project]
root = "ws"
[policy]
"fs.write" = "confirm"
[[agents]]
id = "writer"
  [[agents.steps]]
  actions = [{ tool = "fs.write", input = { path = "a.txt", content = "x" } }]
  [[agents.steps]]
  final = "wrote a.txt"
[[agents]]
id = "reviewer"
  [[agents.steps]]
  final = "reviewed"
[[agents]]
id = "researcher"
role = "specialist"
  [[agents.steps]]
  final = "found"
"""


def test_agent_ids_are_suggested_chat_lists_the_roots_and_deny_says_denied(
    short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (short_tmp / "ws").mkdir()
    with running(short_tmp / "home", SPEC) as daemon:
        home = str(daemon.home)
        unknown = ("no agent 'writr' in the swarm spec; did you mean 'writer'?"
                   " (its agents: writer, reviewer, researcher)")
        code, _out, err = _cli(capsys, "--home", home, "run", "--agent", "writr", "--task", "t")
        assert code == EXIT_FAILED and unknown in err
        code, _out, err = _cli(capsys, "--home", home, "chat", "writr")
        assert code == EXIT_USAGE and unknown in err
        # Two roots (a specialist is not one): chat names them and asks for one.
        code, _out, err = _cli(capsys, "--home", home, "chat")
        assert code == EXIT_USAGE
        assert err == "corral: the swarm spec has 2 root agents: writer, reviewer; name one; corral chat AGENT\n"

        run_id = daemon.call("run", agent_id="writer", task="write it")["run_id"]
        shown = wait_run(daemon, run_id, {"waiting-confirmation"})
        (action,) = [a for a in shown["actions"] if a["phase"] == "waiting-confirmation"]
        code, out, err = _cli(capsys, "--home", home, "deny", action["action_id"])
        assert code == 0, err
        assert out == f"denied {action['action_id']} (run {run_id})\n"
        assert wait_run(daemon, run_id, {"completed", "failed"})["actions"][0]["phase"] == "denied"
