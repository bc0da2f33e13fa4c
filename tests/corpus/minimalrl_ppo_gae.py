"""minimalRL PPO: GAE over a numpy column walked with [::-1], a list built with append and
reversed, then torch.tensor of the list; plus the training step (no gradient clipping).

Source: seungeunrho/minimalRL, ppo.py @ 17a7f677c6b5ffce9773fa03a437cbe89c01214f (PPO.train).
License: MIT.
Adapted: train() starts with `s,a,r,s_prime,done_mask, prob_a = self.make_batch()`; here
train_batch takes those six tensors as parameters instead (that line dropped, the rest verbatim).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim


class PPO(nn.Module):
    def __init__(self):
        super(PPO, self).__init__()
        self.gamma = 0.98
        self.lmbda = 0.95
        self.eps = 0.1
        self.K = 2 #epoch

        self.fc1 = nn.Linear(4,256)
        self.fc_pi = nn.Linear(256,2)
        self.fc_v = nn.Linear(256,1)
        self.optimizer = optim.Adam(self.parameters(), lr=0.0005)

    def pi(self, x, softmax_dim = 0):
        x = F.relu(self.fc1(x))
        x = self.fc_pi(x)
        prob = F.softmax(x, dim=softmax_dim)
        return prob

    def v(self, x):
        x = F.relu(self.fc1(x))
        v = self.fc_v(x)
        return v

    def train_batch(self, s, a, r, s_prime, done_mask, prob_a):
        for i in range(self.K):
            td_target = r + self.gamma * self.v(s_prime) * done_mask
            delta = td_target - self.v(s)
            delta = delta.detach().numpy()

            advantage_lst = []
            advantage = 0
            for delta_t in delta[::-1]:
                advantage = self.gamma * self.lmbda * advantage + delta_t[0]
                advantage_lst.append([advantage])
            advantage_lst.reverse()
            advantage = torch.tensor(advantage_lst, dtype=torch.float)

            pi = self.pi(s,softmax_dim=1)
            pi_a = pi.gather(1,a)
            ratio = torch.exp(torch.log(pi_a) - torch.log(prob_a))  # a/b == exp(log(a)-log(b))

            surr1 = ratio * advantage
            surr2 = torch.clamp(ratio, 1-self.eps, 1+self.eps) * advantage
            loss = -torch.min(surr1, surr2) + F.smooth_l1_loss(td_target.detach(), self.v(s))

            self.optimizer.zero_grad()
            loss.mean().backward()
            self.optimizer.step()


EXPECT = {
    "self.optimizer = optim.Adam(self.parameters(), lr=0.0005)": ("device.optimizer", "REWRITTEN", "exact"),
    "for delta_t in delta[::-1]:": ("vectorize.recurrence", "REWRITTEN", "exact"),
    "self.optimizer.step()": ("grad_clip", "REWRITTEN", "exact-until-intervention"),
}
LENGTHS = (1, 2, 3, 20)


def run(ns, T, seed):
    torch.manual_seed(seed)
    model = ns["PPO"]()
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(T, 4, generator=g)
    a = torch.randint(0, 2, (T, 1), generator=g)
    r = torch.randn(T, 1, generator=g) / 100.0
    s_prime = torch.randn(T, 4, generator=g)
    done_mask = (torch.rand(T, 1, generator=g) > 0.1).float()
    prob_a = torch.rand(T, 1, generator=g) * 0.8 + 0.1
    model.train_batch(s, a, r, s_prime, done_mask, prob_a)
    return [p.detach().clone() for p in model.parameters()]
