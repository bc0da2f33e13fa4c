"""nikhilbarhate99 PPO-PyTorch PPO.update: Monte-Carlo returns over two reversed lists with an
episode reset, rewards.insert(0, ...), then torch.tensor of the list; one optimizer step per epoch.

Source: nikhilbarhate99/PPO-PyTorch, PPO.py @ d5e73e5f1c764a3a892f2a1106c5035cb2f4deb0
(PPO.update, first part). License: MIT.
Adapted: PPO is reduced to the attributes update() reads; the returns loop and the normalisation
after it are verbatim (the optimisation epochs, which need the ActorCritic, are left out).
"""
import torch

device = torch.device('cpu')


class RolloutBuffer:
    def __init__(self):
        self.actions = []
        self.states = []
        self.logprobs = []
        self.rewards = []
        self.is_terminals = []


class PPO:
    def __init__(self, gamma):
        self.gamma = gamma
        self.buffer = RolloutBuffer()

    def update(self):

        # Monte Carlo estimate of returns
        rewards = []
        discounted_reward = 0
        for reward, is_terminal in zip(reversed(self.buffer.rewards), reversed(self.buffer.is_terminals)):
            if is_terminal:
                discounted_reward = 0
            discounted_reward = reward + (self.gamma * discounted_reward)
            rewards.insert(0, discounted_reward)

        # Normalizing the rewards
        rewards = torch.tensor(rewards, dtype=torch.float32).to(device)
        rewards = (rewards - rewards.mean()) / (rewards.std() + 1e-7)
        return rewards


EXPECT = {
    "for reward, is_terminal in zip(reversed(self.buffer.rewards), reversed(self.buffer.is_terminals)):":
        ("vectorize.recurrence", "REWRITTEN", "exact"),
}


def run(ns, T, seed):
    import random
    rnd = random.Random(seed)
    ppo = ns["PPO"](0.99)
    ppo.buffer.rewards = [rnd.uniform(-1.0, 1.0) for _ in range(T)]
    ppo.buffer.is_terminals = [rnd.random() < 0.05 for _ in range(T)]
    return ppo.update()
