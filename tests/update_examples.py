"""Write the expected outputs of the documented examples after an intended change of a transform.

    .venv/bin/python tests/update_examples.py            # every example; prints the diff
    .venv/bin/python tests/update_examples.py recurrence # the cases whose id contains "recurrence"
    .venv/bin/python tests/update_examples.py --check    # write nothing; exit 1 if any would change

Each rewritten example's output (its transform alone, its backend and options) goes to its golden
file (see scalebox_cst.transforms.base); golden files no example names any more are listed (and
removed with ``--prune``). Run by hand and read the diff: the files are the transforms' spec, and
the test (tests/transforms/test_examples_registry.py) never writes them.
"""
from __future__ import annotations

import argparse
import difflib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import rewrite_example  # noqa: E402

from scalebox_cst.transforms.examples import all_examples, check_names, orphans  # noqa: E402


def diff(old: str, new: str, name: str, context: int = 3) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                        f"{name} (expected)", f"{name} (now)", n=context))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("only", nargs="*", help="substrings of case ids (default: all)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file would change")
    parser.add_argument("--prune", action="store_true", help="remove golden files no example names")
    args = parser.parse_args(argv)
    cases = all_examples()
    problems = check_names(cases)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    changed = 0
    for case in cases:
        if case.golden is None or (args.only and not any(s in case.id for s in args.only)):
            continue
        out, sites = rewrite_example(case)
        if not any(s.action == "rewritten" and s.transform == case.transform.id for s in sites):
            print(f"warning: {case.id}: nothing rewritten (is it still a rewritten example?)", file=sys.stderr)
        old = open(case.golden, encoding="utf-8").read() if os.path.exists(case.golden) else ""
        if old == out:
            continue
        changed += 1
        print(diff(old, out, os.path.relpath(case.golden)) or f"new: {case.golden}")
        if not args.check:
            os.makedirs(os.path.dirname(case.golden), exist_ok=True)
            with open(case.golden, "w", encoding="utf-8", newline="") as fh:
                fh.write(out)
    for path in orphans(cases):
        print(f"{'removed' if args.prune and not args.check else 'named by no example'}: {os.path.relpath(path)}")
        if args.prune and not args.check:
            os.remove(path)
    sys.stdout.flush()
    print(f"{changed} expected output(s) {'would change' if args.check else 'written'}", file=sys.stderr)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
