"""The playground: one offline page at ``/`` to try the served models side by side.

One form per served task, with the fields its route declares (text; text + optional pair; question + context),
a checkbox per model of that task, and each model's answer with the server-side latency (the
``x-kiln-latency-ms`` header), its validation summary and, with --shadow-rate, its live agreement (from
``/kiln/info``, read when the page loads). No external asset: it works offline.
"""

from __future__ import annotations

import json
from html import escape

from kiln.tasks.wire import task_wire
from kiln.tasks.wire.http import Route, kiln_path

_STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#1d2430;padding:0 16px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px}
form{border:1px solid #d8dde6;border-radius:8px;padding:14px 16px;margin:12px 0}
label{display:block;font-weight:600;margin:8px 0 4px}
textarea,input[type=text]{width:100%;box-sizing:border-box;font:inherit;padding:6px 8px;border:1px solid #b9c0cc;
border-radius:6px}textarea{min-height:70px}
.models{margin:10px 0}.models label{display:inline;font-weight:400;margin-right:14px}
button{font:inherit;padding:6px 18px;border-radius:6px;border:0;background:#2457c5;color:#fff;cursor:pointer}
.answers{display:grid;grid-template-columns:repeat(auto-fit,minmax(300px,1fr));gap:12px;margin-top:12px}
.answer{border:1px solid #d8dde6;border-radius:8px;padding:10px 12px;background:#f7f9fc}
.answer h3{font-size:15px;margin:0 0 4px}.meta{color:#5a6474;font-size:13px}
.answer pre{white-space:pre-wrap;word-break:break-word;font-size:13px;margin:8px 0 0}
.error{color:#b3261e}
"""

_SCRIPT = """
const info = {};
fetch('/kiln/info').then(r => r.json()).then(d => {
  for (const m of d.models) { info[m.model] = m; }
  document.querySelectorAll('[data-validation]').forEach(el => {
    const m = info[el.dataset.validation];
    if (!m) return;
    const v = m.validation || {};
    const a = v.agreement ? `${v.agreement.primary} ${Number(v.agreement.value).toFixed(4)}` :
      (v.parity ? `parity min cosine ${Number(v.parity.min_cosine).toFixed(6)}` : 'no validation recorded');
    const drift = v.batch_invariant === true ? '; batch-invariant' :
      v.batch_invariant === false ? '; drifts with the batch' : '';
    const s = m.shadow;
    const live = !s ? '' : s.min === null ? '; live agreement: no shadowed input yet' :
      `; live (shadowed ${s.items}): ${s.judged} ${s.figure.replace('_', ' ')} ${Number(s[s.judged]).toFixed(4)}` +
      (s.below_floor ? ' BELOW ITS GATE' : '');
    el.textContent = `${m.variant} on ${m.engine}; ${v.status || 'exported'}; ${a}${drift}${live}`;
  });
});
function body(form) {
  const fields = JSON.parse(form.dataset.fields);
  const values = {};
  for (const f of fields) {
    const v = form.querySelector(`[name="${f.name}"]`).value;
    if (v.trim()) values[f.name] = v;
  }
  const filled = Object.keys(values);
  if (filled.length === 1 && filled[0] === fields[0].name) return values[fields[0].name];
  return values;
}
async function run(event) {
  event.preventDefault();
  const form = event.target;
  const out = form.querySelector('.answers');
  out.innerHTML = '';
  const inputs = body(form);
  for (const box of form.querySelectorAll('input[type=checkbox]:checked')) {
    const card = document.createElement('div');
    card.className = 'answer';
    card.dataset.model = box.value;
    card.innerHTML = `<h3></h3><div class="meta">running…</div><pre></pre>`;
    card.querySelector('h3').textContent = box.value;
    out.appendChild(card);
    const started = performance.now();
    const response = await fetch(form.dataset.route, {method: 'POST', headers: {'content-type': 'application/json'},
      body: JSON.stringify({model: box.value, inputs: inputs})});
    const data = await response.json();
    const server = response.headers.get('x-kiln-latency-ms');
    const trip = (performance.now() - started).toFixed(1);
    card.querySelector('.meta').textContent = `server ${server} ms · round trip ${trip} ms`;
    const pre = card.querySelector('pre');
    if (!response.ok) { pre.className = 'error'; pre.textContent = data.error.message; continue; }
    const result = data.results ? data.results[0] : data.embeddings[0].slice(0, 8).map(x => x.toFixed(4)).concat(['…']);
    pre.textContent = JSON.stringify(result, null, 1);
    card.dataset.done = '1';
  }
}
document.querySelectorAll('form').forEach(f => f.addEventListener('submit', run));
"""


def _form(task: str, route: Route, models: list[str]) -> str:
    fields = "".join(
        f'<label for="{escape(task)}-{f.name}">{escape(f.label)}</label>'
        + (f'<textarea id="{escape(task)}-{f.name}" name="{f.name}"{" required" if f.required else ""}></textarea>'
           if f.multiline else
           f'<input type="text" id="{escape(task)}-{f.name}" name="{f.name}"{" required" if f.required else ""}>')
        for f in route.form)
    boxes = "".join(f'<label><input type="checkbox" value="{escape(m)}" checked> {escape(m)} '
                    f'<span class="meta" data-validation="{escape(m)}"></span></label><br>' for m in models)
    spec = json.dumps([{"name": f.name} for f in route.form])
    path = kiln_path(route)  # kiln's answers, not TEI's at the bare path
    return (f'<h2>{escape(task)} · <code>POST {escape(path)}</code></h2>'
            f"<form data-route=\"{escape(path)}\" data-fields='{escape(spec)}' data-task=\"{escape(task)}\">"
            f'{fields}<div class="models">{boxes}</div><button type="submit">Run</button>'
            f'<div class="answers"></div></form>')


def page(tasks: dict[str, str]) -> str:
    """The playground for models ``{name: task}``: a form per task whose first route declares one."""
    by_task: dict[str, list[str]] = {}
    for name, task in tasks.items():
        by_task.setdefault(task, []).append(name)
    forms = []
    for task, models in by_task.items():
        route = next((r for r in task_wire(task).routes if r.form), None)
        if route is not None:
            forms.append(_form(task, route, models))
    return ("<!doctype html><html lang=en><head><meta charset=utf-8><title>kiln playground</title>"
            f"<style>{_STYLE}</style></head><body><h1>kiln playground</h1>"
            "<p class=meta>Each checked model answers the same input; latency is measured by the server "
            "(tokenize, batch, run, post-process) and by this page (round trip). API: <a href=/docs>/docs</a>.</p>"
            + "".join(forms) + f"<script>{_SCRIPT}</script></body></html>")
