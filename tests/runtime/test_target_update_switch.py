"""runtime.target_update: when the CPU soft update switches from foreach ops to the numba pass.

The switch (importing numba, loading its kernel) costs about 0.5 s once per process and saves
35-55 us a call on small MLPs. After a fixed 1,000 calls it cost XinJingHao's Duel-DDQN on
CartPole (3,000 updates of a 42k-parameter net) 0.5 s to save 0.1 s: the profile showed the
target update's line as 6% of the run, in imports. The switch now waits until the process has
spent as long in the foreach updates as the switch costs (rent or buy).
"""
import copy

import pytest
import torch
from torch import nn

from scalebox_cst.runtime import target_update as tu


def nets(width=16):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))
    return net, copy.deepcopy(net)


@pytest.fixture
def fresh(monkeypatch):
    """A process that has loaded no numba and spent nothing yet, in the default (auto) mode."""
    pytest.importorskip("numba")
    monkeypatch.setattr(tu, "_numba", None)
    monkeypatch.setattr(tu, "_spent", [0.0], raising=False)
    tu.clear_cache()
    yield
    tu.clear_cache()


def test_a_short_run_of_a_small_net_never_pays_for_the_switch(fresh):
    net, target = nets()
    loop = copy.deepcopy(target)
    for _ in range(3000):  # a short DQN run's updates: ~0.1 s of foreach work, less than the switch
        assert tu.soft_update(net, target, 0.005, 0.995)
        for p, tp in zip(net.parameters(), loop.parameters()):
            tp.data.copy_(0.005 * p.data + 0.995 * tp.data)
    assert tu._plan(net, target).kernel is None and not tu._numba
    assert all(torch.equal(a, b) for a, b in zip(target.parameters(), loop.parameters()))


def test_the_switch_comes_once_the_foreach_time_reaches_its_cost(fresh, monkeypatch):
    monkeypatch.setattr(tu, "SWITCH_S", 0.002)
    net, target = nets()
    calls = 0
    while tu._plan(net, target) is None or tu._plan(net, target).kernel is None:
        assert tu.soft_update(net, target, 0.005, 0.995)
        calls += 1
        assert calls < 100_000
    assert tu._spent[0] >= 0.002 and calls > 1
    # numba is loaded now: another pair switches at its first update, there is nothing left to pay
    other, other_target = nets(8)
    assert tu.scale_add(other, other_target, 0.995, 0.005)
    assert tu._plan(other, other_target).kernel
