"""The guard of rewritten linear recurrences (``recurrence_ok``) and of the values they carry
into the vectorized steps (``carry_ok``): the kinds, dtypes, devices, shapes and aliasing under
which the vectorized branch computes what the loop computes."""
from __future__ import annotations

import operator
from collections import deque
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..guard_reasons import no
from ..fused import fused_linear  # noqa: F401  (the one-pass tier of rewritten recurrences)
from .kinds import (
    _FLOATS_N,
    _FLOATS_T,
    _NUMPY2,
    _PY_SCALARS,
    _TENSORS,
    _array,
    _broadcasts_into,
    _checked_kind,
    _main_mode,
    _mode_of,
    _ndarray,
    _same_rows,
    _small,
    _shares,
    _tensor,
    _weak,
)

#: Shortest sequence worth vectorizing, per kind of input: below it the op's fixed cost (about
#: 20-30 us a call) exceeds what the loop costs. Measured on a 2-core CPU, one thread: a torch GAE
#: step costs about 14 us, a numpy one 3.5 us, a step over a list of floats 0.05-0.12 us (the
#: insert(0) variant grows with T); break-even at about 5, 10 and 420 steps. A step over lists of
#: numpy rows (minimalRL's a2c) costs about 1.1 us, the rewrite 30 us plus 0.25 us a step (checking
#: and stacking the rows): break-even at about 40 steps, 3x faster at 2048.
#: Lists of Python floats ("float") are vectorized only where the loop inserts at the front of a
#: list (``returns.insert(0, R)``, quadratic in the loop): measured on CPU, the list -> tensor ->
#: list round trip costs more than the whole loop everywhere else (appending: 0.26-0.48x from 512
#: to 262144 steps; into an ndarray by index: 0.33-1.03x), so "float_appended" (every other
#: output) is never reached in practice; insert(0) wins from about 768 steps (1.1x; 2x at 2048,
#: 11x at 4096). Tests that lower every entry reach both paths.
MIN_STEPS = {"torch": 6, "tlist": 6, "numpy": 12, "nlist": 48, "float": 1024, "float_appended": 1 << 62}



def recurrence_ok(
    T: int,
    seqs: Sequence[Tuple[Any, int]] = (),
    conds: Sequence[Tuple[Any, int]] = (),
    consts: Sequence[Any] = (),
    scalars: Sequence[Any] = (),
    outs: Sequence[Any] = (),
    lists: Sequence[Any] = (),
    memo: Sequence[Any] = (),
    *,
    deques: Sequence[Any] = (),
    reads: Sequence[Tuple[Any, int]] = (),
    cells: Sequence[Any] = (),
    aligned: bool = False,
    sliced: bool = False,
    front: bool = False,
    divides: bool = False,
    cpu: bool = False,
    weak: bool = True,
) -> bool:
    """Whether a vectorized recurrence reproduces the loop exactly for these values.

    ``seqs``: ``(container, extra)`` pairs read per step in arithmetic (``len >= T + extra``);
    all torch tensors, all numpy arrays, all lists of Python floats or all lists of tensors, of
    one floating dtype (float32/float64), one row shape, one device (what may require grad: see
    below). Types are exact (``torch.Tensor`` or ``nn.Parameter``, ``np.ndarray``; never
    ``np.matrix``, ``np.ma`` or other subclasses). Next to them: lists of Python floats, ints /
    bools (done flags; ``|x| <= 2**16``) where the maths is float64 and nothing divides (they meet
    Python floats in the loop, in float64, and the same values as float64 arrays in the rewrite;
    with float32 maths a flag meeting a Python float first would round once in the loop and twice
    in the rewrite), lists of numpy int / bool scalars likewise next to tensors (torch treats them
    as Python numbers), and lists of numpy scalars of one type next to numpy arrays or alone
    (NEP 50: they promote as arrays of their dtype do), and bool tensors (skrl's
    ``terminated.logical_not()``) next to tensors of the default dtype. The carried value is checked after the
    first step by :func:`carry_ok`. ``conds``: ``(container, extra)`` read per step only for their truth value (1-D).
    ``consts``: loop-invariant operands (Python numbers, or arrays of that dtype whose shape
    broadcasts into the row shape). ``scalars``: invariants that form a per-step-constant
    coefficient (Python numbers or 0-d arrays). ``outs``: arrays written at ``[t]`` (same kind,
    no aliasing with any input). ``lists``: Python lists appended / inserted into. ``deques``:
    ``collections.deque`` objects ``appendleft`` is called on (the vectorized steps call
    ``extendleft``, which is a series of ``appendleft``, ``maxlen`` included). ``aligned``: the
    vectorized code binds the per-step inputs with :func:`seqs_of`, so their rows may differ in
    shape where they broadcast (the row is then their broadcast shape). ``reads``: ``(out, n)``,
    outputs the loop reads back at ``[t]`` with ``n`` integer indices after writing them: those
    rows (minus ``n`` dims) must have the row's rank, to line up with the inputs. ``cells``:
    outputs whose rows hold exactly one element (the loop reads ``out[t, 0]`` back as the carried
    value where the rewrite carries the row). ``memo``: arrays
    written at ``[t]`` and read back at ``[t + 1]`` (they carry the recurrence).
    ``sliced``: the loop walks ``x[::-1]`` (tensors do not support that). ``front``: the loop
    writes its outputs at a list's front (``insert(0, v)``, ``appendleft``): only then do lists of
    Python floats pay (see MIN_STEPS). ``divides``: the maths
    divides (Python floats raise on zero where arrays give inf: lists of floats are refused).
    ``cpu``: tensors must be on the CPU (where the op is bitwise exact; elsewhere it reassociates).
    ``weak=False``: the loop appends items made of per-step values alone (no carried value), which
    are Python numbers where those are: lists of Python / numpy scalars must then not become arrays.

    Autograd (grad mode on and some tensor operand requires grad): the rewrite is differentiable
    (:func:`linear_recurrence` has a backward, the peeled steps and the vectorized ``a`` / ``b``
    expressions are ordinary torch ops, :func:`seq_of` stacks and :func:`items_of` hands out
    tensors with their own history), so such operands are accepted when they are float32/float64
    tensors on CPU or CUDA (list outputs get per-item history), with the exceptions below, which
    take the loop.
    Gradient exactness on CPU: every gradient the rewrite produces is a sum, over the uses of a
    value, of products that both versions compute with the same operands (multiplication
    commutes bitwise; the op's backward runs ``lambda[t] = g[t] + a[t-1] * lambda[t-1]``, one
    multiply then one add, exactly what autograd through the loop forms for the carried value:
    its row's gradient ``g[t]`` plus ``a[t-1]`` times the next step's gradient; the gradient of
    ``a[t]`` is ``lambda[t] * x[t+1]`` in both). Only the order in which autograd sums the
    contributions of several uses differs, and a sum of two terms (plus exact zeros from the
    rows other uses do not touch) does not depend on the order, while three or more may. So the
    gradients are bitwise equal (signed zeros aside) when no value they flow through (an input
    that requires grad, or anything computed from one) has more than two uses, in the loop and
    outside it (Dreamer's
    lambda-return: ``target[t]`` once, ``discount[t]`` twice; the carried value: its output row
    and the next step), and equal up to reassociation otherwise (CleanRL GAE through a critic
    with ``returns = advantages + values`` after the loop: ``values[t]`` has three uses). The
    guard cannot see uses outside the loop, so the site keeps ``exact`` for values (bitwise on
    CPU whatever requires grad, and the whole result under ``no_grad``, the common case) and its
    reason states the gradient condition. Declined under autograd, because they would make even
    the in-loop sums differ or change what raises: loop-invariant tensors (``consts``,
    ``scalars``) that require grad (their gradient sums over all steps), per-step inputs that
    require grad and broadcast to a wider row (their per-step gradient is a reduction, done per
    row in the loop and over a block in the rewrite), more than one output (the carried value's
    gradient would sum three terms), outputs whose rows are not the row shape, outputs that are
    leaves or views requiring grad (``out[t] = x`` raises there in the loop; a non-leaf output
    is fine in both: each bumps its version at least once, so a tensor saved from it before the
    loop fails backward in both), and outputs the loop reads back (``memo``, ``reads``,
    ``cells``: the loop's reads of what it stored can save views that its later writes
    invalidate, which the rewrite does not reproduce), and lists of per-step tensors that require
    grad: in the real code that has them (rl-adventure's GAE over a list of critic outputs,
    ``returns.insert(0, gae + values[step])``) each value has three uses, and the reassociated
    gradient of the critic's weights, a float32 sum of thousands of terms with cancellation,
    differed by 2.7e-6 relative at T = 700; the guard is not told how many uses an input has, so
    that form stays on the loop (a list of tensors that do not require grad is accepted, and the
    carried value may require grad).
    """
    try:
        devices = _recurrence_ok(T, seqs, conds, consts, scalars, outs, lists, memo, sliced, divides,
                                 deques=deques, front=front, rows=True, aligned=aligned, reads=reads, cells=cells,
                                 allow_grad=True, weak_ok=weak)
    except Exception as exc:
        return no(f"checking the inputs raised {type(exc).__name__}")
    if devices is False:
        return False  # (the reason is noted)
    if cpu and any(d.type != "cpu" for d in devices):
        return no("tensors off the CPU: this site is exact only on the CPU")
    return True


def _recurrence_ok(T, seqs, conds, consts, scalars, outs, lists, memo, sliced, divides, min_steps=None, deques=(), front=False,
                   rows=False, aligned=False, reads=(), cells=(), allow_grad=False, weak_ok=True):
    """False, or the set of devices of the tensors involved (empty when there are none).
    ``rows``: also admit lists of numpy rows, lists of Python / numpy scalars (see
    :func:`recurrence_ok`), and integer / bool numpy inputs next to float64
    ones (numpy promotes those to float64 whatever the grouping, so the arrays give the values
    the rows give). ``allow_grad``: per-step inputs and outputs may require grad under grad mode
    (the policy of :func:`recurrence_ok`); without it nothing may."""
    T = operator.index(T)
    if T < 2 or not seqs:
        return no("fewer than 2 steps")
    kinds = [_mode_of(x) for x, _ in seqs]
    if None in kinds:
        return no("a per-step input is not a tensor, a numpy array or a list of numbers or tensors")
    mode = _main_mode(kinds)
    if mode is None or (not rows and len(set(kinds)) > 1):  # lists of scalars next to arrays: recurrence_ok only
        return no("per-step inputs of mixed kinds (a list next to a tensor or array)")
    if mode == "float" and divides:
        return no("lists of Python floats where the loop divides (Python raises on zero, arrays give inf)")
    if mode in ("numpy", "nlist") and not _NUMPY2:
        return no("numpy inputs need numpy 2 (its promotion rules)")
    if mode == "nlist" and not rows:
        return no("per-step inputs of mixed kinds (a list next to a tensor or array)")
    minimum = MIN_STEPS if min_steps is None else min_steps
    if T < minimum.get(mode, 2):
        return no(_TOO_FEW.get(mode, "too few steps") % minimum.get(mode, 2))
    if mode == "float" and not front and T < minimum.get("float_appended", 2):
        return no("lists of Python floats appended to: the loop is faster")  # (see MIN_STEPS)
    if sliced and mode in ("torch",):
        return no("the loop walks a tensor with [::-1], which tensors do not support")
    grad = torch.is_grad_enabled()
    graded: List[Tuple[int, ...]] = []  # row shapes of per-step inputs that require grad
    devices = set()
    arrays: List[Any] = []  # every array input (for the aliasing check)
    # ---- per-step arithmetic inputs: one dtype, one row shape
    dtype = None
    row: Optional[Tuple[int, ...]] = None
    ints = False  # integer / bool numpy inputs (``1 - done`` of a bool array)
    weak = False  # per-step Python ints / bools (or numpy ones next to tensors, which torch treats alike)
    masks = False  # bool tensors (``terminated.logical_not()``, skrl's GAE)
    for (x, extra), kind in zip(seqs, kinds):
        if len(x) < T + extra:
            return no("a per-step input is shorter than the loop's steps")
        if _weak(kind, mode):
            if not weak_ok:
                return no("per-step Python numbers where the loop's items must stay Python numbers")
            # exact only where every op on them is float64 (checked below) and nothing divides
            # (Python raises on an int zero where arrays give inf)
            if kind == "float":
                pyints = [e for e in x if type(e) is not float] if len(set(map(type, x))) > 1 else ()
                if divides or (pyints and not _small(pyints)):
                    return no(_WEAK_INTS)
            elif divides or not _small(x) or (kind == "npgen" and x[0].dtype.kind not in "biu"):
                return no(_WEAK_INTS)
            weak = True
            dt, shape = None, ()
        elif kind == "npgen":  # numpy scalars: under NEP 50 they promote as the arrays of their dtype do
            if mode not in ("numpy", "nlist"):
                return no("lists of numpy scalars next to tensors or lists")
            dt, shape = x[0].dtype, ()
        elif mode in ("torch", "numpy"):
            if x.ndim < 1:
                return no("a 0-d array as a per-step input")
            dt, shape = x.dtype, tuple(x.shape[1:])
            if mode == "torch":
                devices.add(x.device)
                if grad and x.requires_grad:
                    if not allow_grad or x.device.type not in ("cpu", "cuda"):
                        return no(_GRAD_DEVICE)
                    graded.append(shape)
            arrays.append(x)
        elif mode == "float":
            if len(set(map(type, x))) > 1 and not _small([e for e in x if type(e) is not float]):
                return no(_WEAK_INTS)
            dt, shape = np.dtype(np.float64), ()
        elif mode == "nlist":
            first = x[0]
            dt, shape = first.dtype, tuple(first.shape)
            if not shape or not _same_rows(x, first):
                return no("a list of numpy rows of different shapes or dtypes, or of 0-d arrays")
            arrays.extend(x)
        else:  # tlist
            first = x[0]
            dt, shape = first.dtype, tuple(first.shape)
            for e in x:
                if e.dtype != dt or tuple(e.shape) != shape:
                    return no("a list of tensors of different dtypes or shapes")
                if grad and e.requires_grad:  # lists of per-step tensors that require grad: declined
                    return no("a list of per-step tensors that require grad (their gradients would reassociate)")
                devices.add(e.device)
        if rows and mode in ("numpy", "nlist") and dt is not None and dt.kind in "biu":
            ints = True
            dt = None  # the float inputs set the dtype
        elif rows and mode == "torch" and dt == torch.bool:
            masks = True
            dt = None  # the float inputs set the dtype (checked below)
        if row is None:
            row = shape
        elif shape != row:
            if not aligned:
                return no(_ROWS)
            try:
                row = tuple(np.broadcast_shapes(row, shape))
            except ValueError:
                return no(_ROWS)
        if dt is None:
            continue
        if dtype is None:
            dtype = dt
        elif dt != dtype:
            return no("per-step inputs of different dtypes")
    if mode == "float":
        dtype = np.dtype(np.float64)
    if mode in ("torch", "tlist") and dtype not in _FLOATS_T:
        return no(f"per-step inputs of dtype {str(dtype).replace('torch.', '')}: only float32 and float64 are vectorized"
                  if dtype is not None else "no floating per-step input")
    if mode in ("numpy", "nlist", "float") and dtype not in _FLOATS_N:
        return no(f"per-step inputs of dtype {dtype}: only float32 and float64 are vectorized"
                  if dtype is not None else "no floating per-step input")
    if ints and dtype != np.float64:  # float32 with int8 stays float32, with int32 does not
        return no("integer arrays next to float32 ones (numpy promotes them differently per step)")
    # A bool tensor promotes to the float operand's dtype, 0-d (a step in the loop) or not (the
    # slices), and to the default dtype against a Python float (``gamma * mask[t]``): the same
    # values in both forms only where that default is the float inputs' dtype.
    if masks and dtype != torch.get_default_dtype():
        return no("bool tensors next to floats of a dtype other than torch's default")
    if weak and dtype not in (torch.float64, np.float64):  # a Python int meets a Python float in the loop
        return no("per-step Python numbers next to float32 arrays (the loop rounds them once, the rewrite twice)")
    assert row is not None  # (float64) and the float32 arrays in the rewrite: only float64 is both
    if any(shape != row for shape in graded):  # a per-step gradient reduced over the broadcast dims
        return no("a per-step input that requires grad broadcasts to a wider row")
    # ---- truth-value inputs
    for x, extra in conds:
        if len(x) < T + extra:
            return no("a per-step input is shorter than the loop's steps")
        if _tensor(x):
            if mode not in ("torch", "tlist") or x.ndim != 1:
                return no(_CONDS)
            devices.add(x.device)
            arrays.append(x)
        elif _ndarray(x):
            if x.ndim != 1 or x.dtype.kind not in "biuf":
                return no(_CONDS)
            arrays.append(x)
        elif type(x) in (list, tuple):
            for e in x:
                if not (type(e) in _PY_SCALARS or isinstance(e, np.generic)
                        or (type(e) in _TENSORS and e.numel() == 1)):
                    return no(_CONDS)
        else:
            return no(_CONDS)
    # ---- loop invariants
    for c in consts:
        if not _const_ok(c, mode, dtype, row, devices, grad):
            return False  # (the reason is noted)
        if isinstance(c, (torch.Tensor, np.ndarray)):
            arrays.append(c)
    if mode == "float" and not any(type(c) is float or isinstance(c, np.floating) for c in scalars) \
            and not any(type(x) in (list, tuple) and all(type(e) is float for e in x) for x, _ in seqs):
        # no float coefficient and no list of floats only: the loop's values stay Python ints at
        # the steps whose inputs are (PPO-PyTorch with gamma = 1 and integer rewards), the
        # vectorized ones are floats
        return no("lists of Python ints with no float coefficient: the loop's values stay ints")
    for c in scalars:  # a coefficient constant in time: 0-d, and (torch promotes a 0-d operand
        # differently against a 0-d step value than against the vector) of the common dtype
        if type(c) in _PY_SCALARS:
            continue
        if not _const_ok(c, mode, dtype, (), devices, grad):
            return False  # (the reason is noted)
    # ---- under autograd (an input or output requires grad; consts / scalars that do were refused)
    if grad and allow_grad and (graded or any(isinstance(o, torch.Tensor) and o.requires_grad for o in outs)):
        if len(outs) + len(lists) + len(deques) + len(memo) > 1 or memo or reads or cells:
            return no("under autograd, more than one output, or outputs the loop reads back")
        if any(not isinstance(o, torch.Tensor) or tuple(o.shape[1:]) != row for o in outs):
            return no("under autograd, an output whose rows are not the computed row")
    # ---- outputs written at [t]
    want = _tensor if mode in ("torch", "tlist") else _ndarray
    for i, o in enumerate(outs):
        if not want(o) or o.ndim < 1 or len(o) < T:
            return no("an output is not an array of the inputs' kind with a row per step")
        if not _broadcasts_into(row, tuple(o.shape[1:])):
            return no("an output's rows cannot hold the computed row")
        if isinstance(o, torch.Tensor):
            # written in place: a leaf (or a view of one) that requires grad raises in the loop's
            # first ``out[t] = x`` under grad mode; a non-leaf is written the same way by both
            if o.requires_grad and not (allow_grad and grad and not o.is_leaf and not o._is_view()
                                        and o.device.type in ("cpu", "cuda")):
                return no("an output is a tensor (or a view of one) that requires grad")
            devices.add(o.device)
            if any(isinstance(a, torch.Tensor) and _shares(a, o) for a in arrays):
                return no(_SHARES)
            if any(_shares(p, o) for p in outs[:i]):
                return no(_SHARES)
        else:
            if any(isinstance(a, np.ndarray) and np.may_share_memory(a, o) for a in arrays):
                return no(_SHARES)
            if any(np.may_share_memory(p, o) for p in outs[:i]):
                return no(_SHARES)
    # ---- arrays that carry the recurrence themselves (out[t] = f(out[t + 1])): the loop reads back
    # what it stored, so they must store exactly the computed value (same dtype, same row shape)
    for m in memo:
        if not want(m) or m.ndim < 1 or len(m) < T or m.dtype != dtype or tuple(m.shape[1:]) != row:
            return no("an array the loop reads back differs from the computed rows in kind, dtype or shape")
        if isinstance(m, torch.Tensor):
            if m.requires_grad:
                return no("an array the loop reads back requires grad")
            devices.add(m.device)
            if any(isinstance(a, torch.Tensor) and _shares(a, m) for a in arrays + list(outs)):
                return no(_SHARES)
        elif any(isinstance(a, np.ndarray) and np.may_share_memory(a, m) for a in arrays + list(outs)):
            return no(_SHARES)
    # ---- outputs read back in the step that writes them
    for o, n in reads:
        if not any(o is x for x in outs) and not any(o is m for m in memo):
            return no("the loop reads back an array it does not write")
        if o.ndim - 1 - n != len(row):
            return no("an output the loop reads back has rows of another rank")
    for c in cells:
        if not _array(c) or c.ndim < 2 or int(np.prod(c.shape[1:])) != 1:
            return no("an output read back as one number holds more than one per row")
    # ---- lists appended / inserted into
    inputs = [x for x, _ in seqs] + [x for x, _ in conds]
    for i, lst in enumerate(lists):
        if type(lst) is not list:
            return no("an output appended to is not a list")
        if any(lst is x for x in inputs) or any(lst is p for p in lists[:i]):
            return no("a list the loop appends to is also an input or another output")
    for i, dq in enumerate(deques):
        if type(dq) is not deque:
            return no("an output appended to on the left is not a collections.deque")
        if any(dq is x for x in inputs) or any(dq is p for p in list(lists) + list(deques[:i])):
            return no("a deque the loop appends to is also an input or another output")
    return devices if len(devices) <= 1 else no("tensors on more than one device")


def _const_ok(c, mode, dtype, row, devices, grad) -> bool:
    """Whether a loop invariant may meet the per-step rows (a reason is noted where not)."""
    if type(c) in _PY_SCALARS:
        return True
    if mode in ("torch", "tlist"):
        if not _tensor(c) or c.dtype != dtype:
            return no(_CONST)
        if grad and c.requires_grad:  # its gradient sums over every step: declined (see recurrence_ok)
            return no("a loop-invariant tensor requires grad (its gradient would sum over every step)")
        devices.add(c.device)
        return _broadcasts_into(tuple(c.shape), row) or no(_CONST)
    if mode in ("numpy", "nlist"):
        if not (_ndarray(c) or isinstance(c, np.generic)) or c.dtype != dtype:
            return no(_CONST)
        return _broadcasts_into(tuple(np.shape(c)), row) or no(_CONST)
    return no("an array operand next to lists of Python floats")  # lists of floats: Python numbers only



#: the reasons said at more than one refusal (runtime/guard_reasons.py)
_TOO_FEW = {
    "torch": "fewer than %d steps of tensors: the loop is faster",
    "tlist": "fewer than %d steps of a list of tensors: the loop is faster",
    "numpy": "fewer than %d steps of numpy arrays: the loop is faster",
    "nlist": "fewer than %d steps of a list of numpy rows: the loop is faster",
    "float": "fewer than %d steps of Python floats: the loop is faster",
}
_WEAK_INTS = "per-step Python numbers where the loop divides, or ints beyond +-65536"
_GRAD_DEVICE = "a per-step tensor requires grad on a device other than CPU or CUDA"
_ROWS = "per-step inputs with rows of different shapes"
_CONDS = "a per-step condition that is not a 1-D array or list of numbers of the inputs' kind"
_CONST = "a loop-invariant operand of another kind, dtype or shape than the per-step rows"
_SHARES = "an output shares memory with an input or another output"


def _fits(shape: Tuple[int, ...], row: Tuple[int, ...]) -> bool:
    """A carried value of this shape, stripped as :func:`as_row` strips it, broadcasts into the row."""
    shape = tuple(shape)
    if shape == row or not shape:
        return True
    while len(shape) > len(row) and shape[0] == 1:
        shape = shape[1:]
    return _broadcasts_into(shape, row)


def carry_ok(carried: Sequence[Any], seqs: Sequence[Any]) -> bool:
    """Whether the carried values, after the first step (run as written), are what the
    vectorized steps compute with: the kind, dtype and device of the per-step inputs ``seqs``
    (those :func:`recurrence_ok` passed) and a shape that broadcasts into their row; a Python
    float where they are lists of Python floats. The loop combines the carried value with every
    step's values, so its type decides the arithmetic: an ``np.float32`` start (a network
    output's ``.numpy()[0, 0]``) makes a loop over Python floats compute in float32, a float64
    tensor makes a float32 loop compute in float64. When this answers False the rewritten code
    runs the remaining steps as written."""
    try:
        kinds = [_checked_kind(x) for x in seqs]
        mode = _main_mode(kinds)
        dtype: Any = np.dtype(np.float64) if mode == "float" else None
        device = None
        row: Tuple[int, ...] = ()
        for x, kind in zip(seqs, kinds):
            if _weak(kind, mode):
                continue
            if kind == "npgen":
                dt, shape = x[0].dtype, ()
            elif kind in ("torch", "numpy"):
                dt, shape, device = x.dtype, tuple(x.shape[1:]), getattr(x, "device", None)
            elif kind == "float":
                dt, shape = np.dtype(np.float64), ()
            else:  # lists of rows
                dt, shape, device = x[0].dtype, tuple(x[0].shape), getattr(x[0], "device", None)
            if shape != row and shape:
                row = shape if not row else tuple(np.broadcast_shapes(row, shape))
            if dtype is None and (dt.is_floating_point if isinstance(dt, torch.dtype) else dt.kind == "f"):
                dtype = dt
        if dtype is None:
            return False
        for s in carried:
            if mode == "float":
                ok = type(s) is float
            elif mode in ("torch", "tlist"):
                ok = _tensor(s) and s.dtype == dtype and s.device == device and _fits(tuple(s.shape), row)
            else:
                ok = (_ndarray(s) or isinstance(s, np.generic)) and s.dtype == dtype and _fits(np.shape(s), row)
            if not ok:
                return False
        return True
    except Exception:
        return False
