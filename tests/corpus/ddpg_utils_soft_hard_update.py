"""Two DDPG/MADDPG helper modules: soft_update with the target first in zip and the coefficients
written `(1 - t) * target + t * source`, or with the source read without `.data`
(`source_param*tau`), and hard_update copies.

Source: resuldagdanov/multi-agent-evolutionary-rl, maddpg/utils.py (soft_update, hard_update) and
clevercoolvip/Deep_Deterministic_Policy_Gradient, update_params_by.py (soft_update). Commits: not
recorded by the index. Licenses: not recorded.
Adapted: the second module's soft_update is renamed soft_update_2 (both files define
soft_update); bodies verbatim.
"""


def soft_update(target, source, t):
    for target_param, source_param in zip(target.parameters(), source.parameters()):
        target_param.data.copy_((1 - t) * target_param.data + t * source_param.data)


def hard_update(target, source):
    for target_param, source_param in zip(target.parameters(), source.parameters()):
        target_param.data.copy_(source_param.data)


def soft_update_2(target, source, tau):
    for target_param, source_param in zip(target.parameters(), source.parameters()):
        target_param.data.copy_(target_param.data * (1.0 - tau) + source_param*tau)


EXPECT = {
    "for target_param, source_param in zip(target.parameters(), source.parameters()):@1": ("vectorize.target_update", "REWRITTEN", "exact"),
    "for target_param, source_param in zip(target.parameters(), source.parameters()):@2": ("vectorize.target_update", "REWRITTEN", "exact"),
    "for target_param, source_param in zip(target.parameters(), source.parameters()):@3": ("vectorize.target_update", "REWRITTEN", "exact"),
}
LENGTHS = (1, 3)


def run(ns, T, seed):
    import torch
    torch.manual_seed(seed)

    def net():
        return torch.nn.Sequential(torch.nn.Linear(5, 24), torch.nn.ReLU(), torch.nn.Linear(24, 2))

    src, a, b, c = net(), net(), net(), net()
    for _ in range(T):
        ns["soft_update"](a, src, 0.01)
        ns["soft_update_2"](b, src, 0.01)
    ns["hard_update"](c, src)
    return [[p.detach().clone() for p in m.parameters()] for m in (a, b, c)]
