// A study's page (scalebox explore): the offline report.html inlines this file with its data;
// the monitor's /study page loads it and polls /api/study. One renderer for both.
(function () {
  "use strict";
  const CSS = `
  .sbx { font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2330; margin: 16px; }
  .sbx h1 { font-size: 18px; margin: 0 0 4px; } .sbx h2 { font-size: 14px; margin: 18px 0 6px; }
  .sbx .muted { color: #6b7280; } .sbx table { border-collapse: collapse; }
  .sbx th, .sbx td { text-align: left; padding: 3px 8px; border-bottom: 1px solid #e3e6eb; white-space: nowrap; }
  .sbx td.num { text-align: right; font-variant-numeric: tabular-nums; }
  .sbx .complete { color: #15803d; } .sbx .pruned { color: #92400e; } .sbx .fail { color: #b91c1c; } .sbx .running { color: #1d4ed8; }
  .sbx .bar { display: inline-block; height: 10px; background: #7c3aed; vertical-align: middle; }
  .sbx .grid { display: flex; flex-wrap: wrap; gap: 12px; } .sbx .plot { border: 1px solid #e3e6eb; padding: 4px; }
  .sbx code { background: #f1f3f7; padding: 0 3px; }`;

  function el(tag, attrs, ...kids) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v; else node.setAttribute(k, v);
    }
    for (const kid of kids) node.append(kid instanceof Node ? kid : document.createTextNode(kid == null ? "" : String(kid)));
    return node;
  }
  const plots = [];  // destroyed before each redraw: uPlot listens on window until destroy()
  const fmt = (v) => (typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toPrecision(4)) : String(v));

  function scatter(title, xs, ys, opts) {
    const order = xs.map((_, i) => i).sort((a, b) => xs[a] - xs[b]);
    const data = [order.map((i) => xs[i]), order.map((i) => ys[i])];
    const series = [{}, { label: opts.ylabel, stroke: "#1d4ed8", paths: () => null, points: { show: true, size: 7, fill: "#1d4ed8" } }];
    if (opts.best) { data.push(order.map((i) => opts.best[i])); series.push({ label: "best so far", stroke: "#15803d", width: 2 }); }
    const box = el("div", { class: "plot" });
    const plot = { title, width: opts.width || 380, height: 220, series, legend: { show: !!opts.best },
      scales: { x: { time: false, distr: opts.log ? 3 : 1 } }, axes: [{ label: opts.xlabel }, { label: opts.ylabel }] };
    if (typeof uPlot !== "undefined" && data[0].length) plots.push(new uPlot(plot, data, box));
    else box.append(el("div", { class: "muted" }, "no complete trial yet"));
    return box;
  }

  function render(root, data, live) {
    if (!document.getElementById("sbx-style")) document.head.append(el("style", { id: "sbx-style" }, CSS));
    while (plots.length) plots.pop().destroy();
    root.replaceChildren();
    const page = el("div", { class: "sbx" });
    root.append(page);
    const cfg = data.config || {};
    const c = data.counts || {};
    page.append(el("h1", {}, `study ${data.study}`, live ? el("span", { class: "muted" }, " · live") : ""));
    page.append(el("div", { class: "muted" }, `${cfg.script || ""} · ${cfg.direction || ""} ${cfg.metric || ""} (mean of its last 10 points, over seeds ${JSON.stringify(cfg.seeds || [])}) · sampler ${cfg.sampler || ""} · prune ${cfg.prune || "none"}`));
    page.append(el("div", { id: "counts" }, `${(data.trials || []).length} trials: ${c.complete || 0} complete, ${c.pruned || 0} pruned, ${c.fail || 0} failed${c.running ? `, ${c.running} running` : ""}`));
    const byNumber = new Map((data.trials || []).map((t) => [t.number, t]));
    const keys = Object.keys(data.places || {});
    // best trials
    page.append(el("h2", {}, "Best trials"));
    const best = el("table", { id: "best" });
    best.append(el("tr", {}, el("th", {}, "trial"), el("th", {}, cfg.metric || "value"), ...keys.map((k) => el("th", {}, k)), el("th", {}, "branch")));
    for (const n of data.best || []) {
      const t = byNumber.get(n);
      best.append(el("tr", {}, el("td", {}, el("a", { href: `#trial-${n}` }, `#${n}`)), el("td", { class: "num" }, fmt(t.value)),
        ...keys.map((k) => el("td", { class: "num" }, fmt(t.params[k]))), el("td", {}, t.branch || "")));
    }
    page.append(best);
    // objective per trial
    page.append(el("h2", {}, "Objective per trial"));
    const done = (data.trials || []).filter((t) => t.state === "complete" && t.value != null);
    const maximize = cfg.direction !== "minimize";
    let run = null;
    const bestSoFar = done.map((t) => (run = run == null ? t.value : (maximize ? Math.max(run, t.value) : Math.min(run, t.value))));
    page.append(scatter("objective", done.map((t) => t.number), done.map((t) => t.value), { xlabel: "trial", ylabel: cfg.metric || "value", best: bestSoFar, width: 780 }));
    // importance
    const imp = (data.importance || {}).values || {};
    page.append(el("h2", {}, `Parameter importance${data.importance && data.importance.method ? ` (${data.importance.method})` : ""}`));
    if (!Object.keys(imp).length) page.append(el("div", { class: "muted" }, "needs at least 3 complete trials with different values"));
    const itab = el("table", { id: "importance" });
    for (const [k, v] of Object.entries(imp)) itab.append(el("tr", {}, el("td", {}, k), el("td", {}, el("span", { class: "bar", style: `width:${Math.round(v * 300)}px` })), el("td", { class: "num" }, v.toFixed(3))));
    page.append(itab);
    // parameter vs objective
    page.append(el("h2", {}, "Parameter vs objective"));
    const grid = el("div", { class: "grid" });
    for (const k of keys) {
      const space = (data.space || {})[k] || {};
      const choices = space.choices;
      const xs = done.map((t) => (choices ? choices.indexOf(t.params[k]) : t.params[k]));
      grid.append(scatter(choices ? `${k} (choice index: ${choices.map(fmt).join(", ")})` : k, xs, done.map((t) => t.value), { xlabel: k, ylabel: cfg.metric || "value", log: space.log }));
    }
    page.append(grid);
    // every trial, with its branch and the code it changed
    page.append(el("h2", {}, "Trials"));
    const all = el("table", { id: "trials" });
    all.append(el("tr", {}, el("th", {}, "trial"), el("th", {}, "state"), el("th", {}, "value"), ...keys.map((k) => el("th", {}, k)), el("th", {}, "branch · runs"), el("th", {}, "code changed")));
    for (const t of data.trials || []) {
      const changed = keys.filter((k) => k in t.params).map((k) => { const p = data.places[k]; return `${p.path}:${p.line} ${p.name} ${p.text} -> ${fmt(t.params[k])}`; }).join("; ");
      const note = t.state === "pruned" && t.last_step != null ? ` at step ${t.last_step}` : (t.error ? `: ${t.error}` : "");
      const where = t.branch ? el("span", { class: "branch", title: `scalebox diff ${t.branch}` }, t.branch) : "";
      all.append(el("tr", { id: `trial-${t.number}` }, el("td", {}, `#${t.number}`), el("td", { class: t.state }, t.state + note), el("td", { class: "num" }, fmt(t.value ?? "")),
        ...keys.map((k) => el("td", { class: "num" }, k in t.params ? fmt(t.params[k]) : "")),
        el("td", {}, where, ` ${(t.runs || []).join(", ")}`), el("td", {}, el("code", {}, changed), t.branch ? el("span", { class: "muted" }, `  (scalebox diff ${t.branch})`) : "")));
    }
    page.append(all);
  }

  function poll(root, name, interval) {
    let last = null;  // redrawn only when the study changed
    const tick = () => fetch(`/api/study?name=${encodeURIComponent(name)}`).then((r) => r.text()).then((text) => {
      if (text === last) return;
      last = text;
      const d = JSON.parse(text);
      if (d.error) root.textContent = d.error; else render(root, d, true);
    }).catch(() => {}).finally(() => setTimeout(tick, interval));
    tick();
  }

  window.scaleboxStudy = { render, poll };
})();
