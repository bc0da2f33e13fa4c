// "Where the time goes" panel: per plotted branch, the profile of its newest run that has one
// (scalebox_cst.profile: a bar per category, the hottest lines). Uses el/pct/colorOf of app.js.
"use strict";

function profileRun(b) {
  const withProfile = b.runs.filter((r) => r.profile && r.profile.categories && r.profile.categories.length);
  return withProfile.reduce((best, r) => (!best || (r.started || 0) >= (best.started || 0) ? r : best), null);
}

function profileCard(b, run) {
  const p = run.profile;
  const bars = p.categories.map((c) => el("div", { class: "prof-row", "data-category": c.category },
    el("span", { class: "prof-label" }, c.label),
    el("span", { class: "prof-track" }, el("span", { class: "prof-bar", style: `width:${(100 * c.share).toFixed(1)}%;background:${colorOf(b.name)}` })),
    el("span", { class: "prof-share" }, pct(c.share))));
  const labels = new Map(p.categories.map((c) => [c.category, c.label]));
  const lines = (p.lines || []).map((l) => el("li", { title: l.coverage ? "transform: " + l.coverage : "" },
    el("span", { class: "prof-share" }, pct(l.share)), " ",
    el("code", {}, l.line === null ? l.path : l.line === 0 ? `${l.path} (added by the rewrite)` : `${l.path}:${l.line}`), " ",
    el("span", { class: "muted" }, `[${labels.get(l.category) || l.category}]`), " ",
    l.code ? el("code", { class: "prof-code" }, l.code) : null));
  return el("div", { class: "prof-card", "data-run": run.id },
    el("div", { class: "prof-head" }, el("span", { class: "swatch", style: `background:${colorOf(b.name)}` }),
      run.id + (run.headline_live ? " (live)" : ""), el("span", { class: "muted" }, ` · ${p.samples} samples, ${p.method || ""}`)),
    ...bars,
    el("ol", { class: "prof-lines" }, ...lines));
}

function renderProfiles(branches, selected) {
  const box = document.getElementById("profiles");
  if (!box) return;
  const cards = [];
  for (const b of branches) {
    if (!selected.has(b.name)) continue;
    const run = profileRun(b);
    if (run) cards.push(profileCard(b, run));
  }
  if (!cards.length) cards.push(el("span", { class: "muted" }, "No profile yet: a plotted branch's runs record one (scalebox profile RUN)."));
  box.replaceChildren(...cards);
}
