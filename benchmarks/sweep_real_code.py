"""Robustness sweep: the whole pipeline over a folder of real, whole RL files, on every backend.

The unit tests and the snippet corpus check what each transform does with the patterns it
knows; this sweep checks that nothing goes wrong on everything else a user's file holds. For
every ``.py`` file in the folder and every backend it runs ``Pipeline(Config(), backend)`` once
(default options, or those given with ``--option``; timed, a slow time re-measured, best of
three) and reports per file the rewrite's wall time and its sites by transform and action.
A PROBLEM is any of:

  (a) ``not-analysed``  a site whose reason starts with "not analysed" (a transform raised
                        while analysing that site: an analysis bug);
  (b) ``error``         the FileReport has an error that is not the input's fault (a transform
                        raised or emitted invalid code; libcst refused a file that ``ast`` took);
  (c) ``no-compile``    the output does not compile, or compiles with a warning the input has
                        not (a SyntaxWarning from emitted code);
  (d) ``not-idempotent``  rewriting the output again changes it, or reports REWRITTEN sites
                        (the engine's own guards and kept-verbatim else branches must not be
                        candidates a second time);
  (e) ``outside-span``  lines outside the rewritten sites' spans changed: every changed or
                        removed input line must lie in the span of a REWRITTEN site, and every
                        inserted line must be an import line or sit next to such a span;
  (f) ``slow``          a rewrite slower than ``--slow-ms`` (200 ms) for a file under 1000 lines.

Input that is not the engine's to fix (not UTF-8, a SyntaxError for this Python, code ``ast``
parses but CPython's compiler refuses, as ``x = 1`` before ``global x``) is listed as a note,
not a problem. Files are not changed. Exit status 1 if any problem, else 0.

    OMP_NUM_THREADS=1 python benchmarks/sweep_real_code.py FOLDER [--backends cpu cuda npu]
        [--sites] [--skipped] [--json OUT.json] [--slow-ms 200] [--option device.allow_precision_change=True]

``--sites`` prints every site of every file (all backends), ``--skipped`` only the SKIPPED and
WARNING ones (to judge noise); ``--json`` writes everything for later comparison.
"""
from __future__ import annotations

import argparse
import ast
import collections
import dataclasses
import difflib
import json
import os
import re
import statistics
import sys
import time
import warnings
from typing import Dict, List, Optional, Sequence

from scalebox_cst.config import Config
from scalebox_cst.pipeline import Pipeline
from scalebox_cst.report import REWRITTEN, SKIPPED, WARNING, Site
from scalebox_cst.runtime.loader import physical_lines

BACKENDS = ("cpu", "cuda", "npu")
IMPORT_LINE = re.compile(r"^\s*(import\s+\S|from\s+\S+\s+import\s)")


@dataclasses.dataclass
class Problem:
    file: str
    backend: str
    kind: str
    detail: str

    def describe(self) -> str:
        return f"{self.file} [{self.backend}] {self.kind}: {self.detail}"


@dataclasses.dataclass
class Outcome:
    file: str
    backend: str
    lines: int
    ms: float
    status: str
    sites: List[Site]
    note: Optional[str] = None


def timed_rewrite(pipeline: Pipeline, name: str, data: bytes, slow_ms: float):
    t0 = time.perf_counter()
    result = pipeline.rewrite(name, data)
    ms = (time.perf_counter() - t0) * 1000
    if ms > slow_ms:  # re-measure: one slow run can be the machine, not the engine
        for _ in range(2):
            t0 = time.perf_counter()
            pipeline.rewrite(name, data)
            ms = min(ms, (time.perf_counter() - t0) * 1000)
    return result, ms


def compile_warnings(code: bytes, name: str) -> set:
    """The warnings compiling ``code`` emits (SyntaxWarning for an invalid escape...); raises
    SyntaxError/ValueError when it does not compile."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compile(code, name, "exec", dont_inherit=True)
    return {f"{w.category.__name__}: {w.message}" for w in caught}


def changed_outside(source: str, output: str, sites: Sequence[Site]) -> List[str]:
    """Input lines changed outside every REWRITTEN span, and inserted lines that are neither
    imports nor next to such a span (1-based input line numbers in the messages)."""
    spans = [(s.line, s.end_line) for s in sites if s.action == REWRITTEN]

    def covered(line: int) -> bool:
        return any(a <= line <= b for a, b in spans)

    a = [line.rstrip("\r\n") for line in physical_lines(source)]
    b = [line.rstrip("\r\n") for line in physical_lines(output)]
    out: List[str] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        new = b[j1:j2]
        if tag == "insert":
            # inserted after input line i1: fine as imports, or touching a span
            if all(IMPORT_LINE.match(x) or not x.strip() for x in new):
                continue
            if any(a_ - 1 <= i1 <= b_ for a_, b_ in spans):
                continue
            out.append(f"lines inserted after input line {i1} outside any rewritten span: {new[0].strip()[:70]!r}")
            continue
        bad = [n for n in range(i1 + 1, i2 + 1) if not covered(n)]
        if not bad:
            continue
        # difflib may pair an inserted import block with an unchanged neighbour: accept a
        # replace whose new side is the old lines plus imports
        kept = [x for x in new if not IMPORT_LINE.match(x)]
        if tag == "replace" and [x for x in kept if x.strip()] == [x for x in a[i1:i2] if x.strip()]:
            continue
        out.append(f"input line(s) {bad[0]}" + (f"-{bad[-1]}" if len(bad) > 1 else "")
                   + f" changed outside any rewritten span: {a[bad[0] - 1].strip()[:70]!r}")
    return out


def check_file(path: str, pipelines: Dict[str, Pipeline], slow_ms: float, name: Optional[str] = None):
    name = name or os.path.basename(path)  # as the report shows it (the path below the folder swept)
    with open(path, "rb") as fh:
        data = fh.read()
    outcomes: List[Outcome] = []
    problems: List[Problem] = []
    for backend, pipeline in pipelines.items():
        result, ms = timed_rewrite(pipeline, name, data, slow_ms)
        report = result.report
        text = data.decode("utf-8-sig", "replace")  # a BOM stays at the head of the file, before any import
        lines = len(physical_lines(text))
        outcome = Outcome(name, backend, lines, ms, report.status, list(report.sites))
        outcomes.append(outcome)

        def problem(kind: str, detail: str) -> None:
            problems.append(Problem(name, backend, kind, detail))

        if report.error:
            if result.bad_input and "libcst" not in report.error:
                outcome.note = report.error
                continue
            problem("error", report.error)
            continue
        for site in report.sites:
            if site.reason.startswith("not analysed"):
                problem("not-analysed", site.describe())
        try:
            old_warnings = compile_warnings(data, name)
        except (SyntaxError, ValueError) as exc:  # ast took it, CPython's compiler does not
            outcome.note = f"the input does not compile: {type(exc).__name__}: {exc}"
            continue
        try:
            new_warnings = compile_warnings(result.output, name) - old_warnings
        except (SyntaxError, ValueError) as exc:
            problem("no-compile", f"{type(exc).__name__}: {exc}")
            continue
        if new_warnings:
            problem("no-compile", f"the output compiles with new warnings: {sorted(new_warnings)}")
        if ms > slow_ms and lines < 1000:
            problem("slow", f"{ms:.0f} ms for {lines} lines")
        if result.output != data:
            again = pipeline.rewrite(name, result.output)
            new_sites = [s for s in again.report.sites if s.action == REWRITTEN]
            if again.report.error:
                problem("not-idempotent", f"second rewrite failed: {again.report.error}")
            elif again.output != result.output or new_sites:
                what = "; ".join(s.describe() for s in new_sites[:3]) or "output changed, no REWRITTEN site"
                problem("not-idempotent", what)
            out_text = result.output.decode("utf-8-sig")
            for message in changed_outside(text, out_text, report.sites):
                problem("outside-span", message)
    return outcomes, problems


def site_key(site: Site) -> str:
    return f"{site.transform}:{site.action}"


def summarise(outcomes: List[Outcome], problems: List[Problem], backends: Sequence[str]) -> str:
    rows = collections.OrderedDict()
    for o in outcomes:
        rows.setdefault(o.file, {})[o.backend] = o
    per_file_problems = collections.Counter(p.file for p in problems)
    width = max([len(f) for f in rows] + [4])
    width = min(width, 60)
    head = f"{'file':<{width}} {'lines':>5} " + " ".join(f"{b + ' ms':>8}" for b in backends)
    head += f" {'rewr':>4} {'skip':>4} {'warn':>4} {'prob':>4}"
    out = [head, "-" * len(head)]
    for file, by_backend in rows.items():
        any_o = next(iter(by_backend.values()))
        counts = collections.Counter()
        for o in by_backend.values():
            counts.update(s.action for s in o.sites)
        n = len(by_backend)
        cells = " ".join(f"{by_backend[b].ms:8.1f}" if b in by_backend else f"{'-':>8}" for b in backends)
        short = file if len(file) <= width else "..." + file[-(width - 3):]
        out.append(
            f"{short:<{width}} {any_o.lines:5d} {cells} {counts[REWRITTEN] / n:4.0f} {counts[SKIPPED] / n:4.0f}"
            f" {counts[WARNING] / n:4.0f} {per_file_problems[file]:4d}"
        )
    out.append("(rewr/skip/warn: sites per backend, averaged over backends)")
    out.append("")
    out.append("sites by transform and action, per backend:")
    table: Dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for o in outcomes:
        for s in o.sites:
            table[site_key(s)][o.backend] += 1
    for key in sorted(table):
        out.append(f"  {key:<40} " + " ".join(f"{b}={table[key][b]}" for b in backends))
    out.append("")
    for b in backends:
        times = [o.ms for o in outcomes if o.backend == b]
        if times:
            out.append(
                f"rewrite time per file [{b}]: median {statistics.median(times):.1f} ms, "
                f"max {max(times):.1f} ms, total {sum(times) / 1000:.2f} s over {len(times)} files"
            )
    notes = [o for o in outcomes if o.note]
    if notes:
        out.append("")
        out.append("inputs left alone (not the engine's to fix):")
        for o in notes:
            out.append(f"  [{o.backend}] {o.note}")
    return "\n".join(out)


def python_files(folder: str) -> list:
    """Every ``.py`` file below ``folder`` (a fetched repository keeps its tree), hidden folders
    (``.git``) left out, sorted."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(os.path.join(root, f) for f in names if f.endswith(".py"))
    return sorted(found)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder")
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--slow-ms", type=float, default=200.0)
    parser.add_argument("--sites", action="store_true", help="print every site")
    parser.add_argument("--skipped", action="store_true", help="print SKIPPED and WARNING sites")
    parser.add_argument("--json", help="write outcomes and problems to this file")
    parser.add_argument(
        "--option", action="append", default=[], metavar="SECTION.KEY=VALUE",
        help="a config option for every run (value read as a Python literal, else a string)",
    )
    args = parser.parse_args(argv)
    config = Config()
    for item in args.option:
        name, _, raw = item.partition("=")
        section, _, key = name.partition(".")
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        config.set_option(section, key, value)

    files = python_files(args.folder)
    if not files:
        print(f"no .py files in {args.folder}", file=sys.stderr)
        return 2
    pipelines = {b: Pipeline(config, backend=b) for b in args.backends}
    for pipeline in pipelines.values():  # warm up imports and caches before timing
        pipeline.rewrite("warmup.py", b"import torch\nfor p in m.parameters():\n    p.data.mul_(2)\n")

    outcomes: List[Outcome] = []
    problems: List[Problem] = []
    for path in files:
        o, p = check_file(path, pipelines, args.slow_ms, os.path.relpath(path, args.folder))
        outcomes.extend(o)
        problems.extend(p)

    print(summarise(outcomes, problems, args.backends))
    if args.sites or args.skipped:
        print("")
        print("sites:")
        seen = set()
        for o in outcomes:
            for s in o.sites:
                if args.skipped and s.action == REWRITTEN:
                    continue
                key = (o.file, s)
                backends = [x.backend for x in outcomes if x.file == o.file and s in x.sites]
                if key in seen:
                    continue
                seen.add(key)
                print(f"  {s.describe(o.file)}  [{','.join(backends)}]")
    print("")
    if problems:
        print(f"PROBLEMS ({len(problems)}):")
        for p in problems:
            print(f"  {p.describe()}")
    else:
        print("PROBLEMS: none")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "outcomes": [
                        {**dataclasses.asdict(o), "sites": [s.to_json() for s in o.sites]} for o in outcomes
                    ],
                    "problems": [dataclasses.asdict(p) for p in problems],
                },
                fh,
                indent=1,
            )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
