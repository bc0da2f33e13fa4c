// scalebox monitor page: polls the JSON API under /api/ and draws with the bundled uPlot.
// Memory stays flat over a day: every poll replaces data (charts get setData, lists are
// rebuilt), nothing is appended to, and one timer chain polls at the server's refresh interval.
"use strict";

const state = {
  interval: 2000,
  ticks: 0,
  branchesText: "",
  branches: [],
  sources: new Map(),
  selected: new Set(),
  picked: false,          // the user changed the selection (else: follow the newest branches)
  rowLimit: 100,
  filter: "",
  diffBranch: null,
  diffText: "",
  eventsText: "",
  metricsText: "",
  charts: new Map(),
  extra: new Set(),       // metrics outside the default list that the user asked for      // key -> {el, plot, layout, text, markers}
};

window.scaleboxMonitor = state;  // for the browser tests and a curious console

const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d",
  "#4d7c0f", "#7c2d12", "#1e3a8a", "#0f766e", "#a16207"];
// The engine's own series are "scalebox/..." (workers: "scalebox/workers/<id>/..."); every other
// name is the script's own tag, drawn under that name (scalebox_cst.runs.ENGINE).
const ENGINE = "scalebox/";
const RETURN_NAMES = [ENGINE + "episodic_return", "episodic_return", "charts/episodic_return", "episode_return", "final_return"];
const isWorkerReturn = (name) => name.startsWith(ENGINE + "workers/") && name.endsWith("/episodic_return");
const isReturn = (name) => RETURN_NAMES.includes(name) || isWorkerReturn(name);
const ORDER = [...RETURN_NAMES, ENGINE + "episodic_length", "episodic_length", "charts/episodic_length",
  ENGINE + "losses/", "losses/", "loss", ENGINE + "grad_norm_preclip", ENGINE + "grad_norm", ENGINE + "grad_norm_clipped",
  "grad_norm", ENGINE + "SPS", "SPS", "charts/SPS", "sps", ENGINE + "optimizer_steps_per_s",
  ENGINE + "host_peak_mem_mb", ENGINE + "device_peak_mem_mb", ENGINE + "device_util_percent", ENGINE + "device_mem_util_percent"];
const MAX_CHARTS = 24;
const DEFAULT_PLOTTED = 5;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

// Plotted branches get distinct colours, in name order; the others a neutral grey.
function colorOf(branch) {
  const i = [...state.selected].sort().indexOf(branch);
  return i < 0 ? "#cbd5e1" : PALETTE[i % PALETTE.length];
}

function fmt(value, digits) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "string") return value;  // "nan", "inf"
  if (Math.abs(value) >= 1e5 || (Math.abs(value) < 1e-3 && value !== 0)) return value.toExponential(2);
  return value.toFixed(digits === undefined ? 2 : digits);
}

function pct(value) {
  return value === null || value === undefined ? "—" : (100 * value).toFixed(1) + "%";
}

function clock(seconds) {
  if (!seconds) return "";
  const d = new Date(seconds * 1000);
  return d.toLocaleTimeString([], { hour12: false }) + (Date.now() - d > 86400e3 ? " " + d.toLocaleDateString() : "");
}

function short(commit) { return commit ? commit.slice(0, 8) : ""; }

async function getJSON(url) {
  const response = await fetch(url, { cache: "no-cache" });  // revalidates: 304 when unchanged
  const text = await response.text();
  if (!response.ok) {
    let message = text;
    try { message = JSON.parse(text).error || text; } catch (e) { /* plain text */ }
    throw new Error(`${url}: ${response.status} ${message}`);
  }
  return { text, data: JSON.parse(text) };
}

function q(params) {
  const s = new URLSearchParams();
  for (const [k, v] of params) s.append(k, v);
  return s.toString();
}

// ------------------------------------------------------------------------------------ branches
function defaultSelection() {
  const withRuns = state.branches.filter((b) => b.runs.length > 0);
  return new Set(withRuns.slice(-DEFAULT_PLOTTED).map((b) => b.name));
}

async function refreshBranches() {
  const { text, data } = await getJSON("/api/branches");
  if (text === state.branchesText) return false;
  state.branchesText = text;
  state.branches = data.branches;
  state.sources = new Map((data.sources || []).map((s) => [s.commit, s]));
  const names = new Set(state.branches.map((b) => b.name));
  if (!state.picked) state.selected = defaultSelection();
  for (const name of [...state.selected]) if (!names.has(name)) state.selected.delete(name);
  renderBranches();
  return true;
}

function branchMatches(b, filter) {
  if (!filter) return true;
  const hay = [b.name, b.status, b.summary, b.hotfix_of || "", b.rollback_to ? "rollback " + b.rollback_to : "",
    Object.keys(b.transforms).join(" "), b.kind].join(" ").toLowerCase();
  return filter.split(/\s+/).every((word) => hay.includes(word));
}

function rewrittenText(b) {
  const parts = Object.entries(b.transforms).map(([t, n]) => `${t} ×${n}`);
  if (b.counts.skipped) parts.push(`${b.counts.skipped} skipped`);
  if (b.counts.warning) parts.push(`${b.counts.warning} warning(s)`);
  if (b.counts.errors) parts.push(`${b.counts.errors} file error(s)`);
  if (b.kind === "hook") parts.push(`import-hook session, ${b.commits} commit(s)`);
  return parts.join(", ") || (b.summary || "").replace(/^rewrite: /, "");
}

function renderBranches() {
  const filter = state.filter.trim().toLowerCase();
  const newestFirst = [...state.branches].reverse().filter((b) => branchMatches(b, filter));
  const tbody = document.querySelector("#branches tbody");
  const rows = [];
  let lastSource;
  for (const b of newestFirst.slice(0, state.rowLimit)) {
    const source = b.kind === "run" ? b.source_commit : b.kind;
    if (source !== lastSource) {
      rows.push(snapshotRow(b));
      lastSource = source;
    }
    rows.push(branchRow(b));
  }
  tbody.replaceChildren(...rows);
  const more = document.getElementById("more-branches");
  more.hidden = newestFirst.length <= state.rowLimit;
  more.textContent = `show more (${newestFirst.length - state.rowLimit} hidden)`;
  document.getElementById("branch-count").textContent =
    `${newestFirst.length} of ${state.branches.length} branch(es), ${state.selected.size} plotted`;
  renderProfiles(state.branches, state.selected);
}

function snapshotRow(b) {
  let text;
  const marks = [];
  if (b.kind === "hook") text = "import-hook sessions (no snapshot of their own)";
  else if (b.kind === "runs-only") text = "runs whose branch is not in the store";
  else {
    const src = state.sources.get(b.source_commit) || {};
    text = `snapshot #${b.source_index ?? "?"} ${short(b.source_commit)} · ${src.message || ""}`;
    if (b.rollback_to) marks.push(el("span", { class: "badge mark-rollback" }, `rollback to ${b.rollback_to}`));
  }
  return el("tr", { class: "snapshot" }, el("td", { colspan: 9 }, el("span", { class: "rail" }, "●"), text, ...marks));
}

function branchRow(b) {
  const box = el("input", { type: "checkbox", "aria-label": `plot ${b.name}`, "data-branch": b.name });
  box.checked = state.selected.has(b.name);
  box.disabled = b.runs.length === 0;
  box.addEventListener("change", () => {
    state.picked = true;
    if (box.checked) state.selected.add(b.name); else state.selected.delete(b.name);
    renderBranches();
    refreshChartsSoon(true).catch(showError);
  });
  const name = el("a", { onclick: () => showDiff(b.name), title: `${b.commit || ""}\n${b.summary || ""}` }, b.name);
  const marks = [];
  if (b.hotfix_of) marks.push(el("span", { class: "badge mark-hotfix" }, `hot-fix of ${b.hotfix_of}`));
  if (b.rollback_to) marks.push(el("span", { class: "badge mark-rollback" }, "after rollback"));
  if (b.kind === "hook") marks.push(el("span", { class: "badge mark-hook" }, "hook"));
  const fell = b.runs.flatMap((r) => r.fallbacks || []);
  if (fell.length) {
    const lines = fell.map((f) => `${f.op} x${f.count} at ${f.file ? f.file + ":" + f.line : "outside the project"}`);
    marks.push(el("span", { class: "badge mark-fallback", title: lines.join("\n") }, `CPU fallbacks: ${fell.reduce((n, f) => n + f.count, 0)}`));
  }
  const damaged = b.runs.filter((r) => r.damaged).map((r) => `${r.id}: ${r.damaged}`);
  if (damaged.length)  // its numbers rest on the lines that could be read (scalebox_cst.jsonlines)
    marks.push(el("span", { class: "badge mark-damaged", title: damaged.join("\n") }, `damaged lines: ${damaged.length} run(s)`));
  const h = b.headline || {};
  if (shownRun(b).variant === "original")
    marks.push(el("span", { class: "badge mark-original", title: "no rewrite run has numbers yet: the numbers shown are the original's (scalebox run --original)" }, "original's numbers"));
  const status = b.status.replace(" ", "-");
  const live = Boolean(shownRun(b).headline_live);
  return el("tr", { class: "branch" + (state.diffBranch === b.name ? " selected-diff" : ""), "data-branch": b.name },
    el("td", {}, box),
    el("td", { class: "name" },
      el("div", {}, el("span", { class: "swatch", style: `background:${colorOf(b.name)}` }), name, ...marks),
      el("div", { class: "rewritten" }, rewrittenText(b))),
    el("td", {}, el("span", { class: `badge st-${status}` }, b.status)),
    el("td", { class: "num" }, b.runs.length || "—"),
    el("td", { class: "num", title: live ? "live: the run is still writing" : "" }, fmt(h.episodic_return_final) + (live && h.episodic_return_final !== undefined ? "*" : "")),
    el("td", { class: "num" }, fmt(h.episodic_return_best)),
    el("td", { class: "num" }, fmt(h.sps, 0)),
    el("td", { class: "num cpu", title: cpuText(b, h) }, h.cpu_time_s === undefined ? "—" : `${fmt(h.cpu_time_s)} s`),
    el("td", { class: "num", title: whyText(h.guard_fallback_why) || null }, pct(h.guard_pass_rate)),
  );
}

// ------------------------------------------------------------------------------------ charts
// The metrics of the list are drawn by default (ORDER); the others on request, so a
// script logging thirty scalars does not bury the return curve.
function chartSpecs(metrics) {
  const names = Object.keys(metrics);
  const rank = (name) => {
    if (isWorkerReturn(name)) return 0.5;  // right after the run's own process's return
    const i = ORDER.findIndex((o) => (o.endsWith("/") ? name.startsWith(o) : name === o));
    return i < 0 ? ORDER.length : i;
  };
  names.sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
  const known = names.filter((n) => rank(n) < ORDER.length);
  const others = names.filter((n) => rank(n) === ORDER.length);
  const shown = known.length ? known : others.slice(0, 6);
  const specs = [];
  for (const name of [...shown, ...others.filter((n) => state.extra.has(n) && !shown.includes(n))]) {
    specs.push({ metric: name, axis: "step" });
    if (isReturn(name) && !specs.some((s) => s.axis === "time")) specs.push({ metric: name, axis: "time" });
  }
  return { specs: specs.slice(0, MAX_CHARTS), others: others.filter((n) => !shown.includes(n)) };
}

function renderOtherMetrics(others) {
  const holder = document.getElementById("other-metrics");
  const key = JSON.stringify([others, [...state.extra].sort()]);
  if (holder.dataset.key === key) return;
  holder.dataset.key = key;
  if (!others.length) { holder.replaceChildren(); return; }
  const buttons = others.map((name) => {
    const on = state.extra.has(name);
    return el("button", { type: "button", class: on ? "metric on" : "metric", onclick: () => {
      if (state.extra.has(name)) state.extra.delete(name); else state.extra.add(name);
      refreshChartsSoon(true).catch(showError);
    } }, name);
  });
  const open = holder.querySelector("details") && holder.querySelector("details").open;
  holder.replaceChildren(el("details", { open }, el("summary", {}, `${others.length} other metric(s) the runs recorded`), ...buttons));
}

async function refreshCharts(force) {
  const selected = [...state.selected].sort();
  const holder = document.getElementById("charts");
  const note = document.getElementById("charts-note");
  if (!selected.length) {
    for (const chart of state.charts.values()) if (chart.plot) chart.plot.destroy();
    state.charts.clear();
    state.metricsText = "";
    holder.replaceChildren(el("p", { class: "muted" }, "No branch with runs is ticked."));
    note.textContent = "";
    return;
  }
  const branchQuery = selected.map((b) => ["branch", b]);
  const { text, data } = await getJSON("/api/metrics?" + q(branchQuery));
  const { specs, others } = chartSpecs(data.metrics);
  renderOtherMetrics(others);
  const keys = specs.map((s) => `${s.metric}|${s.axis}`);
  if (text !== state.metricsText || force) {
    state.metricsText = text;
    for (const [key, chart] of state.charts) {
      if (!keys.includes(key)) { if (chart.plot) chart.plot.destroy(); state.charts.delete(key); }
    }
    const nodes = [];
    for (const spec of specs) {
      const key = `${spec.metric}|${spec.axis}`;
      let chart = state.charts.get(key);
      if (!chart) {
        chart = { spec, el: el("div", { class: "chart", "data-metric": spec.metric, "data-axis": spec.axis }), plot: null, layout: "", text: "", markers: [] };
        state.charts.set(key, chart);
      }
      nodes.push(chart.el);
    }
    holder.replaceChildren(...(nodes.length ? nodes : [el("p", { class: "muted" }, "The plotted runs have recorded no metric yet.")]));
  }
  note.textContent = `${selected.length} branch(es) plotted`;
  for (const spec of specs) {
    const chart = state.charts.get(`${spec.metric}|${spec.axis}`);
    const width = Math.max(320, chart.el.clientWidth - 10);
    const points = Math.min(2000, Math.max(200, Math.round(width * 1.5)));
    const res = await getJSON("/api/series?" + q([["metric", spec.metric], ["axis", spec.axis], ["points", points], ...branchQuery]));
    if (res.text !== chart.text || force) {
      chart.text = res.text;
      drawChart(chart, res.data, width);
    }
  }
}

// One chart refresh at a time: a request made meanwhile runs once more right after it.
let chartsRunning = null;
function refreshChartsSoon(force) {
  state.chartsForce = state.chartsForce || force;
  if (chartsRunning) { state.chartsAgain = true; return chartsRunning; }
  chartsRunning = (async () => {
    try {
      do {
        state.chartsAgain = false;
        const f = state.chartsForce;
        state.chartsForce = false;
        await refreshCharts(f);
      } while (state.chartsAgain);
    } finally {
      chartsRunning = null;
    }
  })();
  return chartsRunning;
}

function axisTitle(spec) {
  if (spec.axis === "time") return "wall time since the run started (s)";
  return isReturn(spec.metric) ? "environment steps" : "step";
}

// One sorted x for all series (uPlot draws aligned data); null where a series has no point.
function align(tables) {
  const all = [];
  for (const t of tables) for (const x of t[0]) all.push(x);
  all.sort((a, b) => a - b);
  const xs = [];
  for (const x of all) if (!xs.length || xs[xs.length - 1] !== x) xs.push(x);
  const out = [xs];
  for (const t of tables) {
    const cols = t.slice(1).map(() => new Array(xs.length).fill(null));
    let j = 0;
    for (let i = 0; i < t[0].length; i++) {
      while (xs[j] < t[0][i]) j++;
      for (let c = 0; c < cols.length; c++) cols[c][j] = t[c + 1][i];
    }
    out.push(...cols);
  }
  return out;
}

function drawChart(chart, data, width) {
  const banded = new Set();
  for (const band of data.bands) for (const run of band.runs) banded.add(run);
  const tables = [];
  const series = [{ label: chart.spec.axis === "time" ? "s" : "step" }];
  const bands = [];
  for (const band of data.bands) {
    const color = colorOf(band.branch);
    const base = series.length;
    tables.push([band.x, band.mean, band.hi, band.lo]);
    const what = `${band.branch}${band.variant === "original" ? " (original)" : ""}`;
    const dash = band.variant === "original" ? [6, 4] : undefined;  // the baseline: dashed
    series.push({ label: `${what} mean of ${band.n} seeds`, stroke: color, width: 2, spanGaps: true, dash });
    series.push({ label: `${what} max`, stroke: color + "55", width: 1, spanGaps: true, bandEdge: true });
    series.push({ label: `${what} min`, stroke: color + "55", width: 1, spanGaps: true, bandEdge: true });
    bands.push({ series: [base + 1, base + 2], fill: color + (band.variant === "original" ? "14" : "22") });
  }
  const markers = [];
  const notes = [];
  for (const line of data.lines) {
    for (const m of line.markers) markers.push({ x: m.x, color: colorOf(line.branch) });
    if (line.nonfinite) notes.push(`${line.nonfinite} non-finite in ${line.run}`);
    if (banded.has(line.run)) continue;
    const color = colorOf(line.branch);
    tables.push([line.x, line.y]);
    let label = line.run + (line.variant === "original" ? " original" : "") + (line.seed !== null && line.seed !== undefined ? ` seed ${line.seed}` : "");
    if (line.status === "running") label += " ●";
    series.push({ label, stroke: color, width: 1.5, spanGaps: true, dash: line.variant === "original" ? [6, 4] : undefined });
  }
  const title = el("h3", {}, chart.spec.metric, el("span", { class: "muted" }, ` · ${axisTitle(chart.spec)}`));
  const nonfinite = notes.length ? el("div", { class: "nonfinite" }, "▲ " + notes.join(", ") + " (marked at the top, not drawn)") : null;
  if (tables.length === 0) {
    if (chart.plot) { chart.plot.destroy(); chart.plot = null; }
    chart.layout = "";
    chart.el.replaceChildren(title, nonfinite, el("div", { class: "empty muted" }, "no finite points yet"));
    return;
  }
  const aligned = align(tables);
  chart.markers = markers;
  const layout = JSON.stringify([series.map((s) => s.label), bands.length, width]);
  if (chart.plot && layout === chart.layout) {
    chart.plot.setData(aligned);
    chart.el.querySelector("h3").replaceWith(title);
    const old = chart.el.querySelector(".nonfinite");
    if (old) old.remove();
    if (nonfinite) chart.el.insertBefore(nonfinite, chart.el.children[1]);
    return;
  }
  if (chart.plot) chart.plot.destroy();
  chart.el.replaceChildren(title);
  if (nonfinite) chart.el.append(nonfinite);
  const opts = {
    width, height: 200,
    scales: { x: { time: false } },
    axes: [{ label: axisTitle(chart.spec), size: 40, labelSize: 14 }, { size: 60 }],
    series, bands,
    legend: { live: true },
    cursor: { drag: { x: true, y: false } },
    hooks: { draw: [(u) => drawMarkers(u, chart)] },
  };
  chart.plot = new uPlot(opts, aligned, chart.el);
  chart.layout = layout;
  // the band's edges are drawn, not listed: the legend names the mean and says "seeds"
  chart.el.querySelectorAll(".u-legend .u-series").forEach((row, i) => { if (series[i] && series[i].bandEdge) row.style.display = "none"; });
}

function drawMarkers(u, chart) {
  if (!chart.markers.length) return;
  const ctx = u.ctx;
  const top = u.bbox.top;
  ctx.save();
  for (const m of chart.markers) {
    const x = u.valToPos(m.x, "x", true);
    if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
    ctx.fillStyle = "#dc2626";
    ctx.beginPath();
    ctx.moveTo(x, top + 8); ctx.lineTo(x - 4, top); ctx.lineTo(x + 4, top);
    ctx.closePath(); ctx.fill();
  }
  ctx.restore();
}

// ------------------------------------------------------------------------------------ diff
async function showDiff(branch) {
  state.diffBranch = branch;
  state.diffText = "";
  document.getElementById("diff-branch").textContent = branch;
  for (const row of document.querySelectorAll("#branches tr.branch")) row.classList.toggle("selected-diff", row.dataset.branch === branch);
  document.getElementById("diff").replaceChildren(el("p", { class: "muted" }, "loading…"));
  await refreshDiff().catch(showError);
}

async function refreshDiff() {
  if (!state.diffBranch) return;
  const branch = state.diffBranch;
  const { text, data } = await getJSON("/api/diff?" + q([["branch", branch]]));
  if (branch !== state.diffBranch || text === state.diffText) return;
  state.diffText = text;
  renderDiff(data);
}

// Why a guard sent its site to the code as written: "reason (count); ..." (sites.json's fallback_why).
// The run whose numbers a branch row shows (the API's headline_run), or {} where none has any.
function shownRun(b) {
  return b.runs.find((r) => r.id === b.headline_run) || {};
}

// The shown run's CPU time read against the branch's own `--original` runs: a ratio, not a
// verdict (`scalebox compare` says whether a difference is beyond the machine's noise).
function cpuText(b, h) {
  const o = b.original_cpu_time_s;
  if (h.cpu_time_s === undefined) return "no CPU time recorded for this run";
  if (shownRun(b).variant === "original" || !o)
    return "user + system, children included; run the original (scalebox run --original) to read it against";
  return `user + system, children included; the original's: ${fmt(o)} s (median of ${b.original_runs} run(s)), ` +
    `${(h.cpu_time_s / o).toFixed(2)}x of it; scalebox compare says whether that is beyond noise`;
}

function whyText(whys) {
  return (Array.isArray(whys) ? whys : []).map(([why, n]) => `${why} (${n})`).join("; ");
}

function measuredText(site, measured) {
  const m = measured.find((s) => s.path === site.path && s.line === site.line && (!s.transform || s.transform === site.transform))
    || measured.find((s) => s.path === site.path && s.line === site.line);
  if (!m) return null;
  const total = m.vectorized + m.fallback;
  const why = m.fallback && whyText(m.fallback_why) ? `; fell back: ${whyText(m.fallback_why)}` : "";
  return `  — guard took the rewrite ${pct(m.pass_rate)} of ${total} time(s), ${fmt(m.time_s * 1000, 1)} ms in the site${why}`;
}

function renderDiff(data) {
  const holder = document.getElementById("diff");
  const nodes = [el("p", { class: "diff-summary" }, `${data.branch} ${short(data.commit)} (source ${short(data.source_commit)}) · ${data.summary}`)];
  const measured = data.sites_measured || [];
  if (!data.files.length) nodes.push(el("p", { class: "muted" }, "No file changed and no candidate was reported."));
  for (const file of data.files) {
    const part = el("div", { class: "file" }, el("h4", {}, `${file.path} (${file.status})`));
    if (file.error) part.append(el("div", { class: "nonfinite" }, "error: " + file.error));
    const told = new Set();  // a site spanning several hunks gives its reason on the first (as scalebox diff)
    for (const hunk of file.hunks) {
      const box = el("div", { class: "hunk" },
        el("div", { class: "hunk-head" }, `@@ -${hunk.old_start},${hunk.old_count} +${hunk.new_start},${hunk.new_count} @@`));
      for (const site of hunk.sites) {
        const key = JSON.stringify([site.transform, site.line, site.end_line, site.reason]);
        if (told.has(key)) {
          box.append(el("div", { class: "hunk-label" }, `#  ${site.transform} line ${site.line} (continued; reason above)`));
          continue;
        }
        told.add(key);
        const m = measuredText({ ...site, path: file.path }, measured);
        box.append(el("div", { class: "hunk-label" }, `#  ${site.transform} [${site.exactness}] line ${site.line}: ${site.reason}`,
          m ? el("span", { class: "measured" }, m) : null));
      }
      if (hunk.note) box.append(el("div", { class: "hunk-label" }, "#  " + hunk.note));
      const pre = el("pre", { class: "code" });
      for (const [op, line] of hunk.lines) pre.append(el("span", { class: op === "+" ? "add" : op === "-" ? "del" : "" }, op + line));
      box.append(pre);
      part.append(box);
    }
    if (file.left_alone.length) {
      const list = el("ul", { class: "left-alone" });
      for (const s of file.left_alone) {
        const where = s.end_line && s.end_line !== s.line ? `${s.line}-${s.end_line}` : `${s.line}`;
        list.append(el("li", {}, `${s.kind ? s.kind + ": " : ""}line ${where}: ${s.transform} ${s.action}${s.exactness ? " [" + s.exactness + "]" : ""}: ${s.reason}`));
      }
      part.append(el("div", { class: "muted" }, "left alone / warnings:"), list);
    }
    nodes.push(part);
  }
  if (measured.length) {
    const table = el("table", { class: "sites" }, el("thead", {}, el("tr", {},
      el("th", {}, "site"), el("th", {}, "transform"), el("th", {}, "rewrite taken"), el("th", {}, "fallback"),
      el("th", {}, "pass rate"), el("th", {}, "time in site"), el("th", {}, "why it fell back"))));
    const body = el("tbody");
    for (const s of measured) {
      body.append(el("tr", {}, el("td", {}, `${s.path}:${s.line}`), el("td", {}, s.transform),
        el("td", { class: "num" }, s.vectorized), el("td", { class: "num" }, s.fallback),
        el("td", { class: "num" }, pct(s.pass_rate)), el("td", { class: "num" }, fmt(s.time_s * 1000, 1) + " ms"),
        el("td", { class: "why" }, whyText(s.fallback_why) || "—")));
    }
    table.append(body);
    nodes.push(el("h4", {}, "guards per site (all runs of this branch)"), table);
  } else {
    nodes.push(el("p", { class: "muted" }, "No run of this branch has reported guard counts yet."));
  }
  holder.replaceChildren(...nodes);
}

// ------------------------------------------------------------------------------------ events
async function refreshEvents() {
  const { text, data } = await getJSON("/api/events?limit=100");
  if (text === state.eventsText) return;
  state.eventsText = text;
  const items = data.events.map((e) => {
    const where = e.scope === "run" ? e.run : "project";
    const li = el("li", { class: `ev-${e.kind}` },
      el("span", { class: "when" }, clock(e.time)), el("span", { class: "kind" }, e.kind.replaceAll("_", " ")),
      el("span", { class: "muted" }, where + " "), e.message || "");
    if (e.error_tail && e.error_tail.length) {
      li.append(el("details", { open: e.kind === "failed" }, el("summary", {}, "last traceback lines"), el("pre", {}, e.error_tail.join("\n"))));
    }
    return li;
  });
  document.getElementById("events").replaceChildren(...(items.length ? items : [el("li", { class: "muted" }, "no events yet")]));
}

// ------------------------------------------------------------------------------------ loop
function showError(err) {
  const conn = document.getElementById("conn");
  conn.textContent = "error: " + (err && err.message ? err.message : err);
  conn.classList.add("bad");
}

async function tick() {
  try {
    await refreshBranches();
    if (!document.hidden) await refreshChartsSoon(false);
    await refreshEvents();
    if (state.diffBranch && state.ticks % 3 === 0) await refreshDiff();
    state.ticks++;
    document.body.dataset.ticks = String(state.ticks);
    const conn = document.getElementById("conn");
    conn.textContent = `updated ${new Date().toLocaleTimeString([], { hour12: false })} · every ${state.interval / 1000}s`;
    conn.classList.remove("bad");
  } catch (err) {
    showError(err);
  } finally {
    setTimeout(tick, state.interval);
  }
}

async function start() {
  try {
    const { data } = await getJSON("/api/project");
    state.interval = Math.max(250, Math.round(1000 * data.refresh_interval));
    document.getElementById("project-name").textContent = "· " + data.name;
    document.getElementById("project-root").textContent = data.root;
    document.title = `${data.name} · scalebox monitor`;
  } catch (err) {
    showError(err);
  }
  document.getElementById("branch-filter").addEventListener("input", (ev) => {
    state.filter = ev.target.value;
    state.rowLimit = 100;
    renderBranches();
  });
  document.getElementById("more-branches").addEventListener("click", () => { state.rowLimit += 100; renderBranches(); });
  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => refreshChartsSoon(true).catch(showError), 200);
  });
  tick();
}

start();
