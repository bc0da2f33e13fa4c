"""DL-project reinforce estimator: tab-indented; a nested function sums a comprehension with the
builtin sum(), then policy_loss.append(-log_prob * R) with a float R and torch.cat(policy_loss).sum().

Source: gasserchristian/DL-project, reinforce.py (reinforce.compute_loss). Commit: not recorded by
the index. License: not recorded.
Adapted: the base class `estimator` (imported from the project) is dropped; the method is verbatim.
"""
import torch
class reinforce:
	def compute_loss(self, trajectory, gamma):
		
		log_probs = trajectory['probs']
		rewards = trajectory['rewards']

		# this nested function computes total discounted reward of the episode 
		def discounted_total_reward(rewards): 
			discounts = [gamma ** i for i in range(len(rewards) + 1)]
			R = sum([a * b for a,b in zip(discounts, rewards)])
			return R
	
		R = discounted_total_reward(rewards)
		policy_loss = []

		for log_prob in log_probs:
			# Note that we are using Gradient Ascent, not Descent. So we need to calculate it with negative rewards.
			policy_loss.append(-log_prob * R)
		# After that, we concatenate whole policy loss in 0th dimension
		policy_loss = torch.cat(policy_loss).sum()
		return policy_loss


EXPECT = {
    "for log_prob in log_probs:": ("vectorize.reduction", "REWRITTEN", "reassociated"),
}


def run(ns, T, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(T, 1, generator=g).requires_grad_()
    probs = list((w * 0.5).unbind(0))
    rewards = [float(x) for x in torch.rand(T, generator=g)]
    loss = ns["reinforce"]().compute_loss({"probs": probs, "rewards": rewards}, 0.99)
    return loss, torch.autograd.grad(loss, w)[0]
