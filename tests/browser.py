"""The monitor's headless Chromium fixtures, shared by every browser test (monitor, explore).

The system's /usr/bin/chromium via playwright; where it is missing the tests skip with the reason.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from scalebox_cst.monitor import Monitor, MonitorServer

CHROMIUM = os.environ.get("SCALEBOX_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-gpu", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
SHOTS = os.environ.get("SCALEBOX_SCREENSHOTS", tempfile.gettempdir())
PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d"]  # app.js: by plotted name order


def _skip_reason():
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)) and not shutil.which("chromium"):
        return f"no Chromium at {CHROMIUM} (make test installs it with apt-get when run as root)"
    return None


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    path = CHROMIUM if os.path.isfile(CHROMIUM) else shutil.which("chromium")
    with sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=path, headless=True, args=ARGS)
        except Exception as exc:  # a broken install: say so, do not fail the API tests' run
            pytest.skip(f"Chromium at {path} does not start: {str(exc).splitlines()[0]}")
        yield b
        b.close()


def serve(root, refresh=0.3):
    srv = MonitorServer(Monitor(root, refresh_interval=refresh), port=0)
    srv.start_background()
    return srv


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1500, "height": 1100})
    pg = context.new_page()
    pg.errors = []
    pg.requests = []
    pg.on("pageerror", lambda exc: pg.errors.append(str(exc)))
    pg.on("console", lambda msg: pg.errors.append(msg.text) if msg.type == "error" else None)
    pg.on("request", lambda req: pg.requests.append(req.url))
    yield pg
    context.close()


def color_pixels(page, selector, hex_color, tol=40):
    """Pixels of a chart's canvas within ``tol`` of a colour (a drawn line leaves some)."""
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return page.evaluate(
        """([sel, r, g, b, tol]) => {
            const c = document.querySelector(sel + ' canvas');
            if (!c) return -1;
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let n = 0;
            for (let i = 0; i < d.length; i += 4)
                if (d[i + 3] > 200 && Math.abs(d[i] - r) < tol && Math.abs(d[i + 1] - g) < tol && Math.abs(d[i + 2] - b) < tol) n++;
            return n;
        }""",
        [selector, r, g, b, tol],
    )


def shot(page, name):
    path = os.path.join(SHOTS, f"scalebox_monitor_{name}.png")
    page.screenshot(path=path, full_page=True)
    assert os.path.getsize(path) > 10_000
    return path


def wait_ticks(page, more):
    start = int(page.evaluate("Number(document.body.dataset.ticks || 0)"))
    page.wait_for_function(f"Number(document.body.dataset.ticks || 0) >= {start + more}", timeout=30_000)

