"""The timeline picture: each actor's lifetime as a horizontal bar, with marks
for kills and restarts, computed from the ledger's event stream alone.

Pure functions: ``lanes(events)`` builds the model, ``svg(timeline)`` draws it.
The dashboard (``corral ui``) and ``corral chaos --report`` share both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape
from typing import Any

#: A process that ended with this exit code was SIGKILLed.
SIGKILL_EXIT = -9
SUPERVISOR = "supervisor"


@dataclass
class Segment:
    """One incarnation of a process: from start to end (``None``: still running)."""

    start: float
    end: float | None = None
    pid: int | None = None
    #: How it ended: "killed", "exited", "stopped", "supervisor-gone", or "" (alive).
    ending: str = ""


@dataclass
class Mark:
    at: float
    kind: str  # "kill", "restart", "boot"
    note: str = ""


@dataclass
class Lane:
    name: str
    segments: list[Segment] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)

    @property
    def kills(self) -> int:
        return sum(mark.kind == "kill" for mark in self.marks)

    @property
    def restarts(self) -> int:
        return sum(mark.kind == "restart" for mark in self.marks)


@dataclass
class Timeline:
    start: float
    end: float
    lanes: list[Lane]


_ENDINGS = {"actor-exited": "exited", "actor-stopped": "stopped", "actor-killed": "killed"}


def lanes(events: list[dict[str, Any]], now: float | None = None) -> Timeline:
    """The lifetimes in ``events`` (oldest first, as ``events`` pages them)."""
    by_name: dict[str, Lane] = {SUPERVISOR: Lane(SUPERVISOR)}
    supervisor = by_name[SUPERVISOR]
    boot: str | None = None
    ended = False  # the boot wrote boot-ended: a clean stop
    last_at = 0.0
    for event in events:
        at = float(event["at"])
        if event["boot_id"] != boot:
            if boot is not None and not ended:
                _supervisor_gone(by_name, last_at, clean=False)
            boot, ended = event["boot_id"], False
            supervisor.segments.append(Segment(at))
            if len(supervisor.segments) > 1:
                supervisor.marks.append(Mark(at, "boot", f"boot {boot}"))
        last_at = at
        kind = str(event["kind"])
        if kind == "boot-ended":
            _supervisor_gone(by_name, at, clean=True)
            ended = True
            continue
        if not kind.startswith("actor-"):
            continue
        lane = by_name.setdefault(str(event["subject"]), Lane(str(event["subject"])))
        data = event.get("data") or {}
        if kind == "actor-started":
            _close(lane, at, "exited")  # a start while one was open: the old one is gone
            lane.segments.append(Segment(at, pid=data.get("pid")))
        elif kind in _ENDINGS:
            killed = data.get("exit_code") == SIGKILL_EXIT or kind == "actor-killed"
            _close(lane, at, "killed" if killed else _ENDINGS[kind])
            if killed:
                lane.marks.append(Mark(at, "kill", str(data.get("reason") or "SIGKILL")))
        elif kind == "actor-restarted":
            lane.marks.append(Mark(at, "restart", f"after {data.get('trigger', '?')}"))
    start = float(events[0]["at"]) if events else 0.0
    end = max(now if now is not None else last_at, last_at, start)
    ordered = [supervisor, *sorted((lane for name, lane in by_name.items() if name != SUPERVISOR),
                                   key=lambda lane: lane.name)]
    return Timeline(start, end, ordered)


def _close(lane: Lane, at: float, ending: str) -> None:
    if lane.segments and lane.segments[-1].end is None:
        lane.segments[-1].end = at
        lane.segments[-1].ending = ending


def _supervisor_gone(by_name: dict[str, Lane], at: float, *, clean: bool) -> None:
    """The boot is over: its supervisor and every actor it ran are gone (actors die
    with their supervisor). A boot that wrote no ``boot-ended`` was killed."""
    for name, lane in by_name.items():
        if name != SUPERVISOR:
            _close(lane, at, "stopped" if clean else "supervisor-gone")
    supervisor = by_name[SUPERVISOR]
    _close(supervisor, at, "stopped" if clean else "killed")
    if not clean:
        supervisor.marks.append(Mark(at, "kill", "the supervisor died"))


# -- drawing ---------------------------------------------------------------------

LABEL_W = 170
ROW_H = 22
BAR_H = 12
COLORS = {"": "#3b82f6", "exited": "#64748b", "stopped": "#94a3b8", "killed": "#f97316",
          "supervisor-gone": "#a855f7"}


def svg(timeline: Timeline, width: int = 960, title: str = "") -> str:
    """An SVG of the timeline: one row per lane, bars for lifetimes, a red ✕ per kill
    and a green ↻ per restart. Standalone (no script, no external reference)."""
    span = max(timeline.end - timeline.start, 1e-3)
    plot_w = width - LABEL_W - 20
    height = 40 + ROW_H * len(timeline.lanes)

    def x(at: float) -> float:
        return LABEL_W + (at - timeline.start) / span * plot_w

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{width}" height="{height}"'
        f' viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11" role="img"'
        f' aria-label="{escape(title or "actor timeline")}">',
        f'<text x="4" y="14" font-weight="bold">{escape(title)}</text>',
        f'<text x="{width - 20}" y="14" text-anchor="end">{span:.2f} s</text>',
    ]
    for row, lane in enumerate(timeline.lanes):
        y = 30 + row * ROW_H
        parts.append(f'<text x="4" y="{y + BAR_H - 2}" class="lane">{escape(lane.name[:28])}</text>')
        for segment in lane.segments:
            left = x(segment.start)
            right = x(segment.end if segment.end is not None else timeline.end)
            tip = f"{lane.name} pid {segment.pid or '?'}: {segment.ending or 'running'}"
            parts.append(
                f'<rect class="life {segment.ending or "running"}" x="{left:.1f}" y="{y}"'
                f' width="{max(right - left, 1.5):.1f}" height="{BAR_H}" rx="2"'
                f' fill="{COLORS.get(segment.ending, "#3b82f6")}"><title>{escape(tip)}</title></rect>'
            )
        for mark in lane.marks:
            at = x(mark.at)
            if mark.kind == "kill":
                parts.append(
                    f'<g class="mark kill"><title>kill: {escape(mark.note)}</title>'
                    f'<path d="M{at - 4:.1f},{y - 2} l8,{BAR_H + 4} M{at + 4:.1f},{y - 2} l-8,{BAR_H + 4}"'
                    ' stroke="#dc2626" stroke-width="2"/></g>'
                )
            else:
                color = "#16a34a" if mark.kind == "restart" else "#7c3aed"
                parts.append(
                    f'<g class="mark {mark.kind}"><title>{mark.kind}: {escape(mark.note)}</title>'
                    f'<circle cx="{at:.1f}" cy="{y + BAR_H / 2}" r="4" fill="none" stroke="{color}"'
                    ' stroke-width="2"/></g>'
                )
    parts.append("</svg>")
    return "".join(parts)


def summary(timeline: Timeline) -> dict[str, int]:
    return {
        "lanes": len(timeline.lanes),
        "kills": sum(lane.kills for lane in timeline.lanes),
        "restarts": sum(lane.restarts for lane in timeline.lanes),
        "boots": len(timeline.lanes[0].segments) if timeline.lanes else 0,
    }
