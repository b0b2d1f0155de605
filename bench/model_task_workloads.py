"""``real_model_tasks``: can a packaged model do a small job? Each task is one to
three tool calls, and the host judges it by its effect (the file written, the
message posted), never by what the model says it did.

Every packaged model runs every task in the same bench run: one supervisor per
model (the model loads once), one agent per task (its tools, ``tool_choice =
"required"`` and ``max_tool_calls`` = the task's number of calls), the runs one
after another. Before each run the project directory is emptied and the task's
input files written, so an oracle sees only that run's effects. The user tools
(``weather.get``, ``chat.post``) are in ``bench/task_tools.py``.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.corral_workloads import _wait_all_ready, supervisor
from bench.harness import Context, Metrics, NotRun, Stats, workload

TOOLS_MODULE = Path(__file__).resolve().with_name("task_tools.py")
POSTS_FILE = "posts.jsonl"  # task_tools.POSTS_FILE: that module is loaded by path, not imported here
MODELS = ("smollm2", "qwen2.5-coder-0.5b")
RUN_TIMEOUT_S = 240.0
NOTE_CHARS = 700

Oracle = Callable[[Path], str | None]
"""The project directory after a run -> None when the task was done, else what is wrong."""
OutputOracle = Callable[[Any], str | None]
"""A typed-output task's validated output -> None when it is right, else what is wrong."""


def _posts(project: Path) -> list[dict[str, Any]]:
    path = project / POSTS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def posted(channel: str, *needles: str) -> Oracle:
    """A post to ``channel`` (with or without its ``#``) whose text holds every needle."""

    def check(project: Path) -> str | None:
        posts = _posts(project)
        if not posts:
            return "nothing was posted"
        for post in posts:
            text = str(post.get("text", ""))
            on_channel = str(post.get("channel", "")).strip().lstrip("#").lower() == channel.lstrip("#")
            if on_channel and all(needle.lower() in text.lower() for needle in needles):
                return None
        shown = "; ".join(f"{p.get('channel')!r}: {str(p.get('text'))[:80]!r}" for p in posts)
        return f"no post to {channel} containing {' and '.join(map(repr, needles))} (posted {shown})"

    return check


def file_is(path: str, expected: str) -> Oracle:
    """The file ``path`` holds ``expected`` (surrounding whitespace ignored)."""

    def check(project: Path) -> str | None:
        target = project / path
        if not target.is_file():
            written = sorted(str(p.relative_to(project)) for p in project.rglob("*") if p.is_file())
            return f"{path} was not written (files: {', '.join(written) or 'none'})"
        text = target.read_text(errors="replace")
        if text.strip() != expected:
            return f"{path} holds {text[:120]!r}, expected {expected!r}"
        return None

    return check


@dataclass(frozen=True)
class Task:
    name: str
    prompt: str
    tools: tuple[str, ...]
    #: The tool calls the task takes: the agent's ``max_tool_calls``.
    calls: int
    oracle: Oracle
    #: Input files, written into the empty project before the run.
    files: Mapping[str, str] = field(default_factory=dict)
    #: The agent's typed output (a JSON Schema), and the check of the validated value
    #: the run returns (the host judges the value, not the reply's words).
    output: Mapping[str, Any] | None = None
    output_oracle: OutputOracle | None = None


FORECAST = {"type": "object", "properties": {"city": {"type": "string"}, "temperature_c": {"type": "number"}},
            "required": ["city", "temperature_c"], "additionalProperties": False}


def forecast_is(city: str, temperature_c: float) -> OutputOracle:
    """The output names ``city`` and its temperature (the run's output is schema-valid already)."""

    def check(output: Any) -> str | None:
        if not isinstance(output, dict):
            return f"no valid output (got {output!r})"
        if city.lower() not in str(output.get("city", "")).lower() or output.get("temperature_c") != temperature_c:
            return f"output {json.dumps(output)[:160]} is not {city} at {temperature_c}"
        return None

    return check


TASKS = (
    Task("write-file", "Write the text 'hello from corral' to the file hello.txt.", ("fs.write",), 1,
         file_is("hello.txt", "hello from corral")),
    Task("post-message", "Post the message 'standup in 5 minutes' to the #team channel.", ("chat.post",), 1,
         posted("team", "standup in 5 minutes")),
    Task("oslo-post", "Find the temperature in Oslo, post it to #ops, and tell me what you posted.",
         ("weather.get", "chat.post"), 2, posted("ops", "-2")),
    Task("copy-first-line", "Read todo.txt and write its first line to first.txt.", ("fs.read", "fs.write"), 2,
         file_is("first.txt", "buy milk"), {"todo.txt": "buy milk\nfix the bike\ncall the bank\n"}),
    Task("read-then-post", "Read status.txt and post its content to #deploys.", ("fs.read", "chat.post"), 2,
         posted("deploys", "14:05"), {"status.txt": "deploy finished at 14:05\n"}),
    Task("two-cities-post", "Get the temperatures in Oslo and in Bergen, then post both to #ops.",
         ("weather.get", "chat.post"), 3, posted("ops", "-2", "4.5")),
    # Typed output (issue 49): two fields the grammar holds the final answer to.
    Task("typed-forecast", "How cold is it in Oslo? Give the city and its temperature in degrees Celsius.",
         ("weather.get",), 1, lambda project: None, output=FORECAST, output_oracle=forecast_is("Oslo", -2.0)),
)


def _toml(value: Any) -> str:
    """``value`` as a TOML inline value (a schema table in an agent's line)."""
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(key)} = {_toml(item)}" for key, item in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def _spec(model: str) -> str:
    agents = "".join(
        f'\n[[agents]]\nid = "{task.name}"\nprovider = "local"\ntools = {json.dumps(list(task.tools))}\n'
        + (f"output = {_toml(task.output)}\n" if task.output is not None else "")
        + f'  [agents.local]\n  model = "m"\n  tool_choice = "required"\n  max_tool_calls = {task.calls}\n'
        for task in TASKS
    )
    return (
        f'[project]\nroot = "ws"\n[tools]\nmodules = [{json.dumps(str(TOOLS_MODULE))}]\n'
        '[policy]\n"chat.post" = "auto"\n"fs.write" = "auto"\n'
        f'[[models]]\nid = "m"\npath = "{model}"\nn_threads = 2\nn_ctx = 2048\n{agents}'
    )


def _fresh(project: Path, task: Task) -> None:
    """An empty project holding only the task's input files."""
    for entry in project.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    for name, text in task.files.items():
        (project / name).write_text(text)


def _turns(transcript: dict[str, Any]) -> str:
    """What the model said each turn, in one line: its calls and their outcomes, its
    final reply, or the repair its answer needed."""
    said = []
    for turn in transcript.get("turns", []):
        plan, repair = turn.get("plan"), turn.get("repair")
        if plan:
            parts = [f"{call.get('tool')}({json.dumps(call.get('input'))[:100]})"
                     f"->{(call.get('outcome') or {}).get('phase', '?')}" for call in plan.get("actions", [])]
            if plan.get("final") is not None:
                parts.append(f"final {str(plan['final'])[:120]!r}")
            said.append(f"t{turn['turn']}: " + ", ".join(parts))
        elif repair:
            said.append(f"t{turn['turn']}: repair {repair.get('category')} on {str(turn.get('said'))[:100]!r}")
        else:
            said.append(f"t{turn['turn']}: {turn.get('status')} {str(turn.get('said') or turn.get('error'))[:100]!r}")
    return " | ".join(said)


@dataclass
class Outcome:
    passed: bool
    wall_s: float
    repairs: int
    note: str = ""
    #: A typed-output task returned a schema-valid output (right or not).
    output_valid: bool = False


def _attempt(client: Any, project: Path, model: str, task: Task, timeout: float) -> Outcome:
    """One run of ``task`` and its oracle's verdict."""
    from corral import RunTimeout

    _fresh(project, task)
    started = time.perf_counter()
    try:
        result = client.run(task.name, task.prompt, timeout=timeout)
    except RunTimeout as exc:
        client.cancel(exc.run_id)
        said = _turns(client.transcript(exc.run_id))
        note = f"{model} {task.name} FAILED: still {exc.status} after {timeout:.0f}s; {said}"
        return Outcome(False, time.perf_counter() - started, 0, note[:NOTE_CHARS])
    wall = time.perf_counter() - started
    repairs = int(result.raw.get("usage", {}).get("format_repairs", 0))
    finding = task.oracle(project)
    if finding is None and task.output_oracle is not None:
        finding = task.output_oracle(result.output)
    valid = result.status == "completed" and result.output is not None
    if finding is None:
        return Outcome(True, wall, repairs, output_valid=valid)
    if not result.done:
        client.cancel(result.run_id)
    said = _turns(client.transcript(result.run_id))
    note = (f"{model} {task.name} FAILED: {finding}; run {result.status}"
            f"{' (' + str(result.reason) + ')' if result.reason else ''}, reply {result.final_reply!r}; {said}")
    return Outcome(False, wall, repairs, note[:NOTE_CHARS], output_valid=valid)


def _model_file_missing(model: str) -> str | None:
    from corral.supervisor.models.packaged_models import packaged_model_file
    from corral.supervisor.spec.spec_base import SpecError

    try:
        packaged_model_file(model)
    except SpecError as exc:
        return str(exc)
    return None


def _run_model(ctx: Context, model: str, reps: int) -> None:
    import corral

    passed: dict[str, list[float]] = {task.name: [] for task in TASKS}
    rates: list[float] = []  # one sample per repetition: the share of all tasks passed
    walls: list[float] = []
    valid: list[float] = []  # typed-output runs: a schema-valid output came back
    repairs = 0
    with supervisor(ctx, _spec(model)) as home, corral.Client(home) as client:
        project = home.parent / "ws"
        _wait_all_ready(home, len(TASKS) + 1, 300)
        for _ in range(reps):
            done = 0
            for task in TASKS:
                ctx.check(f"real_model_tasks {model} {task.name}")
                outcome = _attempt(client, project, model, task, min(RUN_TIMEOUT_S, max(ctx.remaining(), 1.0)))
                passed[task.name].append(100.0 if outcome.passed else 0.0)
                if task.output is not None:
                    valid.append(100.0 if outcome.output_valid else 0.0)
                done += outcome.passed
                walls.append(outcome.wall_s)
                repairs += outcome.repairs
                if outcome.note:
                    ctx.note(outcome.note)
            rates.append(100.0 * done / len(TASKS))
    ctx.metrics[f"success_rate_{model}"] = Stats.of(rates, "%")
    for name, values in passed.items():
        ctx.metrics[f"passed_{model}_{name}"] = Stats.of(values, "%")
    ctx.metrics[f"format_repairs_{model}"] = repairs
    ctx.metrics[f"typed_output_valid_{model}"] = Stats.of(valid, "%")
    ctx.metrics[f"task_wall_s_{model}"] = Stats.of(walls, "s")


@workload("real_model_tasks", group="corral", budget_s=2400, quick_budget_s=900)
def real_model_tasks(ctx: Context) -> Metrics:
    """Seven tasks of one to three tool calls, judged by the host (the file written, the
    message posted, the typed output returned), on each packaged model. Return, per
    model, {"success_rate_{model}" (% of tasks passed), "passed_{model}_{task}",
    "format_repairs_{model}", "task_wall_s_{model}", "typed_output_valid_{model}" (% of
    typed-output runs that returned a schema-valid output)}."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError as exc:
        raise NotRun(f"llama-cpp-python is not installed (pip install 'corral[local]'): {exc}") from None
    missing = {model: reason for model in MODELS if (reason := _model_file_missing(model))}
    if len(missing) == len(MODELS):
        raise NotRun("; ".join(missing.values()))
    reps = ctx.reps(1, 3)
    for model in MODELS:
        if model in missing:
            ctx.skip(f"success_rate_{model}", missing[model])
            continue
        _run_model(ctx, model, reps)
    ctx.note(f"{len(TASKS)} tasks x {reps} rep(s) per model; tool_choice = required, max_tool_calls = the task's calls")
    return ctx.metrics
