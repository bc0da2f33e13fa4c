"""A target network's forward whose parameters' gradients nobody reads: its graph cut at the output.

minimalRL's DQN computes ``max_q_prime = q_target(s_prime).max(1)[0].unsqueeze(1)`` outside any
``no_grad``: the target flows into the loss, so ``loss.backward()`` also runs backward through
the whole target network, into ``.grad`` of parameters nobody reads (the target network is
never given to an optimizer; ``load_state_dict`` copies values, not gradients).
``hot.target_graph_cut`` proves statically that the module object is such a network (built at
one site from this file's code or ``torch.nn``, used only for forwards, ``load_state_dict`` /
``state_dict`` / ``eval`` / ``train``, and as an argument of this file's functions that use it so),
marks the object where it is built (:func:`grads_unread`) and calls its forwards through
:func:`target_forward`.

:func:`target_forward` runs the forward exactly as written (grad mode, hooks, RNG, same values),
then returns ``out.detach().requires_grad_()`` in place of ``out`` only when all of these hold,
and ``out`` itself otherwise:

* the module object was marked (another file calling the same function with another module, or
  one whose gradients an optimizer reads, takes the original path);
* ``out`` is a plain ``torch.Tensor`` that requires grad (a tuple, a subclass, an integer result
  are returned as they are);
* no argument is a tensor that requires grad, and every argument is a tensor, a Python scalar,
  ``None`` or a string (so no gradient into the inputs is cut: only the one into the marked
  module's own parameters, which nobody reads);
* no global module backward or forward hook is registered (``torch.nn.modules.module``'s: the
  first would have seen the target network's backward, the second could hook its outputs).

The leaf keeps ``requires_grad`` as it was, so everything downstream records the same graph up to
the cut, computes the same values and gradients for every other tensor (autograd sums the same
contributions in the same order: the cut branch contributed only to the target's parameters). What
differs, and is refused statically along the value's flow: ``.grad_fn``/``.is_leaf`` of the
output, its ``.grad`` (the leaf's is filled), in-place changes of it or of an alias or view (they
raise on a leaf that requires grad: ``_`` methods and torch functions, ``x += ...``, ``inplace=``,
``out=``), a second backward through it (the original raises, its graph freed; the leaf has none
to free: refused where the output reaches two backward calls, or one in a loop the forward is
outside), and the target's parameters' ``.grad``.
"""
from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.nn.modules import module as _nn_module

_TENSOR = torch.Tensor
_PLAIN = (int, float, bool, str, type(None))
#: module objects built at a site the transform proved (weak: the mark dies with the module)
_UNREAD: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()


def grads_unread(module: Any) -> Any:
    """``module`` as it is, marked as a network whose parameters' gradients nobody reads."""
    if isinstance(module, torch.nn.Module):
        _UNREAD.add(module)
    return module


def _no_grad_input(value: Any) -> bool:
    if type(value) is _TENSOR:
        return not value.requires_grad
    return type(value) in _PLAIN


def target_forward(net: Any, *args: Any, **kwargs: Any) -> Any:
    """``net(*args, **kwargs)``, its graph cut at the output where that changes nothing anyone reads."""
    out = net(*args, **kwargs)
    if type(out) is not _TENSOR or not out.requires_grad or net not in _UNREAD:
        return out
    if _nn_module._global_backward_hooks or _nn_module._global_backward_pre_hooks or _nn_module._global_forward_hooks:
        return out
    for value in args:
        if not _no_grad_input(value):
            return out
    for value in kwargs.values():
        if not _no_grad_input(value):
            return out
    return out.detach().requires_grad_()
