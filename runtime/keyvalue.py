"""Numeric ``key=value`` tokens of one line of a run's output, read as metrics.

Scripts print progress as ``step=200 reward=-1455.4``, but just as often with a label or a
counter in front (``ppo step=200 reward=-1455.4``, ``   0 reward=22.77 len=200``). The grammar,
over the whitespace-separated tokens of one logical line:

- a *metric token* is ``KEY=NUMBER`` with at most one trailing ``,`` or ``;``: KEY starts with a
  letter or ``_`` and holds only letters, digits, ``_ . / -`` (so ``--lr=3e-4``, ``?a=1``,
  ``dict(a=1,`` and ``{'a':`` are not keys); NUMBER is a decimal literal (``3``, ``-0.5``,
  ``1e-3``, ``.5``) or ``nan``/``inf``/``-inf`` (no ``1_000``, hex or ``True``). A token whose
  value is not a number (``mode=train``, ``lr=3e-4)``) is a label: skipped, not a metric;
- the line is rejected whole when it looks like an echoed command line, a URL or a repr: a
  token starting with ``-`` and a letter (``--lr``, ``-n``), one holding ``://``, or a token
  with ``=`` and a bracket or quote (``Namespace(lr=0.1,``: its middle tokens ``seed=1,`` would
  otherwise pass);
- the x of the line's metrics: the value of ``global_step=``, ``step=`` or ``frame=`` (in that
  order; these tokens are not metrics themselves), else a leading integer token (``   0 reward=..``),
  else none (the reader counts the points of each name).
A line with no metric token gives nothing. Non-finite values are kept (they are what a user
most needs to see).
"""
from __future__ import annotations

import re
from typing import Dict

#: key=value tokens that are the x of the others on their line, first found wins
STEP_KEYS = ("global_step", "step", "frame")
#: where a line's x came from when it is a leading integer (the key ``parse_line`` gives it)
LEADING = "step"
#: lines longer than this are data dumps, not progress lines
MAX_LINE = 4000

_TOKEN = re.compile(
    r"([A-Za-z_][\w./-]*)=([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf|infinity))[,;]?",
    re.IGNORECASE,
)
_INTEGER = re.compile(r"\d+")
_OPTION = re.compile(r"-{1,2}[A-Za-z]")
_CODE = re.compile(r"=.*[()\[\]{}'\"<>]|[()\[\]{}'\"<>].*=")


def parse_line(line: str) -> Dict[str, float]:
    """``{"step": 200.0, "reward": -1455.4}`` for ``ppo step=200 reward=-1455.4``; {} for a line
    with no metric token. The x (see the module docstring) is under its own key, a leading
    integer under ``step``; callers take it out with :data:`STEP_KEYS`."""
    if len(line) > MAX_LINE or "=" not in line:
        return {}
    tokens = line.split()
    out: Dict[str, float] = {}
    for token in tokens:
        if _OPTION.match(token) or "://" in token or ("=" in token and _CODE.search(token)):
            return {}
        match = _TOKEN.fullmatch(token)
        if match is not None:
            out[match.group(1)] = float(match.group(2))
    if not any(name not in STEP_KEYS for name in out):
        return {}
    if not any(k in out for k in STEP_KEYS) and _INTEGER.fullmatch(tokens[0]):
        out = {LEADING: float(tokens[0]), **out}
    return out
