"""CleanRL DQN training step: TD target, MSE loss, optimizer step (no clipping), then the soft
target update `target_network_param.data.copy_(args.tau * q_network_param.data + (1.0 - args.tau)
* target_network_param.data)` with the target network first in zip().

Source: vwxyzjn/cleanrl, cleanrl/dqn.py @ 020cf0e53305793c8e39f4b68f9ac1ae9099f004 (the
`# ALGO LOGIC: training.` block of the main loop). License: MIT.
Adapted: the block is wrapped in a function whose parameters are the names it reads (the SPS
print is dropped from the logging branch); the loop text is verbatim.
"""
import time

import torch
import torch.nn.functional as F


def train_step(args, global_step, rb, q_network, target_network, optimizer, writer, start_time):
        # ALGO LOGIC: training.
        if global_step > args.learning_starts:
            if global_step % args.train_frequency == 0:
                data = rb.sample(args.batch_size)
                with torch.no_grad():
                    target_max, _ = target_network(data.next_observations).max(dim=1)
                    td_target = data.rewards.flatten() + args.gamma * target_max * (1 - data.dones.flatten())
                old_val = q_network(data.observations).gather(1, data.actions).squeeze()
                loss = F.mse_loss(td_target, old_val)

                if global_step % 100 == 0:
                    writer.add_scalar("losses/td_loss", loss, global_step)
                    writer.add_scalar("losses/q_values", old_val.mean().item(), global_step)
                    writer.add_scalar("charts/SPS", int(global_step / (time.time() - start_time + 1.0)), global_step)

                # optimize the model
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

            # update target network
            if global_step % args.target_network_frequency == 0:
                for target_network_param, q_network_param in zip(target_network.parameters(), q_network.parameters()):
                    target_network_param.data.copy_(
                        args.tau * q_network_param.data + (1.0 - args.tau) * target_network_param.data
                    )


EXPECT = {
    "optimizer.step()": ("grad_clip", "REWRITTEN", "exact-until-intervention"),
    "for target_network_param, q_network_param in zip(target_network.parameters(), q_network.parameters()):":
        ("vectorize.target_update", "REWRITTEN", "exact"),
}
LENGTHS = (1, 4)


def run(ns, T, seed):
    from types import SimpleNamespace
    import copy
    torch.manual_seed(seed)
    q = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    target = copy.deepcopy(q)
    opt = torch.optim.SGD(q.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(seed)

    def sample(n):
        return SimpleNamespace(
            observations=torch.randn(n, 4, generator=g),
            next_observations=torch.randn(n, 4, generator=g),
            actions=torch.randint(0, 2, (n, 1), generator=g),
            rewards=torch.randn(n, 1, generator=g),
            dones=(torch.rand(n, 1, generator=g) < 0.1).float(),
        )

    rb = SimpleNamespace(sample=sample)
    args = SimpleNamespace(learning_starts=0, train_frequency=1, batch_size=32, gamma=0.99,
                           target_network_frequency=1, tau=0.5)
    writer = SimpleNamespace(add_scalar=lambda *a: None)
    steps = list(range(1, T + 2))
    list(map(lambda s: ns["train_step"](args, s, rb, q, target, opt, writer, 0.0), steps))
    return [p.detach().clone() for p in q.parameters()], [p.detach().clone() for p in target.parameters()]
