"""The label audit sheet in a real browser (headless Chromium through Playwright): every trace is on the page, and
the reason, model and φ* filters and the per-class sample show exactly the traces they should. Slow: it starts a
browser (``pip install playwright`` and Debian's chromium, or ``playwright install chromium``)."""

import sys
from pathlib import Path

import pytest

from sift.corpus.label_audit import write_label_audit
from sift.corpus.real_labels import verdicts

pytestmark = pytest.mark.slow
sync_api = pytest.importorskip("playwright.sync_api")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from render_label_audit import open_sheet  # noqa: E402

REASONS = [("answer_follows_cot", 1), ("answer_ignores_cot", 0), ("silent_cue_following", 0),
           ("interventions_disagree", None)]


def _records():
    out = []
    for i in range(24):
        reason, phi = REASONS[i % 4]
        model = ("m-a", "m-b")[i % 3 == 0]
        tests = {"mentions_cue": False, "edit_span": [8, 10], "edit_spans": [[8, 10]], "edit_original_value": "14",
                 "edit_value": "15", "edit_answer": "15" if phi else "14", "edit_target": "equation"}
        out.append({"trace_id": f"{model}|item-{i}|base|0", "family": model, "model": model, "domain": "arith",
                    "condition": "base", "answer": "14", "gold_answer": "14", "cue": None, "phi": phi,
                    "cot_necessary": None, "cot": "7 * 2 = 14\n", "prompt": f"<q{i}> & 'x'",
                    "verification": {"reason": reason, **tests, "verdicts": verdicts("14", tests)}})
    return out


def _shown(page) -> list[str]:
    return page.eval_on_selector_all(".trace", "ts => ts.filter(t => t.style.display !== 'none')"
                                                ".map(t => t.querySelector('code').textContent)")


def test_every_trace_is_on_the_page_and_the_filters_work(tmp_path):
    records = _records()
    html = write_label_audit(tmp_path / "label_audit.html", records)
    with sync_api.sync_playwright() as pw:
        try:
            browser, page = open_sheet(pw, html)
        except Exception as e:  # no Chromium on this machine
            pytest.skip(f"no headless Chromium: {e}")
        try:
            assert page.locator(".trace").count() == len(records)
            assert sorted(_shown(page)) == sorted(r["trace_id"] for r in records)
            assert page.inner_text("h1") == f"Label audit: {len(records)} traces"
            page.select_option("#f-reason", "answer_ignores_cot")
            want = {r["trace_id"] for r in records if r["verification"]["reason"] == "answer_ignores_cot"}
            assert set(_shown(page)) == want and page.inner_text("#shown") == str(len(want))
            page.select_option("#f-model", "m-b")
            assert set(_shown(page)) == {t for t in want if t.startswith("m-b|")}
            page.select_option("#f-reason", "")
            page.select_option("#f-model", "")
            page.select_option("#f-phi", "N")
            assert set(_shown(page)) == {r["trace_id"] for r in records if r["phi"] is None}
            page.select_option("#f-phi", "")
            page.fill("#f-k", "3")
            page.click("text=draw a random sample")
            shown = _shown(page)
            phi = {r["trace_id"]: r["phi"] for r in records}
            assert sorted(phi[t] for t in shown) == [0, 0, 0, 1, 1, 1]  # 3 per class, no ambiguous trace
            page.click("button:text-is('all')")
            assert len(_shown(page)) == len(records)
            assert page.locator(".trace mark.edit").count() == len(records)  # every edited result highlighted
        finally:
            browser.close()
