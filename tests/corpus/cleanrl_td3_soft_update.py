"""CleanRL TD3: three soft-update loops over (actor, qf1, qf2) with `args.tau`.

Source: vwxyzjn/cleanrl, cleanrl/td3_continuous_action.py @
004f8a086a892a2a180f4dd332b90d83a968aa7a (`# update the target network`). License: MIT.
Adapted: the three loops are wrapped in a function whose parameters are the names they read.
"""
import torch


def update_targets(args, actor, target_actor, qf1, qf1_target, qf2, qf2_target):
                # update the target network
                for param, target_param in zip(actor.parameters(), target_actor.parameters()):
                    target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)
                for param, target_param in zip(qf1.parameters(), qf1_target.parameters()):
                    target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)
                for param, target_param in zip(qf2.parameters(), qf2_target.parameters()):
                    target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)


EXPECT = {
    "for param, target_param in zip(actor.parameters(), target_actor.parameters()):": ("vectorize.target_update", "REWRITTEN", "exact"),
    "for param, target_param in zip(qf1.parameters(), qf1_target.parameters()):": ("vectorize.target_update", "REWRITTEN", "exact"),
    "for param, target_param in zip(qf2.parameters(), qf2_target.parameters()):": ("vectorize.target_update", "REWRITTEN", "exact"),
}
LENGTHS = (1, 3)


def run(ns, T, seed):
    from types import SimpleNamespace
    torch.manual_seed(seed)

    def mlp(i, o):
        return torch.nn.Sequential(torch.nn.Linear(i, 64), torch.nn.ReLU(), torch.nn.Linear(64, o))

    nets = [mlp(5, 2), mlp(5, 2), mlp(7, 1), mlp(7, 1), mlp(7, 1), mlp(7, 1)]
    args = SimpleNamespace(tau=0.005)
    for _ in range(T):
        with torch.no_grad():
            for n in nets[::2]:
                for p in n.parameters():
                    p.add_(torch.randn_like(p) * 0.01)
        ns["update_targets"](args, *nets)
    return [[p.detach().clone() for p in n.parameters()] for n in nets]
