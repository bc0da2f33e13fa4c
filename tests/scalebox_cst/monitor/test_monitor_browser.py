"""The monitor page in a real headless Chromium (the system's /usr/bin/chromium via playwright).

`make test` installs Chromium when it is missing (root with apt); where it cannot, these tests
skip with the reason and the API tests still run. Screenshots go to $SCALEBOX_SCREENSHOTS
(default: the system temp folder) as scalebox_monitor_*.png.
"""
from __future__ import annotations

import os
import time

import pytest

from scalebox_cst.store import Store

from test_monitor_api import append_points, curve, live_pid, make_project, write_run  # noqa: F401  (live_pid: fixture)

from browser import ARGS, CHROMIUM, PALETTE, SHOTS, _skip_reason, browser, color_pixels, page, serve, shot, wait_ticks  # noqa: F401 (fixtures)

pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


def test_page_shows_branches_curves_live_updates_diff_and_events(tmp_path, page, live_pid):
    root = make_project(tmp_path)
    now = time.time()
    live = write_run(root, "run/0003", status="running", pid=live_pid, started=now - 30, points=curve("episodic_return", 20, now - 30, scale=0.5, every=100))
    srv = serve(root)
    try:
        page.goto(srv.url)
        # the branches of the fixture, grouped under their snapshots, marks and statuses shown
        page.wait_for_selector("#branches tr.branch[data-branch='run/0003']")
        rows = page.eval_on_selector_all("#branches tr.branch", "rs => rs.map(r => r.dataset.branch)")
        assert rows == ["run/0003", "run/0002", "run/0001"]
        table = page.inner_text("#branches")
        assert "rollback to run/0001" in table and "failed" in table and "running" in table
        assert "grad_clip ×" in table
        # a chart per metric; episodic return against steps and against wall time
        page.wait_for_selector(".chart[data-metric='episodic_return'][data-axis='step'] canvas")
        page.wait_for_selector(".chart[data-metric='episodic_return'][data-axis='time'] canvas")
        page.wait_for_selector(".chart[data-metric='losses/value_loss'] canvas")
        legend = page.inner_text(".chart[data-metric='episodic_return'][data-axis='step'] .u-legend")
        assert "run/0001#1" in legend and "run/0002 mean of 3 seeds" in legend and "run/0003#1" in legend
        assert "non-finite in run/0001#1" in page.inner_text(".chart[data-metric='episodic_return'][data-axis='step']")
        # a curve per branch: each branch's colour is on the canvas
        sel = ".chart[data-metric='episodic_return'][data-axis='step']"
        for number in (1, 2, 3):
            assert color_pixels(page, sel, PALETTE[number - 1]) > 50, f"no line of run/000{number}"
        shot(page, "overview")
        # live: the running run appends points and the chart follows without a reload
        chart_len = "scaleboxMonitor.charts.get('episodic_return|step').plot.data[0].length"
        before = page.evaluate(chart_len)
        top_before = page.evaluate("scaleboxMonitor.charts.get('episodic_return|step').plot.scales.y.max")
        append_points(live, [("episodic_return", 2000 + 100 * i, 40.0 + i, time.time()) for i in range(30)])
        page.wait_for_function(f"{chart_len} > {before}", timeout=30_000)
        assert page.evaluate("scaleboxMonitor.charts.get('episodic_return|step').plot.scales.y.max") > max(top_before, 40)
        # the diff of a branch: labelled hunks, what was left alone, guard pass rate per site
        page.click("#branches tr.branch[data-branch='run/0001'] td.name a")
        page.wait_for_selector("#diff .hunk")
        diff = page.inner_text("#diff")
        assert "grad_clip [" in diff and "vectorize.recurrence [exact]" in diff
        assert "@@ -" in diff and "+" in diff
        assert "90.0%" in diff and "train.py:7" in diff
        # events: newest first, a failed run with its traceback, a blocked save, a non-finite loss
        events = page.inner_text("#events")
        assert "RuntimeError: boom" in events and "invalid syntax" in events and "non-finite" in events
        page.locator("#diff-panel").scroll_into_view_if_needed()
        shot(page, "diff_events")
        assert not page.errors, page.errors
        assert all(u.startswith(srv.url) for u in page.requests), [u for u in page.requests if not u.startswith(srv.url)]
    finally:
        srv.shutdown()
        srv.server_close()


def test_page_with_500_branches_and_a_branch_never_run(tmp_path, page):
    root = str(tmp_path / "big")
    os.makedirs(root)
    store = Store.init(root)
    source, _ = store.snapshot({"train.py": b"x = 1\n"}, "snapshot")
    report = {"branch": None, "commit": None, "source_commit": None, "backend": "cpu", "files": [
        {"path": "train.py", "status": "rewritten", "error": None, "sites": [
            {"transform": "grad_clip", "line": 1, "end_line": 1, "action": "rewritten", "reason": "r", "exactness": "changes-semantics"}]}]}
    now = time.time()
    for i in range(500):
        name, _ = store.commit_rewrite(source, {"train.py": b"x = %d\n" % i}, "rewrite", "", report, "fp")
        if i != 499:  # the newest branch never ran
            write_run(root, name, started=now - 100, points=curve("episodic_return", 200, now - 100, scale=1 + i / 500, every=10),
                      headline={"episodic_return_final": float(i)})
    srv = serve(root, refresh=0.5)
    try:
        t0 = time.perf_counter()
        page.goto(srv.url)
        page.wait_for_selector(".chart[data-metric='episodic_return'] canvas")
        loaded = time.perf_counter() - t0
        assert page.locator("#branches tr.branch").count() == 100  # the newest first, more on request
        assert "500 of 500 branch(es), 5 plotted" in page.inner_text("#branch-count")
        never = page.locator("#branches tr.branch[data-branch='run/0500']")
        assert "not run" in never.inner_text() and never.locator("input").is_disabled()
        page.fill("#branch-filter", "run/0042")
        assert page.eval_on_selector_all("#branches tr.branch", "rs => rs.map(r => r.dataset.branch)") == ["run/0042"]
        page.check("#branches tr.branch[data-branch='run/0042'] input")
        for axis in ("step", "time"):
            page.wait_for_function(f"document.querySelector(\".chart[data-metric='episodic_return'][data-axis='{axis}'] .u-legend\").innerText.includes('run/0042#1')", timeout=30_000)
        page.fill("#branch-filter", "")
        shot(page, "500_branches")
        print(f"\n500 branches: page with charts in {loaded:.2f}s")
        assert loaded < 20
        assert not page.errors, page.errors
    finally:
        srv.shutdown()
        srv.server_close()


def test_page_diff_gives_a_sites_reason_once_across_its_hunks(tmp_path, page):
    """As `scalebox diff`: a site whose change spans three hunks was explained in each."""
    root = str(tmp_path / "hunks")
    os.makedirs(root)
    store = Store.init(root)
    old = "".join(f"x{i} = {i}\n" for i in range(1, 41)).encode()
    new = old.replace(b"x3 = 3", b"x3 = 30").replace(b"x20 = 20", b"x20 = 200").replace(b"x37 = 37", b"x37 = 370")
    source, _ = store.snapshot({"m.py": old}, "snapshot")
    report = {"branch": None, "commit": None, "source_commit": None, "backend": "cpu", "files": [
        {"path": "m.py", "status": "rewritten", "error": None, "sites": [
            {"transform": "vectorize.loop", "line": 2, "end_line": 38, "action": "rewritten", "reason": "the loop is batched over its rows", "exactness": "exact"},
            {"transform": "grad_clip", "line": 37, "end_line": 37, "action": "rewritten", "reason": "clip before the step", "exactness": "exact-until-intervention"}]}]}
    name, _ = store.commit_rewrite(source, {"m.py": new}, "rewrite", "", report, "fp")
    write_run(root, name, points=curve("episodic_return", 10, time.time()))
    srv = serve(root)
    try:
        page.goto(srv.url)
        page.click(f"#branches tr.branch[data-branch='{name}'] td.name a")
        page.wait_for_selector("#diff .hunk")
        assert page.locator("#diff .hunk").count() == 3
        labels = page.eval_on_selector_all("#diff .hunk-label", "ls => ls.map(l => l.innerText)")
        assert labels == [
            "#  vectorize.loop [exact] line 2: the loop is batched over its rows",
            "#  vectorize.loop line 2 (continued; reason above)",
            "#  vectorize.loop line 2 (continued; reason above)",
            "#  grad_clip [exact-until-intervention] line 37: clip before the step",
        ]
        page.locator("#diff-panel").scroll_into_view_if_needed()
        shot(page, "diff_once_per_site")
        assert not page.errors, page.errors
    finally:
        srv.shutdown()
        srv.server_close()


def test_page_says_why_a_site_fell_back(tmp_path, page):
    """A site's guard pass rate alone ("guards 40%") said nothing a user could change; the diff's
    site label, the per-site table and the branch row's guard cell name the reasons (as text:
    a planted reason holding markup stays text)."""
    root = str(tmp_path / "whys")
    os.makedirs(root)
    store = Store.init(root)
    old = b"for t in reversed(range(T)):\n    acc = r[t] + g * acc\n"
    source, _ = store.snapshot({"m.py": old}, "snapshot")
    report = {"branch": None, "commit": None, "source_commit": None, "backend": "cpu", "files": [
        {"path": "m.py", "status": "rewritten", "error": None, "sites": [
            {"transform": "vectorize.recurrence", "line": 1, "end_line": 2, "action": "rewritten",
             "reason": "backward linear recurrence", "exactness": "exact"}]}]}
    name, _ = store.commit_rewrite(source, {"m.py": b"# rewritten\n" + old}, "rewrite", "", report, "fp")
    whys = [["per-step inputs of dtype float16: only float32 and float64 are vectorized", 5], ["<b id='x'>planted</b>", 1]]
    write_run(root, name, points=curve("episodic_return", 10, time.time()),
              sites=[{"path": "m.py", "line": 1, "end_line": 2, "transform": "vectorize.recurrence",
                      "vectorized": 4, "fallback": 6, "time_s": 0.01, "fallback_why": whys}],
              headline={"guard_pass_rate": 0.4, "guard_fallback_why": whys})
    srv = serve(root)
    try:
        page.goto(srv.url)
        row = page.locator(f"#branches tr.branch[data-branch='{name}']")
        row.wait_for()
        assert "per-step inputs of dtype float16" in row.locator("td.num[title]").last.get_attribute("title")
        row.locator("td.name a").click()
        page.wait_for_selector("#diff table.sites")
        label = page.locator("#diff .hunk-label").first.inner_text()
        assert "guard took the rewrite 40.0% of 10 time(s)" in label and "fell back: per-step inputs of dtype float16" in label
        cells = page.eval_on_selector_all("#diff table.sites td", "ts => ts.map(t => t.innerText)")
        assert cells[-1] == ("per-step inputs of dtype float16: only float32 and float64 are vectorized (5); "
                             "<b id='x'>planted</b> (1)")
        assert page.locator("#x").count() == 0  # the planted markup stayed text
        page.locator("#diff-panel").scroll_into_view_if_needed()
        shot(page, "site_fallback_reasons")
        assert not page.errors, page.errors
    finally:
        srv.shutdown()
        srv.server_close()


def test_branch_row_shows_cpu_time_against_the_branchs_original_runs(tmp_path, page):
    """The figure a rewrite saves: the row's CPU cell, and in its title the branch's own
    ``--original`` runs (a ratio, not a verdict: compare says what is beyond noise)."""
    root = make_project(tmp_path)
    now = time.time()
    for cpu in (4.8, 5.0):
        write_run(root, "run/0002", variant="original", started=now - 300, headline={"cpu_time_s": cpu, "sps": 800.0})
    write_run(root, "run/0002", started=now - 10, headline={"cpu_time_s": 4.3, "sps": 950.0})
    srv = serve(root)
    try:
        page.goto(srv.url)
        cell = page.locator("#branches tr.branch[data-branch='run/0002'] td.cpu")
        cell.wait_for()
        assert cell.inner_text() == "4.30 s"
        title = cell.get_attribute("title")
        assert "the original's: 4.90 s (median of 2 run(s)), 0.88x of it" in title and "scalebox compare" in title
        first = page.locator("#branches tr.branch[data-branch='run/0001'] td.cpu")
        assert first.inner_text() == "—" and first.get_attribute("title") == "no CPU time recorded for this run"
        header = page.eval_on_selector_all("#branches thead th", "ths => ths.map(t => t.innerText)")
        cells = page.eval_on_selector_all("#branches tr.branch[data-branch='run/0002'] td", "tds => tds.length")
        assert "CPU" in header and cells == len(header)
        shot(page, "branch_cpu_time")
        assert not page.errors, page.errors
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_branch_whose_run_files_had_damaged_lines_says_so(tmp_path, page):
    """A run's numbers rest on the lines of its files that could be read: a line cut by kill -9
    or a full disk was skipped without a word. The branch row marks it, the run and what was
    skipped in the mark's title."""
    root = make_project(tmp_path)
    folder = write_run(root, "run/0002", headline={"sps": 900.0, "damaged": {"metrics.jsonl": 2}},
                       points=[("scalebox/SPS", 10, 900.0, time.time())])
    run_id = "run/0002#" + os.path.basename(folder).lstrip("0")
    srv = serve(root)
    try:
        page.goto(srv.url)
        mark = page.locator("#branches tr.branch[data-branch='run/0002'] .mark-damaged")
        mark.wait_for()
        assert mark.inner_text() == "damaged lines: 1 run(s)"
        assert mark.get_attribute("title") == f"{run_id}: metrics.jsonl: 2 damaged lines skipped"
        assert page.locator("#branches tr.branch[data-branch='run/0001'] .mark-damaged").count() == 0
        shot(page, "branch_damaged_lines")
        assert not page.errors, page.errors
    finally:
        srv.shutdown()
        srv.server_close()


def test_page_memory_stays_flat_while_it_polls(tmp_path, page, live_pid):
    """A page left open: many polls with a run writing all along, heap and DOM do not grow."""
    root = make_project(tmp_path)
    now = time.time()
    live = write_run(root, "run/0003", status="running", pid=live_pid, started=now, points=curve("episodic_return", 10, now))
    srv = serve(root, refresh=0.1)
    try:
        page.goto(srv.url)
        page.wait_for_selector(".chart[data-metric='episodic_return'] canvas")
        cdp = page.context.new_cdp_session(page)

        def heap():
            cdp.send("HeapProfiler.collectGarbage")
            return cdp.send("Runtime.getHeapUsage")["usedSize"]

        def nodes():
            return page.evaluate("document.getElementsByTagName('*').length")

        step = [10]

        def write(k):
            append_points(live, [("episodic_return", 100 * (step[0] + i), float(step[0] + i), time.time()) for i in range(k)])
            step[0] += k

        write(50)
        wait_ticks(page, 20)
        base_heap, base_nodes = heap(), nodes()
        for _ in range(5):
            write(2000)  # past the bucket capacity: the series is downsampled from here on
            wait_ticks(page, 12)
        grown_heap, grown_nodes = heap(), nodes()
        ticks = int(page.evaluate("Number(document.body.dataset.ticks)"))
        print(f"\n{ticks} polls: heap {base_heap / 1e6:.2f} -> {grown_heap / 1e6:.2f} MB, DOM {base_nodes} -> {grown_nodes} nodes")
        assert grown_nodes <= base_nodes + 20
        assert grown_heap < base_heap + 3_000_000
        assert page.evaluate("scaleboxMonitor.charts.get('episodic_return|step').plot.data[0].length") < 3000
        assert not page.errors, page.errors
    finally:
        srv.shutdown()
        srv.server_close()


def test_page_shows_where_the_time_goes_as_bars_per_category(tmp_path, page):
    root = make_project(tmp_path)
    from scalebox_cst import runs

    cats = [("env", "environment step", 0.6), ("backward", "backward", 0.3), ("logging", "logging", 0.1)]
    for run in runs.list_runs(root, "run/0002"):
        runs.write_record(run.dir, dict(run.record, profile={
            "samples": 400, "wall_s": 16.0, "method": "sampled at 25 Hz",
            "categories": [{"category": c, "label": label, "share": s} for c, label, s in cats],
            "lines": [{"path": "train.py", "line": 12, "code": "obs, r, done, info = env.step(a)", "share": 0.55,
                       "category": "env", "calls": 300, "coverage": {"covered": False, "reason": "no transform matched this line"}}],
        }))
    srv = serve(root)
    try:
        page.goto(srv.url)
        page.wait_for_selector("#profiles .prof-card[data-run^='run/0002']")
        widths = page.eval_on_selector_all(
            "#profiles .prof-card[data-run^='run/0002'] .prof-row",
            "rows => rows.map(r => [r.dataset.category, r.querySelector('.prof-bar').getBoundingClientRect().width, r.querySelector('.prof-track').getBoundingClientRect().width])")
        assert [w[0] for w in widths] == ["env", "backward", "logging"]
        for (_, bar, track), (_, _, share) in zip(widths, cats):
            assert bar == pytest.approx(share * track, abs=2)
        card = page.inner_text("#profiles .prof-card[data-run^='run/0002']")
        assert "environment step" in card and "60.0%" in card and "train.py:12" in card and "env.step(a)" in card
        # the bars take the branch's colour
        colour = page.eval_on_selector("#profiles .prof-card[data-run^='run/0002'] .prof-bar", "b => getComputedStyle(b).backgroundColor")
        swatch = page.eval_on_selector("#branches tr.branch[data-branch='run/0002'] .swatch", "s => getComputedStyle(s).backgroundColor")
        assert colour == swatch
        page.locator("#profile-panel").scroll_into_view_if_needed()
        shot(page, "profile")
        assert not page.errors, page.errors
    finally:
        srv.shutdown()
        srv.server_close()
