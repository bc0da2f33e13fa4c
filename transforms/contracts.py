"""What each run-time guard and rewrite form promises, written once: the ``details`` of a site.

A site's ``reason`` says what was done and how exact, in one breath (at most
:data:`REASON_LIMIT` characters). The full contract of the run-time check that protects a rewrite
(what ``recurrence_ok`` or ``batch_zip`` accepts, what runs when it declines) used to be spelled
out in prose inside every reason, a second copy of the guard's docstring that could drift and made
reasons up to 3,500 characters long. It lives here instead, one entry per guard or form, and the
pipeline attaches the entries a reason names to the site as JSON (``scalebox diff --details``).
The runtime's docstrings describe the arguments; this table is the promise the report makes.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

#: the longest reason a site may carry (a test holds every reason of the corpus and examples to it)
REASON_LIMIT = 300

#: name -> (what it accepts, clause by clause; what happens otherwise)
CONTRACTS: Dict[str, Tuple[Tuple[str, ...], str]] = {
    "recurrence_ok": ((
        "per-step inputs all tensors (or nn.Parameter), all numpy arrays, all lists of tensors or of numpy "
        "rows, or lists of Python floats only where the loop inserts at the front of a list (elsewhere the "
        "loop over floats is faster)",
        "exact types, one float dtype, device and row shape",
        "lists of Python/numpy int or bool flags only with float64 maths",
        "outputs written at [t] tensors where the inputs are tensors (or lists of them), numpy arrays "
        "otherwise, long enough, sharing no memory with an input (a Python list output takes the loop)",
    ), "the original loop runs (kept in the else branch)"),
    "carry_ok": ((
        "the carried value after the first step of the kind and dtype the vectorized steps compute with",
    ), "the other steps run as written"),
    "linear_recurrence": ((
        "values bitwise the loop's on CPU; gradients through it bitwise too where no value they flow through "
        "has more than two uses, in the loop and outside it, else reassociated (autograd sums three or more "
        "contributions in another order)",
        "on other backends a parallel scan, equal to the loop up to rounding (about 1e-6 relative in float32) "
        "where values are finite: an inf carried across steps whose coefficients multiply to below the "
        "dtype's range gives NaN where the loop gives the inf",
        "folded: the last step computed by the vectorized steps where the temporaries it would leave are "
        "read nowhere after the loop",
    ), "the loop runs as written"),
    "fused_linear": ((
        "CPU float32/float64 contiguous tensors, Python-number constants",
        "the loop body as written, compiled for its C kernel, bitwise the loop; the last-step case as "
        "boundary rows",
    ), "the steps run by linear_recurrence"),
    "quadratic_ok": ((
        "per-step inputs all tensors, all numpy arrays or all lists of Python floats",
        "exact types (nn.Parameter too), one float dtype and device",
        "masks 0/1",
        "Python-int coefficients -1, 0 or 1",
    ), "the original loop runs (kept in the else branch)"),
    "batch_zip": ((
        "tensors or lists of equally shaped tensors, exactly torch.Tensor or nn.Parameter, one float dtype "
        "and device",
        "invariants Python numbers or tensors of that dtype",
        "tensor accumulators of that dtype",
        "no output sharing memory with an input",
    ), "the loop runs as written"),
    "loss_zip": ((
        "what batch_zip/batch_range check (tensors or lists of equally shaped tensors, exactly torch.Tensor "
        "or nn.Parameter, one float dtype and device, invariants Python numbers or tensors of that dtype)",
        "equal lengths, at least one sample",
    ), "the loop runs as written"),
    "flat_params": ((
        "plain float32/float64 tensors of one dtype and device",
        "an accumulator that is a number or a tensor sharing no memory with them",
    ), "the loop runs as written"),
    "scatter guard": ((
        "tensors, dtypes, shapes",
        "indices in range (float indices: finite, truncating into range)",
        "no aliasing, no grad on the output",
    ), "the loop runs as written"),
    "stabilize": ((
        "records the gradient norm of the optimizer's parameters every step",
        "skips the step if a gradient is non-finite",
        "clips a norm far above its history (the spike test)",
        "a GradScaler skips non-finite steps itself; scaler.step would unscale as the inserted "
        "scaler.unscale_ does",
    ), "changes nothing: the step runs as written (bitwise), each intervention recorded as a run event"),
    "hoisted": ((
        "zip's arguments evaluated once before the guard, as the loop evaluates them (pure calls only)",
        "both branches (the vectorized one and the loop kept as written) read the hoisted names",
    ), "nothing is hoisted and the loop is not vectorized"),
    "unswitched": ((
        "the condition is evaluated once before the first step, not at every step, and not at all when "
        "there is none",
        "it reads names and attributes the loop neither binds nor writes (attribute reads taken as plain "
        "reads), and the body calls nothing but dtype casts",
    ), "each branch's loop is planned on its own; a branch not vectorized runs as written"),
    "softmax_probs": ((
        "probs statically the unmodified output of a softmax (torch/F.softmax, nn.Softmax, .softmax, an "
        "nn.Sequential attribute ending in nn.Softmax whose layers this file never changes, a name "
        "bound once to one, or a function/method of this file all of whose returns are one)",
        "at run time: a tensor of at least one dim whose softmax was over its last dim (a literal dim of -1 or "
        "ndim - 1, or a 1-D tensor), with 1 <= rows' length <= the dtype's bound: float32 8, float64 2^20, "
        "float16/bfloat16 1 (worst-case rounding (2n-1)u of torch's renormalise-and-sum below 1e-6)",
        "finite logits: NaN/inf give NaN probs, which the original reports with ValueError in __init__ and "
        "the rewrite does not (the contract of Normal with an exp scale)",
        "log_prob without its support check: a value that is not an integer in [0, n) no longer raises "
        "ValueError (a fractional one is truncated, one out of range still raises from gather); actions from "
        ".sample() of the same distribution, or a buffer of them, are always in the support",
        "sample, log_prob, entropy and probs bitwise the original's (validation computes nothing they use)",
    ), "Categorical(probs=p) is built as written, with validation as configured"),
    "graph_cut": ((
        "statically: the network is bound once in a function to a fresh module (torch.nn layers, or a class of "
        "this file deriving from nn.Module alone, building only layers and constants, reading no module-level "
        "name but imports and constants, registering no hook, setting nothing on self after __init__) and is "
        "used only for forwards, load_state_dict/eval/train statements, state_dict() and as an argument of "
        "this file's functions that use it so: its parameters' gradients are read nowhere",
        "statically: the forward's output is not changed in place, stored, returned or passed to unknown code, "
        "and no autograd state of it is read (backward() is allowed)",
        "at run time: the module object is the one marked where it was built, the output is a plain tensor "
        "that requires grad, every argument is a tensor that does not require grad or a Python scalar/None/str, "
        "and no global module forward or backward hook is registered",
        "the output comes back as out.detach().requires_grad_(): same values, requires_grad kept, every other "
        "tensor's gradient bitwise the same (the cut branch reached only the target's parameters)",
    ), "the forward's output is returned as written (graph kept)"),
}
#: names a reason may use for an entry (``batch_range`` is checked as ``batch_zip`` is)
ALIASES = {"batch_range": "batch_zip", "loss_range": "loss_zip"}

_NAMES = re.compile(r"\b(" + "|".join(sorted({*CONTRACTS, *ALIASES}, key=len, reverse=True)) + r")\b")


def contract(name: str) -> Dict[str, Any]:
    """One entry as JSON: ``{"checks": [...], "otherwise": "..."}``."""
    checks, otherwise = CONTRACTS[ALIASES.get(name, name)]
    return {"checks": list(checks), "otherwise": otherwise}


def details_for(reason: str) -> Optional[Dict[str, Any]]:
    """The contracts of every guard and form ``reason`` names, in order of first mention (None: none)."""
    found: Dict[str, Dict[str, Any]] = {}
    for m in _NAMES.finditer(reason):
        name = ALIASES.get(m.group(1), m.group(1))
        if name not in found:
            found[name] = contract(name)
    return {"contracts": found} if found else None


_MORE = " (more: details)"

#: a line break with the layout around it; after an opening bracket / before a closing one
_BREAK_OPEN = re.compile(r"([(\[{])[ \t]*(?:\\)?\r?\n\s*")
_BREAK_CLOSE = re.compile(r"[ \t]*(?:\\)?\r?\n\s*([)\]}])")
_BREAK = re.compile(r"[ \t]*(?:\\)?\r?\n\s*")


def one_line(reason: str) -> str:
    """``reason`` on one line: a transform that quotes a statement written over several lines
    (``param.data.copy_(\\n    flat[i:j].view(...))``) printed a site line broken in two, its second
    half indented like code. Each line break (a backslash continuation's too) and the indentation
    after it become one space, none just inside brackets (``copy_(flat[i:j]...)``)."""
    if "\n" not in reason:
        return reason
    reason = _BREAK_OPEN.sub(r"\1", reason)
    reason = _BREAK_CLOSE.sub(r"\1", reason)
    return _BREAK.sub(" ", reason)


def shorten(reason: str) -> Tuple[str, Optional[str]]:
    """``(reason, None)`` when it fits :data:`REASON_LIMIT`, else its longest head that ends before
    a parenthesis or at a clause (``; ``, ``: ``, ``, ``) and fits with a pointer to the details, and the whole text (kept in
    the site's details: nothing a transform says is lost, the reason stays one breath)."""
    if len(reason) <= REASON_LIMIT:
        return reason, None
    room = REASON_LIMIT - len(_MORE)
    outside = _outside_brackets(reason[:room])
    # the latest strong break first: a clause end, or before a parenthesis, whose content is a
    # detail ("... through a temporary (understood: ...)": cut at the ': ' before it, the reason
    # said what was read and written, not why); then a comma; then a word
    for seps in ((" (", "; ", ": "), (", ",), (" ",)):
        # a cut inside parentheses would leave them open: "... copies (no gradient (more: details)"
        cut = max((i for sep in seps for i in _finds(reason, sep, room) if outside[i]), default=-1)
        if cut > room // 3:
            return reason[:cut] + _MORE, reason
    # no clause ends outside them far enough in: cut inside, and close what is open there
    room -= len(", ...") + 4
    for sep in ("; ", ": ", ", ", " "):
        cut = reason.rfind(sep, 0, room)
        if cut > room // 3:
            return _closed(reason[:cut]) + _MORE, reason
    return _closed(reason[:room]) + _MORE, reason


def _closed(head: str) -> str:
    """``head`` with ``, ...`` and the closers of the brackets still open at its end."""
    opened = _brackets(head)[1]
    if not opened:
        return head
    return head + ", ..." + "".join({"(": ")", "[": "]", "{": "}"}[c] for c in reversed(opened))


def _finds(text: str, sep: str, end: int) -> List[int]:
    """Where ``sep`` starts in ``text[:end]`` (whole occurrences)."""
    out, i = [], text.find(sep, 0, end)
    while i >= 0:
        out.append(i)
        i = text.find(sep, i + 1, end)
    return out


def _outside_brackets(text: str) -> List[bool]:
    """Per character of ``text``: whether no (), [] or {} is open there (backticked code aside)."""
    return _brackets(text)[0]


def _brackets(text: str) -> Tuple[List[bool], List[str]]:
    """One scan of ``text``'s brackets, backticked code aside: per character, whether none is open
    there; and the openers still open at its end (a closer with none open is passed over)."""
    outside: List[bool] = []
    opened: List[str] = []
    code = False
    for ch in text:
        outside.append(not opened and not code)
        if ch == "`":
            code = not code
        elif not code and ch in "([{":
            opened.append(ch)
        elif not code and ch in ")]}" and opened:
            opened.pop()
    return outside, opened


def _strings(value: Any) -> List[str]:
    """Every string in nested dicts and lists (what a transform's own details say)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def site_details(reason: str, given: Optional[Dict[str, Any]] = None) -> Tuple[str, Optional[Dict[str, Any]]]:
    """A site's (reason, details): the reason cut to :data:`REASON_LIMIT` (the whole text in
    ``details["reason"]``), the contracts of every guard and form it or ``given`` names, and
    ``given`` (what a transform says beyond its reason) as they are."""
    short, whole = shorten(one_line(reason))
    found = details_for(" ".join([reason, *_strings(given)])) or {}
    out: Dict[str, Any] = {**(given or {}), **found}
    if whole is not None:
        out["reason"] = whole
    return short, (out or None)
