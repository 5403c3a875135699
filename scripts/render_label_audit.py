"""Open a label audit sheet (label_audit.html) in headless Chromium and save a screenshot.

    python scripts/render_label_audit.py <corpus_dir>/label_audit.html docs/img/label_audit.png [--reason R]

Needs Playwright's Python package and a Chromium (``pip install playwright``; Debian's ``chromium`` at
/usr/bin/chromium, or ``playwright install chromium``). ``--reason`` applies the sheet's reason filter first.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

#: flags for a headless Chromium on a machine without a display or network (no sandbox: run as root in CI)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str | None:
    """A Chromium executable on PATH (Debian's chromium), or None (Playwright's own download is used)."""
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def open_sheet(pw, html: Path):
    """(browser, page) with the sheet loaded."""
    browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.goto(html.resolve().as_uri())
    return browser, page


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("html", type=Path)
    ap.add_argument("png", type=Path)
    ap.add_argument("--reason", default=None)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser, page = open_sheet(pw, args.html)
        if args.reason:
            page.select_option("#f-reason", args.reason)
        args.png.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(args.png))
        print(f"{args.html}: {page.locator('.trace').count()} traces, shown {page.inner_text('#shown')} "
              f"-> {args.png}")
        browser.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
