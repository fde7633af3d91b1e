"""A real browser (Debian's chromium driven by Playwright) on the demo run's page, served by a real uvicorn.

Screenshots go to ``test-artifacts/`` at the repository root.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

playwright_sync = pytest.importorskip("playwright.sync_api")

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

# .ci/run installs chromium when it is missing; on CI a missing browser is a failure, not a skip.
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists() and os.environ.get("CI", "").lower() != "true",
    reason="Debian's chromium is not installed",
)


@pytest.fixture
def served(tmp_path):
    from app_thread import serve_in_thread

    from moeproxy import migrations
    from moeproxy.config import Settings
    from moeproxy.service.app import create_app
    from moeproxy.service.db import Database
    from moeproxy.service.tokens import repository as tokens
    from moeproxy.service.ui.auth import create_login_link

    url = f"sqlite:///{tmp_path / 'browser.db'}"
    migrations.upgrade(url)
    database = Database(url)

    with database.scope() as s:
        _row, token = tokens.create_token(s, "demo")
        code = create_login_link(s, "demo")  # what `serve --demo` prints
    app = create_app(
        # The shipped fingerprint library (fingerprints=None): the demo runs are recorded engine
        # runs, and the page must show what a user of `serve --demo` sees.
        Settings(database_url=url, fingerprints=None, triage_interval_s=0.5), database=database
    )
    served = serve_in_thread(app)
    yield served.url, token, code, app
    served.stop()
    database.dispose()


def test_demo_run_page_in_chromium(served):
    from moeproxy.demo import post_demo

    base, token, code, app = served
    posted = post_demo(base, token)
    faulty = next(r for r in posted if "healthy" not in r["name"])
    healthy = next(r for r in posted if "healthy" in r["name"])
    ARTIFACTS.mkdir(exist_ok=True)
    # Live triage evaluates both runs in the background (the first evaluation compiles DTW).
    live = app.state.live_triage
    deadline = time.monotonic() + 120
    while (live.evaluations < 2 or not live.idle()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert live.evaluations >= 2

    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            console: list[str] = []
            page.on("console", lambda message: console.append(message.text))
            # The printed one-time link: login.js posts the fragment's code, then the runs list.
            page.goto(f"{base}/login#code={code}")
            page.wait_for_url(f"{base}/")
            assert "project demo" in page.locator("#viewer").inner_text()
            page.goto(f"{base}/runs/{faulty['id']}")
            rows = page.locator("#candidates tr.candidate")
            rows.first.wait_for()
            classes = [rows.nth(i).get_attribute("data-fault-class") for i in range(rows.count())]
            assert "rollout_logp_precision" in classes and "healthy" in classes
            assert classes[0] == "rollout_logp_precision"
            assert "rollout_logp_precision" in page.locator("#verdict").inner_text()
            # Plotly drew the key plots (its SVG), with the run trace and the expected shape.
            page.locator("#plot-key-0 .main-svg").first.wait_for(timeout=20_000)
            assert page.locator("#key-plots .plot .main-svg").count() >= 2
            legend = page.locator("#plot-key-0 .legendtext").all_text_contents()
            assert "run" in legend and any(t.startswith("expected: ") for t in legend)
            page.screenshot(path=str(ARTIFACTS / "run-page.png"), full_page=True)

            # The run is live: new metrics -> live triage re-evaluates -> the open page reloads itself.
            assert page.locator("#run-page").get_attribute("data-live") == "1"
            more = [{"step": s, "values": {"critic/score/mean": 0.3, "actor/ppo_kl": 0.01}} for s in range(100, 120)]
            httpx.post(f"{base}/api/v1/runs/{faulty['id']}/metrics", json={"steps": more},
                       headers={"Authorization": f"Bearer {token}"}).raise_for_status()
            page.wait_for_function(
                "() => document.querySelector('dl.meta').innerText.includes('119')", timeout=60_000
            )

            page.locator("#candidates a[href='/faults#rollout_logp_precision']").first.click()
            page.wait_for_url("**/faults#rollout_logp_precision")
            assert page.locator("#rollout_logp_precision").is_visible()

            # The pages' Content-Security-Policy (scripts from this origin only) refused nothing.
            assert not [m for m in console if "Content Security Policy" in m], console
            page.goto(f"{base}/")
            listed = page.locator("table.runs tbody tr")
            assert listed.count() == 2
            assert faulty["name"] in page.content() and healthy["name"] in page.content()
            page.screenshot(path=str(ARTIFACTS / "runs-list.png"), full_page=True)
        finally:
            browser.close()
