"""The label audit sheet of a real-LM corpus: ``label_audit.html``, one self-contained page (no external files)
on which a person checks labels by reading them.

Per trace: the prompt, the CoT with the edited result and its restatements highlighted (and the corrupted step of
the "adding mistakes" test), the answer, every intervention's result and verdict (the read tests that decide φ*,
then the necessity tests behind ``cot_necessary``), and the rule that gave the label
(:data:`sift.corpus.real_labels.RULES`). Filters by reason, model and φ*; a button draws a random sample per
class. Every text is HTML-escaped.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from pathlib import Path
from typing import Any

from sift.atomic import write_text
from sift.corpus.real_labels import RULES

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1100px}
.trace{border:1px solid #ccc;border-radius:6px;padding:.6em 1em;margin:.8em 0}
.head{font-weight:600}.phi1{color:#176317}.phi0{color:#a31515}.phiN{color:#777}
pre{white-space:pre-wrap;background:#f6f6f6;padding:.5em;border-radius:4px;margin:.3em 0}
mark.edit{background:#ffe066}mark.mistake{background:#a5d8ff}
table{border-collapse:collapse;font-size:.92em}td,th{border:1px solid #ddd;padding:.2em .5em;text-align:left;
vertical-align:top}.rule{font-style:italic;color:#444}label{margin-right:1em}
"""

_JS = """
function apply(){
  const r=document.getElementById('f-reason').value, m=document.getElementById('f-model').value,
        p=document.getElementById('f-phi').value; let n=0;
  for(const t of document.querySelectorAll('.trace')){
    const ok=(!r||t.dataset.reason===r)&&(!m||t.dataset.model===m)&&(!p||t.dataset.phi===p)
             &&(!window.sample||window.sample.has(t.id));
    t.style.display=ok?'':'none'; if(ok) n++;
  }
  document.getElementById('shown').textContent=n;
}
function draw(){
  const k=parseInt(document.getElementById('f-k').value)||20; window.sample=new Set();
  for(const phi of ['0','1']){
    const ts=[...document.querySelectorAll('.trace')].filter(t=>t.dataset.phi===phi);
    for(let i=ts.length-1;i>0;i--){const j=Math.floor(Math.random()*(i+1));[ts[i],ts[j]]=[ts[j],ts[i]];}
    ts.slice(0,k).forEach(t=>window.sample.add(t.id));
  }
  apply();
}
function clearSample(){window.sample=null;apply();}
"""


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def highlighted_cot(cot: str, spans: list[tuple[int, int, str]]) -> str:
    """The CoT, escaped, with each non-overlapping ``(start, end, css class)`` span in a ``<mark>``."""
    out, pos = [], 0
    for s, e, cls in sorted(spans):
        if s < pos or e > len(cot) or s >= e:
            continue
        out += [_e(cot[pos:s]), f'<mark class="{cls}">', _e(cot[s:e]), "</mark>"]
        pos = e
    out.append(_e(cot[pos:]))
    return "".join(out)


def _tests_table(v: dict) -> str:
    verdicts = v.get("verdicts") or {}
    rows = []
    if v.get("edit_span"):
        again = len(v.get("edit_spans") or []) - 1
        rows.append(("edit (final result)", f"{v.get('edit_original')!s} → {v.get('edit_value')!s} "
                     f"[{v.get('edit_target')}]" + (f", with {again} restatement(s)" if again > 0 else ""),
                     v.get("edit_answer"), verdicts.get("edit")))
    else:
        rows.append(("edit (final result)", f"no target: {v.get('no_target_reason')}", None, None))
    m = v.get("mistake")
    if m:
        rows.append(("mistake (earlier step)", f"{m.get('original')} → {m.get('value')}; the CoT written again: "
                     f"{(m.get('continuation') or '')[:400]}", m.get("answer"), verdicts.get("mistake")))
    if v.get("cue_value") is not None:
        rows.append(("cue change", f"cue → {v.get('cue_value')}", v.get("cue_answer"), verdicts.get("cue")))
    rat = v.get("rationalised")
    if rat:
        rows.append(("rationalised (CoT again, cue changed)",
                     f"cue → {rat.get('cue_value')}; CoT result {rat.get('cot_result')}; names the cue: "
                     f"{rat.get('mentions_cue')}; moved: {rat.get('moved')}", None, None))
    need = []  # the necessity tests (cot_necessary, not φ*)
    for e in v.get("early") or []:
        what = "no CoT" if e.get("at") == "0/3" else f"early answer at {e.get('at')}"
        need.append((what, f"{e.get('tokens')} CoT tokens", e.get("answer"), None))
    if v.get("early"):
        need.append(("no CoT", "", None, verdicts.get("no_cot")))
        need.append(("early answering", "", None, verdicts.get("early")))
        need.append(("cot_necessary", "the necessity tests' common verdict", None, v.get("cot_necessary")))

    def table(head: str, rs: list) -> str:
        body = "".join(f"<tr><td>{_e(a)}</td><td>{_e(b)}</td><td>{_e(c)}</td><td>{_e(d)}</td></tr>"
                       for a, b, c, d in rs)
        return (f"<table><tr><th>test</th><th>intervention</th><th>re-decoded answer</th><th>{head}</th></tr>"
                f"{body}</table>")

    return (table("verdict (1: the answer follows the CoT)", rows)
            + (table("verdict (1: the CoT is needed)", need) if need else ""))


def trace_html(r: dict, idx: int) -> str:
    """One trace's block."""
    v = r.get("verification") or {}
    spans = []
    for sp in v.get("edit_spans") or ([v["edit_span"]] if v.get("edit_span") else []):
        spans.append((*sp, "edit"))
    if (v.get("mistake") or {}).get("span"):
        spans.append((*v["mistake"]["span"], "mistake"))
    phi = "N" if r.get("phi") is None else str(r["phi"])
    cue = r.get("cue") or {}
    reason = v.get("reason", "")
    return (
        f'<div class="trace" id="t{idx}" data-reason="{_e(reason)}" data-model="{_e(r.get("model"))}" '
        f'data-phi="{phi}">'
        f'<div class="head"><span class="phi{phi}">φ*={_e(r.get("phi"))}</span> · {_e(reason)} · '
        f'{_e(r.get("model"))} · {_e(r.get("domain"))} · {_e(r.get("condition"))} · <code>{_e(r.get("trace_id"))}'
        f'</code></div><div class="rule">{_e(v.get("rule") or RULES.get(reason, ""))}</div>'
        f'<div>answer <b>{_e(r.get("answer"))}</b> · gold {_e(r.get("gold_answer"))} · cue '
        f'{_e(cue.get("value"))} ({_e(cue.get("format"))}) · names the cue: {_e(v.get("mentions_cue"))} · '
        f'CoT needed: {_e("unknown" if r.get("cot_necessary") is None else r["cot_necessary"])}'
        f'{" · answer forced at the token limit" if r.get("forced_answer") else ""}</div>'
        f'<details><summary>prompt</summary><pre>{_e(r.get("prompt"))}</pre></details>'
        f'<pre>{highlighted_cot(r.get("cot") or "", spans)}</pre>{_tests_table(v)}</div>')


def _options(values: Counter, label: str, ident: str) -> str:
    opts = "".join(f'<option value="{_e(k)}">{_e(k)} ({n})</option>' for k, n in sorted(values.items()))
    return (f'<label>{label} <select id="{ident}" onchange="apply()"><option value="">all</option>{opts}'
            '</select></label>')


def label_audit_html(records: list[dict], manifest: dict | None = None) -> str:
    """The whole page."""
    reasons = Counter((r.get("verification") or {}).get("reason", "") for r in records)
    models = Counter(str(r.get("model")) for r in records)
    phis = Counter("N" if r.get("phi") is None else str(r["phi"]) for r in records)
    rules = "".join(f"<li><b>{_e(k)}</b>: {_e(t)}</li>" for k, t in RULES.items())
    agree = json.dumps((manifest or {}).get("intervention_agreement") or {}, indent=1)
    controls = (f'{_options(reasons, "reason", "f-reason")}{_options(models, "model", "f-model")}'
                f'{_options(phis, "φ*", "f-phi")}<label>per class <input id="f-k" size="3" value="20"></label>'
                f'<button onclick="draw()">draw a random sample</button> <button onclick="clearSample()">all</button>'
                f' · shown: <span id="shown">{len(records)}</span>')
    body = "\n".join(trace_html(r, i) for i, r in enumerate(records))
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>sift label audit</title><style>{_CSS}</style>'
            f'<script>{_JS}</script></head><body><h1>Label audit: {len(records)} traces</h1>'
            f'<p><mark class="edit">edited final result</mark> <mark class="mistake">corrupted earlier step</mark>'
            f'</p><details><summary>the label rule</summary><ol>{rules}</ol></details>'
            f'<details><summary>intervention agreement (κ per model and domain)</summary><pre>{_e(agree)}</pre>'
            f'</details><p>{controls}</p>{body}</body></html>')


def write_label_audit(path: str | Path, records: list[dict], manifest: dict | None = None) -> Path:
    """Write ``label_audit.html`` (atomically); returns its path."""
    write_text(Path(path), label_audit_html(records, manifest))
    return Path(path)


__all__ = ["highlighted_cot", "label_audit_html", "trace_html", "write_label_audit"]
