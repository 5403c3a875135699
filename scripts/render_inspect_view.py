"""Serve an export folder's Inspect eval logs with ``inspect view`` and save a screenshot of it in headless Chromium.

    python scripts/render_inspect_view.py <output_dir>/export docs/img/inspect_view.png [--sample 1]

Needs the ``export`` and ``browser`` extras (``pip install -e ".[export,browser]"``) and a Chromium (Debian's
``chromium``, or ``playwright install chromium``). The log list is shot first; ``--sample N`` also opens the first
log and shoots its sample N (``..._sample.png``). The viewer runs on a free local port and is stopped afterwards.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from render_label_audit import CHROMIUM_ARGS, chromium_path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, seconds: float = 60.0) -> None:
    end = time.time() + seconds
    while time.time() < end:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"inspect view did not answer at {url} within {seconds:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log_dir", type=Path)
    ap.add_argument("png", type=Path)
    ap.add_argument("--sample", type=int, default=0, help="also open the first log's sample N (1-based)")
    args = ap.parse_args()
    if not any(args.log_dir.glob("*.eval")) and not any(args.log_dir.glob("*.json")):
        raise SystemExit(f"{args.log_dir}: no Inspect eval log (.eval or .json) here")
    from playwright.sync_api import sync_playwright

    port = _free_port()
    url = f"http://127.0.0.1:{port}/"
    inspect = Path(sys.executable).with_name("inspect")
    server = subprocess.Popen([str(inspect), "view", "--log-dir", str(args.log_dir), "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(url)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(url)
            page.wait_for_load_state("networkidle")
            page.wait_for_timeout(3000)
            args.png.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(args.png))
            print(f"wrote {args.png}")
            if args.sample:
                page.get_by_text(".eval", exact=False).first.click()
                page.wait_for_timeout(3000)
                rows = page.locator("[role=row], .sample-row, tr")
                if rows.count() > args.sample:
                    rows.nth(args.sample).click()
                    page.wait_for_timeout(2000)
                out = args.png.with_name(args.png.stem + "_sample.png")
                page.screenshot(path=str(out))
                print(f"wrote {out}")
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
