"""The hot.* patterns, original call vs rewrite, on CPU (one thread): per-call medians.

    python benchmarks/bench_hot_patterns.py [--quick]

* distributions: ``Categorical(logits=x).log_prob(a)`` / ``.entropy()`` for one step's logits
  (1x2, CartPole) and a batch (64x6), and ``Normal(mu, exp(log_std)).log_prob(a).sum(-1)``,
  default validation vs ``validate_args=False`` (hot.distribution_args), also
  ``MultivariateNormal(mean, torch.diag(v))`` + ``sample()`` + ``log_prob`` + ``entropy`` for one
  action (1x3) and a batch (2048x3); ``Categorical(probs)``
  from a softmax, construction + ``sample()`` + ``log_prob``, vs ``categorical_probs`` (within its
  bound: 2, 1x4; beyond it, 18 actions: the original path plus the guard's cost);
* tensors from arrays: ``torch.tensor(list of float64 obs, dtype=torch.float)`` and
  ``torch.FloatTensor(list)`` for one observation ``[obs]`` (1 x 4: below MIN_ELEMENTS, the guard's
  cost only) and replay-buffer batches (8 x 4, 32 x obs 4, 64 x obs 17, 256 x obs 84),
  vs ``tensor_from_arrays`` (hot.tensor_from_arrays), and the guard's cost on a list of Python
  lists (the fallback: the original call plus the check);
* target networks: one minimalRL DQN update (batch 32, 4-128-128-2 MLPs, smooth L1 to
  ``r + gamma * q_target(s2).max(1)[0]``, Adam step) with the target's forward as written vs through
  ``target_forward`` of a marked network (hot.target_graph_cut), and the forward alone of an
  unmarked network through it (the fallback: the guard's cost);
* acting forwards (hot.no_grad): a module given as a parameter, under ``no_grad`` behind
  ``checked_modules``, and that check's cost on a module of another class;
* fresh tensors moved (hot.fresh_on_device): ``torch.Tensor`` / ``torch.FloatTensor`` of a
  float32 observation (CleanRL's CartPole), a bool ``done`` array, a float64 observation and a
  256x17 float64 replay batch, ``.to(device)``, vs ``tensor_on``; and a list (the fallback).
"""
from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import torch
from torch.distributions import Categorical, MultivariateNormal, Normal

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import median_time  # noqa: E402

from scalebox_cst.runtime.hot_device import tensor_on  # noqa: E402
from scalebox_cst.runtime.hot_distributions import categorical_probs  # noqa: E402
from scalebox_cst.runtime.hot_grad import checked_modules  # noqa: E402
from scalebox_cst.runtime.hot_target import grads_unread, target_forward  # noqa: E402
from scalebox_cst.runtime.hot_tensors import tensor_from_arrays  # noqa: E402


def row(name, before, after):
    print(f"{name:<52} {before * 1e6:9.1f} us {after * 1e6:9.1f} us  {before / after:5.2f}x", flush=True)


def main() -> None:
    quick = "--quick" in sys.argv[1:]
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # torch's "extremely slow" warning on the original path
    number, repeat = (200, 3) if quick else (1000, 5)
    print(f"{'pattern':<52} {'original':>12} {'rewrite':>12}  ratio")
    g = torch.Generator().manual_seed(0)
    for shape in ((1, 2), (64, 6)):
        x = torch.randn(*shape, generator=g)
        a = torch.randint(0, shape[1], shape[:1], generator=g)
        t0 = median_time(lambda: Categorical(logits=x).log_prob(a), number, repeat)
        t1 = median_time(lambda: Categorical(logits=x, validate_args=False).log_prob(a), number, repeat)
        row(f"Categorical(logits {shape[0]}x{shape[1]}).log_prob", t0, t1)
        t0 = median_time(lambda: Categorical(logits=x).entropy(), number, repeat)
        t1 = median_time(lambda: Categorical(logits=x, validate_args=False).entropy(), number, repeat)
        row(f"Categorical(logits {shape[0]}x{shape[1]}).entropy", t0, t1)
    for shape, dim in (((2,), 0), ((1, 4), 1), ((18,), -1)):
        p = torch.softmax(torch.randn(*shape, generator=g), dim)

        def orig():
            m = Categorical(p)
            return m.log_prob(m.sample())

        def new():
            m = categorical_probs(Categorical, p, dim)
            return m.log_prob(m.sample())
        t0, t1 = median_time(orig, number, repeat), median_time(new, number, repeat)
        row(f"Categorical(softmax {'x'.join(map(str, shape))}) + sample + log_prob", t0, t1)
    for shape in ((1, 1), (64, 6)):
        mu = torch.randn(*shape, generator=g)
        log_std = torch.zeros(shape[1]) - 0.5
        act = torch.randn(*shape, generator=g)
        t0 = median_time(lambda: Normal(mu, log_std.exp()).log_prob(act).sum(-1), number, repeat)
        t1 = median_time(lambda: Normal(mu, log_std.exp(), validate_args=False).log_prob(act).sum(-1), number, repeat)
        row(f"Normal(mu {shape[0]}x{shape[1]}, exp(log_std)).log_prob", t0, t1)
    cov = torch.diag(torch.full((3,), 0.5))  # PPO-for-Beginners' self.cov_mat
    for rows in (1, 2048):
        mean = torch.randn(rows, 3, generator=g)

        def mvn_orig():
            d = MultivariateNormal(mean, cov)
            return d.log_prob(d.sample()), d.entropy()

        def mvn_new():
            d = MultivariateNormal(mean, cov, validate_args=False)
            return d.log_prob(d.sample()), d.entropy()
        n = number if rows == 1 else max(number // 10, 20)
        row(f"MultivariateNormal({rows}x3, diag) + sample + log_prob", median_time(mvn_orig, n, repeat), median_time(mvn_new, n, repeat))
    rng = np.random.default_rng(0)
    for n, dim in ((1, 4), (8, 4), (32, 4), (64, 17), (256, 84)):
        obs = [rng.standard_normal(dim) for _ in range(n)]
        t0 = median_time(lambda: torch.tensor(obs, dtype=torch.float), max(number // 10, 20), repeat)
        t1 = median_time(lambda: tensor_from_arrays(torch.tensor, obs, dtype=torch.float), max(number // 10, 20), repeat)
        row(f"torch.tensor({n} arrays of {dim}, dtype=float)", t0, t1)
        t0 = median_time(lambda: torch.FloatTensor(obs), max(number // 10, 20), repeat)
        t1 = median_time(lambda: tensor_from_arrays(torch.FloatTensor, obs), max(number // 10, 20), repeat)
        row(f"torch.FloatTensor({n} arrays of {dim})", t0, t1)
    for n, kw in ((32, {}), (2000, {}), (64, {"dtype": torch.float}), (2000, {"dtype": torch.float})):
        # a GAE loop's numpy numbers (adv.append(gae) on np.float32 values); with a dtype torch's
        # list path is fast, and below 256 scalars the helper leaves it (a guard's cost)
        scalars = [np.float32(v) for v in rng.standard_normal(n)]
        t0 = median_time(lambda: torch.tensor(scalars, **kw), max(number // 10, 20), repeat)
        t1 = median_time(lambda: tensor_from_arrays(torch.tensor, scalars, **kw), max(number // 10, 20), repeat)
        row(f"torch.tensor({n} numpy float32 scalars{', dtype=float' if kw else ''})", t0, t1)
    lists = [[float(i)] for i in range(32)]
    t0 = median_time(lambda: torch.tensor(lists), number, repeat)
    t1 = median_time(lambda: tensor_from_arrays(torch.tensor, lists), number, repeat)
    row("torch.tensor(32 Python lists) (fallback: guard cost)", t0, t1)
    target_pattern(number, repeat)
    acting_pattern(number, repeat)
    fresh_device_pattern(number, repeat)


def fresh_device_pattern(number: int, repeat: int) -> None:
    """hot.fresh_on_device: ``make(x).to(device)`` as written vs ``tensor_on(make, x, device)``."""
    rng = np.random.default_rng(0)
    device = torch.device("cpu")
    cases = (("float32 observation (4)", rng.standard_normal(4).astype(np.float32)),
             ("bool done array (4)", np.zeros(4, dtype=bool)),
             ("float64 observation (4)", rng.standard_normal(4)),
             ("float64 replay batch (256x17)", rng.standard_normal((256, 17))),
             ("list of 4 floats (fallback)", [0.5, 1.5, 2.5, 3.5]))
    for what, x in cases:
        for make in (torch.Tensor, torch.FloatTensor):
            row(f"{make.__name__}({what}).to(device)", median_time(lambda: make(x).to(device), number, repeat),
                median_time(lambda: tensor_on(make, x, device), number, repeat))


def acting_pattern(number: int, repeat: int) -> None:
    """hot.no_grad: Packt's acting forward ``sm(net(obs_v))`` (4-128-2 MLP, one observation) as
    written, under ``no_grad`` behind the run-time check of a module given as a parameter, and the
    check's cost where the module is of another class (the statement as written)."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 128), torch.nn.ReLU(), torch.nn.Linear(128, 2))

        def forward(self, x):
            return self.net(x)

    torch.manual_seed(0)
    net, other, sm = Net(), torch.nn.Sequential(torch.nn.Linear(4, 2)), torch.nn.Softmax(dim=1)
    obs_v = torch.randn(1, 4)

    def written(m):
        return sm(m(obs_v)).data.numpy()[0]

    def guarded(m):
        if checked_modules((Net,), m):
            with torch.no_grad():
                p = sm(m(obs_v))
        else:
            p = sm(m(obs_v))
        return p.data.numpy()[0]

    row("acting forward of a parameter's module (no_grad)", median_time(lambda: written(net), number, repeat),
        median_time(lambda: guarded(net), number, repeat))
    row("the same, a module of another class (check's cost)", median_time(lambda: written(other), number, repeat),
        median_time(lambda: guarded(other), number, repeat))


def target_pattern(number: int, repeat: int) -> None:
    import torch.nn.functional as F

    def qnet():
        return torch.nn.Sequential(torch.nn.Linear(4, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                                   torch.nn.ReLU(), torch.nn.Linear(128, 2))

    torch.manual_seed(0)
    q, q_target, plain = qnet(), grads_unread(qnet()), qnet()
    opt = torch.optim.Adam(q.parameters(), lr=1e-4)
    s, s2, r, done = torch.randn(32, 4), torch.randn(32, 4), torch.randn(32, 1), torch.ones(32, 1)
    a = torch.randint(0, 2, (32, 1))

    def update(forward):
        q_a = q(s).gather(1, a)
        target = r + 0.98 * forward(q_target, s2).max(1)[0].unsqueeze(1) * done
        loss = F.smooth_l1_loss(q_a, target)
        opt.zero_grad()
        loss.backward()
        opt.step()

    n = max(number // 5, 20)
    t0 = median_time(lambda: update(lambda net, x: net(x)), n, repeat)
    t1 = median_time(lambda: update(target_forward), n, repeat)
    row("DQN update, target forward (32 x 4-128-128-2)", t0, t1)
    t0 = median_time(lambda: plain(s2), number, repeat)
    t1 = median_time(lambda: target_forward(plain, s2), number, repeat)
    row("unmarked network through target_forward (guard cost)", t0, t1)


if __name__ == "__main__":
    main()
