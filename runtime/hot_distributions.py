"""``Categorical(probs)`` built from a softmax, without argument validation where torch's check
provably passes (for :mod:`scalebox_cst.transforms.hot.distributions`).

``Categorical(probs=p)`` stores ``q = p / p.sum(-1, keepdim=True)`` and, when validating, checks
``q`` against ``constraints.simplex``: ``all(q >= 0)`` and ``|q.sum(-1) - 1| < 1e-6``, computed in
``q``'s dtype. The transform proves statically that ``p`` is the unmodified output of a softmax
(finite logits: every entry >= 0). Over the *last* dim, each row holds its maximum's
``1 / s >= 1/n > 0``, so no row sums to 0 and ``q`` is finite. What is left is rounding: with
``u`` the dtype's unit roundoff, ``p.sum`` is within ``(n-1)u`` of the exact sum (any summation
order, first order in u), each division adds ``u``, and the check's own sum ``(n-1)u``: so
``|q.sum(-1) - 1| <= (2n-1)u`` (the ``- 1`` is exact near 1). Hence the bounds below:

* float32 (u = 2^-24): ``(2n-1)u < float32(1e-6)`` for n <= 8 (15 * 2^-24 = 8.9e-7);
* float64 (u = 2^-53): any practical n; capped at 2^20 so that the bound is tested at its value;
* float16 / bfloat16: in those dtypes ``|sum - 1| < 1e-6`` means the sum rounds to exactly 1,
  which only n = 1 guarantees (softmax of one entry is 1.0 exactly).

:func:`categorical_probs` reads the shape and dtype (no host sync, no reduction) and passes
``validate_args=False`` only when the row length is within the bound and the softmax was over
the last dim (its static ``dim`` is -1 or ``ndim - 1``, or the tensor is 1-D); otherwise it builds
the distribution exactly as the original call did (validation as configured). Finite logits are
the contract: NaN/inf logits give NaN probs, which the original reports with ValueError and the
fast path does not (as for ``Normal`` with an ``exp`` scale).
"""
from __future__ import annotations

import torch

_Tensor = torch.Tensor

#: dtype -> the largest row length n for which (2n - 1) * u < 1e-6 in that dtype (see above)
BOUNDS = {torch.float32: 8, torch.float64: 1 << 20, torch.float16: 1, torch.bfloat16: 1}


def categorical_probs(cls, probs, dim=None):
    """``cls(probs=probs)``, with ``validate_args=False`` where the simplex check cannot fail
    (see the module docstring); ``dim``: the softmax's dim where it is a literal, else None."""
    if isinstance(probs, _Tensor):
        shape = probs.shape
        nd = len(shape)
        if nd and 1 <= shape[-1] <= BOUNDS.get(probs.dtype, 0) and (nd == 1 or dim == -1 or dim == nd - 1):
            return cls(probs=probs, validate_args=False)
    return cls(probs=probs)
