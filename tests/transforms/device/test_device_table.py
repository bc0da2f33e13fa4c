"""Golden tests over the device swap table: each entry's ``before`` must rewrite to its ``after``.

A new swap is one table entry; this file picks it up without change. It also checks the table's
own consistency (known kinds and conditions, one transform per entry, unique ids) and that every
torch_npu function or ``torch.npu`` twin the table emits exists in the test stand-in.
"""
from __future__ import annotations

from conftest import TESTS  # tests/: the corpus, fake_torch_npu and the repository root beside it
import ast
import json
import os
import subprocess
import sys

import pytest

from scalebox_cst.report import REWRITTEN, SKIPPED, WARNING
from scalebox_cst.transforms import REGISTRY, transform_ids
from scalebox_cst.transforms import device_table as T
from scalebox_cst.transforms.device import DEVICE_TRANSFORMS
import harness

HERE = TESTS
FAKE = os.path.join(HERE, "fake_torch_npu")


def run(src, transform_ids_, backend, options=()):
    return harness.rewrite_result(src, list(transform_ids_), backend, options={T.SECTION: dict(options)})


@pytest.mark.parametrize("entry", T.TABLE, ids=lambda e: e.id)
def test_golden(entry):
    result = run(entry.before, [entry.transform], entry.golden_backend, entry.example_options)
    assert result.report.error is None
    assert result.output.decode() == entry.after
    sites = [s for s in result.report.sites if s.transform == entry.transform]
    if entry.after != entry.before:
        rewritten = [s for s in sites if s.action == REWRITTEN]
        assert rewritten, "a golden rewrite reports its sites"
        assert {s.exactness for s in rewritten} == {entry.exactness}
    else:
        assert any(s.action in (WARNING, SKIPPED) for s in sites), "a left-alone entry says why"
        if entry.site_kind:
            assert any(s.kind == entry.site_kind for s in sites)
    ast.parse(entry.after)


@pytest.mark.parametrize("entry", [e for e in T.TABLE if e.after != e.before], ids=lambda e: e.id)
def test_golden_is_a_fixed_point(entry):
    """Rewriting the rewritten code again (all device transforms) changes nothing."""
    once = run(entry.after, ["device.*"], entry.golden_backend, entry.example_options)
    assert once.output.decode() == entry.after


@pytest.mark.parametrize("entry", [e for e in T.TABLE if e.option], ids=lambda e: e.id)
def test_option_gated_entries_do_nothing_without_their_option(entry):
    result = run(entry.before, [entry.transform], entry.golden_backend)
    assert result.output.decode() != entry.after
    sites = [s for s in result.report.sites if s.transform == entry.transform]
    if entry.without_option == "warn":
        assert result.output.decode() == entry.before
        warned = [s for s in sites if s.action == WARNING]
        assert warned and all(s.kind == entry.site_kind for s in warned)
        assert all(entry.option in s.reason for s in warned)


@pytest.mark.parametrize("backend", ["cpu", "cuda", "npu"])
def test_entries_outside_their_backends_do_nothing(backend):
    for entry in T.TABLE:
        if backend in entry.backends or entry.golden_backend == backend:
            continue
        result = run(entry.before, [entry.transform], backend, entry.example_options)
        ours = [s for s in result.report.sites if s.transform == entry.transform and entry.id in s.reason]
        assert not ours, (entry.id, backend)
        if all(backend not in e.backends for e in T.entries_for(entry.transform)):
            assert result.output.decode() == entry.before, (entry.id, backend)


def test_table_is_consistent():
    ids = [e.id for e in T.TABLE]
    assert len(ids) == len(set(ids))
    transforms = {T.PLACEMENT, T.AUTOCAST, T.OPTIMIZER, T.FUSED_OP, T.PRECISION, T.UNSUPPORTED}
    for e in T.TABLE:
        assert e.kind in T.KINDS, e.id
        assert set(e.conditions) <= set(T.CONDITIONS), e.id
        assert e.transform in transforms, e.id
        assert set(e.backends) <= {"cpu", "cuda", "npu"} and e.backends, e.id
        assert e.before and e.after, e.id
        assert e.without_option in ("ignore", "warn")
        if e.kind.startswith("report-"):
            assert e.action == WARNING and e.site_kind and e.site_kind.startswith(("not-migratable:", "npu:")), e.id
        if e.kind == "literal-arg":
            assert e.positions and len(e.literal) == 2, e.id
        if e.kind == "add-kwarg":
            assert e.keyword and e.value and e.keyword in e.absent, e.id


def test_device_transforms_are_registered_last_and_start_with_device():
    ids = transform_ids()
    device_ids = [cls.id for cls in DEVICE_TRANSFORMS]
    assert all(i.startswith("device.") for i in device_ids)
    assert ids[-len(device_ids):] == device_ids
    assert [cls for cls in REGISTRY if cls in DEVICE_TRANSFORMS] == list(DEVICE_TRANSFORMS)


def test_every_emitted_npu_name_exists_in_the_stand_in():
    """Twins (torch.npu.*), torch_npu kernels behind the helpers, torch_npu.optim classes."""
    twins = sorted({e.replacement.split(".", 2)[2] for e in T.TABLE if e.replacement.startswith("torch.npu.")})
    optims = sorted({e.replacement.split(".", 2)[2] for e in T.TABLE if e.replacement.startswith("torch_npu.optim.")})
    code = (
        "import json, sys, torch, torch_npu, torch_npu.optim\n"
        "twins, optims = json.loads(sys.argv[1]), json.loads(sys.argv[2])\n"
        "def get(obj, path):\n"
        "    for part in path.split('.'):\n"
        "        obj = getattr(obj, part, None)\n"
        "    return obj\n"
        "missing = [t for t in twins if get(torch.npu, t) is None]\n"
        "missing += [o for o in optims if get(torch_npu.optim, o) is None]\n"
        "missing += [k for k in ('npu_gelu', 'npu_fast_gelu', 'npu_rms_norm', 'npu_swiglu') if not hasattr(torch_npu, k)]\n"
        "print(json.dumps(missing))\n"
    )
    env = dict(os.environ, PYTHONPATH=FAKE, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(twins), json.dumps(optims)],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
    assert {"is_available", "manual_seed_all", "Stream", "Event", "amp.GradScaler"} <= set(twins)


def test_helpers_named_by_the_table_exist_in_the_runtime():
    from scalebox_cst.runtime import npu

    for e in T.TABLE:
        if e.kind in ("helper", "swiglu"):
            assert hasattr(npu, e.replacement) or e.replacement in npu._LAZY, e.id
    assert callable(npu.fused_ok)
