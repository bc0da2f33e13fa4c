"""Guard-type fuzzing: every corpus loop, fed inputs of every array-like type, gives what the
original code gives.

Each file in tests/corpus is rewritten (the ``vectorize.*`` transforms, CPU backend) and both
versions are run by the file's own ``run(ns, T, seed)``; every function and method the file
defines is wrapped so that, per call, its arguments (and the attributes of namespace arguments)
are swapped for another type holding the same numbers (one input, sometimes two, of the first
call of each function, or for a method an attribute of ``self`` or of an object it holds; trial 0
keeps the inputs): float32 / float64 / float16 / int / bool
tensors, ``nn.Parameter`` (with and without grad), a tensor subclass, numpy arrays of several
dtypes, ``np.matrix``, ``np.ma`` masked arrays, 0-d arrays, lists of Python floats / ints / bools,
lists of numpy scalars, lists of tensors or rows, tuples, mixed lists, numpy / tensor scalars for
Python numbers. The swap is drawn from a seeded generator, the same for both runs. The rewritten
run must give the same values (bitwise where every rewritten site claims ``exact``), the same
types and dtypes (containers, elements, masked-array masks), the same arguments afterwards, and
the same exception type when the original raises. The run counts how often a guard let the
vectorized branch run (recurrence_ok / quadratic_ok / carry_ok, batch_zip / batch_range, the
target-update ops, flat_params): a fuzz that only ever took the fallback would prove nothing.

``SCALEBOX_FUZZ_TRIALS`` sets the trials per corpus file (default 24).
"""
import functools
import inspect
import os
import random
import sys
import types
import warnings

import numpy as np
import pytest
import torch

from scalebox_cst.report import EXACT, REWRITTEN
from scalebox_cst.runtime import vectorized as vectorized_mod

from corpus_harness import NAMES, Sub, Trace, corpus, same
import harness


TRIALS = int(os.environ.get("SCALEBOX_FUZZ_TRIALS", "24"))
LENGTHS = (2, 3, 5, 17, 33)
pytestmark = pytest.mark.filterwarnings("ignore")


# --------------------------------------------------------------------------- variants


def _tensor_variants(v, rng):
    out = []
    x = v.detach()
    if x.is_floating_point():
        out += [("f64", x.double()), ("f32", x.float()), ("f16", x.half()), ("int", x.round().long()), ("bool", x > 0)]
    else:
        out += [("f32", x.float()), ("f64", x.double())]
    out += [("param", torch.nn.Parameter(x.clone(), requires_grad=False)), ("sub", x.clone().as_subclass(Sub))]
    if x.is_floating_point():
        out.append(("param_grad", torch.nn.Parameter(x.double().clone())))
    n = x.cpu().numpy()
    out += _array_variants(n, rng, from_tensor=True)
    if x.ndim >= 1 and len(x):
        out.append(("rows", list(x.clone().unbind(0))))
    if x.ndim == 0:
        out += [("pyfloat", float(x)), ("np32", np.float32(x)), ("0d", np.array(float(x)))]
    return out


def _array_variants(n, rng, from_tensor=False):
    out = [("nd_f32", n.astype(np.float32)), ("nd_f64", n.astype(np.float64))]
    if n.dtype.kind == "f":
        out += [("nd_int", np.round(n).astype(np.int64)), ("nd_bool", n > 0)]
    if not from_tensor:
        out.append(("tensor", torch.from_numpy(np.array(n))))
        if n.dtype.kind == "f":
            out.append(("tensor_f64", torch.from_numpy(n.astype(np.float64))))
    if 1 <= n.ndim <= 2:
        out.append(("matrix", np.matrix(n)))
    if n.ndim >= 1:
        mask = rng.random(n.shape) < 0.2
        out += [("ma", np.ma.masked_array(n.copy(), mask=mask)), ("ma_nomask", np.ma.masked_array(n.copy()))]
    if n.ndim == 1:
        out += [("floats", [float(e) for e in n]), ("np_scalars", list(n)), ("tuple", tuple(float(e) for e in n))]
    if n.ndim >= 2 and len(n):
        out.append(("nd_rows", [r.copy() for r in n]))
    if n.ndim == 0:
        out += [("pyfloat", float(n)), ("scalar", n[()])]
    return out


def _list_variants(v, rng):
    if not v:
        return []
    types_ = set(map(type, v))
    out = [("tuple", tuple(v))]
    if types_ <= {float, int, bool}:
        out += [("np32", [np.float32(e) for e in v]), ("np64", [np.float64(e) for e in v]),
                ("ints", [int(round(e)) for e in v]), ("bools", [bool(e > 0) for e in v]),
                ("np_bools", [np.bool_(e > 0) for e in v]), ("mixed", [int(e) if i % 3 == 0 else float(e) for i, e in enumerate(v)]),
                ("nd", np.array(v, dtype=np.float64)), ("tensor", torch.tensor([float(e) for e in v])),
                ("t0d", [torch.tensor(float(e)) for e in v])]
    elif types_ <= {np.bool_}:
        out += [("pybools", [bool(e) for e in v]), ("ints", [int(e) for e in v]), ("floats", [float(e) for e in v])]
    elif types_ <= {torch.Tensor}:
        if all(e.is_floating_point() for e in v):
            out += [("f64", [e.double() for e in v]), ("params", [torch.nn.Parameter(e.detach().clone(), requires_grad=False) for e in v]),
                    ("subs", [e.detach().clone().as_subclass(Sub) for e in v]),
                    ("numpy_rows", [e.detach().numpy().copy() for e in v])]
            if len(v) > 1:
                out.append(("mixed_dtype", [e.double() if i == 1 else e for i, e in enumerate(v)]))
    elif types_ <= {np.ndarray}:
        out += [("f32", [e.astype(np.float32) for e in v]), ("f64", [e.astype(np.float64) for e in v]),
                ("tensors", [torch.from_numpy(np.array(e)) for e in v])]
        if all(e.ndim <= 2 for e in v):
            out.append(("matrices", [np.matrix(e) for e in v]))
    return out


def _scalar_variants(v):
    if type(v) is bool:
        return [("np_bool", np.bool_(v)), ("int", int(v)), ("float", float(v))]
    if type(v) is int:  # mostly sizes and counts: kept integral (a float size only breaks the set-up)
        return [("np_int", np.int64(v))] + ([("bool", bool(v))] if v in (0, 1) else [])
    if type(v) is float:
        return [("np32", np.float32(v)), ("np64", np.float64(v)), ("np16", np.float16(v)), ("0d", np.array(v)),
                ("t0d", torch.tensor(v)), ("t0d64", torch.tensor(v, dtype=torch.float64)), ("int", int(v))]
    if isinstance(v, np.floating):
        return [("py", v.item()), ("np32", np.float32(v)), ("np64", np.float64(v))]
    if isinstance(v, np.generic):
        return [("py", v.item())]
    return []


def variants(v, rng):
    if type(v) in (torch.Tensor, torch.nn.Parameter):
        return _tensor_variants(v, rng)
    if type(v) is np.ndarray:
        return _array_variants(v, rng)
    if type(v) in (list, tuple):
        return _list_variants(list(v), rng)
    return _scalar_variants(v)


def mutate(v, rng, log):
    """Another type holding the numbers of ``v`` (``v`` itself when it has no variant)."""
    try:
        cands = variants(v, np.random.default_rng(rng.randrange(2**32)))
    except Exception:  # e.g. values that do not convert: keep the value
        return v
    if not cands:
        return v
    name, out = cands[rng.randrange(len(cands))]
    log.append(f"{type(v).__name__}->{name}")
    return out


# --------------------------------------------------------------------------- wrapping


def mutate_call(args, kwargs, rng, log):
    """One input of the call (sometimes two) swapped for another type: an argument, or an
    attribute of a namespace argument (``args.gamma``); trial 0 of a file keeps its inputs."""
    slots = [("arg", i, None) for i in range(len(args))] + [("kw", k, None) for k in kwargs]
    for kind, key, _ in list(slots):
        v = args[key] if kind == "arg" else kwargs[key]
        if isinstance(v, types.SimpleNamespace):
            slots += [(kind, key, attr) for attr in vars(v)]
    if not slots:
        return args, kwargs
    for kind, key, attr in rng.sample(slots, min(len(slots), 1 if rng.random() < 0.8 else 2)):
        box = args if kind == "arg" else kwargs
        if attr is None:
            box[key] = mutate(box[key], rng, log)
        else:
            ns = types.SimpleNamespace(**vars(box[key]))
            setattr(ns, attr, mutate(getattr(ns, attr), rng, log))
            box[key] = ns
    return args, kwargs


def _holders(obj, module):
    """``obj`` and the objects of the corpus file's own classes (or namespaces) it holds."""
    out = [obj]
    for v in vars(obj).values():
        if isinstance(v, types.SimpleNamespace) or type(v).__module__ == module:
            out.append(v)
    return out


def mutate_attribute(obj, module, rng, log):
    try:
        slots = [(h, k) for h in _holders(obj, module) for k, v in vars(h).items()
                 if type(v) in (list, tuple, np.ndarray, torch.Tensor, float, int, bool) and not k.startswith("_")]
    except TypeError:  # no __dict__
        return
    if slots:
        h, k = slots[rng.randrange(len(slots))]
        setattr(h, k, mutate(getattr(h, k), rng, log))


def wrap_namespace(ns, filename, trial, log):
    """Wrap every function and method defined in the exec'd corpus file (``filename``)."""
    counter = [0]

    def wrap(fn):
        sig_self = "." in fn.__qualname__
        calls = [0]

        @functools.wraps(fn)
        def inner(*args, **kwargs):
            counter[0] += 1
            calls[0] += 1
            if trial == 0 or calls[0] > 1:  # the first call of each function (code that calls one
                return fn(*args, **kwargs)  # per minibatch would otherwise nearly always raise)
            rng = random.Random(f"{trial}:{counter[0]}")
            head = args[:1] if sig_self else ()
            rest = args[1:] if sig_self else args
            if head and rng.random() < 0.3:  # an attribute of self (or of an object it holds), in place
                mutate_attribute(head[0], ns.get("__name__"), rng, log)
            else:
                rest, kwargs = mutate_call(list(rest), dict(kwargs), rng, log)
            return fn(*head, *rest, **kwargs)

        return inner

    for key, obj in list(ns.items()):
        if key == "run":
            continue
        if inspect.isfunction(obj) and obj.__code__.co_filename == filename:
            ns[key] = wrap(obj)
        elif inspect.isclass(obj) and obj.__module__ == ns.get("__name__"):
            for name, member in list(vars(obj).items()):
                if inspect.isfunction(member) and member.__code__.co_filename == filename:
                    setattr(obj, name, wrap(member))


# --------------------------------------------------------------------------- comparison


# --------------------------------------------------------------------------- running

class Timeout(Exception):
    pass


def _timeout():
    return Timeout("the run did not finish (a guard let a loop spin?)")


@functools.lru_cache(maxsize=None)
def fuzz_rewrite(name):
    c = corpus(name)
    res = harness.rewrite_result(c.source, "vectorize.*", path=name + ".py")
    assert res.report.error is None, res.report.error
    sites = [s for s in res.report.sites if s.action == REWRITTEN]
    return res.output.decode(), all(s.exactness == EXACT for s in sites), bool(sites)


def run_once(c, code, tag, T, trial, log, trace=None):
    filename = f"<fuzz {c.name} {tag}>"
    ns = harness.load(code, filename=filename, module="fuzz_" + c.name, cache_lines=True)
    wrap_namespace(ns, filename, trial, log)
    random.seed(trial)
    np.random.seed(trial % 2**32)
    torch.manual_seed(trial)
    with harness.deadline(20, _timeout):
        try:
            if trace is not None:
                sys.setprofile(trace)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    return ns["run"](ns, T, trial % 3), None
            except Exception as exc:  # a Timeout too: the original never loops forever
                return None, exc
        finally:
            sys.setprofile(None)


@pytest.fixture(autouse=True)
def short_sequences():
    """Vectorize from 2 steps on, so that short fuzzed inputs reach the vectorized branches."""
    saved, qsaved = dict(vectorized_mod.MIN_STEPS), dict(vectorized_mod.QUAD_MIN_STEPS)
    vectorized_mod.MIN_STEPS.update({k: 2 for k in saved})
    vectorized_mod.QUAD_MIN_STEPS.update({k: 2 for k in qsaved})
    yield
    vectorized_mod.MIN_STEPS.update(saved)
    vectorized_mod.QUAD_MIN_STEPS.update(qsaved)


def fuzz(name, trials):
    """(trials, vectorized, raised, rewritten, failures) for one corpus file."""
    c = corpus(name)
    new, exact, rewritten = fuzz_rewrite(name)
    fast = raised = 0
    failures = []
    for trial in range(trials):
        T = LENGTHS[trial % len(LENGTHS)]
        log1, log2 = [], []
        want, err1 = run_once(c, c.text, "original", T, trial, log1)
        trace = Trace()
        got, err2 = run_once(c, new, "rewritten", T, trial, log2, trace)
        where = f"{name} trial {trial} T={T} inputs {log1}"
        fast += trace.vectorized()
        if log1 != log2:
            failures.append(f"{where}: the runs drew other inputs ({log2})")
        elif err1 is not None or err2 is not None:
            raised += 1
            if type(err1) is not type(err2):
                failures.append(f"{where}: original raised {err1!r}, rewritten {err2!r}")
        else:
            try:
                same(want, got, exact)
            except AssertionError as exc:
                failures.append(f"{where}: {exc}")
    return trials, fast, raised, rewritten, failures


@pytest.mark.parametrize("name", [n for n in NAMES if not corpus(n).leave_alone])
def test_guard_fuzz(name):
    trials, fast, raised, rewritten, failures = fuzz(name, TRIALS)
    print(f"{name}: {trials} trials, vectorized {fast}, raised {raised}")
    assert not failures, "\n".join(failures[:5])
    if rewritten:
        # the unchanged inputs are among the draws: some trial must take a fast branch
        assert fast > 0, f"{name}: no trial took the vectorized branch"


def test_variants_cover_every_array_like_type():
    """The fuzz really draws the types it claims (a variant list that lost some would pass silently)."""
    rng = np.random.default_rng(0)
    names = {n for n, _ in variants(torch.randn(4, 3), rng)} | {n for n, _ in variants(np.zeros(5), rng)}
    names |= {n for n, _ in variants([0.5, 1.0, 2.0], rng)} | {n for n, _ in variants(0.5, rng)}
    names |= {n for n, _ in variants([torch.zeros(2)] * 3, rng)}
    for want in ("f64", "f16", "int", "bool", "param", "param_grad", "sub", "matrix", "ma", "floats", "np_scalars",
                 "rows", "nd_rows", "np32", "np_bools", "ints", "bools", "mixed", "0d", "t0d", "params", "subs"):
        assert want in names, want
    ma = dict(variants(np.arange(6.0), rng))["ma"]
    assert type(ma) is np.ma.MaskedArray
    assert type(dict(variants(torch.ones(3), rng))["sub"]) is Sub


if __name__ == "__main__":  # python tests/runtime/test_guard_fuzz.py [TRIALS]: the counts for a report
    n = int(sys.argv[1]) if len(sys.argv) > 1 else TRIALS
    saved, qsaved = dict(vectorized_mod.MIN_STEPS), dict(vectorized_mod.QUAD_MIN_STEPS)
    vectorized_mod.MIN_STEPS.update({k: 2 for k in saved})
    vectorized_mod.QUAD_MIN_STEPS.update({k: 2 for k in qsaved})
    total = [0, 0, 0]
    failures = []
    for nm in NAMES:
        if corpus(nm).leave_alone:
            continue
        t, f, r, _, fails = fuzz(nm, n)
        total[0] += t
        total[1] += f
        total[2] += r
        failures += fails
        print(f"{nm}: {t} trials, vectorized {f}, raised {r}, failures {len(fails)}", flush=True)
        for line in fails[:3]:
            print("   ", line[:400], flush=True)
    print(f"total: {total[0]} trials, vectorized {total[1]}, raised {total[2]}, failures {len(failures)}")
