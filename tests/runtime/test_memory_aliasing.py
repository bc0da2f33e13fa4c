"""The run-time guards' aliasing question across storages (runtime/memory.py).

Tensors made over the same memory each get a storage of their own (``torch.from_numpy`` of
overlapping views of one array): the batched, fused and soft-update guards compared storage
addresses, so a loop whose writes a later step reads through another storage took the fast path
and computed other values (a differential review found it in the recurrence guard first). Each
case runs the loop as written and the guarded helper on the same memory layout.
"""
import numpy as np
import pytest
import torch
import torch.nn as nn

from scalebox_cst.runtime import loop_batch, memory, target_update


def test_may_share_sees_overlapping_bytes_under_two_storages():
    buf = np.arange(10, dtype=np.float32)
    a, b, c = torch.from_numpy(buf[0:6]), torch.from_numpy(buf[4:10]), torch.from_numpy(buf[6:10])
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    assert memory.may_share(a, b) and memory.may_share(b, c)
    assert not memory.may_share(a, c)  # disjoint parts of one buffer
    assert memory.may_share(a, a[2:])  # one storage


def test_any_overlap_tells_packed_parameters_apart():
    flat = torch.zeros(20)
    views = [flat[0:6].view(2, 3), flat[6:10], flat[10:20].view(5, 2)]
    assert not memory.any_overlap(views)
    assert memory.any_overlap(views + [flat[9:11]])
    assert memory.any_overlap([flat[0:10], flat[2:4]])  # one inside another, not adjacent in order
    every_other = flat[10:20:2]  # strided: it spans elements 10..18
    assert memory.element_span(every_other)[1:] == memory.element_span(flat[10:19])[1:]
    assert not memory.any_overlap([every_other, flat[0:10], flat[19:20]])
    assert memory.any_overlap([every_other, flat[18:20]])


def _shift_loop(xs, out):
    for k in range(len(xs)):
        out[k] = xs[k] * 2.0 + 1.0
    return out


def test_batched_loop_whose_output_is_a_later_input_takes_the_loop():
    """``out`` is ``xs`` one element on, through a second storage: each step reads the last."""
    def layout():
        buf = np.arange(9, dtype=np.float32)
        return torch.from_numpy(buf[0:8]), torch.from_numpy(buf[1:9])

    xs, out = layout()
    expected = _shift_loop(xs, out).clone()
    xs, out = layout()
    assert loop_batch.batch_range(range(8), (xs,), (), (), (out,), 0, True) is None
    disjoint = np.arange(16, dtype=np.float32)
    assert loop_batch.batch_range(range(8), (torch.from_numpy(disjoint[0:8]),), (), (),
                                  (torch.from_numpy(disjoint[8:16]),), 0, True) is not None
    assert torch.equal(expected, _shift_loop(*layout()))  # the loop as written, for the record


def _nets(overlap):
    torch.manual_seed(0)
    online, target = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False)), \
        nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    buf = np.random.default_rng(0).standard_normal(24).astype(np.float32)
    at = {"online0": 0, "target0": 8, "online1": 10 if overlap else 16, "target1": 20}
    for name, start in at.items():
        net = online if name.startswith("online") else target
        layer = net[int(name[-1])]
        layer.weight = nn.Parameter(torch.from_numpy(buf[start:start + 4]).view(2, 2))
    return online, target


def _loop(online, target, tau):
    with torch.no_grad():
        for p, tp in zip(online.parameters(), target.parameters()):
            tp.copy_(tau * p + (1 - tau) * tp)


@pytest.mark.parametrize("overlap", [True, False])
def test_soft_update_over_parameters_sharing_bytes_across_pairs(overlap):
    """Pair 1's online weight spans pair 0's target weight: the loop reads it after updating it."""
    a_online, a_target = _nets(overlap)
    _loop(a_online, a_target, 0.3)
    b_online, b_target = _nets(overlap)
    with torch.no_grad():
        done = target_update.soft_update(b_online, b_target, 0.3, 0.7)
    if not done:
        _loop(b_online, b_target, 0.3)
    assert done is not overlap  # disjoint parameters keep the fused path
    for p, q in zip([*a_online.parameters(), *a_target.parameters()], [*b_online.parameters(), *b_target.parameters()]):
        assert torch.equal(p, q)
