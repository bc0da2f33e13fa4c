"""The shape of a file's text the transforms see, and the user's shape put back on their output.

Two things in real files make libcst's view of a file differ from the file, so the pipeline takes
them out before the transforms run and puts them back afterwards:

- Form feeds in the indentation of a line of code (GNU-style page breaks: ``\f`` before a
  ``def``) are lost by libcst 1.9, or copied onto every line of a block when its first statement
  has one. Python ignores them (a form feed resets the indentation count), so the transforms see
  the code without them and they go back on the lines they came from (:class:`PageBreaks`).
- A file whose last line has no newline (4% of 2,542 public RL files: all of minimalRL's) is
  parsed by libcst as a module without a trailing newline, which the partial modules of
  ``transforms/partial.py`` cannot stand for: every transform parsed and visited the whole file
  (minimalRL's scripts: 0.82x of the rewrite time with the newline). The transforms see the text
  with a newline added; the output loses it again (libcst writes a module without a trailing
  newline the same way: its code less the last newline).
"""
from __future__ import annotations

import io
import tokenize
from typing import Dict, List, Optional

from scalebox_cst import linediff
from scalebox_cst.textlines import physical_lines


class Shaped:
    """A file's text as the transforms see it (:attr:`code`), and :meth:`restore` for their output."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.breaks = PageBreaks.strip(text)
        code = text if self.breaks is None else self.breaks.stripped
        #: whether a newline was added at the end (never after a backslash continuation or in a
        #: file with carriage returns, whose newline style a ``\n`` would mix)
        self.added_newline = bool(code) and not code.endswith("\n") and not code.endswith("\\") and "\r" not in code
        self.code = code + "\n" if self.added_newline else code

    def restore(self, code: str) -> str:
        """The transforms' output ``code`` in the user's shape: its last newline taken off again
        where one was added, then the form feeds put back."""
        if self.added_newline and code.endswith("\n"):
            code = code[:-1]
        return code if self.breaks is None else self.breaks.restore(code, self.text)


class PageBreaks:
    """Form feeds in the indentation of lines that start a logical line, taken out and put back."""

    def __init__(self, stripped: str, runs: Dict[int, str]) -> None:
        self.stripped = stripped
        self.runs = runs  # 1-based line -> the indentation prefix taken out (through its last \f)

    @classmethod
    def strip(cls, text: str) -> Optional["PageBreaks"]:
        if "\f" not in text:
            return None
        lines = physical_lines(text)
        runs: Dict[int, str] = {}
        for number in logical_line_starts(text):
            line = lines[number - 1]
            indent = line[: len(line) - len(line.lstrip(" \t\f"))]
            if "\f" in indent:
                cut = indent.rindex("\f") + 1
                runs[number] = line[:cut]
                lines[number - 1] = line[cut:]
        return cls("".join(lines), runs) if runs else None

    def restore(self, code: str, original: str) -> str:
        """``code`` (a rewrite of ``stripped``) with the form feeds put back: on every line that is
        unchanged, and on the code that replaced a line that had one (see below). Checked: the
        result must strip back to ``code`` (each form feed opens a logical line, where Python
        ignores it), else only unchanged lines get theirs back."""
        if code == self.stripped:
            return original
        a, b = physical_lines(self.stripped), physical_lines(code)
        opcodes = linediff.opcodes(a, b)
        for carry_replaced in (True, False):
            out = list(b)
            for tag, i1, i2, j1, j2 in opcodes:
                if tag == "equal":
                    for k in range(i2 - i1):
                        run = self.runs.get(i1 + k + 1)
                        if run:
                            out[j1 + k] = run + out[j1 + k]
                elif tag == "replace" and carry_replaced:
                    # line for line when the edit kept the line count (in-line rewrites), else
                    # the first line's, onto the code that replaced it
                    pairs = range(i2 - i1) if i2 - i1 == j2 - j1 else range(1)
                    for k in pairs:
                        run = self.runs.get(i1 + k + 1)
                        if run:
                            out[j1 + k] = run + out[j1 + k]
            result = "".join(out)
            again = PageBreaks.strip(result)
            if again is not None and again.stripped == code:
                return result
        return code


def logical_line_starts(text: str) -> List[int]:
    """Lines (1-based) whose first token starts a logical line (not inside brackets, strings or a
    continuation, not blank or comment-only): where the tokenizer measures indentation."""
    starts: List[int] = []
    fresh = True
    skip = (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER)
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text, newline=None).readline):
            if tok.type == tokenize.NEWLINE:
                fresh = True
            elif tok.type not in skip and fresh:
                starts.append(tok.start[0])
                fresh = False
    except (tokenize.TokenError, SyntaxError):
        return []  # ast accepted the file, so this is rare; libcst then sees the form feeds
    return starts
