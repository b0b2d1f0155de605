"""The dashboard's pages as HTML strings: pure functions of what the supervisor's
control methods return (``status``, ``runs``, ``show``, ``pending``). Every value
is escaped; nothing here reads anything or writes anything.
"""

from __future__ import annotations

import time
from html import escape
from typing import Any
from urllib.parse import quote

from corral.approval_text import printable, show_command
from corral.ui.assets import CSS, SCRIPT

NAV = (("/", "Actors"), ("/runs", "Runs"), ("/pending", "Pending"), ("/timeline", "Timeline"))


def layout(title: str, body: str, *, csrf: str, cursor: int, path: str) -> str:
    links = "".join(
        f'<a href="{href}"{" class=here" if href == path else ""}>{name}</a>' for href, name in NAV
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{escape(title)} · corral</title>"
        f'<meta name="csrf" content="{escape(csrf)}"><meta name="cursor" content="{cursor}">'
        f"<style>{CSS}</style></head><body>"
        f'<header><b>corral</b><nav>{links}</nav><span id="live" class="live">connecting…</span></header>'
        f'<main id="main">{body}</main>'
        '<aside><h3>Live events</h3><ol id="events"></ol></aside>'
        f"<script>{SCRIPT}</script></body></html>"
    )


def _table(headers: tuple[str, ...], rows: list[list[str]], css: str = "") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _mib(value: int | None) -> str:
    return "—" if value is None else f"{value / 2**20:.1f} MiB"


def _state(value: str) -> str:
    return f'<span class="state {escape(value)}">{escape(value)}</span>'


def _run_link(run_id: str) -> str:
    return f'<a href="/runs/{quote(run_id)}">{escape(run_id)}</a>'


def tree(status: dict[str, Any], uss: dict[int, int]) -> str:
    """Groups (strategy, status) and their actors: pid, state, restarts, USS."""
    actors = {actor["id"]: actor for actor in status.get("actors", [])}
    sections = []
    for group in status.get("groups", []):
        rows = []
        for actor_id in group["actors"]:
            actor = actors.get(actor_id)
            if actor is None:
                continue
            pid = actor.get("pid")
            rows.append(
                [
                    f'<span class="actor" data-actor="{escape(actor_id)}">{escape(actor_id)}</span>',
                    escape(str(actor.get("template", ""))),
                    escape(str(pid or "—")),
                    _state(str(actor.get("status", ""))),
                    str(int(actor.get("restarts", 0))),
                    _mib(uss.get(pid) if pid else None),
                ]
            )
        sections.append(
            f'<section class="group"><h3>{escape(group["id"])} <small>{escape(group["strategy"])} · '
            f'{_state(str(group.get("status", "")))}</small></h3>'
            + _table(("actor", "template", "pid", "state", "restarts", "USS"), rows)
            + "</section>"
        )
    ledger = status.get("ledger", {})
    head = (
        f'<p class="meta">supervisor pid {escape(str(status.get("pid")))} · boot {escape(str(status.get("boot_id")))}'
        f" · up {float(status.get('uptime_s', 0)):.0f} s · {len(actors)} actors ·"
        f" ledger {int(ledger.get('commits', 0))} commits, {int(ledger.get('syncs', 0))} fsyncs</p>"
    )
    return f"<h2>Actor tree</h2>{head}{''.join(sections) or '<p>No actors.</p>'}"


def runs(items: list[dict[str, Any]]) -> str:
    rows = [
        [
            _run_link(run["run_id"]),
            escape(run["agent_id"]),
            escape(run.get("kind", "")),
            _state(run["status"]),
            escape(run.get("task") or ""),
            time.strftime("%H:%M:%S", time.localtime(float(run.get("created_at") or 0))),
        ]
        for run in items
    ]
    return "<h2>Runs</h2>" + (_table(("run", "agent", "kind", "status", "task", "created"), rows) if rows
                              else "<p>No runs yet.</p>")


def run(shown: dict[str, Any]) -> str:
    """One run: status, the agent's instructions, final reply and typed output, its
    action timeline with lifecycle states, receipts, provider turns, children,
    claims and deliveries."""
    info = shown["run"]
    actions = [
        [
            escape(a["action_id"]),
            str(a["loop_index"]),
            escape(a["tool"]),
            _state(a["phase"]),
            escape(a.get("policy") or ""),
            str(a.get("attempts", 0)),
            escape(a.get("reason") or a.get("error") or ""),
        ]
        for a in shown.get("actions", [])
    ]
    receipts = [
        [escape(r["action_id"]), escape(r["tool"]), _state(r["status"]), escape(r.get("input_summary") or ""),
         escape(r.get("result_summary") or "")]
        for r in shown.get("receipts", [])
    ]
    turns = [
        [escape(p["slot"]), str(p.get("attempt", "")), _state(p["status"]), escape(p.get("error") or "")]
        for p in shown.get("provider_requests", [])
    ]
    swarm = shown.get("swarm") or {}
    kids = [
        [_run_link(c["run_id"]) if c.get("run_id") else "—", escape(f"child {c.get('template')}"),
         escape(group["group_id"]), _state(c["status"])]
        for group in swarm.get("groups", [])
        for c in group.get("children", [])
    ] + [
        [_run_link(d["run_id"]) if d.get("run_id") else "—", escape(f"delegated to {d.get('target_agent')}"),
         escape(d["delegation_id"]), _state(d["status"])]
        for d in swarm.get("delegations", [])
    ]
    deliveries = [
        [escape(d["delivery_id"]), escape(d["kind"]), escape(d.get("source_id") or ""), _state(d["status"]),
         escape(d.get("claimed_by_action_id") or "")]
        for d in swarm.get("deliveries", [])
    ]
    claims = [
        [escape(c["claim_id"]), escape(c.get("action_id") or ""), escape(str(c.get("delivery_ids") or "")),
         _state(c["phase"])]
        for c in swarm.get("claims", [])
    ]
    final = shown.get("final_reply")
    parts = [
        f'<h2>Run {escape(info["run_id"])} {_state(info["status"])}</h2>',
        f'<p class="meta">agent {escape(info["agent_id"])} · {escape(info.get("kind", ""))} · loop'
        f' {escape(str(info.get("loop_index", 0)))}{" · " + escape(info["reason"]) if info.get("reason") else ""}</p>',
        f'<p class="task"><b>Task</b> {escape(info.get("task") or "")}</p>',
        instructions(shown.get("instructions"), info["run_id"]),
        f'<div class="final" id="final-reply"><b>Final reply</b> {escape(final) if final else "<i>not yet</i>"}</div>',
        typed_output(shown),
        f'<h3>Actions <a class="meta" href="/runs/{quote(info["run_id"])}/conversation">· conversation'
        " (what the model saw and said)</a></h3>",
        action_timeline(shown.get("actions", [])),
        _table(("action", "loop", "tool", "phase", "policy", "attempts", "reason"), actions) if actions
        else "<p>No actions.</p>",
        *(
            f'<details class="traceback" open><summary>{escape(a["action_id"])} ({escape(a["tool"])}) raised'
            f'</summary><pre>{escape(a["traceback"])}</pre></details>'
            for a in shown.get("actions", [])
            if a.get("traceback")
        ),
        "<h3>Receipts</h3>",
        _table(("action", "tool", "status", "input", "result"), receipts) if receipts else "<p>None.</p>",
        "<h3>Provider turns</h3>",
        _table(("slot", "attempt", "status", "error"), turns) if turns else "<p>None.</p>",
        "<h3>Children and delegations</h3>",
        _table(("run", "what", "group / delegation", "status"), kids) if kids else "<p>None.</p>",
        "<h3>Deliveries</h3>",
        _table(("delivery", "kind", "source", "status", "claimed by"), deliveries) if deliveries else "<p>None.</p>",
        "<h3>Claims</h3>",
        _table(("claim", "action", "deliveries", "phase"), claims) if claims else "<p>None.</p>",
    ]
    for name in ("intent", "interactive", "usage"):
        section = shown.get(name)
        if section:
            parts.append(f"<h3>{escape(name.capitalize())}</h3><pre>{escape(_plain(section))}</pre>")
    return "".join(parts)


#: A text past this many characters is cut on the page, saying so (``corral show --json`` has all).
TEXT_CHARS = 8000


def _cut(text: str) -> str:
    if len(text) <= TEXT_CHARS:
        return escape(text)
    return escape(text[:TEXT_CHARS]) + f"\n[… {len(text) - TEXT_CHARS} more characters: corral show --json has all]"


def instructions(given: dict[str, Any] | None, run_id: str) -> str:
    """The agent's own instructions (``show``'s ``instructions``: the inline text and
    the file), which lead every turn's system prompt. The file is read again at each
    turn, so its text as each turn read it is in that turn's prompt, on the
    conversation page (linked; its first turn shows the prompt whole). Empty: none."""
    if not given or not (given.get("text") or given.get("file")):
        return ""
    parts = ['<div class="final instructions" id="instructions"><b>Instructions</b>'
             ' <span class="meta">(they lead every turn\'s prompt)</span>']
    if given.get("text"):
        parts.append(f"<pre>{_cut(str(given['text']))}</pre>")
    if given.get("file"):
        parts.append(f'<p class="meta">{"then " if given.get("text") else ""}the file'
                     f' <code>{escape(str(given["file"]))}</code>, read again at each turn ·'
                     f' <a href="/runs/{quote(run_id)}/conversation#turn-1">the prompts as sent</a></p>')
    return "".join(parts) + "</div>"


def typed_output(shown: dict[str, Any]) -> str:
    """The run's typed output (``show``'s ``output``, validated against the agent's
    ``output``) as JSON, with its pydantic model's name. Empty: the run has no typed
    output (or its schema is a table and it has not ended yet)."""
    import json

    value, model = shown.get("output"), shown.get("output_model")
    if value is None and not model:
        return ""
    head = '<b>Output</b>' + (f' <span class="meta">{escape(str(model))}</span>' if model else "")
    body = (f"<pre>{_cut(json.dumps(value, indent=2, ensure_ascii=False, default=str))}</pre>"
            if value is not None else " <i>not yet</i>")
    return f'<div class="final output" id="output">{head}{body}</div>'


PHASE_COLORS = {"ok": "#22c55e", "failed": "#ef4444", "denied": "#94a3b8", "needs-reconciliation": "#f59e0b"}


def action_timeline(actions: list[dict[str, Any]], width: int = 760) -> str:
    """Each action as a bar: prepared (grey) until it began executing, then running
    (blue) until it ended, coloured by how it ended. Empty when nothing is timed."""
    timed = [a for a in actions if a.get("created_at")]
    if not timed:
        return ""
    start = min(float(a["created_at"]) for a in timed)
    end = max(float(a.get("finished_at") or a.get("executing_at") or a["created_at"]) for a in timed)
    span = max(end - start, 1e-3)
    label_w, row_h = 230, 18

    def x(at: float) -> float:
        return label_w + (at - start) / span * (width - label_w - 10)

    parts = [f'<svg class="actions" xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{12 + row_h * len(timed)}" font-family="sans-serif" font-size="11">']
    for row, action in enumerate(timed):
        y = 4 + row * row_h
        created = float(action["created_at"])
        began = float(action["executing_at"]) if action.get("executing_at") else None
        ended = float(action["finished_at"]) if action.get("finished_at") else None
        label = f"{action['tool']} ({action['phase']})"
        parts.append(f'<text x="2" y="{y + 10}">{escape(label[:36])}</text>')
        waited_to = began if began is not None else (ended if ended is not None else end)
        parts.append(f'<rect x="{x(created):.1f}" y="{y}" width="{max(x(waited_to) - x(created), 1.5):.1f}" '
                     f'height="12" fill="#cbd5e1"><title>prepared</title></rect>')
        if began is not None:
            color = PHASE_COLORS.get(str(action["phase"]), "#3b82f6")
            finish = ended if ended is not None else end
            parts.append(f'<rect class="action {escape(str(action["phase"]))}" x="{x(began):.1f}" y="{y}" '
                         f'width="{max(x(finish) - x(began), 1.5):.1f}" height="12" fill="{color}">'
                         f'<title>{escape(label)}: {finish - began:.3f} s executing</title></rect>')
    parts.append("</svg>")
    return "".join(parts)


def _plain(value: Any) -> str:
    import json

    return json.dumps(value, indent=1, sort_keys=True, default=str)[:4000]


def pending(waiting: dict[str, Any]) -> str:
    """What waits for a person, each with its buttons (POSTs with the CSRF token)."""
    rows = []
    for action in waiting.get("actions", []):
        action_id = escape(action["action_id"])
        fingerprint = escape(action.get("fingerprint") or "")
        if action["phase"] == "waiting-confirmation":
            buttons = (
                f'<button data-post="/api/approve" data-action="{action_id}" data-fingerprint="{fingerprint}">'
                "Approve</button>"
                f'<button data-post="/api/deny" data-action="{action_id}" data-fingerprint="{fingerprint}">'
                "Deny</button>"
            )
        else:
            buttons = (
                f'<button data-post="/api/reconcile" data-action="{action_id}" data-outcome="ok">It happened</button>'
                f'<button data-post="/api/reconcile" data-action="{action_id}" data-outcome="failed">'
                "It did not</button>"
            )
        rows.append([action_id, _run_link(action["run_id"]), escape(action["tool"]), _state(action["phase"]),
                     escape(action.get("reason") or "") + approval(action), buttons])
    parts = ["<h2>Pending</h2>"]
    parts.append(_table(("action", "run", "tool", "phase", "why, and what it approves", ""), rows, "pending") if rows
                 else "<p>No action waits for a person.</p>")
    questions = waiting.get("questions") or []
    if questions:
        qrows = [[_run_link(q["run_id"]), question_form(q)] for q in questions]
        parts.append("<h3>Questions</h3>" + _table(("run", "questions, each with its options"), qrows))
    for name in ("provider_requests", "sessions"):
        items = waiting.get(name) or []
        if items:
            parts.append(f"<h3>{escape(name.replace('_', ' ').capitalize())}</h3><pre>{escape(_plain(items))}</pre>")
    return "".join(parts)


def question_form(request: dict[str, Any]) -> str:
    """A structured request (``user.input_request``): each question with its header,
    its options and their descriptions, a choice per question (and a free-text field
    where the agent allows one), and one button that answers them all."""
    request_id = escape(str(request.get("request_id") or ""))
    parts = [f'<p class="meta">request <code>{request_id}</code></p>'] if request_id else []
    for question in request.get("questions") or []:
        qid = escape(str(question["id"]))
        field = f'data-answer-of="{request_id}" data-qid="{qid}"'
        parts.append(f"<p><b>[{escape(printable(str(question['header'])))}]</b>"
                     f" {escape(printable(str(question['question'])))}</p><ul>")
        parts.extend(f"<li><b>{escape(printable(str(o['label'])))}</b>: {escape(printable(str(o['description'])))}</li>"
                     for o in question.get("options") or [])
        choices = "".join(f'<option value="{escape(str(o["label"]))}">{escape(printable(str(o["label"])))}</option>'
                          for o in question.get("options") or [])
        parts.append(f"</ul><select {field}>{choices}</select>")
        if request.get("free_text"):
            parts.append(f'<input {field} placeholder="or your own answer">')
    run_id = escape(str(request["run_id"]))
    if request_id:
        parts.append(f'<button data-post="/api/answer" data-run="{run_id}" data-request="{request_id}">Answer</button>')
    return "".join(parts)


_DIFF_COLORS = {"+": "#16a34a", "-": "#dc2626", "@": "#6366f1"}
_VALUE_STYLE = "max-height:16em;overflow:auto;margin:.2em 0"


def approval(action: dict[str, Any]) -> str:
    """What approving the action would approve (its approval view in ``pending``:
    supervisor/runs/approval_view.py): effect, policy, fingerprint, each argument's
    first page, and a file tool's diff. What the page leaves out is counted, with
    the command that shows it."""
    view = action.get("approval")
    if not view:
        return f"<p><code>{escape(show_command(action['action_id'], 1))}</code> shows it</p>"
    command = escape(show_command(view["action_id"]))
    fingerprint = escape(view["fingerprint"])
    parts = [f'<p class="meta">effect {escape(view["effect"])} · policy {escape(view["policy"])} · agent'
             f' {escape(view["agent_id"])} · fingerprint <code title="{fingerprint}">{fingerprint[:16]}…</code></p>',
             "<dl>"]
    for argument in view["arguments"]:
        parts.append(f"<dt>{escape(printable(argument['name']))}</dt><dd>{_paged(argument, command)}</dd>")
    parts.append("</dl>")
    for change in view["files"]:
        head = f"<p><b>diff {escape(printable(change['path']))}</b>"
        if change["error"]:
            parts.append(f"{head}: {escape(printable(change['error']))}</p>")
        elif not change["chars"]:
            parts.append(f"{head}: no change</p>")
        else:
            parts.append(head + "</p>" + _paged(change, command, diff=True))
    return "".join(parts)


def _paged(value: dict[str, Any], command: str, *, diff: bool = False) -> str:
    text = printable(str(value["text"]))
    if diff:
        body = "".join(
            f'<span style="color:{_DIFF_COLORS[line[0]]}">{escape(line)}</span>' if line[:1] in _DIFF_COLORS
            else escape(line)
            for line in text.splitlines(keepends=True)
        )
    else:
        body = escape(text)
    more = int(value["chars"]) - len(str(value["text"]))
    note = f'<p class="meta">… {more} more chars, see <code>{command}</code></p>' if more > 0 else ""
    return f'<pre style="{_VALUE_STYLE}">{body}</pre>{note}'


def timeline(picture: str, counts: dict[str, int]) -> str:
    return (
        "<h2>Timeline</h2>"
        f'<p class="meta">{counts["boots"]} supervisor boots · {counts["lanes"] - 1} actors ·'
        f' {counts["kills"]} kills · {counts["restarts"]} restarts</p>'
        '<p class="legend"><span class="key running"></span>running <span class="key exited"></span>exited'
        ' <span class="key stopped"></span>stopped <span class="key killed"></span>killed'
        ' <span class="key supervisor-gone"></span>gone with its supervisor'
        ' <span style="color:#dc2626">✕</span> kill <span style="color:#16a34a">○</span> restart</p>'
        f'<div class="picture">{picture}</div>'
    )


def standalone_report(title: str, pictures: list[tuple[str, str]]) -> str:
    """``corral chaos --report``: the same timeline per episode, one HTML file,
    no script and no external reference."""
    body = "".join(f"<section><h2>{escape(name)}</h2>{picture}</section>" for name, picture in pictures)
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{escape(title)}</title>"
        f'<style>{CSS}</style></head><body class="report"><main><h1>{escape(title)}</h1>'
        '<p class="legend"><span class="key running"></span>running <span class="key exited"></span>exited'
        ' <span class="key stopped"></span>stopped <span class="key killed"></span>killed'
        ' <span class="key supervisor-gone"></span>gone with its supervisor'
        ' <span style="color:#dc2626">✕</span> kill <span style="color:#16a34a">○</span> restart</p>'
        f"{body}</main></body></html>"
    )
