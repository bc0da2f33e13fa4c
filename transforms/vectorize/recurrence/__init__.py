"""vectorize.recurrence: backward first-order linear recurrences (GAE, discounted returns) as one op.

RL code computes advantages and returns with a Python loop that walks time backwards carrying one
value, ``s = b_t + a_t * s`` (CleanRL's GAE, SB3's ``compute_returns_and_advantage``, REINFORCE's
``R = r + gamma * R``); at T = 2048 that loop costs milliseconds per update, the runtime op
``linear_recurrence`` microseconds. The recurrence is recognised from the algebra of the loop body
(the carried value must appear affinely), never from variable names.

The rewrite peels the loop: the first step (t = T-1, where CleanRL special-cases the bootstrap
value) and the last step (t = 0) run exactly as written, so every variable the loop leaves behind
keeps its value; the steps in between compute a_t and b_t as array expressions with the same
operation grouping as the body (bitwise-identical elements) and hand them to the op. A run-time
guard (types, dtypes, lengths, devices, aliasing) picks the vectorized branch; the original loop
stays verbatim in the else branch. Quadratic double loops that compute the same sums (each
advantage summed over k >= t) are recognised in :mod:`.quadratic`.

Where each part lives: :mod:`.headers` recognises backward loop headers, :mod:`.body` parses the
body into updates, :mod:`.candidates` decides which loops are planned, :mod:`.views` reads time
indexed in the middle (``x[..., t, :]``) through time-major views and :mod:`.unpack` splits tuple
assignments for the analysis. Then three stages, each a function whose result is frozen: a
:class:`~.headers.Header` and its loop -> :func:`.analysis.analyse` (with :mod:`.reads` the
per-step reads, :mod:`.grammar` the expressions understood, :mod:`.dataflow` what flows between
steps, :mod:`.lists` ``adv.append(f(adv[-1]))``) -> an ``Analysis`` -> :func:`.plan.plan` (with
:mod:`.render` the array expressions, :mod:`.affine` the carried update's algebra) -> a ``Plan``
-> :func:`.build.build`, the guarded statement. :mod:`.quadratic` handles double loops (the same
grammar and rendering), :mod:`.transform` ties them together, :mod:`.examples` holds the
documented examples. Dependencies point one way: syntax <- headers <- body <- reads <- grammar
<- analysis <- render <- plan <- build/quadratic <- transform.
"""
from __future__ import annotations

from .build import HELPERS_QUALNAME, OP_QUALNAME
from .syntax import Skip
from .transform import ID, VectorizeRecurrence

__all__ = ["HELPERS_QUALNAME", "ID", "OP_QUALNAME", "Skip", "VectorizeRecurrence"]
