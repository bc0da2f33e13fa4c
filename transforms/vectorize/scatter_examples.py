"""Documented examples of the per-row ``index_add_`` rewrite (vectorize.elementwise): rewritten
and left alone; all are listed in VectorizeElementwise.EXAMPLES (the transform that rewrites them).
"""
from __future__ import annotations

from ..base import Example, Inputs


EXAMPLES = [
    Example(
        code=(
            "import torch\n"
            "def segment_sum(values, seg, n_seg):\n"
            "    out = torch.zeros(values.shape[0], n_seg, dtype=values.dtype)\n"
            "    for b in range(values.shape[0]):\n"
            "        out[b].index_add_(0, seg[b], values[b])\n"
            "    return out\n"
        ),
        rewritten=True,
        note="per-row segment sum (index_add_ → scatter_add_)",
        expected="per_row_segment_sum",
        inputs=Inputs("segment_sum", "torch.randn(5, 9, dtype=torch.float64), torch.randint(0, 4, (5, 9)), 4"),
    ),
    Example(
        code=(
            "import torch\n"
            "def aggregate(msg, dst, agg):\n"
            "    for g in range(agg.size(0)):\n"
            "        agg[g].index_add_(dim=0, index=dst[g], source=msg[g])\n"
            "    return agg\n"
        ),
        rewritten=True,
        note="message passing per graph, keyword arguments",
        expected="message_passing_per_graph",
        inputs=Inputs("aggregate", "torch.randn(3, 11, 8), torch.randint(0, 6, (3, 11)), torch.zeros(3, 6, 8)"),
    ),
    Example(
        code=(
            "import torch\n"
            "def scaled(out, idx, src, scale):\n"
            "    for i in range(len(out)):\n"
            "        out[i].index_add_(0, idx[i], src[i], alpha=scale)\n"
            "    return out\n"
        ),
        rewritten=True,
        note="per-row index_add_ with alpha (flattened index_add_)",
        expected="per_row_index_add_with_alpha",
        inputs=Inputs("scaled", "torch.randn(4, 5, 3, dtype=torch.float64), torch.randint(0, 5, (4, 12)), torch.randn(4, 12, 3, dtype=torch.float64), 0.3"),
    ),
    Example(
        code=(
            "import torch\n"
            "def last_dim(out, idx, src):\n"
            "    for o, j, s in zip(out, idx, src):\n"
            "        o.index_add_(-1, j, s)\n"
            "    return out\n"
        ),
        rewritten=True,
        note="zip over rows, negative dim",
        expected="zip_over_rows",
        inputs=Inputs("last_dim", "torch.randn(4, 2, 6), torch.randint(0, 6, (4, 7)), torch.randn(4, 2, 7)"),
    ),
    Example(
        code=(
            "import torch\n"
            "def project(target_pmfs, l, u, d_m_l, d_m_u):\n"
            "    for i in range(target_pmfs.size(0)):\n"
            "        target_pmfs[i].index_add_(0, l[i].long(), d_m_l[i])\n"
            "        target_pmfs[i].index_add_(0, u[i].long(), d_m_u[i])\n"
            "    return target_pmfs\n"
        ),
        rewritten=True,
        note="CleanRL C51 projection: two calls per row, float index rows cast with .long()",
        expected="cleanrl_c51_projection",
        inputs=Inputs("project", "torch.zeros(4, 11), torch.rand(4, 11).mul(10).floor(), torch.rand(4, 11).mul(10).ceil(), torch.rand(4, 11), torch.rand(4, 11)"),
    ),
    Example(
        code=(
            "import torch\n"
            "def two_dims(out, idx, src, jdx, tgt):\n"
            "    for i in range(len(out)):\n"
            "        out[i].index_add_(0, idx[i], src[i])\n"
            "        out[i].index_add_(1, jdx[i], tgt[i])\n"
            "    return out\n"
        ),
        rewritten=False,
        reason="index different dims",
        note="two calls per row along different dims",
    ),
    Example(
        code=(
            "import torch\n"
            "def half_index(out, idx, src):\n"
            "    for i in range(len(out)):\n"
            "        out[i].index_add_(0, idx[i].short(), src[i])\n"
            "    return out\n"
        ),
        rewritten=False,
        reason="only `.long()`, `.int()`",
        note="index row cast to int16 (index_add_ rejects it)",
    ),
    Example(
        code=(
            "import torch\n"
            "def shifted(out, idx, src):\n"
            "    for i in range(len(idx)):\n"
            "        out[i + 1].index_add_(0, idx[i], src[i])\n"
            "    return out\n"
        ),
        rewritten=False,
        reason="not the current row",
        note="index_add_ into the next row",
    ),
    Example(
        code=(
            "import torch\n"
            "def normalised(out, idx, src):\n"
            "    for i in range(len(out)):\n"
            "        out[i].index_add_(0, idx[i], src[i])\n"
            "        out[i] /= out[i].sum()\n"
            "    return out\n"
        ),
        rewritten=False,
        reason="loop-carried",
        note="index_add_ then a statement reading the output",
    ),
    Example(
        code=(
            "import torch\n"
            "def greedy(out, src):\n"
            "    for i in range(len(out)):\n"
            "        out[i].index_add_(0, out[i].argmax().view(1), src[i])\n"
            "    return out\n"
        ),
        rewritten=False,
        reason="which the loop writes",
        note="index computed from the output",
    ),
    Example(
        code=(
            "import torch\n"
            "def until_done(out, idx, src, done):\n"
            "    for i in range(len(out)):\n"
            "        if done[i]:\n"
            "            break\n"
            "        out[i].index_add_(0, idx[i], src[i])\n"
            "    return out\n"
        ),
        rewritten=False,
        reason="exit early (break)",
        note="per-row index_add_ with an early exit",
    ),
]
