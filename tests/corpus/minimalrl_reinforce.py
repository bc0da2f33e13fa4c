"""minimalRL REINFORCE train_net: backward() inside the returns loop, one optimizer step after it
(gradients accumulate over the episode); the loop is neither a plain recurrence nor a reduction.

Source: seungeunrho/minimalRL, REINFORCE.py @ 1d44f1356b12af93336cedbb12147d7410a7c94c
(hyperparameters, Policy). License: MIT.
Adapted: none (verbatim; the environment loop of main() is left out).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

#Hyperparameters
learning_rate = 0.0002
gamma         = 0.98

class Policy(nn.Module):
    def __init__(self):
        super(Policy, self).__init__()
        self.data = []
        
        self.fc1 = nn.Linear(4, 128)
        self.fc2 = nn.Linear(128, 2)
        self.optimizer = optim.Adam(self.parameters(), lr=learning_rate)
        
    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.softmax(self.fc2(x), dim=0)
        return x
      
    def put_data(self, item):
        self.data.append(item)
        
    def train_net(self):
        R = 0
        self.optimizer.zero_grad()
        for r, prob in self.data[::-1]:
            R = r + gamma * R
            loss = -torch.log(prob) * R
            loss.backward()
        self.optimizer.step()
        self.data = []


EXPECT = {
    "self.optimizer = optim.Adam(self.parameters(), lr=learning_rate)": ("device.optimizer", "REWRITTEN", "exact"),
    "for r, prob in self.data[::-1]:": ("vectorize.recurrence", "SKIPPED", None),
    "self.optimizer.step()": ("grad_clip", "REWRITTEN", "exact-until-intervention"),
}
LENGTHS = (1, 5)


def run(ns, T, seed):
    torch.manual_seed(seed)
    pi = ns["Policy"]()
    g = torch.Generator().manual_seed(seed)
    for t in range(T):
        prob = pi(torch.randn(4, generator=g))
        pi.put_data((float(torch.rand(1, generator=g)), prob[t % 2]))
    pi.train_net()
    return [p.detach().clone() for p in pi.parameters()]
