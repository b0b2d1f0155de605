"""The suite's points, as one typed tuple, and the suites that select them.

Each point names its seed slice and judges evidence from the suite's shared
``Context`` (flows run at most once, the first time a point needs them). The
ledger and secret points judge everything the points before them produced, so
they come last."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from corral.acceptance import oracle, oracle_flows, point_names
from corral.acceptance.chat_flow import ChatFacts, chat_flow
from corral.acceptance.coder_flow import CoderFacts, coder_flow
from corral.acceptance.consistency import ledger_checks
from corral.acceptance.host import Host
from corral.acceptance.leak_scan import scan
from corral.acceptance.point_names import POINT_NAMES
from corral.acceptance.provider import Provider
from corral.acceptance.retry_flow import RetryFacts, retry_flow
from corral.acceptance.swarm_flow import SwarmFacts, swarm_flow
from corral.acceptance.verify_flow import VerifyFacts, verify_flow
from corral.acceptance.workspace import Workspace
from corral.supervisor.home.home_dir import LEDGER


@dataclass
class Context:
    """What the points of one suite run share: the workspace, the processes, the
    provider, and each flow's evidence once it ran."""

    workspace: Workspace
    host: Host
    provider: Provider
    #: The homes the flows used (their ledgers and logs are checked and scanned).
    homes: list[Path] = field(default_factory=list)
    _coder: CoderFacts | None = None
    _swarm: SwarmFacts | None = None
    _verify: VerifyFacts | None = None
    _retry: RetryFacts | None = None
    _chat: ChatFacts | None = None

    def _used(self, home: Path) -> None:
        if home.exists():
            self.homes.append(home)

    def coder(self) -> CoderFacts:
        if self._coder is None:
            self._coder = coder_flow(self.workspace, self.host, self.provider)
            self._used(self._coder.home)
        return self._coder

    def swarm(self) -> SwarmFacts:
        if self._swarm is None:
            self._swarm = swarm_flow(self.workspace, self.host, self.provider)
            self._used(self._swarm.home)
        return self._swarm

    def verify(self) -> VerifyFacts:
        if self._verify is None:
            self._verify = verify_flow(self.workspace, self.host, self.provider)
            self._used(self._verify.home)
        return self._verify

    def retry(self) -> RetryFacts:
        if self._retry is None:
            self._retry = retry_flow(self.workspace, self.host, self.provider)
            self._used(self._retry.home)
        return self._retry

    def chat(self) -> ChatFacts:
        if self._chat is None:
            self._chat = chat_flow(self.workspace, self.host, self.provider)
            self._used(self._chat.home)
        return self._chat

    def coder_evidence(self) -> list[Path]:
        facts = self.coder()
        return [facts.home / LEDGER, facts.project / "notes.txt"]

    def swarm_evidence(self) -> list[Path]:
        facts = self.swarm()
        return [facts.home / LEDGER, *sorted(p for p in facts.project.rglob("*.md") if p.is_file())]

    def verify_evidence(self) -> list[Path]:
        facts = self.verify()
        return [facts.home / LEDGER, *facts.screenshots]

    def retry_evidence(self) -> list[Path]:
        return [self.retry().home / LEDGER]

    def chat_evidence(self) -> list[Path]:
        facts = self.chat()
        shown = [facts.transcript] if facts.transcript is not None else []
        return [facts.home / LEDGER, *shown, *sorted(p for p in facts.project.rglob("*.md") if p.is_file())]


Judge = Callable[[Context], oracle.Judgement]
EvidenceOf = Callable[[Context], list[Path]]


@dataclass(frozen=True)
class Point:
    name: str
    title: str
    #: The seed 004 slice it checks.
    seed: str
    judge: Judge
    evidence: EvidenceOf
    #: In the reduced suite (`make test`): the points one real run covers.
    reduced: bool
    #: It judges what the points before it ran (their ledgers): when each of those
    #: was blocked and nothing ran, it is blocked too, not failed.
    after_the_runs: bool = False


def _ledger(ctx: Context) -> oracle.Judgement:
    checks = [check for home in ctx.homes if (home / LEDGER).exists()
              for check in ledger_checks(home, home.parent / "effects.log")]
    return oracle.consistency(checks)


def _ledgers(ctx: Context) -> list[Path]:
    return [home / LEDGER for home in ctx.homes if (home / LEDGER).exists()]


def _secrets(ctx: Context) -> oracle.Judgement:
    roots = [*(p for home in ctx.homes for p in (home / LEDGER, home / "logs")), ctx.workspace.root / "logs"]
    judged = oracle.secrets(scan([p for p in roots if p.exists()], ctx.workspace.decoys.values()))
    return judged


def _coder_point(judge: Callable[[CoderFacts], oracle.Judgement]) -> Judge:
    return lambda ctx: judge(ctx.coder())


POINTS: tuple[Point, ...] = (
    Point("startup-context", "startup context without leaks", "V1.1 §5.1",
          lambda ctx: oracle.startup_context(ctx.coder(), ctx.workspace.decoys.values()),
          Context.coder_evidence, True),
    Point("tool-plan", "a legal tool plan", "V1.1 §5.2", _coder_point(oracle.tool_plan), Context.coder_evidence,
          True),
    Point("read-patch-confirm", "read, an exact changeset (checkpointed), and wait for confirmation", "V1.1 §5.3",
          _coder_point(oracle.read_patch_confirm), Context.coder_evidence, True),
    Point("confirm-after-exit", "the confirmation carries on in the supervisor after the CLI exits", "V1.1 §5.4",
          _coder_point(oracle.confirm_after_cli_exit), Context.coder_evidence, True),
    Point("kill-recovery", "a supervisor SIGKILL mid-run: the same run, no duplicates", "V1.1 §5.7",
          _coder_point(oracle.kill_recovery), Context.coder_evidence, True),
    Point("verify-preview", "a change, then verify and preview validation", "V1.1 §5.5",
          lambda ctx: oracle_flows.verify_preview(ctx.verify()), Context.verify_evidence, False),
    Point("delegates-and-group", "two delegates and three children of two templates (2 + 1) at once, one join",
          "V1.1 §5.6",
          lambda ctx: oracle_flows.swarm(ctx.swarm()), Context.swarm_evidence, False),
    Point("retry-planning", "a specialist's call dropped: one retry, killed in the backoff, held at a forwarding gate"
          " until the ledger was read; two overlapping specialists and one repair", "V1.29",
          lambda ctx: oracle_flows.retry_plan(ctx.retry()), Context.retry_evidence, False),
    Point("retry-final-reply", "exactly the supervisor's base final reply dropped after 2 + 1 claimed deliveries",
          "V1.42",
          lambda ctx: oracle_flows.retry_final(ctx.retry()), Context.retry_evidence, False),
    Point("chat-autonomous", "an autonomous chat turn: delegation on its own, one repair at most, one report",
          "V1.30 in part", lambda ctx: oracle_flows.chat_autonomous(ctx.chat()), Context.chat_evidence, False),
    Point("chat-static-isolated", "static delegates and an isolated group in one chat turn: one approval for the"
          " first batch, overlap, a repair killed at its approval", "V1.31",
          lambda ctx: oracle_flows.chat_static_isolated(ctx.chat()), Context.chat_evidence, False),
    Point("ledger-consistency", "ledger consistency", "V1.1 §5.8", _ledger, _ledgers, True, after_the_runs=True),
    Point("secret-leaks", "secret_leak_count = 0 over ledger, logs and transcripts", "V1.1 §5.9", _secrets,
          _ledgers, True, after_the_runs=True),
)

if tuple(point.name for point in POINTS) != POINT_NAMES:
    raise RuntimeError("corral/acceptance/point_names.py must list the points of points.py, in order")
#: Why `reduced` exists (the report and `--help` say it).
REDUCED_NOTE = (
    "reduced: the seven points one real run covers (startup context, tool plan, read/changeset/confirm, confirmation"
    " after the CLI exits, supervisor SIGKILL recovery, ledger consistency, secret leaks) on one project; the swarm,"
    " verify/preview, transient-retry and chat points each need their own multi-agent runs (tens of provider calls"
    " on a CPU model), too slow for `make test`"
)


def select(suite: str) -> tuple[Point, ...]:
    """The points of ``suite`` (full, reduced) or the one point so named, with the
    ledger and secret points after it; ``KeyError`` for an unknown name."""
    if suite == "full":
        return POINTS
    if suite == "reduced":
        return tuple(point for point in POINTS if point.reduced)
    named = {point.name: point for point in POINTS}
    point = named[suite]
    tail = tuple(p for p in POINTS if p.name in ("ledger-consistency", "secret-leaks") and p is not point)
    return (point, *tail)


def names() -> tuple[str, ...]:
    return point_names.names()
