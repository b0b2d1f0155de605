"""The dashboard's only assets, inline: a stylesheet and a little vanilla JS. Nothing
is loaded from anywhere else, so the dashboard works with no network at all.

The script does three things:

* follows ``/api/stream`` (server-sent events, resumed by ``Last-Event-ID`` after a
  reconnect) and lists the events as they come;
* when an event may change what the page shows, fetches the page again
  (``?fragment=1``, the ``<main>`` part only) and swaps it in, at most every 300 ms;
* turns each ``data-post`` button into a POST with the page's CSRF token.
"""

CSS = """
body{margin:0;font:14px/1.4 system-ui,sans-serif;color:#0f172a;background:#f8fafc;display:grid;
grid-template-columns:1fr 300px;grid-template-rows:auto 1fr}
header{grid-column:1/3;display:flex;gap:16px;align-items:center;padding:8px 16px;background:#0f172a;color:#fff}
header nav a{color:#cbd5e1;margin-right:12px;text-decoration:none}header nav a.here{color:#fff;font-weight:bold}
.live{margin-left:auto;font-size:12px;color:#fbbf24}.live.on{color:#4ade80}
main{padding:8px 16px;overflow:auto}aside{padding:8px;border-left:1px solid #e2e8f0;font-size:12px;overflow:auto;
max-height:calc(100vh - 40px)}aside ol{padding-left:38px;margin:0}
table{border-collapse:collapse;width:100%;margin:4px 0 12px;background:#fff}
th,td{border-bottom:1px solid #e2e8f0;padding:3px 6px;text-align:left;vertical-align:top}th{background:#f1f5f9}
.meta{color:#475569}.state{padding:1px 6px;border-radius:8px;background:#e2e8f0;font-size:12px}
.state.running,.state.ok,.state.completed{background:#dcfce7}.state.failed,.state.denied{background:#fee2e2}
.state.waiting-confirmation,.state.needs-reconciliation,.state.needs-input{background:#fef3c7}
.state.restarting,.state.killed{background:#ffedd5}
.final{background:#fff;border:1px solid #e2e8f0;padding:8px;margin:8px 0}
.final pre{white-space:pre-wrap;word-break:break-word;max-height:24em;overflow:auto;margin:4px 0 0;padding:0}
.final p{margin:4px 0 0}
button{margin-right:6px;cursor:pointer}.legend .key{display:inline-block;width:14px;height:10px;margin:0 4px}
.key.running{background:#3b82f6}.key.exited{background:#64748b}.key.killed{background:#f97316}
.key.supervisor-gone{background:#a855f7}.key.stopped{background:#94a3b8}body.report{display:block}.picture{overflow-x:auto}pre{background:#fff;padding:6px}
"""

SCRIPT = r"""
(function () {
  const csrf = document.querySelector('meta[name=csrf]').content;
  const list = document.getElementById('events');
  const live = document.getElementById('live');
  // The page shows the ledger up to this cursor; the panel starts a little earlier.
  const since = Number(document.querySelector('meta[name=cursor]').content);
  const moving = /^(actor-|run-|action-|receipt-|reply-|boot-|claim-|input-|steer-)/;
  let refreshing = null;
  function refresh() {
    if (refreshing) return;
    refreshing = setTimeout(async () => {
      refreshing = null;
      const url = new URL(location.href);
      url.searchParams.set('fragment', '1');
      const reply = await fetch(url, {credentials: 'same-origin'});
      if (reply.ok) document.getElementById('main').innerHTML = await reply.text();
    }, 300);
  }
  const stream = new EventSource('/api/stream?since=' + Math.max(0, since - 30));
  stream.onopen = () => { live.textContent = 'live'; live.className = 'live on'; };
  stream.onerror = () => { live.textContent = 'reconnecting…'; live.className = 'live'; };
  stream.addEventListener('ledger', (message) => {
    const event = JSON.parse(message.data);
    const item = document.createElement('li');
    item.value = event.cursor;
    item.textContent = event.kind + ' ' + event.subject;
    list.prepend(item);
    while (list.children.length > 200) list.lastChild.remove();
    live.dataset.cursor = event.cursor;
    if (event.cursor > since && moving.test(event.kind)) refresh();
  });
  document.addEventListener('click', async (click) => {
    const button = click.target.closest('button[data-post]');
    if (!button) return;
    const body = {};
    for (const key of ['action', 'fingerprint', 'outcome', 'run']) {
      if (button.dataset[key]) body[key] = button.dataset[key];
    }
    if (button.dataset.run) {
      const input = document.querySelector('input[data-run="' + button.dataset.run + '"]');
      if (input) body.text = input.value;
    }
    if (button.dataset.request) {
      // A structured question: each question's choice, a non-empty free text winning.
      body.request = button.dataset.request;
      body.answers = {};
      document.querySelectorAll('[data-answer-of="' + button.dataset.request + '"]').forEach((field) => {
        if (field.value) body.answers[field.dataset.qid] = field.value;
      });
    }
    button.disabled = true;
    const reply = await fetch(button.dataset.post, {
      method: 'POST', credentials: 'same-origin',
      headers: {'Content-Type': 'application/json', 'X-CSRF-Token': csrf},
      body: JSON.stringify(body),
    });
    const answer = await reply.json().catch(() => ({}));
    button.textContent = reply.ok ? 'done' : ('refused: ' + (answer.error || reply.status));
    refresh();
  });
})();
"""
