"""Numba kernel for the exact soft update on CPU (imported lazily by ``target_update.py``).

One pass over a parameter pair: ``t[i] = b * t[i] + a * p[i]`` with each product rounded to
the array dtype and then one rounded add, exactly what ``tp.copy_(a * p + b * tp)`` and
``tp.mul_(b); tp.add_(a * p)`` compute element by element (torch multiplies a float32 tensor by a
Python float as ``float32(scalar) * x`` in float32). numba's default ``fastmath=False`` gives LLVM
no ``contract``/``reassoc`` flags, so it may vectorize but never fuse the multiply and the add
into an FMA: the result is bitwise the loop's. ``p`` and ``t`` are flat C-contiguous views of
the ``.data`` of one parameter pair, of the same length (one call per pair costs about 0.6 us,
less than what a typed list of arrays costs to compile).
"""

import numpy as np
from numba import njit

__all__ = ["soft32", "soft64"]


@njit(cache=True)
def soft32(p, t, a, b):  # pragma: no cover - compiled
    a32 = np.float32(a)
    b32 = np.float32(b)
    for i in range(p.size):
        t[i] = np.float32(b32 * t[i]) + np.float32(a32 * p[i])


@njit(cache=True)
def soft64(p, t, a, b):  # pragma: no cover - compiled
    a64 = np.float64(a)
    b64 = np.float64(b)
    for i in range(p.size):
        t[i] = (b64 * t[i]) + (a64 * p[i])
