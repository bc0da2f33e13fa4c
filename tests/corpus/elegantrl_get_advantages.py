"""ElegantRL AgentPPO.get_advantages: two backward loops over [horizon, envs] tensors behind a
loop-invariant flag; the V-trace branch carries next_value and rebinds it to values[t] at the end
of each step, the GAE branch reads its own output advantages[t] back into the carry.

Source: AI4Finance-Foundation/ElegantRL, elegantrl/agents/AgentPPO.py @
01cc7d32489070f16c43b747c64c753b0ed717f3 (AgentPPO.get_advantages). License: Apache-2.0.
Adapted: the agent is reduced to what the method reads (cri, last_state, gamma, lambda_gae_adv,
if_use_v_trace, set in __init__); the method is verbatim but for a comment naming each loop header.
"""
import torch as th

TEN = th.Tensor


class AgentPPO:
    def __init__(self, cri, last_state, gamma, lambda_gae_adv, if_use_v_trace):
        self.cri = cri
        self.last_state = last_state
        self.gamma = gamma
        self.lambda_gae_adv = lambda_gae_adv
        self.if_use_v_trace = if_use_v_trace

    def get_advantages(self, states: TEN, rewards: TEN, undones: TEN, unmasks: TEN, values: TEN) -> TEN:
        advantages = th.empty_like(values)  # advantage value

        # update undones rewards when truncated
        truncated = th.logical_not(unmasks)
        if th.any(truncated):
            rewards[truncated] += self.cri(states[truncated]).squeeze(1).detach()
            undones[truncated] = False

        masks = undones * self.gamma
        horizon_len = rewards.shape[0]

        next_state = self.last_state.clone()
        next_value = self.cri(next_state).detach().squeeze(-1)

        advantage = th.zeros_like(next_value)  # last advantage value by GAE (Generalized Advantage Estimate)
        if self.if_use_v_trace:  # get advantage value in reverse time series (V-trace)
            for t in range(horizon_len - 1, -1, -1):  # (corpus: V-trace loop)
                next_value = rewards[t] + masks[t] * next_value
                advantages[t] = advantage = next_value - values[t] + masks[t] * self.lambda_gae_adv * advantage
                next_value = values[t]
        else:  # get advantage value using the estimated value of critic network
            for t in range(horizon_len - 1, -1, -1):  # (corpus: GAE loop)
                advantages[t] = rewards[t] - values[t] + masks[t] * advantage
                advantage = values[t] + self.lambda_gae_adv * advantages[t]
        return advantages


EXPECT = {
    # next_value, rebound to values[t] at the end of the step, is read by the next step's first
    # assignment: its first value gets a name of its own in the vectorized steps (issue 20)
    "for t in range(horizon_len - 1, -1, -1):  # (corpus: V-trace loop)": ("vectorize.recurrence", "REWRITTEN", "exact"),
    # the carry is read back from advantages[t] plus values[t]: affine, but not a plain read-back
    "for t in range(horizon_len - 1, -1, -1):  # (corpus: GAE loop)": ("vectorize.recurrence", "SKIPPED", None),
    "for t in range(horizon_len - 1, -1, -1):  # (corpus: GAE loop)@1": ("vectorize.elementwise", "SKIPPED", None),
}


def run(ns, T, seed):
    g = th.Generator().manual_seed(seed)
    N, S = 4, 3
    w = th.randn(S, 1, generator=g)
    cri = lambda s: s @ w
    out = []
    for vtrace in (True, False):
        states = th.randn(T, N, S, generator=g)
        rewards = th.randn(T, N, generator=g)
        undones = th.rand(T, N, generator=g) > 0.05
        unmasks = th.rand(T, N, generator=g) > 0.02
        values = th.randn(T, N, generator=g)
        agent = ns["AgentPPO"](cri, th.randn(N, S, generator=g), 0.99, 0.95, vtrace)
        out.append(agent.get_advantages(states, rewards, undones, unmasks, values))
        out.append((rewards, undones))
    return out
