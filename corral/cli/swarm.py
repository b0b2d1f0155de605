"""``corral demo``: the embedded swarm (scripted, an OpenAI-compatible server, or a
real local model), with a live view and a summary."""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

from corral.cli import demo_budget, demo_owner
from corral.cli.main import EXIT_FAILED, CliError, arguments, cli_errors, command, print_table
from corral.client import Client
from corral.client_types import Event
from corral.core.child_python import python_argv, python_env
from corral.core.redact import redact_text
from corral.mailbox.control import ControlError
from corral.supervisor.home import home_dir as homes
from corral.supervisor.models.packaged_models import PACKAGED

ROOT_AGENT = "project-supervisor"
DEMO_TASK = "Prepare the launch plan: research, review, drafts and checks."
#: The packaged model demo_local.toml names (the smallest measured to do its job).
DEMO_LOCAL_MODEL = "qwen2.5-coder-0.5b"
#: A model of half a billion parameters needs the steps spelled out.
LOCAL_DEMO_TASK = (
    "Delegate two tasks. To agent researcher: write research/survey.md. To agent reviewer: write review/notes.md."
)


def demo_spec_text(name: str = "demo.toml") -> str:
    return resources.files("corral").joinpath(f"defaults/{name}").read_text()


def _demo_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", help="where to put the demo project and its home (default: a new temp dir)")
    parser.add_argument("--keep", action="store_true", help="leave the supervisor running at the end")
    parser.add_argument("--quiet", action="store_true", help="no live view, only the summary")
    parser.add_argument(
        "--provider",
        choices=["scripted", "openai", "local"],
        default="scripted",
        help="scripted (default, no API key), any OpenAI-compatible server, or local: every agent on"
        f" {PACKAGED[DEMO_LOCAL_MODEL].title} on the CPU (needs the local extra: make demo-local)",
    )
    parser.add_argument("--base-url", help="OpenAI-compatible base URL (with --provider openai)")
    parser.add_argument("--model", help="model name (with --provider openai); 'local' alone means --provider local")
    parser.add_argument(
        "--local-model", default=DEMO_LOCAL_MODEL, metavar="NAME",
        help=f"with --model local: a packaged model ({', '.join(PACKAGED)}) or a .gguf path"
        f" (default {DEMO_LOCAL_MODEL})")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds before giving up (default 120; local: none fixed, it gives up when nothing has"
                        " moved for as long as the model, at its measured speed, needs for a whole turn)")


@command("demo", "run the embedded demo swarm end to end and print a summary")
@arguments(_demo_args)
def cmd_demo(args: argparse.Namespace) -> int:
    base = Path(args.dir).absolute() if args.dir else Path(tempfile.mkdtemp(prefix="corral-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    (base / "project").mkdir(exist_ok=True)
    local = args.provider == "local" or (args.provider == "scripted" and args.model == "local")
    spec_text = demo_spec_text("demo_local.toml" if local else "demo.toml")
    if local:
        model_path = args.local_model if args.local_model in PACKAGED else str(Path(args.local_model).absolute())
        spec_text = spec_text.replace(f'path = "{DEMO_LOCAL_MODEL}"', f"path = {json.dumps(model_path)}")
    task = LOCAL_DEMO_TASK if local else DEMO_TASK
    # The local model's pace decides (corral/cli/demo_budget.py) unless a timeout is given.
    timeout = args.timeout if args.timeout is not None else (None if local else 120.0)
    if args.provider == "openai":
        if not args.base_url or not args.model:
            raise CliError("--provider openai needs --base-url and --model")
        spec_text = _openai_demo(spec_text, args.base_url, args.model)
    spec_path = base / "swarm.toml"
    spec_path.write_text(spec_text)
    home = base / ".corral"
    if homes.is_locked(home):
        raise CliError(f"a supervisor is already running on {home}; pick another --dir or `corral down`")
    started = time.monotonic()
    stopped_by: int | None = None
    # The demo owns what it starts: SIGTERM or Ctrl-C stops its supervisor (and with
    # it every actor and the model process) before the demo ends, --keep or not.
    with demo_owner.signals_stop_the_demo():
        try:
            up = subprocess.run(
                python_argv("-m", "corral", "--home", str(home), "up", "--spec", str(spec_path)),
                env=python_env(),
                capture_output=True,
                text=True,
                check=False,
            )
            if up.returncode != 0:
                raise CliError(f"supervisor did not start: {up.stderr.strip()}")
            print(f"corral demo: project {base / 'project'}", flush=True)
            with cli_errors(), Client.connect(home) as api:
                run_id = api.run(ROOT_AGENT, task, wait=False).run_id
                shown = _live_view(api, run_id, started, timeout, quiet=args.quiet)
                _summary(api, shown, time.monotonic() - started)
                if local:
                    model = PACKAGED.get(args.local_model)
                    _model_summary(api, shown, model.title if model else Path(args.local_model).name)
        except demo_owner.Stopped as exc:
            stopped_by = exc.signum
        finally:
            if stopped_by is not None or not args.keep:
                demo_owner.stop_supervisor(home)
    if stopped_by is not None:
        print(f"corral demo: stopped; its supervisor and actors are stopped too (the project stays: {base})",
              file=sys.stderr)
        demo_owner.die_by(stopped_by)
    if not args.dir and not args.keep:
        print(f"(the demo directory stays for inspection: {base}; remove it with rm -r)")
    return 0 if shown["run"]["status"] == "completed" else EXIT_FAILED


def _openai_demo(spec_text: str, base_url: str, model: str) -> str:
    import re

    block = f'provider = "openai"\n[agents.openai]\nbase_url = "{base_url}"\nmodel = "{model}"\n'
    # Only the root agent thinks with the real model; specialists and children stay scripted.
    return re.sub(
        r'(id = "project-supervisor"\nrole = "root"\nwrite_scopes = \["summary"\]\n)'
        r'(?s:.*?)(?=\n\[\[agents\]\]\nid = "researcher")',
        lambda m: m.group(1) + block,
        spec_text,
        count=1,
    )


_SHOWN_KINDS = {
    "run-running",
    "run-waiting-for-join",
    "run-waiting-confirmation",
    "run-completed",
    "run-failed",
    "group-spawned",
    "delegated",
    "child-finished",
    "delegation-receipt",
    "join-delivered",
    "claim-committed",
    "claim-observed",
    "reply-appended",
    "actor-ready",
    "actor-stopped",
    "actor-restarted",
    "action-executing",
    "run-needs-reconciliation",
    "model-ready",
    "model-failed",
}


def _live_view(api: Client, run_id: str, started: float, timeout: float | None, *, quiet: bool) -> dict[str, Any]:
    """The events as they come (the task of each run, each plan's tool calls with
    their arguments, the model's reply text), and on a terminal a status area
    under them: the root run's state, step, children, and the model's words while
    it generates (corral/cli/progress.py). ``timeout`` None: give up only when
    nothing moved for longer than the model's measured pace allows
    (corral/cli/demo_budget.py)."""
    # rich: loaded for the live view only.
    from rich.console import Console
    from rich.live import Live

    from corral.cli import progress

    log = _DemoLog(api, started)
    status = progress.RunProgress(run_id)
    cursor = 0
    deadline = time.monotonic() + timeout if timeout is not None else None
    pace = demo_budget.Pace(api, time.monotonic()) if timeout is None else None
    with contextlib.ExitStack() as stack:
        live = None
        if not quiet and sys.stdout.isatty():
            live = stack.enter_context(Live(console=Console(), transient=True, refresh_per_second=8))
        while True:
            shown: dict[str, Any] = api.show(run_id).raw
            if shown["run"]["status"] in ("completed", "failed", "cancelled", "needs-reconciliation"):
                if not quiet:
                    log.print_events([event.raw for event in api.events(cursor)])
                return shown
            if deadline is not None and time.monotonic() > deadline:
                raise CliError(f"the demo run is still {shown['run']['status']} after {timeout}s")
            if pace is not None and pace.budget.expired(time.monotonic()):
                raise CliError(f"the demo run is still {shown['run']['status']}: {pace.why()}")
            reply = api.call("events", timeout=10, since=cursor, wait_ms=progress.POLL_MS if live else 2000)
            if pace is not None:
                pace.observe([Event.from_row(row) for row in reply["events"]])
            if not quiet:
                log.print_events(reply["events"])
            cursor = reply["cursor"]
            if live is not None:
                status = progress.reduce_all(status, [Event.from_row(row) for row in reply["events"]])
                status = progress.with_children(status, shown)
                status, area = log.status_area(status)
                live.update(area)


class _DemoLog:
    """Prints the demo's events, one line each, with what they were about."""

    def __init__(self, api: Client, started: float) -> None:
        self.api = api
        self.started = started
        #: Reply text streamed and not printed yet, by run.
        self.replies: dict[str, str] = {}
        #: Runs not ended yet (their model's progress is asked for).
        self.live_runs: dict[str, str] = {}

    def print_events(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            kind, data, subject = event["kind"], event["data"], event["subject"]
            if kind == "run-created":
                self.live_runs[subject] = str(data.get("agent", ""))
                self._line(event, f"agent={data.get('agent', '')} task: {_flat(str(data.get('task', '')))}")
            elif kind == "reply-delta":
                self.replies[subject] = self.replies.get(subject, "") + str(data.get("text", ""))
            elif kind == "reply-stream-restart":
                self.replies.pop(subject, None)
            elif kind == "plan-committed" and data.get("actions"):
                for call in self._calls(subject, int(data.get("loop", 0))):
                    self._line({**event, "kind": "tool-call"}, call)
            elif kind in _SHOWN_KINDS:
                if kind == "reply-appended" or kind in ("run-completed", "run-failed"):
                    self._reply(event)
                if kind in ("run-completed", "run-failed", "run-cancelled"):
                    self.live_runs.pop(subject, None)
                self._line(event, _detail(data))
        for run_id in list(self.replies):
            self._reply({"kind": "model-reply", "subject": run_id, "at": events[-1]["at"], "data": {}})

    def _reply(self, event: dict[str, Any]) -> None:
        text = self.replies.pop(event["subject"], "")
        if text:
            self._line({**event, "kind": "model-reply"}, repr(_flat(text)))

    def _calls(self, run_id: str, loop: int) -> list[str]:
        """The tool calls of the run's plan at ``loop``, with their arguments (from
        its transcript: redacted when stored, and again when shown)."""
        from corral.cli.progress import format_call

        try:
            transcript = self.api.transcript(run_id)
        except ControlError:
            return []  # a supervisor without transcripts: the tool names still show
        return [
            format_call(str(call.get("tool", "")), call.get("input"))
            for turn in transcript.get("turns", [])
            if turn.get("loop") == loop and turn.get("plan")
            for call in turn["plan"].get("actions") or []
        ]

    def _line(self, event: dict[str, Any], detail: str) -> None:
        elapsed = max(0.0, event["at"] - (time.time() - (time.monotonic() - self.started)))
        print(f"  [{elapsed:6.2f}s] {event['kind']:<24} {event['subject']:<30} {detail}"[:200], flush=True)

    def status_area(self, root: Any) -> tuple[Any, Any]:
        """The root run's status (its progress report applied), and the model's
        words where it generates now for another run. Returns (root, renderable)."""
        from rich.console import Group
        from rich.text import Text

        from corral.cli import progress

        others = [run for run in self.live_runs if run != root.run_id][: progress.MAX_PROGRESS_RUNS - 1]
        try:
            reports = progress.progress_events(self.api.call("progress", run_ids=[root.run_id, *others]))
        except ControlError:
            reports = []  # a supervisor without progress reports
        root = progress.reduce_all(root, [event for event in reports if event.subject == root.run_id])
        rows = [progress.render(root, verbose=True)]
        for event in sorted((e for e in reports if e.subject != root.run_id), key=lambda e: e.at)[-1:]:
            generation = progress.reduce(progress.RunProgress(event.subject), event).generation
            if generation is not None and generation.tokens:
                rate = generation.tokens_per_s
                speed = f", {rate:.1f} tokens/s" if rate is not None else ""
                rows.append(Text(
                    f"  {self.live_runs.get(event.subject, '')} {event.subject}: generating,"
                    f" {generation.tokens} tokens{speed}",
                    style="cyan", no_wrap=True, overflow="ellipsis",
                ))
        return root, Group(*rows)


def _detail(data: dict[str, Any]) -> str:
    return " ".join(
        f"{k}={v}"
        for k, v in sorted(data.items())
        if k in ("tool", "status", "target", "children", "group", "failed", "reason", "repair_of", "pid", "load_s")
        and v not in ("", None)
    )


def _flat(text: str) -> str:
    return " ".join(redact_text(text).split())


def _summary(api: Client, shown: dict[str, Any], wall: float) -> None:
    home = api.home
    status = api.status()
    swarm = shown.get("swarm", {})
    receipts = len(api.show(shown["run"]["run_id"]).raw["receipts"])
    all_runs = api.runs()
    print()
    print("== corral demo summary ==")
    rows = [[a["id"], a["template"], a["status"], str(a["restarts"])] for a in status["actors"]]
    print_table(rows, ["ACTOR", "TEMPLATE", "STATUS", "RESTARTS"])
    delegations = swarm.get("delegations", [])
    repairs = sum(1 for d in delegations if d["repair_of"])
    children = sum(len(g["children"]) for g in swarm.get("groups", []))
    print()
    print_table(
        [
            ["runs", str(len(all_runs))],
            ["root actions", str(len(shown["actions"]))],
            ["root receipts", str(receipts)],
            ["isolated children", str(children)],
            ["delegations (repairs)", f"{len(delegations)} ({repairs})"],
            [
                "deliveries claimed",
                str(sum(1 for d in swarm.get("deliveries", []) if d["status"] == "claimed-by-parent")),
            ],
            ["claims observed", str(sum(1 for c in swarm.get("claims", []) if c["phase"] == "observed"))],
            ["restarts", str(sum(a["restarts"] for a in status["actors"]))],
            ["wall time", f"{wall:.2f}s"],
        ],
        ["WHAT", "COUNT"],
    )
    print()
    print(f"run {shown['run']['run_id']}: {shown['run']['status']}")
    print(f"final reply: {shown['final_reply']}")
    cluster = status.get("cluster")
    where = f"{cluster['ledger']} partition {cluster['partition']}" if cluster else str(home / homes.LEDGER)
    # Quoted for the shell: the line is meant to be pasted as printed.
    print(f"ledger: {where}   (inspect: corral --home {shlex.quote(str(home))} show {shown['run']['run_id']})")


def _model_summary(api: Client, shown: dict[str, Any], model: str) -> None:
    """What the real model did, summed over every run of the demo, beside the wall
    time of the root run: the share of it the model was not generating is corral
    (ledger, messages, tools, processes), since one model serves every agent."""
    totals = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "model_ms": 0.0, "format_repairs": 0}
    for run in api.runs():
        usage = api.show(run["run_id"]).raw.get("usage", {})
        for key in totals:
            totals[key] += usage.get(key, 0)
    run = shown["run"]
    wall_s = max(1e-9, float(run["updated_at"]) - float(run["created_at"]))
    model_s = totals["model_ms"] / 1000
    print()
    print_table(
        [
            ["model requests", str(totals["requests"])],
            ["format repairs", str(totals["format_repairs"])],
            ["prompt / completion tokens", f"{totals['prompt_tokens']} / {totals['completion_tokens']}"],
            ["tokens/s (completion / model time)", f"{totals['completion_tokens'] / max(model_s, 1e-9):.1f}"],
            [
                "tokens/s (prompt + completion)",
                f"{(totals['prompt_tokens'] + totals['completion_tokens']) / max(model_s, 1e-9):.1f}",
            ],
            ["model time", f"{model_s:.2f}s"],
            ["root run wall time", f"{wall_s:.2f}s"],
            [
                "not generating (corral, tools)",
                f"{max(0.0, wall_s - model_s):.2f}s ({max(0.0, 1 - model_s / wall_s):.1%})",
            ],
        ],
        [f"MODEL ({model}, CPU)", "VALUE"],
    )
