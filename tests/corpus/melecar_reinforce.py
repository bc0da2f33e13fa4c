"""MeLeCaR Reinforce.update: two-space indentation; policy_loss.append(-log_prob * advantage) over
zip(log_probs, advantages), then torch.cat(policy_loss).sum(); no gradient clipping.

Source: chanb/MeLeCaR, rl_algos/reinforce.py (Reinforce.update). Commit: not recorded by the
index. License: not recorded.
Adapted: none (verbatim).
"""
import torch

class Reinforce:
  def __init__(self, model, optimizer):
    self.model = model
    self.optimizer = optimizer


  def update(self, sampler):
    states = sampler.states
    actions = sampler.actions
    log_probs = sampler.log_probs
    returns = sampler.returns
    advantages = sampler.advantages
    values = sampler.values
    hidden_states = sampler.get_hidden_states()

    # loss = Adv_t * log_prob(A_t | S_t)
    policy_loss = []
    for log_prob, advantage in zip(log_probs, advantages):
      policy_loss.append(-log_prob * advantage)

    self.optimizer.zero_grad()
    policy_loss = torch.cat(policy_loss).sum()
    policy_loss.backward()
    self.optimizer.step()


EXPECT = {
    "for log_prob, advantage in zip(log_probs, advantages):": ("vectorize.reduction", "REWRITTEN", "reassociated"),
    "self.optimizer.step()": ("grad_clip", "REWRITTEN", "exact-until-intervention"),
}


def run(ns, T, seed):
    from types import SimpleNamespace
    torch.manual_seed(seed)
    net = torch.nn.Linear(3, 2)
    g = torch.Generator().manual_seed(seed)
    logits = net(torch.randn(T, 1, 3, generator=g))
    log_probs = list(torch.log_softmax(logits, -1)[:, :, 0].unbind(0))  # T tensors of shape [1]
    sampler = SimpleNamespace(states=None, actions=None, log_probs=log_probs, returns=None,
                              advantages=torch.randn(T, 1, generator=g), values=None,
                              get_hidden_states=lambda: None)
    ns["Reinforce"](net, torch.optim.SGD(net.parameters(), lr=0.1)).update(sampler)
    return [p.detach().clone() for p in net.parameters()]
