"""A study's results: ``report.html`` (one offline file), ``optimal_params.json``, and the JSON the
monitor's study page polls.

One data shape (:func:`study_data`) and one renderer (``monitor/static/study.js``) serve both the
offline report (the renderer, uPlot and the data inlined: it opens from disk with no network)
and the live monitor page (``/study?name=S`` fetching ``/api/study``), so they cannot drift.
"""
from __future__ import annotations

import html
import importlib.resources
import json
import math
import os
from typing import Any, Dict, List, Optional

from scalebox_cst import statedir, tmpnames
from scalebox_cst.explore.places import render

OPTIMAL = "optimal_params.json"
REPORT = "report.html"


def _static(name: str) -> str:
    return importlib.resources.files("scalebox_cst.monitor").joinpath("static", *name.split("/")).read_text("utf-8")


def _num(value: Any) -> Any:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def _importance(study, complete: List[Any]) -> Dict[str, Any]:
    """Parameter importance: Optuna's fANOVA where scikit-learn is installed, else its PED-ANOVA
    evaluator (no dependency); {} with under 3 complete trials of different values."""
    if len(complete) < 3 or len({t.value for t in complete}) < 2:
        return {}
    import optuna

    evaluator: optuna.importance.BaseImportanceEvaluator
    try:
        import sklearn  # noqa: F401 - fANOVA's forest
        method, evaluator = "fANOVA", optuna.importance.FanovaImportanceEvaluator(seed=0)
    except ImportError:
        method, evaluator = "PED-ANOVA", optuna.importance.PedAnovaImportanceEvaluator()
    try:
        found = optuna.importance.get_param_importances(study, evaluator=evaluator)
    except (ValueError, RuntimeError, ImportError):
        return {}
    return {"method": method, "values": {k: round(float(v), 4) for k, v in found.items()}}


def study_data(study) -> Dict[str, Any]:
    """Everything the report and the monitor page show of a study, JSON-ready."""
    attrs = study.user_attrs
    config = attrs.get("config", {})
    places = attrs.get("places", {})
    trials = []
    complete = []
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("interrupted"):
            continue
        inter = t.intermediate_values
        trials.append({
            "number": t.number, "state": t.state.name.lower(), "value": _num(t.value),
            "params": t.params, "branch": t.user_attrs.get("branch"), "runs": t.user_attrs.get("runs", []),
            "finals": t.user_attrs.get("finals"), "error": t.user_attrs.get("error"),
            "last_step": max(inter) if inter else None,
            "duration": round(t.duration.total_seconds(), 2) if t.duration else None,
        })
        if t.state.name == "COMPLETE" and _num(t.value) is not None:
            complete.append(t)
    maximize = config.get("direction", "maximize") == "maximize"
    best = sorted(complete, key=lambda t: t.value, reverse=maximize)
    params_space = {}
    for t in study.get_trials(deepcopy=False):
        for key, dist in t.distributions.items():
            if key not in params_space:
                kind = type(dist).__name__
                params_space[key] = {"log": bool(getattr(dist, "log", False)), "choices": list(getattr(dist, "choices", []) or []) or None,
                                     "kind": kind}
    return {
        "study": study.study_name, "config": config, "places": places,
        "counts": {s: sum(1 for t in trials if t["state"] == s) for s in ("complete", "pruned", "fail", "running")},
        "best": [t.number for t in best[:10]], "trials": trials, "space": params_space,
        "importance": _importance(study, complete),
    }


def optimal(study) -> Optional[Dict[str, Any]]:
    """``optimal_params.json``: the best trial's values and where they live in the code."""
    data = study_data(study)
    if not data["best"]:
        return None
    best = next(t for t in data["trials"] if t["number"] == data["best"][0])
    places = data["places"]
    return {
        "study": data["study"], "trial": best["number"], "metric": data["config"].get("metric"),
        "direction": data["config"].get("direction"), "value": best["value"], "branch": best["branch"],
        "params": best["params"],
        "places": {k: {**places[k], "new_text": render(v)} for k, v in best["params"].items() if k in places},
    }


def page(data: Dict[str, Any]) -> str:
    """The offline page: the renderer, uPlot and the data inlined (opens from disk, no network)."""
    payload = json.dumps(data).replace("</", "<\\/")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>scalebox explore: study {html.escape(data['study'])}</title>
<style>{_static('vendor/uPlot.min.css')}</style>
<script>{_static('vendor/uPlot.iife.min.js')}</script>
<script>{_static('study.js')}</script></head>
<body><div id="study"></div>
<script>scaleboxStudy.render(document.getElementById("study"), {payload}, false);</script>
</body></html>
"""


def write(study, directory: str) -> Dict[str, Optional[str]]:
    """Write report.html and optimal_params.json (when a trial completed) into ``directory``."""
    statedir.makedirs(directory)
    data = study_data(study)
    report_path = os.path.join(directory, REPORT)
    out: Dict[str, Optional[str]] = {"report": report_path, "optimal": None}
    _atomic(report_path, page(data))
    best = optimal(study)
    if best is not None:
        out["optimal"] = optimal_path = os.path.join(directory, OPTIMAL)
        _atomic(optimal_path, json.dumps(best, indent=2) + "\n")
    return out


def _atomic(path: str, text: str) -> None:
    """Replace ``path`` with ``text`` through a temporary beside it, never written through a link
    (a link planted at the temporary's name had its target overwritten with the report) and never
    left behind half-written (a full disk): :func:`tmpnames.write_replacing`."""
    tmpnames.write_replacing(path, text.encode("utf-8"), tmpnames.sibling(path, tmpnames.writer_id(thread=True)))
