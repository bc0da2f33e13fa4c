"""Triton (CUDA) kernel for :func:`scalebox_cst.runtime.recurrence.linear_recurrence`.

Imported lazily (only when a CUDA tensor reaches ``linear_recurrence`` and
``triton`` is importable).

One launch per call.  Program ``pid`` owns a block of ``BLOCK_N`` contiguous
columns (envs) and walks the time axis in chunks of ``BLOCK_T`` rows, in
recurrence order (from ``T-1`` down for ``reverse``).  Each chunk is a
``[BLOCK_T, BLOCK_N]`` tile (loads coalesced along the column axis), scanned
along the time axis with ``tl.associative_scan`` using the affine-map
composition

    (a_l, b_l) o (a_r, b_r) = (a_l * a_r, a_r * b_l + b_r)

so that row ``i`` holds ``(A_i, B_i)`` with ``x_i = A_i * carry + B_i``; the
carry is the last row of ``x``.  Rows outside ``[0, T)`` are padded with the
identity ``(1, 0)``, so the last row of the last tile always holds the final
value.

This is a reassociated evaluation (and Triton may contract ``A * carry + B``
into an FMA): results agree with the sequential loop to rounding, not bitwise.
float16 / bfloat16 inputs are accumulated in float32, float64 in float64.
"""

import triton
import triton.language as tl

__all__ = ["launch", "pick_config"]


@triton.jit
def _combine(a_l, b_l, a_r, b_r):
    return a_l * a_r, a_r * b_l + b_r


@triton.jit
def _linrec_kernel(
    a_ptr, b_ptr, init_ptr, out_ptr,
    T, M,
    stride_at, stride_am, stride_bt, stride_bm, stride_im, stride_ot,
    a_scalar, init_scalar,
    A_IS_SCALAR: tl.constexpr,
    INIT_IS_SCALAR: tl.constexpr,
    REVERSE: tl.constexpr,
    ACC_F64: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < M
    cols64 = cols.to(tl.int64)
    rows = tl.arange(0, BLOCK_T)
    is_last_row = (rows == BLOCK_T - 1)[:, None]

    if INIT_IS_SCALAR:
        carry = tl.zeros([BLOCK_N], dtype=tl.float32) + init_scalar
    else:
        carry = tl.load(init_ptr + cols64 * stride_im, mask=col_mask, other=0.0)
    if ACC_F64:
        carry = carry.to(tl.float64)
    else:
        carry = carry.to(tl.float32)

    for start in tl.range(0, T, BLOCK_T, num_stages=NUM_STAGES):
        if REVERSE:
            t = T - 1 - start - rows
        else:
            t = start + rows
        t_ok = (t >= 0) & (t < T)
        mask = t_ok[:, None] & col_mask[None, :]
        t64 = t.to(tl.int64)

        b = tl.load(b_ptr + t64[:, None] * stride_bt + cols64[None, :] * stride_bm,
                    mask=mask, other=0.0)
        if A_IS_SCALAR:
            a = tl.where(mask, tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32) + a_scalar, 1.0)
        else:
            a = tl.load(a_ptr + t64[:, None] * stride_at + cols64[None, :] * stride_am,
                        mask=mask, other=1.0)
        if ACC_F64:
            a = a.to(tl.float64)
            b = b.to(tl.float64)
        else:
            a = a.to(tl.float32)
            b = b.to(tl.float32)

        A, B = tl.associative_scan((a, b), 0, _combine)
        x = A * carry[None, :] + B
        tl.store(out_ptr + t64[:, None] * stride_ot + cols64[None, :],
                 x.to(out_ptr.dtype.element_ty), mask=mask)
        carry = tl.sum(tl.where(is_last_row, x, 0.0), axis=0)


def _next_pow2(n):
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def pick_config(T, M, itemsize):
    """Heuristic launch configuration ``(BLOCK_T, BLOCK_N, num_warps, num_stages)``.

    Few columns (small batch of envs): one program per column block, so take
    long time chunks to keep the sequential chunk loop short.  Many columns:
    32-wide column blocks (128 B rows in float32) and short chunks, so that
    there are enough programs to fill the GPU.  Picked from a sweep on an
    H200 (benchmarks/bench_recurrence.py --sweep): T=2048 M=8 best at
    (512, 8, 8 warps), M=64 at (128, 32, 4), M=16384 at (64, 32, 4);
    one pipeline stage (two gave no measurable gain).
    """
    tp = _next_pow2(max(T, 1))
    if M <= 16:
        block_n = _next_pow2(M)
        block_t = min(tp, 512)
    elif M <= 4096:
        block_n = 32
        block_t = min(tp, 128)
    else:
        block_n = 32
        block_t = min(tp, 64)
    if itemsize == 8:
        block_t = max(16, block_t // 2)
    tile = block_t * block_n
    if M <= 16:
        num_warps = min(8, max(1, tile // 512))
    else:
        num_warps = min(4, max(1, tile // 256))
    return block_t, block_n, num_warps, 1


_configs = {}


def launch(a, b, init, out, reverse, config=None):
    """Run the kernel.

    ``b``: ``[T, M]`` CUDA tensor (any strides); ``a``: a Python float or a
    ``[T, M]`` tensor (any strides, 0-strides for broadcast dims allowed);
    ``init``: a Python float or an ``[M]`` tensor (any stride); ``out``:
    contiguous ``[T, M]`` tensor of the result dtype.  For float64 results the
    scalars must be passed as tensors (Triton passes Python floats as fp32).
    """
    T, M = b.shape
    if T == 0 or M == 0:
        return out
    if config is None:
        key = (T, M, out.element_size())
        config = _configs.get(key)
        if config is None:
            if len(_configs) > 256:
                _configs.clear()
            config = _configs[key] = pick_config(*key)
    block_t, block_n, num_warps, num_stages = config
    a_is_scalar = not hasattr(a, "data_ptr")
    init_is_scalar = not hasattr(init, "data_ptr")
    a_ptr = b if a_is_scalar else a
    init_ptr = b if init_is_scalar else init
    sat, sam = (0, 0) if a_is_scalar else (a.stride(0), a.stride(1))
    sim = 0 if init_is_scalar else init.stride(0)
    grid = (triton.cdiv(M, block_n),)
    _linrec_kernel[grid](
        a_ptr, b, init_ptr, out,
        T, M,
        sat, sam, b.stride(0), b.stride(1), sim, out.stride(0),
        float(a) if a_is_scalar else 0.0,
        float(init) if init_is_scalar else 0.0,
        A_IS_SCALAR=a_is_scalar,
        INIT_IS_SCALAR=init_is_scalar,
        REVERSE=bool(reverse),
        ACC_F64=out.dtype.itemsize == 8,
        BLOCK_T=block_t,
        BLOCK_N=block_n,
        NUM_STAGES=num_stages,
        num_warps=num_warps,
    )
    return out
