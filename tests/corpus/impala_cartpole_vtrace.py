"""IMPALA-CartPole compute_vtrace: V-trace targets over [B, T] tensors with time in the second
dimension (x[:, t]), temporaries per step, and the carry handed on as `last_v = vs_t`.

Source: wooyechan/IMPALA-CartPole-v1, vtrace.py (compute_vtrace). Commit: not recorded by the
index. License: not stated.
Adapted: Config (the repository's hyper-parameters) is a stub class; the function is verbatim.
"""
import torch


class Config:
    COEF_MAX = 1.0
    RHO_MAX = 1.0


def compute_vtrace(actor_policy_logits, learner_policy_logits, actions, discounts, rewards, values, bootstrap_value):
    # Compute importance weights (ρ_t)
    actor_log_probs = torch.log_softmax(actor_policy_logits, dim=-1)
    learner_log_probs = torch.log_softmax(learner_policy_logits, dim=-1)
    
    actions_expanded = actions.unsqueeze(-1)
    actor_log_probs = actor_log_probs.gather(-1, actions_expanded).squeeze(-1)
    learner_log_probs = learner_log_probs.gather(-1, actions_expanded).squeeze(-1)
    
    log_rhos = learner_log_probs - actor_log_probs
    rhos = torch.exp(log_rhos)

    # Compute truncated importance sampling weights (c_t)
    cs = torch.clamp(rhos, max=Config.COEF_MAX)
    clipped_rhos = torch.clamp(rhos, max=Config.RHO_MAX)

    # Compute temporal differences
    bootstrap_value = bootstrap_value.unsqueeze(1)
    next_values = torch.cat([values[:, 1:], bootstrap_value], dim=1)
    deltas = clipped_rhos * (rewards + discounts * next_values - values)

    # Compute V-trace targets recursively
    vs = torch.zeros_like(values)
    last_v = bootstrap_value.squeeze(1)
    
    for t in reversed(range(values.shape[1])):
        curr_discount = discounts[:, t]
        curr_c = cs[:, t]
        curr_delta = deltas[:, t]
        
        vs_t = values[:, t] + curr_delta + curr_c * curr_discount * (last_v - values[:, t])
        vs[:, t] = vs_t
        last_v = vs_t

    # Advantage for policy gradient
    vs_tp1 = torch.cat([vs[:, 1:], bootstrap_value], dim=1)
    pg_advantages = clipped_rhos * (rewards + discounts * vs_tp1 - values)

    return vs, pg_advantages, rhos


EXPECT = {
    "for t in reversed(range(values.shape[1])):": ("vectorize.recurrence", "REWRITTEN", "reassociated"),
}


def run(ns, T, seed):
    g = torch.Generator().manual_seed(seed)
    B, A = 4, 2
    a_logits = torch.randn(B, T, A, generator=g)
    l_logits = torch.randn(B, T, A, generator=g)
    actions = torch.randint(0, A, (B, T), generator=g)
    discounts = 0.99 * (torch.rand(B, T, generator=g) > 0.05).float()
    rewards = torch.randn(B, T, generator=g)
    values = torch.randn(B, T, generator=g)
    bootstrap = torch.randn(B, generator=g)
    return ns["compute_vtrace"](a_logits, l_logits, actions, discounts, rewards, values, bootstrap)
