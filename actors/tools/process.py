"""process.start/poll/stdin/terminate, command.exec and command.output_read.

Process sessions live in session actors owned by the supervisor; these tools are
thin requests to it (``session.*``), which checks that the calling run owns the
process. ``command.exec`` runs a one-shot command right here in the agent's
process, under the sandbox profile of the swarm spec, with its launch recorded
(``command.launched``) before the program may start.

None of the side-effecting tools is re-runnable: a start, a write to stdin, a
terminate or a command that may have happened is never repeated by recovery.
Receipts and outputs carry byte counts and digests of stdin, never its content.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Annotated, Any, NotRequired

import msgspec
import trio
from pydantic import Field
from typing_extensions import TypedDict

from corral.actors.one_shot_command import CommandResult, StreamCapture, read_transcript_lines, run_command
from corral.actors.providers.observation_budget import OUTPUT_PAGE_CHARS
from corral.actors.session import private_dirs, sandbox_profile
from corral.actors.session_state import BadSessionInput, InvalidCursor, SessionError, decode_cursor
from corral.actors.tools.base import ASKS_A_PERSON, Tool, ToolContext, ToolError, ToolResult, is_sealed, schema
from corral.actors.tools.fs import SOURCES_CHANGED
from corral.actors.tools.paths import resolve_in_workspace
from corral.actors.tools.source_fingerprint import fingerprint
from corral.core import failpoints
from corral.mailbox.errors import RemoteError
from corral.mailbox.protocol import (
    DEFAULT_POLL_CHARS,
    MAX_POLL_CHARS,
    MAX_POLL_WAIT_MS,
    CommandLaunched,
    CommandSandbox,
    HistoryCommand,
    SandboxGrant,
    SealedValue,
    SessionPoll,
    SessionStart,
    SessionStdin,
    SessionTerminate,
)
from corral.sandbox.bwrap import LaunchMode, SandboxError
from corral.sandbox.exec_handshake import OnReady, ReadyInfo
from corral.sandbox.facts import sandbox_facts
from corral.sandbox.launched_process import LaunchError

#: Request timeouts to the supervisor, above what it may take to answer.
START_TIMEOUT_S = 45.0
STDIN_TIMEOUT_S = 30.0
TERMINATE_TIMEOUT_S = 40.0
POLL_SLACK_S = 15.0
DEFAULT_COMMAND_TIMEOUT_S = 120.0
MAX_COMMAND_TIMEOUT_S = 3600.0
HEAD_LINES = 20
TAIL_LINES = 20
#: Head and tail lines are cut to this, so a capture stays well inside a result.
MAX_LINE_CHARS = 500
#: The seed's page (V1.8): 160 lines unless asked, at most 240.
DEFAULT_PAGE_LINES = 160
MAX_PAGE_LINES = 240
#: A page of the transcript stops early rather than exceed this many characters (its
#: numbered lines; the model is sent a page whole: providers/observation_budget.py).
MAX_PAGE_CHARS = OUTPUT_PAGE_CHARS
#: A line of a page is a bounded string (seed 004 V1.8: "lines 是带稳定行号的有界字符串").
MAX_PAGE_LINE_CHARS = 2000
_ACTION_ID = re.compile(r"^act-[0-9a-f]{24}$")
#: The seed's command bounds (V1.11).
MAX_PROGRAM_CHARS = 64
MAX_ARGS = 64
MAX_ARG_CHARS = 512
MAX_ARGS_BYTES = 8 * 1024
_PROGRAM = re.compile(r"[A-Za-z0-9._+-]{1,64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: A command ran to its end and its result is not recorded: what it did is unknown.
AFTER_EXIT_FAILPOINT = "command.after-exit"

class ProgramArgs(TypedDict):
    program: Annotated[str, Field(description="executable (looked up on PATH inside the sandbox)")]
    args: NotRequired[list[str]]
    cwd: NotRequired[Annotated[str, Field(description="directory relative to the workspace (default: its root)")]]
    timeout_s: NotRequired[float]


class PollArgs(TypedDict):
    process_id: str
    cursor: NotRequired[str]
    max_chars: NotRequired[Annotated[int, Field(ge=1, le=MAX_POLL_CHARS, description=f"default {DEFAULT_POLL_CHARS}")]]
    wait_ms: NotRequired[Annotated[int, Field(ge=0, le=MAX_POLL_WAIT_MS)]]


class StdinArgs(TypedDict):
    process_id: str
    data: NotRequired[str]
    append_newline: NotRequired[bool]
    eof: NotRequired[bool]


class TerminateArgs(TypedDict):
    process_id: str
    cursor: NotRequired[str]


class OutputReadArgs(TypedDict):
    action_id: str
    start_line: NotRequired[int]
    max_lines: NotRequired[int]


def _argv(tool_input: dict[str, Any]) -> list[str]:
    """The seed's bounds (V1.11): a bare program name looked up on the sandbox's PATH
    (a path could name a file the project planted), and args small enough to show."""
    program = tool_input["program"]
    args = tool_input.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ToolError("args must be a list of strings", "bad-input")
    if not isinstance(program, str) or not _PROGRAM.fullmatch(program):
        raise ToolError(
            f"program {str(program)[:80]!r} must be a bare name of 1-{MAX_PROGRAM_CHARS} ASCII letters, digits,"
            " '.', '_', '+' or '-' (no path)", "bad-input")
    if len(args) > MAX_ARGS:
        raise ToolError(f"at most {MAX_ARGS} args ({len(args)} given)", "bad-input")
    for index, arg in enumerate(args):
        if len(arg) > MAX_ARG_CHARS:
            raise ToolError(f"args[{index}] has {len(arg)} characters; at most {MAX_ARG_CHARS}", "bad-input")
        if _CONTROL.search(arg):
            raise ToolError(f"args[{index}] holds a NUL or control character", "bad-input")
    total = sum(len(arg.encode()) for arg in args)
    if total > MAX_ARGS_BYTES:
        raise ToolError(f"args hold {total} bytes; at most 8 KiB ({MAX_ARGS_BYTES}) in all", "bad-input")
    return [program, *args]


def _stdin_data(data: Any) -> str | SealedValue:
    """``data`` as the tool got it: text, or the sealed value the plan holds in its
    place (the supervisor unseals it: supervisor/runs/sealed_input.py)."""
    if is_sealed(data):
        return SealedValue(sealed=data["sealed"], bytes=data["bytes"])
    if not isinstance(data, str):
        raise ToolError("data must be a string", "bad-input")
    return data


def _cwd(ctx: ToolContext, tool_input: dict[str, Any]) -> tuple[str, Path]:
    raw = tool_input.get("cwd") or "."
    if raw in (".", "./"):
        target = ctx.workspace.resolve()
    else:
        target = resolve_in_workspace(ctx.workspace, raw, forbidden=(ctx.home,))
    if not target.is_dir():
        raise ToolError(f"cwd {raw!r} is not a directory in the workspace", "bad-input")
    return raw, target


class ProcessStart:
    default_policy = ASKS_A_PERSON
    schema = schema(
        "process.start",
        "Start a long-running program on a terminal (120x30) in the sandbox; returns a process_id and a cursor."
        " Before your final reply, poll it until it has ended or stop it with process.terminate (the final reply"
        " waits while it runs).",
        ProgramArgs,
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        argv = _argv(tool_input)
        cwd, _target = _cwd(ctx, tool_input)
        start = SessionStart(
            run_id=ctx.run_id,
            action_id=ctx.action_id,
            program=argv[0],
            args=argv[1:],
            cwd=cwd,
            timeout_s=tool_input.get("timeout_s"),
        )
        view = await ctx.ask(start, timeout=START_TIMEOUT_S)
        status = view.status
        mode = view.launch_mode or "not launched"
        output: dict[str, Any] = msgspec.to_builtins(view)
        if view.launch_mode:
            output.update(sandbox_facts(LaunchMode(view.launch_mode)))
        if status in ("failed", "needs-reconciliation", "launching", "prepared"):
            error = view.error or f"the process is {status}"
            return ToolResult(False, output, f"{view.process_id} {status} [{view.code or mode}]: {error}")
        return ToolResult(True, output, f"started {view.process_id} ({status}, launch={mode})")


class ProcessPoll:
    schema = schema(
        "process.poll",
        "Read a process's output from a cursor (the same cursor always gives the same text); "
        "wait_ms waits for new output. Pass next_cursor back as it is to read on. Before your final reply, poll"
        " until its status is final or stop it with process.terminate.",
        PollArgs,
        read_only=True,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        wait_ms = tool_input.get("wait_ms", 0)
        poll = SessionPoll(
            run_id=ctx.run_id,
            process_id=tool_input["process_id"],
            cursor=tool_input.get("cursor"),
            max_chars=tool_input.get("max_chars", DEFAULT_POLL_CHARS),
            wait_ms=wait_ms,
        )
        reply = await ctx.ask(poll, timeout=max(wait_ms, 0) / 1000 + POLL_SLACK_S)
        more = ", more available" if reply.more else ""
        summary = f"{len(reply.chunk)} chars from {reply.process_id} ({reply.status}{more})"
        return ToolResult(True, msgspec.to_builtins(reply), summary)


class ProcessStdin:
    default_policy = ASKS_A_PERSON
    schema = schema(
        "process.stdin",
        "Type into a running process's terminal; eof sends end-of-file. Only byte counts and sha256 are kept.",
        StdinArgs,
        read_only=False,
        sealed=("data",),
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        stdin = SessionStdin(
            run_id=ctx.run_id,
            action_id=ctx.action_id,
            process_id=tool_input["process_id"],
            data=_stdin_data(tool_input.get("data", "")),
            append_newline=tool_input.get("append_newline", False),
            eof=tool_input.get("eof", False),
        )
        reply = await ctx.ask(stdin, timeout=STDIN_TIMEOUT_S)
        eof = ", eof" if reply.eof else ""
        summary = f"wrote {reply.bytes_written} bytes to {reply.process_id} (sha256 {reply.sha256[:12]}{eof})"
        output = msgspec.to_builtins(reply)
        if not reply.complete:
            return ToolResult(False, output, summary + ": incomplete, the process stopped reading")
        return ToolResult(True, output, summary)


class ProcessTerminate:
    default_policy = ASKS_A_PERSON
    schema = schema(
        "process.terminate",
        "Stop a process: SIGTERM to its group, 800 ms grace, then SIGKILL; returns its final state and reads"
        " nothing: give your last next_cursor, then read the rest with process.poll from the next_cursor it returns"
        " (the same one).",
        TerminateArgs,
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        process_id = tool_input["process_id"]
        given = tool_input.get("cursor")
        if given is not None:
            try:  # checked before the stop, so a bad cursor stops nothing
                decode_cursor(given, process_id)
            except InvalidCursor as exc:
                raise ToolError(str(exc), "bad-input") from None
        reply = await ctx.ask(SessionTerminate(run_id=ctx.run_id, process_id=process_id), timeout=TERMINATE_TIMEOUT_S)
        # Seed 004 V1.10: "terminate 只返回同一 cursor 的零消费状态元数据，不读取、不跳过 PTY 字符；
        # 终止后继续从该 cursor poll": the state, and the cursor it was given, unread.
        cursor = given if given is not None else reply.cursor
        output = {**msgspec.to_builtins(reply), "cursor": cursor, "next_cursor": cursor}
        status = reply.status
        code = reply.exit_code
        summary = f"{reply.process_id} {status}" + (f" (exit {code})" if code is not None else "")
        # Only a confirmed end counts; a terminate that timed out leaves "terminating".
        confirmed = status in ("exited", "terminated", "timed-out", "output-limit-exceeded", "failed")
        return ToolResult(confirmed, output, summary)


def _capture(stream: StreamCapture) -> dict[str, Any]:
    return {
        "head": list(stream.head),
        "tail": list(stream.tail),
        "total_lines": stream.total_lines,
        "omitted_lines": stream.omitted_lines,
        "total_bytes": stream.total_bytes,
    }


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def command_transcript(ctx: ToolContext, action_id: str) -> Path:
    """Where command.exec keeps a command's full sanitized transcript. Under the run's
    own directory, so a run can only ever page its own commands."""
    return ctx.home / "transcripts" / ctx.run_id / f"{action_id}.log"


async def run_sandboxed(
    argv: list[str],
    cwd: Path,
    timeout_s: float,
    granted: SandboxGrant,
    transcript: Path,
    on_ready: OnReady | None = None,
) -> CommandResult:
    """One command to its end in the sandbox the supervisor granted (``project_root``
    and ``sandbox``, as ``command.sandbox`` answers): the one runner of command.exec
    and project.verify."""
    try:
        profile = sandbox_profile(Path(granted.project_root), granted.sandbox)
        return await run_command(
            argv,
            cwd,
            timeout_s,
            profile,
            HEAD_LINES,
            TAIL_LINES,
            transcript_path=transcript,
            on_ready=on_ready,
            max_line_chars=MAX_LINE_CHARS,
        )
    except (SandboxError, LaunchError, SessionError) as exc:
        # Fails closed: for every one of these the target never ran (or execve failed).
        raise ToolError(str(exc), exc.code) from None


class CommandExec:
    default_policy = ASKS_A_PERSON
    schema = schema(
        "command.exec",
        "Run one command to its end in the sandbox (stdin empty); returns the first and last lines of "
        "stdout/stderr and an action id for command.output_read.",
        ProgramArgs,
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        argv = _argv(tool_input)
        _raw, cwd = _cwd(ctx, tool_input)
        timeout_s = tool_input.get("timeout_s", DEFAULT_COMMAND_TIMEOUT_S)
        if not 0 < timeout_s <= MAX_COMMAND_TIMEOUT_S:
            raise ToolError(f"timeout_s must be within (0, {MAX_COMMAND_TIMEOUT_S:.0f}]", "bad-input")
        granted = await ctx.ask(CommandSandbox(run_id=ctx.run_id, action_id=ctx.action_id))
        transcript = command_transcript(ctx, ctx.action_id)
        private_dirs(transcript.parent)
        if transcript.exists():
            # Only a command that already started leaves one: never run it twice.
            raise ToolError(f"action {ctx.action_id} already ran its command once", "conflict")

        async def launched(info: ReadyInfo) -> None:
            # Committed before COMMIT_EXEC: the launch mode is on the action first.
            await ctx.ask(CommandLaunched(run_id=ctx.run_id, action_id=ctx.action_id, launch_mode=info.launch_mode))

        before = await trio.to_thread.run_sync(fingerprint, ctx.workspace, ctx.home)
        result = await run_sandboxed(argv, cwd, float(timeout_s), granted, transcript, launched)
        failpoints.hit(AFTER_EXIT_FAILPOINT)
        after = await trio.to_thread.run_sync(fingerprint, ctx.workspace, ctx.home)
        output = {
            "action_id": ctx.action_id,
            # What command.output_read pages by (seed V1.9): this action's own id, so
            # the model never has to look it up.
            "sourceActionId": ctx.action_id,
            "status": result.state.value,
            "exit_code": result.exit_code,
            "launch_mode": result.launch_mode.value,
            **sandbox_facts(result.launch_mode),
            "stdout": _capture(result.stdout),
            "stderr": _capture(result.stderr),
            "transcript_lines": result.transcript_lines,
            "totalLines": result.transcript_lines,
            "outputSha256": await trio.to_thread.run_sync(_sha256_of, transcript),
            # The output limit stopped the command: the transcript is not all it would have said.
            "captureTruncated": result.state.value == "output-limit-exceeded",
            # Said either way: its revision was made when its sandbox was ready, and only
            # an explicit false lets the final-reply gate pass it over (revision_store.py).
            SOURCES_CHANGED: False,
        }
        ok = result.state.value == "exited" and result.exit_code == 0
        summary = (
            f"{argv[0]} {result.state.value} (exit {result.exit_code}), {result.transcript_lines} lines"
            f" [launch={result.launch_mode.value}]"
        )
        if not before.same_as(after):
            output[SOURCES_CHANGED] = True
            output["sources_fingerprint_complete"] = before.complete and after.complete
            summary += "; it changed sources"
        if result.guard is not None and not result.guard.clean:
            # What the command did to git's control entries was undone: it did not
            # do what it was asked, and the model must hear why.
            output["control_entries"] = result.guard.as_dict()
            ok = False
            summary += f"; {result.guard.notice()}"
        return ToolResult(ok, output, summary)


def numbered_line(number: int, line: str) -> str:
    """A transcript line as a page shows it: its stable number in the transcript first
    (``"129: text"``), so a reader knows where it is whatever was cut; bounded."""
    if len(line) > MAX_PAGE_LINE_CHARS:
        line = line[:MAX_PAGE_LINE_CHARS] + f" [… {len(line) - MAX_PAGE_LINE_CHARS} more characters of this line cut]"
    return f"{number}: {line}"


class CommandOutputRead:
    schema = schema(
        "command.output_read",
        "Page through the full sanitized transcript of one of your finished command.exec actions (this run or an"
        " earlier one): give the sourceActionId its result carries (do not call agent.action_history to find it);"
        " follow nextLine while hasMore. Each line starts with its line number (\"129: ...\"). When a command's"
        " short result does not show why it failed, page here to the root error before you change anything;"
        " never guess from the tail alone.",
        OutputReadArgs,
        read_only=True,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        action_id = tool_input["action_id"]
        if not _ACTION_ID.match(action_id):
            raise ToolError(f"{action_id[:60]!r} is not an action id", "bad-input")
        start = tool_input.get("start_line", 1)
        limit = tool_input.get("max_lines", DEFAULT_PAGE_LINES)
        if not 1 <= limit <= MAX_PAGE_LINES:
            raise ToolError(f"max_lines must be within 1..{MAX_PAGE_LINES}", "bad-input")
        try:  # the agent's own command, in any of its runs (never another agent's)
            source = await ctx.ask(HistoryCommand(run_id=ctx.run_id, source=action_id))
        except RemoteError as exc:
            if exc.code in ("not-found", "bad-request"):
                raise ToolError(exc.message, "not-found" if exc.code == "not-found" else "bad-input") from None
            raise
        path = ctx.home / "transcripts" / source.run_id / f"{action_id}.log"
        if not path.is_file():
            raise ToolError(f"no command transcript for action {action_id} (it is gone from this home)", "not-found")
        digest = await trio.to_thread.run_sync(_sha256_of, path)
        if source.output_sha256 is not None and digest != source.output_sha256:
            # Fails closed: the file is not what the command left.
            raise ToolError(f"the transcript of {action_id} changed since its command ended", "conflict")
        try:
            page = read_transcript_lines(path, start, limit)
        except BadSessionInput as exc:
            raise ToolError(str(exc), exc.code) from None
        lines: list[str] = []
        used = 0
        for number, line in enumerate(page.lines, start=page.start_line):
            shown = numbered_line(number, line)
            if lines and used + len(shown) > MAX_PAGE_CHARS:
                break
            lines.append(shown)
            used += len(shown)
        following = page.start_line + len(lines)
        next_line = following if following <= page.total_lines else None
        # The seed's fields (V1.8), as the model reads them.
        output = {
            "action_id": action_id,
            "run_id": source.run_id,
            "lines": lines,
            "startLine": page.start_line,
            "nextLine": next_line,
            "totalLines": page.total_lines,
            "hasMore": next_line is not None,
            "captureTruncated": source.capture_truncated,
            "outputSha256": digest,
            "exitCode": source.exit_code,
            "timedOut": source.timed_out,
            "sourceChanged": source.source_changed,
        }
        return ToolResult(True, output, f"lines {start}..{following - 1} of {page.total_lines} of {action_id}")


TOOLS: list[Tool] = [
    ProcessStart(),
    ProcessPoll(),
    ProcessStdin(),
    ProcessTerminate(),
    CommandExec(),
    CommandOutputRead(),
]
