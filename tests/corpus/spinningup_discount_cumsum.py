"""Spinning Up PPO buffer: GAE and rewards-to-go through core.discount_cumsum, which already runs
the recurrence in C (scipy.signal.lfilter): there is no loop, and nothing may be touched.

Source: openai/spinningup, spinup/algos/pytorch/ppo/core.py (discount_cumsum) and
spinup/algos/pytorch/ppo/ppo.py @ 20921137141b154454c0a2698709d9f9a0302101 (PPOBuffer.__init__,
store, finish_path). License: MIT.
Adapted: core.discount_cumsum is inlined as a module function (`core.` dropped at its two call
sites); core.combined_shape is inlined in __init__. Otherwise verbatim.
"""
import numpy as np
import scipy.signal


def discount_cumsum(x, discount):
    """
    magic from rllab for computing discounted cumulative sums of vectors.

    input: 
        vector x, 
        [x0, 
         x1, 
         x2]

    output:
        [x0 + discount * x1 + discount^2 * x2,  
         x1 + discount * x2,
         x2]
    """
    return scipy.signal.lfilter([1], [1, float(-discount)], x[::-1], axis=0)[::-1]


class PPOBuffer:
    """
    A buffer for storing trajectories experienced by a PPO agent interacting
    with the environment, and using Generalized Advantage Estimation (GAE-Lambda)
    for calculating the advantages of state-action pairs.
    """

    def __init__(self, obs_dim, act_dim, size, gamma=0.99, lam=0.95):
        self.obs_buf = np.zeros((size, obs_dim), dtype=np.float32)
        self.act_buf = np.zeros((size, act_dim), dtype=np.float32)
        self.adv_buf = np.zeros(size, dtype=np.float32)
        self.rew_buf = np.zeros(size, dtype=np.float32)
        self.ret_buf = np.zeros(size, dtype=np.float32)
        self.val_buf = np.zeros(size, dtype=np.float32)
        self.logp_buf = np.zeros(size, dtype=np.float32)
        self.gamma, self.lam = gamma, lam
        self.ptr, self.path_start_idx, self.max_size = 0, 0, size

    def store(self, obs, act, rew, val, logp):
        """
        Append one timestep of agent-environment interaction to the buffer.
        """
        assert self.ptr < self.max_size     # buffer has to have room so you can store
        self.obs_buf[self.ptr] = obs
        self.act_buf[self.ptr] = act
        self.rew_buf[self.ptr] = rew
        self.val_buf[self.ptr] = val
        self.logp_buf[self.ptr] = logp
        self.ptr += 1

    def finish_path(self, last_val=0):
        path_slice = slice(self.path_start_idx, self.ptr)
        rews = np.append(self.rew_buf[path_slice], last_val)
        vals = np.append(self.val_buf[path_slice], last_val)
        
        # the next two lines implement GAE-Lambda advantage calculation
        deltas = rews[:-1] + self.gamma * vals[1:] - vals[:-1]
        self.adv_buf[path_slice] = discount_cumsum(deltas, self.gamma * self.lam)
        
        # the next line computes rewards-to-go, to be targets for the value function
        self.ret_buf[path_slice] = discount_cumsum(rews, self.gamma)[:-1]
        
        self.path_start_idx = self.ptr


EXPECT = {}
LEAVE_ALONE = True


def run(ns, T, seed):
    rng = np.random.default_rng(seed)
    buf = ns["PPOBuffer"](3, 1, T)
    for t in range(T):
        buf.store(rng.standard_normal(3), rng.standard_normal(1), rng.standard_normal(), rng.standard_normal(), 0.0)
    buf.finish_path(0.5)
    return buf.adv_buf, buf.ret_buf
