"""Run-time guards and glue for vectorized loops (rewritten code calls these by full name).

A rewrite of a Python loop is only exact when the values it meets at run time are of the kinds
the rewrite was planned for; static analysis cannot see that, so the rewritten code asks these
helpers first (cheap type / length / dtype / device / aliasing checks) and keeps the original
loop in the else branch. The other helpers convert between the user's containers (tensors,
numpy arrays, lists of floats, lists of tensors) and the arrays the vectorized maths runs on,
keeping the types the loop would have produced. No helper here ever raises on odd input in a
guard position: a guard that cannot decide answers False.

The emitted code imports this package (``from scalebox_cst.runtime import vectorized``) and
calls its names as attributes; each guard family lives in a module of its own: ``kinds`` (what
a value is), ``recurrence_guard``, ``quadratic``, ``loss`` (per-sample loss loops), ``resets``
and ``conversions`` (glue between the user's containers and arrays).
"""
from __future__ import annotations

from ..fused import fused_linear
from ..loop_batch import batch_range, batch_zip
from ..recurrence import linear_recurrence
from .conversions import (
    arrays_only,
    as_row,
    column,
    dim1,
    dim_view,
    items_of,
    restore,
    seq_of,
    seqs_of,
    to_rank,
    truth_of,
    wrapped,
    written_apart,
)
from .kinds import backward_steps, length, no_steps, steps
from .loss import LOSS_MIN_SAMPLES, LossBatch, loss_range, loss_zip
from .quadratic import QUAD_MIN_STEPS, int_of, quadratic_ok
from .recurrence_guard import MIN_STEPS, carry_ok, recurrence_ok
from .resets import reset_linear_recurrence, switch_linear_recurrence

__all__ = [
    "fused_linear",
    "steps",
    "no_steps",
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
    # also called by rewritten code, or read by tests and tools, by their names here
    "arrays_only",
    "switch_linear_recurrence",
    "MIN_STEPS",
    "QUAD_MIN_STEPS",
    "LOSS_MIN_SAMPLES",
    "batch_range",
    "batch_zip",
    "linear_recurrence",
]
