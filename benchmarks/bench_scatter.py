"""Benchmark: per-row ``out[i].index_add_(0, idx[i], src[i])`` loops vs the code vectorize.elementwise emits.

    python benchmarks/bench_scatter.py [--quick] [--device cpu|cuda]

Single thread on CPU (OMP_NUM_THREADS=1, torch.set_num_threads(1)). The "rewritten" rows run the
code the pipeline emits for the naive source (guard included: type/shape checks and one
``aminmax`` of the indices). Cases, B=256 rows, K=64 indices per row into M=128 slots:

* rows of D=16 channels (message passing per graph), ``out`` [B, M, D];
* 1-D rows (segment sums per env), ``out`` [B, M];
* rows of D=16 with ``alpha`` (kept as one ``index_add_`` over flattened rows);
* CleanRL C51's projection, B=128 rows of 51 atoms, two calls per row with ``.long()`` index
  rows (``l``, ``u`` from ``b = (tz - v_min) / delta_z`` as in cleanrl/c51.py, some b integral):
  the rewrite makes two ``scatter_add_`` calls after a guard that casts and range-checks both.

Peer: a hand-written single op without guard (for C51: the hand-vectorized forms users write,
``scatter_add_`` of both halves, and ``index_add_`` over ``offset``-shifted flat indices as in
Rainbow implementations). Reported: median time per call and naive / method;
and whether rewritten == loop bitwise.
"""

import argparse
import os
import sys
import textwrap

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

import _timing  # noqa: E402  (benchmarks/_timing.py, beside this script)
from scalebox_cst.config import Config  # noqa: E402
from scalebox_cst.pipeline import Pipeline  # noqa: E402

DEVICE = "cpu"

LOOP = """\
def per_row(out, idx, src):
    for i in range(out.shape[0]):
        out[i].index_add_(0, idx[i], src[i])
    return out
"""

LOOP_ALPHA = """\
def per_row(out, idx, src):
    for i in range(out.shape[0]):
        out[i].index_add_(0, idx[i], src[i], alpha=0.5)
    return out
"""


LOOP_C51 = """\
def per_row(target_pmfs, l, u, d_m_l, d_m_u):
    for i in range(target_pmfs.size(0)):
        target_pmfs[i].index_add_(0, l[i].long(), d_m_l[i])
        target_pmfs[i].index_add_(0, u[i].long(), d_m_u[i])
    return target_pmfs
"""


def sync():
    _timing.sync(DEVICE)


def timeit(fn, number, repeat):
    """Median seconds per call over ``repeat`` samples of ``number`` calls."""
    return _timing.median_time(fn, number, repeat, DEVICE, warmup=3)


def rewritten(src, name):
    src = textwrap.dedent(src)
    result = Pipeline(Config(transforms=["vectorize.elementwise"]), backend=DEVICE).rewrite("bench.py", src.encode())
    assert result.report.error is None, result.report.error
    sites = [s for s in result.report.sites if s.action == "rewritten"]
    assert sites, result.report.sites
    ns_a, ns_b = {}, {}
    exec(src, ns_a)
    exec(result.output.decode(), ns_b)
    return ns_a[name], ns_b[name], sites[0]


def flat_peer(out, idx, src, alpha=None):
    b, m = out.shape[:2]
    flat = out.view(b * m, *out.shape[2:])
    index = (idx + torch.arange(0, b * m, m, device=idx.device).unsqueeze(1)).reshape(-1)
    source = src.reshape(b * idx.shape[1], *src.shape[2:])
    if alpha is None:
        flat.index_add_(0, index, source)
    else:
        flat.index_add_(0, index, source, alpha=alpha)


def case(args, title, code, rest, peers, b=256, k=64, m=128):
    naive, new, site = rewritten(code, "per_row")
    torch.manual_seed(0)
    out0 = torch.zeros(b, m, *rest, device=DEVICE)
    idx = torch.randint(0, m, (b, k), device=DEVICE)
    src = torch.randn(b, k, *rest, device=DEVICE)
    number, repeat = (3, 3) if args.quick else (10, 7)
    bufs = [out0.clone() for _ in range(2 + len(peers))]
    methods = [("index_add_ loop", lambda: naive(bufs[0], idx, src)), ("rewritten", lambda: new(bufs[1], idx, src))]
    for j, (label, fn) in enumerate(peers):
        methods.append((label, lambda j=j, fn=fn: fn(bufs[2 + j], idx, src)))
    print(f"\n{title} ({site.exactness})")
    base = None
    for label, fn in methods:
        t = timeit(fn, number if label != "index_add_ loop" else max(2, number // 3), repeat)
        base = base or t
        print(f"  {label:<48} {t * 1e6:>10.1f} us  {base / t:>7.1f}x")
    a, c = out0.clone(), out0.clone()
    naive(a, idx, src)
    new(c, idx, src)
    print(f"  {'check: rewritten == loop, bitwise':<48} {bool(torch.equal(a, c))}")


def c51_inputs(b=128, n_atoms=51, v_min=-10.0, v_max=10.0, gamma=0.99):
    """l, u, d_m_l, d_m_u as cleanrl/c51.py computes them (a quarter of the rows terminal with
    rewards on the atom grid, so b is integral there: l == u)."""
    g = torch.Generator().manual_seed(0)
    atoms = torch.linspace(v_min, v_max, n_atoms)
    next_pmfs = torch.softmax(torch.randn(b, n_atoms, generator=g), dim=1)
    rewards = torch.randn(b, 1, generator=g)
    dones = (torch.arange(b) % 4 == 0).float().unsqueeze(1)
    rewards[dones.bool()] = atoms[torch.randint(0, n_atoms, (int(dones.sum()),), generator=g)]
    next_atoms = rewards + gamma * atoms * (1 - dones)
    delta_z = atoms[1] - atoms[0]
    tz = next_atoms.clamp(v_min, v_max)
    bb = (tz - v_min) / delta_z
    lo = bb.floor().clamp(0, n_atoms - 1)
    up = bb.ceil().clamp(0, n_atoms - 1)
    d_m_l = (up + (lo == up).float() - bb) * next_pmfs
    d_m_u = (bb - lo) * next_pmfs
    return [x.to(DEVICE) for x in (torch.zeros_like(next_pmfs), lo, up, d_m_l, d_m_u)]


def c51_scatter_peer(t, lo, up, d_m_l, d_m_u):
    t.scatter_add_(1, lo.long(), d_m_l)
    t.scatter_add_(1, up.long(), d_m_u)


def c51_offset_peer(t, lo, up, d_m_l, d_m_u):
    b, n = t.shape
    offset = torch.linspace(0, (b - 1) * n, b, device=t.device).long().unsqueeze(1).expand(b, n)
    t.view(-1).index_add_(0, (lo.long() + offset).view(-1), d_m_l.view(-1))
    t.view(-1).index_add_(0, (up.long() + offset).view(-1), d_m_u.view(-1))


def c51_case(args):
    naive, new, site = rewritten(LOOP_C51, "per_row")
    out0, lo, up, d_m_l, d_m_u = c51_inputs()
    number, repeat = (3, 3) if args.quick else (20, 7)
    methods = [
        ("index_add_ loop (CleanRL c51.py)", naive),
        ("rewritten", new),
        ("peer: two scatter_add_(1, l.long(), d_m_l)", c51_scatter_peer),
        ("peer: two index_add_ over offset flat indices", c51_offset_peer),
    ]
    print(f"\nC51 projection, B=128, 51 atoms, two calls per row ({site.exactness})")
    base = None
    for label, fn in methods:
        buf = out0.clone()
        t = timeit(lambda fn=fn, buf=buf: fn(buf, lo, up, d_m_l, d_m_u), number if "loop" not in label else max(2, number // 4), repeat)
        base = base or t
        print(f"  {label:<48} {t * 1e6:>10.1f} us  {base / t:>7.1f}x")
    results = []
    for _, fn in methods:
        buf = out0.clone()
        fn(buf, lo, up, d_m_l, d_m_u)
        results.append(buf)
    print(f"  {'check: rewritten == loop, bitwise':<48} {bool(torch.equal(results[0], results[1]))}")
    print(f"  {'check: peers == loop, bitwise':<48} {[bool(torch.equal(results[0], r)) for r in results[2:]]}")


def main(argv=None):
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args(argv)
    DEVICE = args.device
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {DEVICE}")
    expand = lambda idx, src: idx.unsqueeze(-1).expand(src.shape)  # noqa: E731
    case(args, "rows [M=128, D=16], B=256, K=64", LOOP, (16,), [
        ("peer: out.scatter_add_(1, idx expanded, src)", lambda o, i, s: o.scatter_add_(1, expand(i, s), s)),
        ("peer: one index_add_ over flattened rows", flat_peer),
    ])
    case(args, "1-D rows [M=128], B=256, K=64", LOOP, (), [
        ("peer: out.scatter_add_(1, idx, src)", lambda o, i, s: o.scatter_add_(1, i, s)),
    ])
    case(args, "rows [M=128, D=16], B=256, K=64, alpha=0.5", LOOP_ALPHA, (16,), [
        ("peer: one index_add_ over flattened rows", lambda o, i, s: flat_peer(o, i, s, 0.5)),
    ])
    c51_case(args)


if __name__ == "__main__":
    sys.exit(main())
