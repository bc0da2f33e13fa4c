"""Spinning Up SAC update(): Q step, Q networks frozen by a requires_grad loop, pi step, then the
polyak update `p_targ.data.mul_(polyak); p_targ.data.add_((1 - polyak) * p.data)` under no_grad.

Source: openai/spinningup, spinup/algos/pytorch/sac/sac.py @
009d9afcbcf97ee72a7556e554cd884378d45a31 (the nested update() of sac()). License: MIT.
Adapted: update() is a closure in sac(); here the names it closes over (ac, ac_targ, q_params,
the optimizers, the loss functions, logger, polyak) are parameters of a factory with the same
closure shape. update() is verbatim.
"""
import torch


def make_update(ac, ac_targ, q_params, q_optimizer, pi_optimizer, compute_loss_q, compute_loss_pi, logger, polyak):

    def update(data):
        # First run one gradient descent step for Q1 and Q2
        q_optimizer.zero_grad()
        loss_q, q_info = compute_loss_q(data)
        loss_q.backward()
        q_optimizer.step()

        # Record things
        logger.store(LossQ=loss_q.item(), **q_info)

        # Freeze Q-networks so you don't waste computational effort 
        # computing gradients for them during the policy learning step.
        for p in q_params:
            p.requires_grad = False

        # Next run one gradient descent step for pi.
        pi_optimizer.zero_grad()
        loss_pi, pi_info = compute_loss_pi(data)
        loss_pi.backward()
        pi_optimizer.step()

        # Unfreeze Q-networks so you can optimize it at next DDPG step.
        for p in q_params:
            p.requires_grad = True

        # Record things
        logger.store(LossPi=loss_pi.item(), **pi_info)

        # Finally, update target networks by polyak averaging.
        with torch.no_grad():
            for p, p_targ in zip(ac.parameters(), ac_targ.parameters()):
                # NB: We use an in-place operations "mul_", "add_" to update target
                # params, as opposed to "mul" and "add", which would make new tensors.
                p_targ.data.mul_(polyak)
                p_targ.data.add_((1 - polyak) * p.data)

    return update


EXPECT = {
    "q_optimizer.step()": ("grad_clip", "REWRITTEN", "exact-until-intervention"),
    "pi_optimizer.step()": ("grad_clip", "REWRITTEN", "exact-until-intervention"),
    "for p, p_targ in zip(ac.parameters(), ac_targ.parameters()):": ("vectorize.target_update", "REWRITTEN", "exact"),
}
LENGTHS = (1, 3)


def run(ns, T, seed):
    import copy
    from types import SimpleNamespace
    torch.manual_seed(seed)
    nn = torch.nn
    ac = nn.Module()
    ac.pi = nn.Sequential(nn.Linear(3, 32), nn.ReLU(), nn.Linear(32, 1))
    ac.q1 = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
    ac.q2 = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
    ac_targ = copy.deepcopy(ac)
    q_params = list(ac.q1.parameters()) + list(ac.q2.parameters())
    q_opt = torch.optim.SGD(q_params, lr=0.01)
    pi_opt = torch.optim.SGD(ac.pi.parameters(), lr=0.01)

    def loss_q(d):
        sa = torch.cat([d["obs"], d["act"]], 1)
        return ((ac.q1(sa) - d["rew"]) ** 2).mean() + ((ac.q2(sa) - d["rew"]) ** 2).mean(), {}

    def loss_pi(d):
        sa = torch.cat([d["obs"], ac.pi(d["obs"])], 1)
        return -torch.min(ac.q1(sa), ac.q2(sa)).mean(), {}

    logs = []
    logger = SimpleNamespace(store=lambda **kw: logs.append(sorted(kw.items())))
    update = ns["make_update"](ac, ac_targ, q_params, q_opt, pi_opt, loss_q, loss_pi, logger, 0.995)
    g = torch.Generator().manual_seed(seed)
    for _ in range(T):
        update({"obs": torch.randn(16, 3, generator=g), "act": torch.randn(16, 1, generator=g),
                "rew": torch.randn(16, 1, generator=g)})
    return [p.detach().clone() for p in ac.parameters()], [p.detach().clone() for p in ac_targ.parameters()], logs
