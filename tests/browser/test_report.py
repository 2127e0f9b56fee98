"""The shareable report (`lab report`) in a real browser: built from the committed reference runs into a temporary
directory and opened as a file (no server), in Debian's headless Chromium driven by Playwright. The page loads,
every image on it loads (none broken), the first screen (a screenshot is kept) opens with the findings and their key
figures in view, the claims ledger holds every claim of results/CLAIMS.csv, and filtering it
by verdict shows exactly that verdict's rows.

Marked `browser` (deselected from `make test`; `make test-browser` runs it), skipping as the widget test does
where Chromium or Playwright is missing."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from test_jupyterlab_widgets import CHROMIUM, CHROMIUM_FLAGS, playwright_api  # noqa: F401 (a fixture)

pytestmark = pytest.mark.browser

RESULTS = Path(__file__).resolve().parents[2] / "results"


def test_the_report_loads_with_every_image_and_a_working_ledger_filter(playwright_api, tmp_path):  # noqa: F811
    from lab.publish.report import build

    index = build(RESULTS, tmp_path / "report")
    claims = pd.read_csv(RESULTS / "CLAIMS.csv", dtype=str)
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        page = browser.new_page()
        try:
            page.goto(index.as_uri(), wait_until="load", timeout=60_000)
            assert page.title() == "Inference Lab: findings"
            # the first screen: the findings, their key figures loaded, the first ones in view (issue 49)
            page.set_viewport_size({"width": 1280, "height": 900})
            page.screenshot(path=str(tmp_path / "first_screen.png"))
            print(f"first screen: {tmp_path / 'first_screen.png'}")
            figures = page.locator("#findings .finding img")
            assert figures.count() == 10, "the report opens with the ten findings' key figures"
            assert all(page.eval_on_selector_all("#findings img", "els => els.map(e => e.complete && e.naturalWidth > 0)"))
            first = figures.first.bounding_box()
            assert first is not None and first["y"] < 900 and first["height"] > 100, first
            images = page.eval_on_selector_all("img", "els => els.map(e => [e.src, e.complete && e.naturalWidth])")
            assert images, "the report shows no plot"
            broken = [src for src, width in images if not width]
            assert not broken, f"{len(broken)} of {len(images)} images did not load: {broken[:3]}"
            rows = page.locator("#ledger tbody tr")
            assert rows.count() == len(claims)
            assert set(page.eval_on_selector_all("#ledger tbody tr td:first-child", "els => els.map(e => e.textContent)")
                       ) == set(claims["id"])
            wrong = int((claims["verdict"] == "wrong").sum())
            page.select_option("#verdict", "wrong")
            assert page.locator("#shown").text_content() == str(wrong)
            assert page.locator("#ledger tbody tr:visible").count() == wrong
            page.select_option("#verdict", "")
            page.select_option("#seed", "002")
            assert int(page.locator("#shown").text_content()) == int((claims["seed"] == "002").sum())
            # the one-page summary prints on one A4 page
            page.goto((index.parent / "summary.html").as_uri(), wait_until="load", timeout=60_000)
            pdf = page.pdf(format="A4", print_background=False)
            (tmp_path / "summary.pdf").write_bytes(pdf)
            pages = pdf.count(b"/Type /Page") - pdf.count(b"/Type /Pages")
            assert pages == 1, f"the summary prints on {pages} pages: {tmp_path / 'summary.pdf'}"
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            print(f"screenshot: {tmp_path / 'failure.png'}")
            raise
        finally:
            browser.close()
