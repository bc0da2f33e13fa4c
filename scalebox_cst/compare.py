"""Statistics of ``scalebox compare``: one number per run and metric, then means over runs with
bootstrap confidence intervals, and whether a difference between two groups is within noise.

Why bootstrap: a handful of seeds per branch, returns far from normal; the percentile bootstrap
of the mean (and of the difference of means, groups resampled independently) needs no such
assumption. The resampling is seeded, so the same runs always print the same intervals.
A difference is *within noise* when the interval of the difference contains 0; with a single
run on either side there is no noise estimate at all, and the verdict says so.

Speed: steps/s and wall time measure the machine as well as the code. Where a run shared the
machine (other runs of the project at the same time, or a host more loaded than it has CPUs:
scalebox_cst.contention), their difference gets no better/worse and says so, and the CPU time of
the runs (children included), which other load hardly changes, is compared beside them; unless
those runs had several torch intra-op threads: those spin while a sibling waits for a core, so
then CPU time gets no better/worse either.
"""
from __future__ import annotations

import math
import shlex
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from scalebox_cst import contention, fallbacks, headlines, jsonlines, profile, runs
from scalebox_cst.runner import seedopt

#: what ``compare`` shows without --metric: (metric, label, higher is better)
#: (labels and directions: the headline table, scalebox_cst.headlines)
DEFAULT_METRICS: Tuple[Tuple[str, str, Optional[bool]], ...] = tuple(
    ("episodic_return" if h.key == "episodic_return_final" else h.key, h.label, h.higher_is_better)
    for h in headlines.HEADLINES
)
#: metrics measured in wall-clock time: not a speed measurement where runs shared the machine
WALL_CLOCK = ("sps", "SPS", "wall_time")
#: metric names that read a headline key rather than a series
_HEADLINE = {
    "episodic_return": "episodic_return_final",
    "episodic_return_final": "episodic_return_final",
    "episodic_return_best": "episodic_return_best",
    "sps": "sps",
    "SPS": "sps",
    "site_time_s": "site_time_s",
    "guard_pass_rate": "guard_pass_rate",
    "wall_time": "wall_time",
    "cpu_time_s": "cpu_time_s",
}
LEVEL = 0.95
RESAMPLES = 4000
#: a group whose runs of one seed differ needs this many runs before a difference in returns gets a
#: verdict (see seed_loose): below it, the percentile bootstrap of a few draws is far too narrow
SEED_LOOSE_RUNS = 5


def run_value(head: Dict[str, Any], series: Dict[str, Sequence[runs.Point]], metric: str, own: bool = False) -> Optional[float]:
    """One number for ``metric`` in one run: a headline value (see runs.headline), else the mean
    of the last runs.RETURN_WINDOW finite points of the series of that name (the run's own, else
    the engine's ``scalebox/<metric>``: runs.engine_name). ``own``: the user's own series of that
    exact name comes before a headline of the same name (``--metric episodic_return`` where the
    script prints ``episodic_return=``, ``--metric sps`` where it prints ``sps=``)."""
    key = None if own and metric in series else _HEADLINE.get(metric)
    if key == "site_time_s" and head.get("site_samples") == 0:
        return None  # the sites ran too briefly for the sampler to see: not a measured 0 s
    if key is not None:
        value = head.get(key)
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None
    points = series.get(runs.engine_name(series, metric))
    return runs.tail_mean(runs.finite(points)) if points else None


def bootstrap_ci(values: Sequence[float], level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0) -> Optional[Tuple[float, float]]:
    """Percentile bootstrap interval of the mean; None for fewer than two values."""
    v = np.asarray(values, dtype=float)
    if v.size < 2:
        return None
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(resamples, v.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def bootstrap_diff_ci(a: Sequence[float], b: Sequence[float], level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0) -> Optional[Tuple[float, float]]:
    """Percentile bootstrap interval of mean(b) - mean(a), each group resampled on its own."""
    va, vb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if va.size < 2 or vb.size < 2:
        return None
    rng = np.random.default_rng(seed)
    ma = va[rng.integers(0, va.size, size=(resamples, va.size))].mean(axis=1)
    mb = vb[rng.integers(0, vb.size, size=(resamples, vb.size))].mean(axis=1)
    lo, hi = np.quantile(mb - ma, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def describe(values: Sequence[float]) -> Dict[str, Any]:
    """n, mean, sample standard deviation, bootstrap interval of the mean (None for n < 2)."""
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "ci": None}
    mean = float(np.mean(values))
    std = float(np.std(values, ddof=1)) if n > 1 else None
    ci = bootstrap_ci(values)
    return {"n": n, "mean": mean, "std": std, "ci": list(ci) if ci else None}


def verdict(a: Sequence[float], b: Sequence[float], higher_is_better: Optional[bool] = None) -> Dict[str, Any]:
    """The difference mean(b) - mean(a), its interval, and what it means in words."""
    if not a or not b:
        return {"delta": None, "relative": None, "ci": None, "within_noise": None, "text": "no value on one side"}
    ma, mb = float(np.mean(a)), float(np.mean(b))
    delta = mb - ma
    relative = delta / abs(ma) if ma else None
    ci = bootstrap_diff_ci(a, b)
    if ci is None:
        text = f"one run on a side ({len(a)} vs {len(b)}): no noise estimate; run several seeds (--seeds 0,1,2)"
        return {"delta": delta, "relative": relative, "ci": None, "within_noise": None, "text": text}
    within = ci[0] <= 0.0 <= ci[1]
    if within:
        text = "within noise" if delta or ci != (0.0, 0.0) else "no difference"
    else:
        direction = "higher" if delta > 0 else "lower"
        text = direction
        if higher_is_better is not None:
            text += " (better)" if (delta > 0) == higher_is_better else " (worse)"
    return {"delta": delta, "relative": relative, "ci": list(ci), "within_noise": within, "text": text}


def _returns(head: Dict[str, Any], series: Dict[str, Sequence[runs.Point]]) -> Tuple[Tuple[float, float], ...]:
    """A run's episode returns as ``((step, value), ...)``, the form runs are compared in; () without any."""
    return tuple((p.step, p.value) for p in series.get(head.get("metric_return") or "") or ())


def seed_blind(per_run: Sequence[Tuple[runs.RunInfo, Dict[str, Any], Dict[str, Sequence[runs.Point]]]]) -> Optional[List[Any]]:
    """The seeds of a group whose runs, of two or more seeds, recorded the very same episode
    returns, else None. A script that seeds itself (``torch.manual_seed(1)``, ``env.reset(seed=1)``)
    gives one run however many seeds it is started with: the group's spread is then 0 and every
    difference looked certain, its interval a point (a newcomer's runs of sweetice's PPO)."""
    # runs without episodes (an older record, an env the telemetry did not see) say nothing either way
    told = [(r.record.get("seed"), _returns(head, series)) for r, head, series in per_run]
    told = [(seed, returns) for seed, returns in told if returns]
    seeds = [seed for seed, _ in told]
    if len(told) < 2 or None in seeds or len(set(map(str, seeds))) < 2:
        return None
    return seeds if len({returns for _, returns in told}) == 1 else None


def seed_loose(per_run: Sequence[Tuple[runs.RunInfo, Dict[str, Any], Dict[str, Sequence[runs.Point]]]]) -> Optional[Dict[str, Any]]:
    """Two runs of a group started with one seed and the same script arguments whose episode
    returns differ, else None: ``{"seed", "runs", "returns"}`` (the first such pair). The seed
    then does not fix the run (a generator the script and the launcher leave unseeded, threads,
    a nondeterministic kernel), so each run is a fresh draw; with two or three of them a side,
    a percentile bootstrap's interval is far narrower than that spread (Packt's cross-entropy
    CartPole: seed 0 ended at 129.8 and 152.5, and a rewrite's two runs at 101.8 and 101.9 read as
    "lower (worse)", interval [-50.7, -27.9])."""
    seen: Dict[Tuple[str, Any], Tuple[runs.RunInfo, Tuple[Any, ...], Optional[float]]] = {}
    for run, head, series in per_run:
        seed = run.record.get("seed")
        returns = _returns(head, series)
        if seed is None or not returns:
            continue
        key = (str(seed), repr(run.record.get("args")))
        final = run_value(head, series, "episodic_return")  # the figure the table shows
        if key in seen and seen[key][1] != returns:
            first = seen[key]
            return {"seed": seed, "runs": [first[0].id, run.id], "returns": [first[2], final]}
        seen.setdefault(key, (run, returns, final))
    return None


def _returns_by_seed(per_run: Sequence[Any]) -> Dict[str, set]:
    """seed (as text) -> the episode-return series its runs recorded (runs with a seed and returns)."""
    out: Dict[str, set] = {}
    for run, head, series in per_run:
        seed, returns = run.record.get("seed"), _returns(head, series)
        if seed is not None and returns:
            out.setdefault(str(seed), set()).add(returns)
    return out


def _seed_list(seeds: Sequence[str]) -> str:
    return ", ".join(sorted(seeds, key=lambda s: (len(s), s)))


def seed_pairing(first: Tuple[str, Sequence[Any]], other: Tuple[str, Sequence[Any]]) -> Optional[str]:
    """What the seeds say beside a difference of returns: that every seed both sides ran gave
    the very same episode returns on both (a rewrite that changed no number read "+0 (+0.0%)
    [-150, +150], within noise", as if it might have), and where the sides ran other seeds, that
    the means are over other seeds (an original run with seeds 0-3 beside a rewrite with 0, 1
    read "+12.96 ... within noise" where each shared seed was identical). None where neither holds."""
    a, b = _returns_by_seed(first[1]), _returns_by_seed(other[1])
    shared = [s for s in a if s in b]
    if not shared:
        return None
    identical = all(len(a[s] | b[s]) == 1 for s in shared)
    if set(a) == set(b):
        return f"identical episode returns on each seed ({_seed_list(shared)})" if identical else None
    said = (f"other seeds on the two sides ({first[0]}: {_seed_list(list(a))}; {other[0]}: {_seed_list(list(b))}), "
            "so the means are over other seeds")
    if identical:
        said += f"; on the seeds both ran ({_seed_list(shared)}) the episode returns are identical"
    return said


def _project_runs(group: Sequence[runs.RunInfo]) -> List[runs.RunInfo]:
    """Every run of the project the runs of ``group`` belong to (their folders tell it)."""
    for run in group:
        root = run.dir
        for _ in range(len(run.branch.split("/")) + 1):
            root = os.path.dirname(root)
        if os.path.basename(root) == runs.RUNS:
            return runs.list_runs(os.path.dirname(os.path.dirname(root)))
    return []


def usable(group: Sequence[runs.RunInfo]) -> Tuple[List[runs.RunInfo], List[runs.RunInfo]]:
    """(runs that ended ok, the others): failed, stopped or lost runs would skew a mean."""
    ok = [r for r in group if r.status == "ok"]
    return ok, [r for r in group if r.status != "ok"]


def compare(groups: Sequence[Tuple[str, Sequence[runs.RunInfo]]], metrics: Sequence[str] = ()) -> Dict[str, Any]:
    """Compare labelled groups of runs; the first group is the baseline of every difference."""
    chosen = [(m, label, better) for m, label, better in DEFAULT_METRICS] if not metrics else [
        (m, m, next((b for name, _, b in DEFAULT_METRICS if name == m), None)) for m in metrics
    ]
    loaded = []
    project = _project_runs([r for _, g in groups for r in g])
    for label, group in groups:
        ok, excluded = usable(group)
        per_run = []
        for run in ok:
            series, damage = runs.read_series_counted(run.dir)  # runs that ended ok: a cut last line is damage
            head = runs.headline(run.record, series, runs.read_sites(run.dir), damage)
            head["shared_machine"] = contention.shared_machine(run, project)
            per_run.append((run, head, series))
        loaded.append((label, ok, excluded, per_run))
    arg_lists = [_arg_lists(per_run) for _, _, _, per_run in loaded]  # per group, its distinct argument lists
    # a name given with --metric that some run recorded as its own series: that series, in every run
    own = {m: any(m in s for _, _, _, per_run in loaded for _, _, s in per_run) for m in metrics}
    out: Dict[str, Any] = {
        "groups": [
            {
                "label": label,
                "runs": [r.id for r in ok],
                "seeds": [r.record.get("seed") for r in ok],
                "excluded": [{"run": r.id, "status": r.status} for r in excluded],
                "shared_machine": {r.id: h["shared_machine"] for r, h, _ in per_run if h["shared_machine"]},
                "seed_blind": seed_blind(per_run),
                "damaged": {r.id: jsonlines.note(h["damaged"]) for r, h, _ in per_run if h["damaged"]},
                "seed_loose": seed_loose(per_run),
                "args_mixed": _shown_arg_lists(lists) if len(lists) > 1 else [],
            }
            for (label, ok, excluded, per_run), lists in zip(loaded, arg_lists)
        ],
        "metrics": [],
        "builds": _builds([r for _, ok, _, _ in loaded for r in ok]),
    }
    for metric, title, better in chosen:
        rows = []
        values_by_group = []
        for label, _, _, per_run in loaded:
            values = [v for v in (run_value(h, s, metric, own.get(metric, False)) for _, h, s in per_run) if v is not None]
            values_by_group.append(values)
            unseen = sum(1 for _, h, _ in per_run if h.get("site_samples") == 0) if metric == "site_time_s" else 0
            rows.append({"label": label, "values": values, "below_sampling": unseen, **describe(values)})
        if not any(values_by_group) and not any(row["below_sampling"] for row in rows):
            continue
        base = values_by_group[0]
        shared = [sum(1 for _, h, _ in per_run if h["shared_machine"]) for _, _, _, per_run in loaded]
        # CPU time holds under other load only with one intra-op thread: OpenMP's threads spin at
        # each parallel region's barrier while a sibling waits for a core (identical seeded runs
        # of a DQN took 9.5 s and 15.7 s of CPU on a host loaded 5 to 6 on 2 CPUs)
        spun = [sum(1 for _, h, _ in per_run if h["shared_machine"] and _threads(h) > 1) for _, _, _, per_run in loaded]
        blind = [out["groups"][i]["label"] for i in range(len(loaded)) if out["groups"][i]["seed_blind"]]
        loose = [i for i in range(len(loaded)) if out["groups"][i]["seed_loose"] and len(loaded[i][3]) < SEED_LOOSE_RUNS]
        for i, (row, values) in enumerate(zip(rows[1:], values_by_group[1:]), 1):
            row["vs_first"] = verdict(base, values, better)
            same = [label for label in blind if label in (loaded[0][0], loaded[i][0])]
            if same and metric not in WALL_CLOCK and metric != "cpu_time_s" and row["vs_first"]["delta"] is not None:
                row["vs_first"].update(ci=None, within_noise=None, text=(
                    f"no noise estimate: {' and '.join(same)} gave identical episode returns for every seed"))
            few = [loaded[j][0] for j in (0, i) if j in loose]
            if few and metric not in WALL_CLOCK and metric != "cpu_time_s" and row["vs_first"]["delta"] is not None \
                    and row["vs_first"]["ci"] is not None:
                row["vs_first"].update(within_noise=None, text=(
                    f"no verdict: runs of one seed differ in {' and '.join(few)}, and fewer than {SEED_LOOSE_RUNS} "
                    f"runs a side cannot tell that spread from a difference (more seeds: --seeds 0-{SEED_LOOSE_RUNS * 2 - 1})"))
            if metric in WALL_CLOCK and (shared[0] or shared[i]) and row["vs_first"]["delta"] is not None:
                row["vs_first"].update(verdict(base, values, None))  # no better/worse from a shared machine
                row["vs_first"]["shared_machine"] = True
                row["vs_first"]["text"] += (f"; not a speed measurement: {shared[0] + shared[i]} of "
                                            f"{len(loaded[0][3]) + len(loaded[i][3])} runs shared the machine (see CPU time)")
            if metric == "cpu_time_s" and (spun[0] or spun[i]) and row["vs_first"]["delta"] is not None:
                row["vs_first"].update(verdict(base, values, None))
                row["vs_first"]["shared_machine"] = True
                row["vs_first"]["text"] += (f"; not a speed measurement either: {spun[0] + spun[i]} of "
                                            f"{len(loaded[0][3]) + len(loaded[i][3])} runs shared the machine with "
                                            "several torch threads, whose waits for a core count as CPU time "
                                            "(OMP_NUM_THREADS=1, or an idle machine, for a CPU-time comparison)")
            counts = (_thread_counts(loaded[0][3]), _thread_counts(loaded[i][3]))
            if (metric in WALL_CLOCK or metric == "cpu_time_s") and all(counts) and counts[0] != counts[1] \
                    and row["vs_first"]["delta"] is not None:
                row["vs_first"].update(verdict(base, values, None))  # the settings differ, not only the code
                row["vs_first"]["threads_differ"] = True
                row["vs_first"]["text"] += (f"; the runs had other torch thread counts ({loaded[0][0]}: "
                                            f"{_listed(counts[0])}; {loaded[i][0]}: {_listed(counts[1])}): "
                                            "this compares those settings too (OMP_NUM_THREADS)")
            if metric in _HEADLINE and metric.startswith("episodic_return") and row["vs_first"]["delta"] is not None \
                    and not same and not few and arg_lists[0] == arg_lists[i]:
                paired = seed_pairing((loaded[0][0], loaded[0][3]), (loaded[i][0], loaded[i][3]))
                if paired:
                    row["vs_first"]["seeds"] = paired
                    row["vs_first"]["text"] += f"; {paired}"
            given = (arg_lists[0], arg_lists[i])
            # other lists on the two sides, or several on one: a mean over lengths of run is no figure of the code
            if all(given) and (given[0] != given[1] or len(given[0]) > 1 or len(given[1]) > 1) \
                    and row["vs_first"]["delta"] is not None:
                row["vs_first"].update(verdict(base, values, None))  # other work, not only other code
                row["vs_first"]["args_differ"] = True
                if given[0] == given[1]:
                    row["vs_first"]["text"] += (f"; the runs of each side had several script arguments ({_shown_args(given[0])}): "
                                                "the means mix them")
                else:
                    row["vs_first"]["text"] += (f"; the runs had other script arguments ({loaded[0][0]}: {_shown_args(given[0])}; "
                                                f"{loaded[i][0]}: {_shown_args(given[1])}): this compares those arguments too")
        out["metrics"].append({"metric": metric, "title": title, "higher_is_better": better, "groups": rows})
    out["profile"] = profile.compare_shares([(label, ok) for label, ok, _, _ in loaded])
    out["fallbacks"] = fallbacks.per_group([(label, ok) for label, ok, _, _ in loaded])
    return out


#: how a run made before builds were recorded is named beside recorded ones
UNRECORDED_BUILD = "an earlier build (not recorded)"


def _builds(compared: Sequence[runs.RunInfo]) -> Optional[Dict[str, List[str]]]:
    """build -> the compared runs it launched, where they were launched by more than one build of
    the engine (an upgrade between the original's runs and the rewrite's: its seeding, telemetry
    and launcher are part of what a run measured); None where one build made them all, or none
    of them says."""
    found: Dict[str, List[str]] = {}
    for run in compared:
        build = run.record.get("engine")
        found.setdefault(build if isinstance(build, str) and build else UNRECORDED_BUILD, []).append(run.id)
    if len(found) < 2:
        return None
    return found


def _known_threads(head: Dict[str, Any]) -> Optional[int]:
    """torch's intra-op threads in a run (telemetry's at exit), None where it did not say."""
    value = (head.get("last") or {}).get(runs.ENGINE + "intra_op_threads")
    return int(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _threads(head: Dict[str, Any]) -> int:
    return _known_threads(head) or 1


def _thread_counts(per_run: Sequence[Any]) -> frozenset:
    """The thread counts a group's runs said they had (older records say none)."""
    return frozenset(n for n in (_known_threads(h) for _, h, _ in per_run) if n is not None)


def _arg_lists(per_run: Sequence[Any]) -> frozenset:
    """The script arguments a group's runs were started with, one tuple per distinct list (a
    watcher's run of a branch given `--total-steps 3000` sits beside `scalebox run`'s of 6000)."""
    return frozenset(own_args(r.record) for r, _, _ in per_run)


def with_args(groups: Sequence[Tuple[str, Sequence[runs.RunInfo]]], text: str) -> List[Tuple[str, List[runs.RunInfo]]]:
    """``groups`` with only the runs started with the script arguments ``text`` (shell words; the
    seed option ``--seeds`` appended aside): ``compare --args '--episodes 80'``."""
    want = tuple(shlex.split(text))
    return [(label, [r for r in group if own_args(r.record) == want]) for label, group in groups]


def own_args(record: Dict[str, Any]) -> Tuple[str, ...]:
    """A run's script arguments without the ``--seed N`` that ``scalebox run --seeds`` appended
    (seed_via "option"): runs of seeds 0, 1 and 2 were started with the same arguments."""
    args = [str(a) for a in (record.get("args") or ())]
    if record.get("seed_via") == "option":
        args = seedopt.without_seed(args, record.get("seed"))
    return tuple(args)


def _shown_args(lists: frozenset) -> str:
    return " | ".join(_shown_arg_lists(lists))


def _shown_arg_lists(lists: frozenset) -> List[str]:
    """Each argument list as shell words, sorted, cut to 60 characters."""
    shown = sorted(shlex.join(args) or "none" for args in lists)
    return [text if len(text) <= 60 else text[:57] + "..." for text in shown]


def _listed(counts: frozenset) -> str:
    return ", ".join(str(n) for n in sorted(counts))


def _fmt(value: Optional[float]) -> str:
    if value is None:
        return "-"
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
        return f"{value:.3g}"
    return f"{value:.4g}" if abs(value) < 100 else f"{value:.1f}"


def render(result: Dict[str, Any]) -> str:
    """Plain text: per metric, each group's mean [interval] (n), and each difference in words."""
    lines: List[str] = []
    groups = result["groups"]
    for g in groups:
        seeds = [s for s in g["seeds"] if s is not None]
        line = f"{g['label']}: {len(g['runs'])} run(s)"
        if g["runs"]:
            line += " " + ", ".join(g["runs"])
        unseeded = len(g["seeds"]) - len(seeds)  # a watcher's runs: seeded by nothing of the engine's
        if seeds or unseeded:
            line += " (" + "; ".join(part for part in (
                f"seeds {', '.join(str(s) for s in seeds)}" if seeds else "",
                f"{unseeded} not seeded by scalebox" if unseeded else "") if part) + ")"
        if g["excluded"]:
            line += "; left out: " + ", ".join(f"{e['run']} ({e['status']})" for e in g["excluded"])
        if not g["runs"]:  # its rows would all read "-": one line says so, and how to make a run
            line += (f"; nothing to compare: `scalebox run {'--original ' if g['label'].startswith('original') else ''}"
                     "SCRIPT` makes a run of it")
        lines.append(line)
        if g.get("seed_loose"):
            loose_ = g["seed_loose"]
            lines.append(f"  runs of seed {loose_['seed']} differ ({', '.join(loose_['runs'])}: final return "
                         f"{' vs '.join(_fmt(v) for v in loose_['returns'])}): the seed does not fix the run (an "
                         "unseeded generator, threads, a nondeterministic kernel), so each run is a new draw")
        if g.get("seed_blind"):
            lines.append(f"  seeds {', '.join(str(x) for x in g['seed_blind'])} gave identical episode returns: the script "
                         "seems to set its own seed (torch.manual_seed, env.reset(seed=...)), so these runs are one sample")
        if g.get("args_mixed"):
            lines.append(f"  its runs had several script arguments ({' | '.join(g['args_mixed'])}): each mean mixes "
                         "them; compare the runs of one list: --args '...'")
        for run_id, said in (g.get("damaged") or {}).items():  # its numbers rest on the readable lines
            lines.append(f"  {run_id}: {said}")
        shared = g.get("shared_machine") or {}
        if shared:
            whys = "; ".join(f"{run_id}: {why}" for run_id, why in shared.items())
            lines.append(f"  {len(shared)} of {len(g['runs'])} shared the machine ({whys}): their wall time and steps/s are not a speed measurement")
    builds = result.get("builds")
    if builds:
        shown = "; ".join(f"{build}: {', '.join(ids[:4])}{' ...' if len(ids) > 4 else ''}" for build, ids in builds.items())
        lines.append(f"runs made by {len(builds)} builds of scalebox ({shown}): their seeding, telemetry and launcher "
                     "may differ, so a difference may be the engine's as well as the code's")
    if not result["metrics"]:
        lines.append("no metric to compare (no finished run has one)")
    width = max((len(g["label"]) for g in groups), default=4)
    for m in result["metrics"]:
        lines.append("")
        lines.append(m["title"])
        for g, row in zip(groups, m["groups"]):
            if not g["runs"]:  # said once, in its header line
                continue
            text = f"  {row['label']:<{width}}  "
            unseen = row.get("below_sampling")
            if row["n"] == 0:
                lines.append(text + (f"below sampling in {unseen} run(s): the sites ran too briefly to be seen" if unseen else "-"))
                continue
            text += _fmt(row["mean"])
            if row["ci"]:
                text += f"  [{_fmt(row['ci'][0])}, {_fmt(row['ci'][1])}]"
            text += f"  (n={row['n']}{f'; {unseen} below sampling' if unseen else ''})"
            diff = row.get("vs_first")
            if diff and diff["delta"] is not None:
                rel = f" ({diff['relative'] * 100:+.1f}%)" if diff["relative"] is not None else ""
                ci = f" [{diff['ci'][0]:+.4g}, {diff['ci'][1]:+.4g}]" if diff["ci"] else ""
                text += f"   vs {groups[0]['label']}: {diff['delta']:+.4g}{rel}{ci}, {diff['text']}"
            elif diff:
                text += f"   vs {groups[0]['label']}: {diff['text']}"
            lines.append(text)
    sizes = [len(g["runs"]) for g in groups]
    if any(1 < n < 5 for n in sizes):
        lines.append("")
        lines.append(f"[...]: {LEVEL:.0%} bootstrap intervals; with fewer than 5 runs in a group they are rough (more seeds: --seeds 0-4)")
    elif any(n > 1 for n in sizes):
        lines.append("")
        lines.append(f"[...]: {LEVEL:.0%} bootstrap intervals (of the mean; after vs: of the difference)")
    return "\n".join(lines) + "\n" + profile.render_shares(result.get("profile")) + fallbacks.render_groups(result.get("fallbacks"))
