"""Warnings, log records and ``inspect`` stacks in the user's line numbers, as tracebacks are.

Code served from a rewrite runs under the user's file name with the rewritten file's line
numbers: a ``warnings.warn`` on the user's line 9 ran as line 11 after two lines were inserted
above it, and Python reports ``w.py:11`` (quoting the rewritten file's line 11).
:func:`install` maps each through :func:`scalebox_cst.runtime.loader.origin_of`, the map the
excepthook uses for tracebacks:

- warnings: ``warnings._showwarnmsg``, the one function every shown warning passes through
  (the printed line, a replaced ``warnings.showwarning``, ``logging.captureWarnings`` and the
  records of ``catch_warnings(record=True)``), gets the user's line number and text;
- ``logging``: each record's ``lineno`` (the record factory), and tracebacks the default
  ``Formatter.formatException`` prints (``logger.exception``) come from the excepthook's
  ``format_exception``;
- ``inspect.getframeinfo`` (so ``inspect.stack``, ``getouterframes``, ``getinnerframes``):
  ``lineno``, ``code_context`` and ``positions`` in the user's lines.

Nothing runs until a warning is shown, a record is made or a stack is asked for; files that
were not rewritten cost one dict lookup there. ``logging`` and ``inspect`` are patched when
the program imports them (a finder that answers only for those two names), not imported here.
``frame.f_lineno`` and the code objects are left alone.
"""
from __future__ import annotations

import importlib.abc
import sys
from typing import Callable, Dict, Optional, Tuple

from scalebox_cst.runtime.loader import format_exception as users_traceback, import_machinery, origin_of

_installed = False


def user_line(filename, line) -> Optional[Tuple[int, Optional[str]]]:
    """``(user's line, user's text)`` for a line of a rewritten file; None if ``filename`` was not
    rewritten (or the map fails: a warning must print whatever happens)."""
    if not isinstance(filename, str) or not isinstance(line, int):
        return None
    try:
        origin = origin_of(filename)
        if origin is None:
            return None
        mapped, text, _ = origin.locate(line)
        return mapped, text
    except Exception:
        return None


# ------------------------------------------------------------------------------ warnings
def _patch_warnings(warnings) -> None:
    show = warnings._showwarnmsg

    def _showwarnmsg(msg):
        where = user_line(msg.filename, msg.lineno)
        if where is not None:
            line, text = where
            msg = warnings.WarningMessage(
                msg.message, msg.category, msg.filename, line, msg.file,
                msg.line if msg.line is not None else (text or ""), msg.source,
            )
        return show(msg)

    _showwarnmsg.__wrapped__ = show
    warnings._showwarnmsg = _showwarnmsg


# ------------------------------------------------------------------------------ logging
def _patch_logging(logging) -> None:
    make = logging.getLogRecordFactory()

    def record_factory(*args, **kwargs):
        record = make(*args, **kwargs)
        where = user_line(record.pathname, record.lineno)
        if where is not None:
            record.lineno = where[0]
        return record

    logging.setLogRecordFactory(record_factory)
    format_exception = logging.Formatter.formatException

    def formatException(self, ei):
        if ei and ei[2] is not None and _through_rewritten_code(ei[2]):
            try:
                return users_traceback(*ei).rstrip("\n")
            except Exception:
                pass
        return format_exception(self, ei)

    formatException.__wrapped__ = format_exception
    logging.Formatter.formatException = formatException


def _through_rewritten_code(tb) -> bool:
    while tb is not None:
        if user_line(tb.tb_frame.f_code.co_filename, tb.tb_lineno) is not None:
            return True
        tb = tb.tb_next
    return False


# ------------------------------------------------------------------------------ inspect
def _patch_inspect(inspect) -> None:
    getframeinfo = inspect.getframeinfo

    def _getframeinfo(frame, context=1):
        info = getframeinfo(frame, context)
        where = user_line(info.filename, info.lineno)
        if where is None:
            return info
        try:
            return _users_frameinfo(inspect, info, where[0], context)
        except Exception:
            return info

    _getframeinfo.__wrapped__ = getframeinfo
    inspect.getframeinfo = _getframeinfo


def _users_frameinfo(inspect, info, line: int, context: int):
    original = origin_of(info.filename).original
    lines = index = None
    if context > 0 and original:
        start = max(0, min(line - 1 - context // 2, len(original) - context))
        lines = [text + "\n" for text in original[start:start + context]]
        index = line - 1 - start
    fields = dict(filename=info.filename, lineno=line, function=info.function, code_context=lines, index=index)
    if hasattr(info, "positions"):  # 3.11: columns are the rewritten line's; not the user's
        import dis

        end = line if getattr(info.positions, "end_lineno", None) == info.lineno else None
        fields["positions"] = dis.Positions(line, end, None, None)
    return inspect.Traceback(**fields)


# ------------------------------------------------------------------------------ install
class _OnImport(importlib.abc.MetaPathFinder):
    """Patches ``logging`` / ``inspect`` right after the program first imports them."""

    def __init__(self, patches: Dict[str, Callable]) -> None:
        self.patches = patches

    def find_spec(self, fullname, path=None, target=None):
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        others = [f for f in sys.meta_path if f is not self]  # who would have found it
        del self.patches[fullname]
        if not self.patches and self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in others:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        @import_machinery
        def exec_module(module):
            run(module)
            try:
                patch(module)
            except Exception:  # a module of that name that is not the standard one: left alone
                pass

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Map warnings, log records and inspect stacks to the user's lines (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    import warnings

    _patch_warnings(warnings)
    later: Dict[str, Callable] = {}
    for name, patch in (("logging", _patch_logging), ("inspect", _patch_inspect)):
        module = sys.modules.get(name)
        if module is not None:
            patch(module)
        else:
            later[name] = patch
    if later:
        sys.meta_path.insert(0, _OnImport(later))
