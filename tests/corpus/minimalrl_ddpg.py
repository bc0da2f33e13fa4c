"""minimalRL DDPG: train() steps two optimizers after their own backward() (no clipping), and
soft_update() writes `param_target.data * (1.0 - tau) + param.data * tau` with the module-level tau.

Source: seungeunrho/minimalRL, ddpg.py @ 17654b135331be0414e2eed4ac01697d88610cb4 (hyperparameters,
MuNet, QNet, train, soft_update). License: MIT.
Adapted: none (the code is verbatim; the replay buffer comes from the test).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

#Hyperparameters
lr_mu        = 0.0005
lr_q         = 0.001
gamma        = 0.99
batch_size   = 32
buffer_limit = 50000
tau          = 0.005 # for target network soft update


class MuNet(nn.Module):
    def __init__(self):
        super(MuNet, self).__init__()
        self.fc1 = nn.Linear(3, 128)
        self.fc2 = nn.Linear(128, 64)
        self.fc_mu = nn.Linear(64, 1)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        mu = torch.tanh(self.fc_mu(x))*2 # Multipled by 2 because the action space of the Pendulum-v0 is [-2,2]
        return mu

class QNet(nn.Module):
    def __init__(self):
        super(QNet, self).__init__()
        self.fc_s = nn.Linear(3, 64)
        self.fc_a = nn.Linear(1,64)
        self.fc_q = nn.Linear(128, 32)
        self.fc_out = nn.Linear(32,1)

    def forward(self, x, a):
        h1 = F.relu(self.fc_s(x))
        h2 = F.relu(self.fc_a(a))
        cat = torch.cat([h1,h2], dim=1)
        q = F.relu(self.fc_q(cat))
        q = self.fc_out(q)
        return q

def train(mu, mu_target, q, q_target, memory, q_optimizer, mu_optimizer):
    s,a,r,s_prime,done_mask  = memory.sample(batch_size)
    
    target = r + gamma * q_target(s_prime, mu_target(s_prime)) * done_mask
    q_loss = F.smooth_l1_loss(q(s,a), target.detach())
    q_optimizer.zero_grad()
    q_loss.backward()
    q_optimizer.step()
    
    mu_loss = -q(s,mu(s)).mean() # That's all for the policy loss.
    mu_optimizer.zero_grad()
    mu_loss.backward()
    mu_optimizer.step()
    
def soft_update(net, net_target):
    for param_target, param in zip(net_target.parameters(), net.parameters()):
        param_target.data.copy_(param_target.data * (1.0 - tau) + param.data * tau)


EXPECT = {
    "q_optimizer.step()": ("grad_clip", "REWRITTEN", "exact-until-intervention"),
    "mu_optimizer.step()": ("grad_clip", "REWRITTEN", "exact-until-intervention"),
    "for param_target, param in zip(net_target.parameters(), net.parameters()):": ("vectorize.target_update", "REWRITTEN", "exact"),
}
LENGTHS = (1, 3)


class _Memory:
    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def sample(self, n):
        g = self.g
        return (torch.randn(n, 3, generator=g), torch.rand(n, 1, generator=g) * 4 - 2,
                torch.randn(n, 1, generator=g) / 100.0, torch.randn(n, 3, generator=g),
                (torch.rand(n, 1, generator=g) > 0.05).float())


def run(ns, T, seed):
    torch.manual_seed(seed)
    q, q_target = ns["QNet"](), ns["QNet"]()
    q_target.load_state_dict(q.state_dict())
    mu, mu_target = ns["MuNet"](), ns["MuNet"]()
    mu_target.load_state_dict(mu.state_dict())
    mu_optimizer = torch.optim.SGD(mu.parameters(), lr=0.01)
    q_optimizer = torch.optim.SGD(q.parameters(), lr=0.01)
    memory = _Memory(seed)
    nets = (mu, mu_target, q, q_target)
    for _ in range(T):
        ns["train"](mu, mu_target, q, q_target, memory, q_optimizer, mu_optimizer)
        ns["soft_update"](mu, mu_target)
        ns["soft_update"](q, q_target)
    return [[p.detach().clone() for p in n.parameters()] for n in nets]
