"""Run-time guards and glue for vectorized loops (rewritten code calls these by full name).

A rewrite of a Python loop is only exact when the values it meets at run time are of the kinds
the rewrite was planned for; static analysis cannot see that, so the rewritten code asks these
helpers first (cheap type / length / dtype / device / aliasing checks) and keeps the original
loop in the else branch. The other helpers convert between the user's containers (tensors,
numpy arrays, lists of floats, lists of tensors) and the arrays the vectorized maths runs on,
keeping the types the loop would have produced. No helper here ever raises on odd input in a
guard position: a guard that cannot decide answers False.
"""
from __future__ import annotations

import operator
from collections import deque
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .loop_batch import batch_range, batch_zip
from .fused import fused_linear  # noqa: F401  (the one-pass tier of rewritten recurrences)
from .recurrence import linear_recurrence

__all__ = [
    "fused_linear",
    "steps",
    "backward_steps",
    "length",
    "recurrence_ok",
    "seq_of",
    "seqs_of",
    "truth_of",
    "as_row",
    "restore",
    "items_of",
    "wrapped",
    "to_rank",
    "column",
    "dim1",
    "dim_view",
    "written_apart",
    "reset_linear_recurrence",
    "quadratic_ok",
    "int_of",
    "carry_ok",
    "LossBatch",
    "loss_zip",
    "loss_range",
]

_FLOATS_T = (torch.float32, torch.float64)
_FLOATS_N = (np.dtype(np.float32), np.dtype(np.float64))
_NUMPY2 = int(np.__version__.split(".")[0]) >= 2
_PY_SCALARS = (int, float, bool)
#: Array types the guards accept, by exact type (never "anything with a shape": ``np.matrix``
#: stays 2-D when indexed, ``np.ma`` arrays compute other values, tensor subclasses may override
#: any op). ``nn.Parameter`` is proved safe: indexing and arithmetic on it give plain tensors.
_TENSORS = (torch.Tensor, torch.nn.Parameter)
#: Per-step Python ints / bools (done flags, masks) promote exactly: ints of at most this size
#: keep every product of up to three of them below 2**53, so float64 arithmetic on them is
#: Python's int arithmetic converted once.
_FLAG_MAX = 1 << 16
_DTYPE, _SHAPE = operator.attrgetter("dtype"), operator.attrgetter("shape")
_NDIM, _SIZE = operator.attrgetter("ndim"), operator.attrgetter("size")

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


def steps(T: Any) -> int:
    """``T`` as an int (anything ``range`` accepts), or -1 when it is not one."""
    try:
        return operator.index(T)
    except Exception:
        return -1


def backward_steps(x: Any) -> int:
    """``n`` when ``x`` is a list, tuple or range holding the ints ``n - 1, n - 2, ..., 0`` (what
    ``for t in x`` walks as ``for t in reversed(range(n))`` does), else -1. Never consumes an
    iterator."""
    try:
        if type(x) is range:
            n = len(x)
            return n if n == 0 or (x.start == n - 1 and x.step == -1) else -1
        if type(x) in (list, tuple):
            n = len(x)
            if n and set(map(type, x)) != {int}:
                return -1
            return n if list(x) == list(range(n - 1, -1, -1)) else -1
    except Exception:
        pass
    return -1


def _tensor(x: Any) -> bool:
    return type(x) in _TENSORS


def _ndarray(x: Any) -> bool:
    return type(x) is np.ndarray


def _array(x: Any) -> bool:
    return type(x) in _TENSORS or type(x) is np.ndarray


def length(*xs: Any) -> int:
    """The common length of the sequences a ``zip(reversed(a), reversed(b))`` loop walks, or -1
    (not sequences, lengths differ, or ``reversed`` would not index them)."""
    try:
        n = -1
        for x in xs:
            if not (type(x) in (list, tuple) or _array(x)):
                return -1
            if getattr(x, "ndim", 1) == 0:
                return -1
            k = len(x)
            if n >= 0 and k != n:
                return -1
            n = k
        return n
    except Exception:
        return -1


def _mode_of(x: Any) -> Optional[str]:
    """The kind of a per-step container, by exact types: "torch", "numpy", "float" (a list of
    Python floats, some ints / bools among them allowed), "tlist" / "nlist" (lists of tensors / numpy arrays), "flags" (a list of
    Python ints / bools), "npgen" (a list of numpy scalars of one type), else None."""
    if _tensor(x):
        return "torch"
    if _ndarray(x):
        return "numpy"
    if type(x) in (list, tuple) and len(x):
        types = set(map(type, x))
        if types == {float} or (float in types and types <= {float, int, bool}):
            return "float"
        if types <= {torch.Tensor}:
            return "tlist"
        if types == {np.ndarray}:
            return "nlist"
        if types <= {int, bool}:
            return "flags"
        if len(types) == 1 and issubclass(next(iter(types)), (np.bool_, np.number)):
            return "npgen"
    return None


def _checked_kind(x: Any) -> str:
    """The kind of a container :func:`recurrence_ok` accepted, from its first element (the guard
    saw to the rest; a list of floats with an int first reads as "flags", which gives the same
    float64 maths): O(1) where :func:`_mode_of` is O(T)."""
    if _tensor(x):
        return "torch"
    if _ndarray(x):
        return "numpy"
    e = type(x[0])
    if e is float:
        return "float"
    if e is int or e is bool:
        return "flags"
    if e is torch.Tensor:
        return "tlist"
    if e is np.ndarray:
        return "nlist"
    return "npgen"


_ARRAY_KINDS = ("torch", "numpy", "tlist", "nlist")


def _main_mode(kinds: Sequence[Optional[str]]) -> Optional[str]:
    """The kind the vectorized maths runs in: the one array kind among the containers (two: None);
    else lists of Python floats ("float", ints / bools among or next to them); else numpy scalars."""
    arrays = {k for k in kinds if k in _ARRAY_KINDS}
    if len(arrays) > 1 or None in kinds:
        return None
    if arrays:
        return arrays.pop()
    return "numpy" if "npgen" in kinds and "float" not in kinds and "flags" not in kinds else \
        ("float" if "npgen" not in kinds else None)


def _weak(kind: str, mode: str) -> bool:
    """Per-step values that are Python numbers to the loop (numpy ints / bools to torch) next to
    arrays: they become float64 arrays, exact only with float64 maths (see recurrence_ok)."""
    return (kind == "flags" or (kind == "float" and mode in _ARRAY_KINDS)
            or (kind == "npgen" and mode in ("torch", "tlist")))


def _small(x: Sequence[Any]) -> bool:
    """Every element of a list of ints / bools / numpy int scalars has ``|e| <= _FLAG_MAX``."""
    return max(map(abs, x)) <= _FLAG_MAX


def _same_rows(x: Sequence[np.ndarray], first: np.ndarray) -> bool:
    """Every array in ``x`` has the dtype and shape of ``first`` (C-level passes over the list:
    a Python loop costs about as much as the loop being replaced)."""
    n = len(x)
    if list(map(_DTYPE, x)).count(first.dtype) != n:
        return False
    if first.ndim == 1:  # 1-D of the same size: the same shape, without building T shape tuples
        return list(map(_NDIM, x)).count(1) == n and list(map(_SIZE, x)).count(first.size) == n
    return list(map(_SHAPE, x)).count(first.shape) == n


def _broadcasts_into(shape: Tuple[int, ...], row: Tuple[int, ...]) -> bool:
    if len(shape) > len(row):
        return False
    try:
        return tuple(np.broadcast_shapes(tuple(shape), tuple(row))) == tuple(row)
    except ValueError:
        return False


def _storage(x: torch.Tensor) -> int:
    return x.untyped_storage().data_ptr()


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
    (NEP 50: they promote as arrays of their dtype do). The carried value is checked after the
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
    ``sliced``: the loop walks ``x[::-1]`` (tensors do not support that). ``divides``: the maths
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
                                 deques=deques, rows=True, aligned=aligned, reads=reads, cells=cells,
                                 allow_grad=True, weak_ok=weak)
    except Exception:
        return False
    if devices is False:
        return False
    return not cpu or all(d.type == "cpu" for d in devices)


def _recurrence_ok(T, seqs, conds, consts, scalars, outs, lists, memo, sliced, divides, min_steps=None, deques=(),
                   rows=False, aligned=False, reads=(), cells=(), allow_grad=False, weak_ok=True):
    """False, or the set of devices of the tensors involved (empty when there are none).
    ``rows``: also admit lists of numpy rows, lists of Python / numpy scalars (see
    :func:`recurrence_ok`), and integer / bool numpy inputs next to float64
    ones (numpy promotes those to float64 whatever the grouping, so the arrays give the values
    the rows give). ``allow_grad``: per-step inputs and outputs may require grad under grad mode
    (the policy of :func:`recurrence_ok`); without it nothing may."""
    T = operator.index(T)
    if T < 2 or not seqs:
        return False
    kinds = [_mode_of(x) for x, _ in seqs]
    if None in kinds:
        return False
    mode = _main_mode(kinds)
    if mode is None or (not rows and len(set(kinds)) > 1):  # lists of scalars next to arrays: recurrence_ok only
        return False
    if mode is None or (mode == "float" and divides) or (mode in ("numpy", "nlist") and not _NUMPY2):
        return False
    if mode == "nlist" and not rows:
        return False
    minimum = MIN_STEPS if min_steps is None else min_steps
    if T < minimum.get(mode, 2):
        return False
    if mode == "float" and not sliced and T < minimum.get("float_appended", 2):
        return False  # the loop is faster (see MIN_STEPS)
    if sliced and mode in ("torch",):
        return False
    grad = torch.is_grad_enabled()
    graded: List[Tuple[int, ...]] = []  # row shapes of per-step inputs that require grad
    devices = set()
    arrays: List[Any] = []  # every array input (for the aliasing check)
    # ---- per-step arithmetic inputs: one dtype, one row shape
    dtype = None
    row: Optional[Tuple[int, ...]] = None
    ints = False  # integer / bool numpy inputs (``1 - done`` of a bool array)
    weak = False  # per-step Python ints / bools (or numpy ones next to tensors, which torch treats alike)
    for (x, extra), kind in zip(seqs, kinds):
        if len(x) < T + extra:
            return False
        if _weak(kind, mode):
            if not weak_ok:
                return False
            # exact only where every op on them is float64 (checked below) and nothing divides
            # (Python raises on an int zero where arrays give inf)
            if kind == "float":
                pyints = [e for e in x if type(e) is not float] if len(set(map(type, x))) > 1 else ()
                if divides or (pyints and not _small(pyints)):
                    return False
            elif divides or not _small(x) or (kind == "npgen" and x[0].dtype.kind not in "biu"):
                return False
            weak = True
            dt, shape = None, ()
        elif kind == "npgen":  # numpy scalars: under NEP 50 they promote as the arrays of their dtype do
            if mode not in ("numpy", "nlist"):
                return False
            dt, shape = x[0].dtype, ()
        elif mode in ("torch", "numpy"):
            if x.ndim < 1:
                return False
            dt, shape = x.dtype, tuple(x.shape[1:])
            if mode == "torch":
                devices.add(x.device)
                if grad and x.requires_grad:
                    if not allow_grad or x.device.type not in ("cpu", "cuda"):
                        return False
                    graded.append(shape)
            arrays.append(x)
        elif mode == "float":
            if len(set(map(type, x))) > 1 and not _small([e for e in x if type(e) is not float]):
                return False
            dt, shape = np.dtype(np.float64), ()
        elif mode == "nlist":
            first = x[0]
            dt, shape = first.dtype, tuple(first.shape)
            if not shape or not _same_rows(x, first):
                return False
            arrays.extend(x)
        else:  # tlist
            first = x[0]
            dt, shape = first.dtype, tuple(first.shape)
            for e in x:
                if e.dtype != dt or tuple(e.shape) != shape:
                    return False
                if grad and e.requires_grad:  # lists of per-step tensors that require grad: declined
                    return False
                devices.add(e.device)
        if rows and mode in ("numpy", "nlist") and dt is not None and dt.kind in "biu":
            ints = True
            dt = None  # the float inputs set the dtype
        if row is None:
            row = shape
        elif shape != row:
            if not aligned:
                return False
            try:
                row = tuple(np.broadcast_shapes(row, shape))
            except ValueError:
                return False
        if dt is None:
            continue
        if dtype is None:
            dtype = dt
        elif dt != dtype:
            return False
    if mode == "float":
        dtype = np.dtype(np.float64)
    if mode in ("torch", "tlist") and dtype not in _FLOATS_T:
        return False
    if mode in ("numpy", "nlist", "float") and dtype not in _FLOATS_N:
        return False
    if ints and dtype != np.float64:  # float32 with int8 stays float32, with int32 does not
        return False
    if weak and dtype not in (torch.float64, np.float64):  # a Python int meets a Python float in the loop
        return False  # (float64) and the float32 arrays in the rewrite: only float64 is both
    assert row is not None
    if any(shape != row for shape in graded):  # a per-step gradient reduced over the broadcast dims
        return False
    # ---- truth-value inputs
    for x, extra in conds:
        if len(x) < T + extra:
            return False
        if _tensor(x):
            if mode not in ("torch", "tlist") or x.ndim != 1:
                return False
            devices.add(x.device)
            arrays.append(x)
        elif _ndarray(x):
            if x.ndim != 1 or x.dtype.kind not in "biuf":
                return False
            arrays.append(x)
        elif type(x) in (list, tuple):
            for e in x:
                if not (type(e) in _PY_SCALARS or isinstance(e, np.generic)
                        or (type(e) in _TENSORS and e.numel() == 1)):
                    return False
        else:
            return False
    # ---- loop invariants
    for c in consts:
        if not _const_ok(c, mode, dtype, row, devices, grad):
            return False
        if isinstance(c, (torch.Tensor, np.ndarray)):
            arrays.append(c)
    for c in scalars:  # a coefficient constant in time: 0-d, and (torch promotes a 0-d operand
        # differently against a 0-d step value than against the vector) of the common dtype
        if type(c) in _PY_SCALARS:
            continue
        if not _const_ok(c, mode, dtype, (), devices, grad):
            return False
    # ---- under autograd (an input or output requires grad; consts / scalars that do were refused)
    if grad and allow_grad and (graded or any(isinstance(o, torch.Tensor) and o.requires_grad for o in outs)):
        if len(outs) + len(lists) + len(deques) + len(memo) > 1 or memo or reads or cells:
            return False
        if any(not isinstance(o, torch.Tensor) or tuple(o.shape[1:]) != row for o in outs):
            return False
    # ---- outputs written at [t]
    want = _tensor if mode in ("torch", "tlist") else _ndarray
    for i, o in enumerate(outs):
        if not want(o) or o.ndim < 1 or len(o) < T:
            return False
        if not _broadcasts_into(row, tuple(o.shape[1:])):
            return False
        if isinstance(o, torch.Tensor):
            # written in place: a leaf (or a view of one) that requires grad raises in the loop's
            # first ``out[t] = x`` under grad mode; a non-leaf is written the same way by both
            if o.requires_grad and not (allow_grad and grad and not o.is_leaf and not o._is_view()
                                        and o.device.type in ("cpu", "cuda")):
                return False
            devices.add(o.device)
            if any(isinstance(a, torch.Tensor) and _storage(a) == _storage(o) for a in arrays):
                return False
            if any(_storage(p) == _storage(o) for p in outs[:i]):
                return False
        else:
            if any(isinstance(a, np.ndarray) and np.may_share_memory(a, o) for a in arrays):
                return False
            if any(np.may_share_memory(p, o) for p in outs[:i]):
                return False
    # ---- arrays that carry the recurrence themselves (out[t] = f(out[t + 1])): the loop reads back
    # what it stored, so they must store exactly the computed value (same dtype, same row shape)
    for m in memo:
        if not want(m) or m.ndim < 1 or len(m) < T or m.dtype != dtype or tuple(m.shape[1:]) != row:
            return False
        if isinstance(m, torch.Tensor):
            if m.requires_grad:
                return False
            devices.add(m.device)
            if any(isinstance(a, torch.Tensor) and _storage(a) == _storage(m) for a in arrays + list(outs)):
                return False
        elif any(isinstance(a, np.ndarray) and np.may_share_memory(a, m) for a in arrays + list(outs)):
            return False
    # ---- outputs read back in the step that writes them
    for o, n in reads:
        if not any(o is x for x in outs) and not any(o is m for m in memo):
            return False
        if o.ndim - 1 - n != len(row):
            return False
    for c in cells:
        if not _array(c) or c.ndim < 2 or int(np.prod(c.shape[1:])) != 1:
            return False
    # ---- lists appended / inserted into
    inputs = [x for x, _ in seqs] + [x for x, _ in conds]
    for i, lst in enumerate(lists):
        if type(lst) is not list:
            return False
        if any(lst is x for x in inputs) or any(lst is p for p in lists[:i]):
            return False
    for i, dq in enumerate(deques):
        if type(dq) is not deque:
            return False
        if any(dq is x for x in inputs) or any(dq is p for p in list(lists) + list(deques[:i])):
            return False
    return devices if len(devices) <= 1 else False


def _const_ok(c, mode, dtype, row, devices, grad) -> bool:
    if type(c) in _PY_SCALARS:
        return True
    if mode in ("torch", "tlist"):
        if not _tensor(c) or c.dtype != dtype:
            return False
        if grad and c.requires_grad:  # its gradient sums over every step: declined (see recurrence_ok)
            return False
        devices.add(c.device)
        return _broadcasts_into(tuple(c.shape), row)
    if mode in ("numpy", "nlist"):
        if not (_ndarray(c) or isinstance(c, np.generic)) or c.dtype != dtype:
            return False
        return _broadcasts_into(tuple(np.shape(c)), row)
    return False  # lists of floats: Python numbers only


def seq_of(x: Any) -> Any:
    """A per-step container as one array: tensors and numpy arrays as they are, a list of floats
    (or of ints / bools, which the guard admits next to float64 maths only) as a float64 array
    (Python float arithmetic is float64), a list of numpy scalars as an array of their dtype, a
    list of tensors or of numpy rows stacked (their dtype kept)."""
    if _array(x):
        return x
    if len(x) and type(x[0]) is torch.Tensor:
        return torch.stack(list(x))
    if len(x) and type(x[0]) is np.ndarray:  # rows of one dtype and shape (the guard saw to it)
        return np.concatenate(x).reshape((len(x),) + x[0].shape)  # 3x faster than np.stack
    if len(x) and isinstance(x[0], np.generic):  # numpy scalars of one type (the guard saw to it)
        return np.array(x)
    return np.array(x, dtype=np.float64)


def seqs_of(*xs: Any) -> Tuple[Any, ...]:
    """:func:`seq_of` of each, with singleton dims inserted after the time axis of those whose rows
    have a lower rank than the others': per step, broadcasting aligns rows from the right; with
    time first, the rows must have one rank for the arrays to align the same way. Lists of
    Python or numpy ints / bools next to tensors become tensors of the tensors' dtype and device
    (the guard admits them with float64 tensors only, where they convert exactly)."""
    vs = [seq_of(x) for x in xs]
    ref = next((v for v in vs if isinstance(v, torch.Tensor)), None)
    if ref is not None:
        vs = [v if isinstance(v, torch.Tensor) else torch.from_numpy(np.asarray(v, dtype=np.float64)).to(
            device=ref.device, dtype=ref.dtype) for v in vs]
    rank = max(v.ndim for v in vs)
    return tuple(v if v.ndim == rank else v.reshape(tuple(v.shape[:1]) + (1,) * (rank - v.ndim) + tuple(v.shape[1:]))
                 for v in vs)


_COMPARE = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
            ">": operator.gt, ">=": operator.ge}
_NEP50 = int(np.__version__.split(".")[0]) >= 2  # a Python number meets a numpy scalar as it meets an array


def truth_of(x: Any, op: Optional[str] = None, number: Any = None) -> Any:
    """Per-element truth values (``bool(x[t])``, or ``bool(x[t] <op> number)``) as a bool array.
    A tensor or, under NumPy 2, a numpy array is compared whole: the per-step comparison meets
    the same Python number with the same promotion; otherwise each element as the loop does."""
    if op is None:
        if isinstance(x, (torch.Tensor, np.ndarray)):
            return x != 0
        return np.fromiter((bool(e) for e in x), dtype=bool, count=len(x))
    compare = _COMPARE[op]
    if isinstance(x, torch.Tensor) or (_NEP50 and isinstance(x, np.ndarray)):
        return compare(x, number)
    return np.fromiter((bool(compare(e, number)) for e in x), dtype=bool, count=len(x))


def arrays_only(x: Any) -> Any:
    """``x`` if it is a tensor or numpy array, else None (which the guard declines): the values a
    reset condition reads through ``.item()``, which Python numbers do not have."""
    return x if isinstance(x, (torch.Tensor, np.ndarray)) else None


def as_row(s: Any, b: Any) -> Any:
    """The carried value with the leading size-1 dims that broadcasting added dropped, so that
    it has (at most) the rank of one step of ``b``."""
    if _array(s) and _array(b):
        rank = b.ndim - 1
        while s.ndim > rank and s.shape[0] == 1:
            s = s[0]
    return s


def restore(last: Any, s: Any) -> Any:
    """The carried value after the vectorized steps, in the form the loop would hold it: the
    shape of ``s`` (the carried value before them), a Python float if ``s`` is one."""
    if type(s) is float:
        return float(last)
    if isinstance(s, torch.Tensor) and isinstance(last, torch.Tensor) and last.shape != s.shape:
        return last.reshape(s.shape)
    if isinstance(s, np.ndarray) and isinstance(last, (np.ndarray, np.generic)) and np.shape(last) != s.shape:
        return np.reshape(last, s.shape)
    return last


def items_of(seq: Any, src: Any, like: Any = None, srcs: Sequence[Any] = ()) -> list:
    """Per-step values of a vectorized result as list items, in index order: Python floats when
    the loop read lists of floats (``src``, or every container of ``srcs`` when given, is a list
    of Python numbers), numpy scalars / rows, row tensors otherwise (shaped like ``like``).
    Rows that carry autograd history are cloned: each keeps its own history (its gradient flows
    back through the clone, an identity, and the op) and, like the loop's items, is a tensor of
    its own, not one of several views of one result (which autograd forbids modifying in place)
    sharing one version counter."""
    if isinstance(seq, np.ndarray):
        if all(type(x) in (list, tuple) and _checked_kind(x) in ("float", "flags") for x in (srcs or (src,))):
            return seq.tolist()
        rows = list(seq)
    else:
        rows = list(seq.unbind(0))
    if like is not None and hasattr(like, "shape") and rows and tuple(np.shape(rows[0])) != tuple(like.shape):
        rows = [r.reshape(like.shape) for r in rows]
    if isinstance(seq, torch.Tensor) and seq.requires_grad and torch.is_grad_enabled():
        rows = [r.clone() for r in rows]
    return rows


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


def to_rank(v: Any, out: Any) -> Any:
    """``v`` (time first, ``[n, *row]``) shaped for ``out[lo:hi] = v`` to store each step's row as
    the loop's ``out[t] = row`` does: broadcasting aligns shapes from the right, so a row of lower
    rank than ``out``'s rows needs its singleton dims between the time axis and the row (not in
    front of the time axis, where the assignment would put them), and size-1 dims a row has in
    excess (which ``out[t] = row`` drops) go."""
    if not isinstance(v, (torch.Tensor, np.ndarray)) or v.ndim < 1:
        return v
    k = out.ndim - v.ndim
    if k > 0:
        return v.reshape(tuple(v.shape[:1]) + (1,) * k + tuple(v.shape[1:]))
    if k < 0 and all(d == 1 for d in v.shape[1:1 - k]):
        return v.reshape(tuple(v.shape[:1]) + tuple(v.shape[1 - k:]))
    return v


def wrapped(items: list) -> list:
    """Each item in a one-element list of its own (the loop appends ``[x]``)."""
    return [[x] for x in items]


def dim1(x: Any) -> Any:
    """The time-major view of an array walked along dimension 1 (``x[:, t]`` is ``dim1(x)[t]``,
    writes through it land in ``x``), or None for anything else (the guard declines)."""
    if _tensor(x) and x.ndim >= 2:
        return x.movedim(1, 0)
    if _ndarray(x) and x.ndim >= 2:
        return np.moveaxis(x, 1, 0)
    return None


def dim_view(x: Any, dim: int, ndim: int, ints: Tuple[int, ...] = ()) -> Any:
    """The time-major view of an array walked along dimension ``dim`` (negative: from the end):
    ``x[..., t, :]`` is ``dim_view(x, -2, 2)[t]``, ``x[:, :, t]`` is ``dim_view(x, 2, 3)[t]``, and
    with integer indices right after the time index ``x[:, t, 0]`` is ``dim_view(x, 1, 3, (0,))[t]``
    (``movedim`` keeps the other dimensions in order, so the dimensions after time keep their
    places; basic indexing keeps a view: writes through it land in ``x``). None (the guard
    declines) for anything but a tensor or ndarray of at least ``ndim`` dimensions, the number the
    loop's subscript needs, or an index out of range (the loop raises as written)."""
    try:
        if not ((_tensor(x) or _ndarray(x)) and type(dim) is int and x.ndim >= max(ndim, 2)
                and -x.ndim <= dim < x.ndim and all(type(i) is int for i in ints)):
            return None
        v = x.movedim(dim, 0) if _tensor(x) else np.moveaxis(x, dim, 0)
        if ints:
            at = dim if dim >= 0 else x.ndim + dim  # the dims after time are at at + 1, ... in v too
            v = v[(slice(None),) * (at + 1) + tuple(ints)]
        return v
    except Exception:
        return None


def written_apart(written: Sequence[Any], others: Sequence[Any]) -> bool:
    """No container the loop writes (lists appended to, arrays written at ``[t]``) is, or shares
    memory with, a container whose loop-invariant elements the guard reads once (``others``:
    ``coef`` of ``coef[0]``): under a second name the loop's writes would change what those reads
    give from one step to the next (``returns.insert(0, r + gamma * R * other[0])`` with ``other is
    returns``), which the rewrite, reading them once, would not see."""
    try:
        for w in written:
            for o in others:
                if w is o:
                    return False
                if _tensor(w) and _tensor(o) and _storage(w) == _storage(o):
                    return False
                if _ndarray(w) and _ndarray(o) and np.may_share_memory(w, o):
                    return False
        return True
    except Exception:
        return False


def column(x: Any, idx: Tuple[int, ...]) -> Any:
    """``x[:, *idx]``: the per-step values ``x_t[idx]`` of a loop over the rows ``x_t`` of an
    array (``x[t][idx]`` is ``x[:, idx][t]`` for tensors and numpy arrays with integer indices),
    or None for anything else (the guard declines None; an index out of range is left to the
    loop, which raises as written)."""
    try:
        if _array(x) and x.ndim > len(idx) and all(type(i) is int for i in idx):
            return x[(slice(None),) + tuple(idx)]
    except Exception:
        pass
    return None


def reset_linear_recurrence(a: Any, b: Any, reset: Any, value: Any, init: Any = 0.0, return_last: bool = False):
    """``x[t] = b[t] + a[t] * (value if reset[t] else x[t+1])`` for t = T-1..0, ``x[T] = init``:
    the loop with ``if done: s = value`` before ``s = b + a * s``. Exact: one
    :func:`linear_recurrence` call per stretch between resets, the stretch below a reset
    starting from ``value`` exactly as the loop does."""
    n = len(b)
    if isinstance(reset, torch.Tensor):
        idx = torch.nonzero(reset).flatten().tolist()
    else:
        idx = np.flatnonzero(reset).tolist()
    a_seq = not isinstance(a, _PY_SCALARS) and np.ndim(a) >= 1
    parts = []
    hi, carry = n, init
    last = init
    for lo in [r + 1 for r in reversed(idx)] + [0]:
        if lo < hi:
            seg_a = a[lo:hi] if a_seq else a
            out, last = linear_recurrence(seg_a, b[lo:hi], init=carry, return_last=True)
            parts.append(out)
        hi, carry = lo, value
    parts.reverse()
    if not parts:
        out = b[0:0]
    elif len(parts) == 1:
        out = parts[0]
    elif isinstance(parts[0], torch.Tensor):
        out = torch.cat(parts)
    else:
        out = np.concatenate(parts)
    if return_last:
        return out, (last if n else init)
    return out


def switch_linear_recurrence(a: Any, b: Any, reset: Any, value: Any, init: Any = 0.0, return_last: bool = False):
    """``x[t] = value if reset[t] else b[t] + a[t] * x[t+1]`` for t = T-1..0, ``x[T] = init``: the
    loop with ``if done: s = value else: s = b + a * s``. Exact: the steps that do not reset are
    :func:`reset_linear_recurrence` with each reset moved to the step below it (which reads
    ``value``, as the loop's does); the reset steps then hold ``value`` itself (a selection)."""
    n = len(b)
    if isinstance(reset, torch.Tensor):
        below = torch.cat([reset[1:], reset.new_zeros(1 if n else 0)])
    else:
        reset = np.asarray(reset, dtype=bool)
        below = np.concatenate([reset[1:], np.zeros(1 if n else 0, dtype=bool)])
    out = reset_linear_recurrence(a, b, below, value, init=init)
    if n:
        mask = reset.reshape((n,) + (1,) * (out.ndim - 1))
        if isinstance(out, torch.Tensor):  # flags from a list are a numpy mask next to tensors
            mask = torch.as_tensor(mask, device=out.device)
            out = torch.where(mask, torch.tensor(value, dtype=out.dtype, device=out.device), out)
        else:
            out = np.where(mask, np.asarray(value, dtype=out.dtype), out)
    if return_last:
        return out, (out[0] if n else init)
    return out


#: Shortest sequence worth vectorizing a quadratic sum loop (``out[t] = sum over k >= t``, T (T + 1) / 2
#: inner steps) instead of running it: the rewrite costs 13-20 us at small T. Measured on a 2-core
#: CPU, one thread: break-even at about 3 steps for tensors, 10-14 for numpy, 22 for lists of floats.
QUAD_MIN_STEPS = {"torch": 3, "tlist": 3, "numpy": 12, "float": 24}


def quadratic_ok(
    T: int,
    seqs: Sequence[Tuple[Any, int]] = (),
    masks: Sequence[Tuple[Any, int]] = (),
    consts: Sequence[Any] = (),
    scalars: Sequence[Any] = (),
    outs: Sequence[Any] = (),
    lists: Sequence[Any] = (),
    *,
    divides: bool = False,
) -> bool:
    """Whether ``out[t] = sum_{k=t}^{T-1} c^(k-t) E(k)``, computed as one backward recurrence, may
    replace the quadratic loop for these values: what :func:`recurrence_ok` checks (``T`` is the
    number of outer steps, equal to the inner loop's end; shorter minimum lengths, the loop being
    quadratic), and also: ``masks``, ``(container, extra)`` pairs the loop reads as
    ``int(x[k])``, are 1-D with every element 0 or 1 (so that the float mask :func:`int_of` builds
    is what ``int`` gives, in any float dtype); ``outs`` have a floating dtype; Python-int
    ``scalars`` are -1, 0 or 1 (larger ones make the loop's powers exact big ints, which may
    overflow where the vectorized floats would not)."""
    try:
        if any(type(c) is int and abs(c) > 1 for c in scalars):
            return False
        devices = _recurrence_ok(T, seqs, masks, consts, scalars, outs, lists, (), False, divides, QUAD_MIN_STEPS)
        if devices is False:
            return False
        for x, _ in masks:
            if not _zero_one(x):
                return False
        for o in outs:
            if isinstance(o, torch.Tensor) and not o.is_floating_point():
                return False
            if isinstance(o, np.ndarray) and o.dtype.kind != "f":
                return False
        return True
    except Exception:
        return False


def _zero_one(x: Any) -> bool:
    if _tensor(x):
        return x.dtype == torch.bool or bool(((x == 0) | (x == 1)).all())
    if _ndarray(x):
        return x.dtype == np.bool_ or bool(((x == 0) | (x == 1)).all())
    if type(x) not in (list, tuple):
        return False
    for e in x:
        if type(e) in _PY_SCALARS or isinstance(e, np.generic):
            if not (e == 0 or e == 1):
                return False
        elif not (type(e) in _TENSORS and e.numel() == 1 and bool(e == 0) | bool(e == 1)):
            return False
    return True


def int_of(x: Any, like: Any) -> Any:
    """``int(x[k])`` for every k of a 0/1 mask (see :func:`quadratic_ok`), as an array of the kind,
    dtype and device of ``like``: the loop's Python ints are weak operands (they take the float
    operand's dtype), and this array combines with ``like`` the same way, with the same values."""
    if isinstance(like, torch.Tensor):
        if isinstance(x, torch.Tensor):
            return x.to(device=like.device, dtype=like.dtype)
        return torch.as_tensor(_ints(x, np.float64), device=like.device).to(like.dtype)
    if isinstance(x, np.ndarray):
        return x.astype(like.dtype)
    return _ints(x, like.dtype)


def _ints(x: Any, dtype: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x.astype(dtype)
    return np.fromiter((int(e) for e in x), dtype=dtype, count=len(x))


# ---------------------------------------------------------------- per-sample loss loops
# vectorize.reduction's loss loops (``advantage = R - value.item()`` then appends or sums):
# loss_zip / loss_range guard them on top of loop_batch's batch_zip / batch_range.

_EXACT_INT = 1 << 53
#: Fewest samples worth batching: below it the guard and the batched ops cost more than the loop.
#: Measured on a 2-core CPU, one thread, pytorch/examples' actor-critic loss loop (two appends,
#: .item(), smooth_l1_loss): 0.5x at 1 sample, about 0.8x at 2-3 under autograd, 1.3-1.4x at 4,
#: 6-16x at 16-64, 26-37x at 512.
LOSS_MIN_SAMPLES = 4


def _unpacks(item: Any, k: int) -> bool:
    """``a, b = item`` yields ``item``'s ``k`` entries, as ``zip(*seq)`` does: a list, a tuple or a
    tuple subclass (a namedtuple) that keeps tuple's iteration."""
    t = type(item)
    if t is tuple or t is list:
        return len(item) == k
    return isinstance(item, tuple) and t.__iter__ is tuple.__iter__ and t.__len__ is tuple.__len__ and len(item) == k


def _indexes(t: type) -> bool:
    """Items of type ``t`` give ``item[j]`` what unpacking them gives (tuple's own methods)."""
    return t is tuple or t is list or (issubclass(t, tuple) and t.__iter__ is tuple.__iter__
                                         and t.__len__ is tuple.__len__ and t.__getitem__ is tuple.__getitem__)


def _elem_rank(x: Any, first: int = 0) -> int:
    """The rank of one element of a per-sample container (a tensor's rows, or a list's tensors)."""
    return x.dim() - 1 if type(x) in _TENSORS else x[first].dim()


class LossBatch:
    """The samples of a loss loop as batches, with what the batched body needs: ``seqs`` (one
    aligned batch per loop element read), ``dtype`` (of every tensor the body computes), the
    rank each result has per sample (``fit``), and the conversions that stand for ``.item()``,
    Python-scalar arithmetic and ``torch.tensor([x])``."""

    __slots__ = ("seqs", "dtype", "ranks")

    def __init__(self, seqs: Tuple[Any, ...], dtype: Any, ranks: Tuple[int, ...]) -> None:
        self.seqs, self.dtype, self.ranks = seqs, dtype, ranks

    @staticmethod
    def item(x: Any) -> Any:
        """``x.item()`` per sample of a 1-element tensor: the float64 value, no history (a Python
        float holds a float32 or float64 value exactly, and Python float arithmetic is float64)."""
        return x.detach().to(torch.float64)

    def weak(self, x: Any) -> Any:
        """Python floats per sample meeting a tensor: torch casts a Python scalar to the tensor's
        dtype first, then computes in that dtype (float32/float64 on CPU and CUDA)."""
        return x.to(self.dtype)

    @staticmethod
    def new(x: Any) -> Any:
        """``torch.tensor([x])`` per sample of a 0-d tensor ``x``: its value, dtype, no history."""
        return x.detach()

    def fit(self, v: Any, j: int) -> Any:
        """A batched result with the rank one sample's result has (the batches were aligned to
        the highest rank: a 0-d result of 1-element operands drops their size-1 dims)."""
        r, n = self.ranks[j], v.dim() - 1
        return v if r >= n else v.reshape(tuple(v.shape[:1]) + tuple(v.shape[1 + n - r:]))


def _loss_finish(batches, ranks, invariants, *, units=(), zerod=(), numbers=(), unit_invs=(), fits=(), rank=0, cats=(),
                 cpu=False, floats=False, default=False) -> Optional[LossBatch]:
    """The checks a loss loop's batched body needs beyond loop_batch's (see :func:`loss_zip`)."""
    dtype = batches[0].dtype
    if floats and (dtype not in _FLOATS_T or batches[0].device.type not in ("cpu", "cuda")):
        return None  # float16/bfloat16 compute a Python scalar in float opmath; MPS has no float64
    if default and torch.get_default_dtype() != dtype:
        return None
    if cpu and batches[0].device.type != "cpu":
        return None
    for i in numbers:
        v = invariants[i]
        if type(v) not in _PY_SCALARS or (type(v) is int and abs(v) > _EXACT_INT):
            return None
    for k in units:
        if batches[k][0].numel() != 1:
            return None
    if any(type(invariants[i]) in _TENSORS and invariants[i].numel() != 1 for i in unit_invs):
        return None
    if any(ranks[k] != 0 for k in zerod):
        return None
    inv_ranks = [v.dim() if type(v) in _TENSORS else 0 for v in invariants]
    out = tuple(max([c] + [ranks[k] for k in keys] + [inv_ranks[i] for i in invs]) for keys, invs, c in fits)
    if any(out[j] < 1 for j in cats):
        return None  # torch.cat of 0-d results raises: the loop raises
    n0 = batches[0].dim() - 1
    if rank > n0:
        pad = (slice(None),) + (None,) * (rank - n0)
        batches = [b[pad] for b in batches]
    return LossBatch(tuple(batches), dtype, out)


def loss_zip(seqs: Sequence[Any], unpack: Sequence[Any], invariants: Sequence[Any] = (), accs: Sequence[Any] = (),
             **checks: Any) -> Optional[LossBatch]:
    """The samples of ``for a, (b, c) in zip(A, BC)`` as a :class:`LossBatch`, or None (the loop runs).

    ``unpack``: per zipped sequence, whether its element is read (a bool) or, for a tuple target,
    which of its entries are (a tuple of bools; every item must unpack into that many entries).
    What :func:`~scalebox_cst.runtime.loop_batch.batch_zip` checks holds for the entries read
    (tensors or lists of equally shaped tensors of one float dtype and device, invariants Python
    numbers or tensors of that dtype, equal lengths, at least one sample); ``checks``: ``units``
    (elements with one value per sample: ``.item()``, per-sample losses), ``zerod`` (0-d elements:
    ``torch.tensor([x])``), ``numbers`` (invariants that meet Python floats: Python numbers, ints
    below 2**53), ``unit_invs`` (invariants of a per-sample loss: numbers or 1-element tensors), ``floats`` (float32/float64 on CPU or CUDA only, where Python scalars convert as
    described in :meth:`LossBatch.weak` and float64 exists), ``default`` (the default dtype is the batch's: ``torch.tensor([f])``
    of a Python float), ``cpu`` (``torch.tensor`` makes CPU tensors), ``fits`` (per result, the
    elements and invariants its rank is the highest of, and a floor), ``cats`` (results that
    ``torch.cat`` joins: not 0-d), ``rank`` (the least rank the batches are aligned to)."""
    try:
        for seq, u in zip(seqs, unpack):  # O(1) first: lists of Python floats (returns) decline at once
            if type(seq) in (list, tuple) and seq:
                first = seq[0]
                if type(u) is tuple:
                    if not _unpacks(first, len(u)) or any(f and type(e) not in _TENSORS for e, f in zip(first, u)):
                        return None
                elif u and type(first) not in _TENSORS:
                    return None
        used: List[Any] = []
        sizes = set()
        for seq, u in zip(seqs, unpack):
            if type(seq) not in (list, tuple) and type(seq) not in _TENSORS:
                return None
            sizes.add(len(seq))
            if type(u) is tuple:  # checked and split in bulk (a per-item Python check costs as much as the loop)
                types = set(map(type, seq))
                if type(seq) not in (list, tuple) or not all(_unpacks(seq[0], len(u)) and _indexes(t) for t in types) \
                        or set(map(len, seq)) != {len(u)}:
                    return None
                used.extend(list(map(operator.itemgetter(j), seq)) for j, flag in enumerate(u) if flag)
            elif u:
                used.append(seq)
        if len(sizes) != 1 or not used or min(sizes) < LOSS_MIN_SAMPLES:
            return None
        batches = batch_zip(tuple(used), tuple(invariants), tuple(accs))
        if batches is None:
            return None
        return _loss_finish(list(batches), [_elem_rank(s) for s in used], invariants, **checks)
    except Exception:
        return None


def loss_range(r: Any, seqs: Sequence[Any], invariants: Sequence[Any] = (), accs: Sequence[Any] = (),
               **checks: Any) -> Optional[LossBatch]:
    """``X[i]`` for ``i`` in ``range(...)`` as a :class:`LossBatch` (what
    :func:`~scalebox_cst.runtime.loop_batch.batch_range` checks, and the ``checks`` of
    :func:`loss_zip`), or None."""
    try:
        if type(r) is not range or len(r) < LOSS_MIN_SAMPLES:
            return None
        batches = batch_range(r, tuple(seqs), tuple(invariants), tuple(accs))
        if batches is None:
            return None
        return _loss_finish(list(batches), [_elem_rank(s, r.start) for s in seqs], invariants, **checks)
    except Exception:
        return None
