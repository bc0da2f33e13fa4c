"""Hugging Face Deep RL Course, unit 4 REINFORCE: discounted returns into a deque by appendleft,
the previous return read back as returns[0] under a conditional expression
(`returns[0] if len(returns)>0 else 0`), walked by range(n_steps)[::-1]; then standardised and
used in a per-sample loss loop (policy_loss.append(-log_prob * disc_return)).

Source: the Hugging Face Deep RL Course's unit 4 notebook (huggingface/deep-rl-class,
notebooks/unit4/unit4.ipynb, reinforce()); the text here is from course copies in the index
(ten files carry these loop lines verbatim, none of them named by the index), not checked
against a commit of the course repository. License: Apache-2.0 (the course repository).
Adapted: the cell's reinforce() is cut to the part after the rollout: a function of the episode's
rewards and saved log-probs; the loop lines are verbatim.
"""
from collections import deque

import numpy as np
import torch


def reinforce_update(rewards, saved_log_probs, optimizer, gamma, max_t):
        returns = deque(maxlen=max_t) 
        n_steps = len(rewards) 
        # Compute the discounted returns at each timestep,
        for t in range(n_steps)[::-1]:
            disc_return_t = (returns[0] if len(returns)>0 else 0)
            returns.appendleft( gamma*disc_return_t + rewards[t]   )    
            
        ## standardization of the returns is employed to make training more stable
        eps = np.finfo(np.float32).eps.item()
        ## eps is the smallest representable float, which is 
        # added to the standard deviation of the returns to avoid numerical instabilities        
        returns = torch.tensor(returns)
        returns = (returns - returns.mean()) / (returns.std() + eps)
        
        # Line 7:
        policy_loss = []
        for log_prob, disc_return in zip(saved_log_probs, returns):
            policy_loss.append(-log_prob * disc_return)
        policy_loss = torch.cat(policy_loss).sum()
        
        # Line 8: PyTorch prefers gradient descent 
        optimizer.zero_grad()
        policy_loss.backward()
        optimizer.step()
        return returns


EXPECT = {
    "for t in range(n_steps)[::-1]:": ("vectorize.recurrence", "REWRITTEN", "exact"),
    "for log_prob, disc_return in zip(saved_log_probs, returns):": ("vectorize.reduction", "REWRITTEN", "reassociated"),
    "optimizer.step()": ("grad_clip", "REWRITTEN", "exact-until-intervention"),
}
FINDINGS = {
    "for t in range(n_steps)[::-1]:": (
        "two gaps: range(n)[::-1] (a range sliced backward, the course's spelling, copied "
        "verbatim in many repositories) is 'header not recognised'; and spelled "
        "reversed(range(n_steps)) the loop is still skipped: the read-back returns[0] reaches "
        "returns.appendleft through a temporary under a conditional expression "
        "(`returns[0] if len(returns)>0 else 0`, which is 0 exactly on the first step)"
    ),
}


def run(ns, T, seed):
    torch.manual_seed(seed)
    net = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(seed)
    logp = torch.log_softmax(net(torch.randn(T, 4, generator=g)), -1)
    acts = torch.randint(0, 2, (T,), generator=g)
    saved = [logp[t, acts[t]].unsqueeze(0) for t in range(T)]  # m.log_prob(action) of a [1] sample
    rewards = [1.0] * (T - 1) + [float(torch.rand(1, generator=g))]  # CartPole-like rewards
    ns["reinforce_update"](rewards, saved, opt, 0.99, 1000)
    # (the returns themselves are NaN at T = 1: std() of one value)
    return [p.detach().clone() for p in net.parameters()]
