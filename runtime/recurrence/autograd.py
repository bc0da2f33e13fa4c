"""The recurrence under autograd: its backward is itself a linear recurrence in the other
direction, run on the same backend (and differentiable again)."""
from __future__ import annotations

import torch

from .backends import _Tensor
from .kernels import _backend

# --------------------------------------------------------------------------
# autograd
# --------------------------------------------------------------------------


def _needs_grad(a, b, init):
    if not torch.is_grad_enabled():
        return False
    return (
        b.requires_grad
        or (isinstance(a, _Tensor) and a.requires_grad)
        or (isinstance(init, _Tensor) and init.requires_grad)
    )


class _LinearRecurrenceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, b, a, init, reverse, S, impl):
        out = _backend(a, b, init, reverse, S, impl)
        a_t = a if isinstance(a, _Tensor) else None
        i_t = init if isinstance(init, _Tensor) else None
        ctx.save_for_backward(a_t, i_t, out)
        ctx.a_scalar = None if a_t is not None else a
        ctx.init_scalar = None if i_t is not None else init
        ctx.b_shape = b.shape
        ctx.reverse = reverse
        ctx.S = S
        ctx.impl = impl
        return out

    @staticmethod
    def backward(ctx, g):
        a, init, out = ctx.saved_tensors
        rev = ctx.reverse
        S = ctx.S
        T = out.shape[0]
        need_b, need_a, need_i = ctx.needs_input_grad[:3]
        # lambda[t] = dL/dx[t]; reverse: lambda[t] = g[t] + a[t-1] * lambda[t-1]
        if a is None:
            a_sh = ctx.a_scalar
        elif a.shape[0] == 1 or T == 1:
            a_sh = a
        else:
            z = a.new_zeros((1,) + a.shape[1:])
            a_sh = torch.cat([z, a[:-1]]) if rev else torch.cat([a[1:], z])
        lam = _core(a_sh, g, 0.0, not rev, S, ctx.impl)
        grad_b = grad_a = grad_i = None
        if need_b:
            grad_b = lam.sum_to_size(ctx.b_shape) if lam.shape != ctx.b_shape else lam
        if need_a:
            if init is not None:
                edge = init.expand(S).unsqueeze(0)
            else:
                edge = out.new_full((1,) + S, ctx.init_scalar)
            x_next = torch.cat([out[1:], edge]) if rev else torch.cat([edge, out[:-1]])
            ga = lam * x_next
            grad_a = ga.sum_to_size(a.shape)
        if need_i:
            if a is None:
                ae = ctx.a_scalar
            else:
                ae = a[0] if a.shape[0] == 1 else (a[-1] if rev else a[0])
            gi = ae * (lam[-1] if rev else lam[0])
            grad_i = gi.sum_to_size(init.shape) if gi.shape != init.shape else gi
        return grad_b, grad_a, grad_i, None, None, None


def _core(a, b, init, reverse, S, impl):
    if _needs_grad(a, b, init):
        return _LinearRecurrenceFn.apply(b, a, init, reverse, S, impl)
    return _backend(a, b, init, reverse, S, impl)
