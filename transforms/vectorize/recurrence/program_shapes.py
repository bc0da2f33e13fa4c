"""A fused program's normal text and parameters, found once per shape of program.

Each loop the fused kernel can run is written as a program text (``fused_program``): its
statements parsed and unparsed (no more parentheses than needed: the text is shown in the
diff), then compiled for its parameters. On a file of thousands of loops that differ only in
names (``adv_1[t] = ...``, ``adv_2[t] = ...``) that was a parse, an unparse and a compile per
loop, ~0.5 ms each (7% of such a file's rewrite). Renaming identifiers one for one changes
neither: the compiler decides by which names are equal, where they stand and whether a name is
``t`` or ``T`` (kept), never by how a name is spelled; ``ast.unparse`` writes a renamed tree as
the renamed text. So a text's names are replaced by placeholders in order of first appearance,
the placeholder text is worked out once, and its answer is renamed back. Texts this cannot
show (a string, an attribute, a character outside ASCII, a placeholder's spelling) are worked
out as they are.
"""
from __future__ import annotations

import ast
import keyword
import re
from typing import Dict, Optional, Tuple

from scalebox_cst import fused_program

_IDENT = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*")
_ATTRIBUTE = re.compile(r"\.\s*[A-Za-z_]")
_PLACEHOLDER = "_sbx_p"
_KEPT = frozenset({"t", "T", *keyword.kwlist, *keyword.softkwlist})
#: placeholder text -> (its normal text, its parameters), or None outside the grammar
_SHAPES: Dict[str, Optional[Tuple[str, Tuple[str, ...]]]] = {}
_MAX_SHAPES = 4096


def normal_program(text: str) -> Optional[Tuple[str, Tuple[str, ...]]]:
    """(``text`` parsed and unparsed statement by statement, joined by ``"; "``; the parameters of
    its program), or None where it does not parse or is outside the fused program's grammar."""
    if not text.isascii() or "'" in text or '"' in text or _PLACEHOLDER in text or _ATTRIBUTE.search(text):
        return _work_out(text)
    names: Dict[str, str] = {}

    def placeholder(m: "re.Match[str]") -> str:
        word = m.group(0)
        if word in _KEPT:
            return word
        got = names.get(word)
        if got is None:
            got = names[word] = f"{_PLACEHOLDER}{len(names)}"
        return got

    shape = _IDENT.sub(placeholder, text)
    if shape not in _SHAPES:
        if len(_SHAPES) >= _MAX_SHAPES:
            _SHAPES.clear()
        _SHAPES[shape] = _work_out(shape)
    done = _SHAPES[shape]
    if done is None:
        return None
    back = {v: k for k, v in names.items()}
    normal = _IDENT.sub(lambda m: back.get(m.group(0), m.group(0)), done[0])
    return normal, tuple(back.get(p, p) for p in done[1])


def _work_out(text: str) -> Optional[Tuple[str, Tuple[str, ...]]]:
    try:
        normal = "; ".join(ast.unparse(st) for st in ast.parse(text).body)
    except SyntaxError:
        return None
    prog = fused_program.program(normal)
    return None if prog is None else (normal, prog.params)
