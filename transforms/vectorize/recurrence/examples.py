"""Documented examples of vectorize.recurrence (rewritten and left alone), run by the example tests.
"""
from __future__ import annotations

from ...base import Example, Inputs


EXAMPLES = [
    Example(
        code=(
            "import torch\n"
            "def gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda, num_steps):\n"
            "    advantages = torch.zeros_like(rewards)\n"
            "    lastgaelam = 0\n"
            "    for t in reversed(range(num_steps)):\n"
            "        if t == num_steps - 1:\n"
            "            nextnonterminal = 1.0 - next_done\n"
            "            nextvalues = next_value\n"
            "        else:\n"
            "            nextnonterminal = 1.0 - dones[t + 1]\n"
            "            nextvalues = values[t + 1]\n"
            "        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]\n"
            "        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam\n"
            "    return advantages\n"
        ),
        rewritten=True,
        note="CleanRL GAE: bitwise exact (the coefficient is the left-associated prefix of the product)",
        expected="cleanrl_gae",
        inputs=Inputs("gae", "torch.randn(16, 4), torch.randn(16, 4), (torch.rand(16, 4) < 0.1).float(), torch.randn(4), (torch.rand(4) < 0.1).float(), 0.99, 0.95, 16", seeds=(0, 1)),
    ),
    Example(
        code=(
            "def discounted(rewards, gamma):\n"
            "    R = 0\n"
            "    returns = []\n"
            "    for r in reversed(rewards):\n"
            "        R = r + gamma * R\n"
            "        returns.insert(0, R)\n"
            "    return returns\n"
        ),
        rewritten=True,
        note="REINFORCE returns over a list of floats",
        expected="reinforce_returns_over_a_list_of_floats",
        inputs=Inputs("discounted", "torch.randn(20, dtype=torch.float64), 0.99", seeds=(0, 1)),
    ),
    Example(
        code=(
            "from collections import deque\n"
            "def finish_episode(rewards, gamma):\n"
            "    R = 0\n"
            "    returns = deque()\n"
            "    for r in rewards[::-1]:\n"
            "        R = r + gamma * R\n"
            "        returns.appendleft(R)\n"
            "    return returns\n"
        ),
        rewritten=True,
        note="pytorch/examples reinforce.py: deque.appendleft (the guard checks it is a deque)",
        expected="pytorch_examples_reinforce_py",
        inputs=Inputs("finish_episode", "rng.standard_normal(1100).tolist(), 0.99"),
    ),
    Example(
        code=(
            "def returns_of(rewards, dones, gamma):\n"
            "    out = []\n"
            "    discounted_reward = 0\n"
            "    for reward, done in zip(reversed(rewards), reversed(dones)):\n"
            "        if done:\n"
            "            discounted_reward = 0\n"
            "        discounted_reward = reward + (gamma * discounted_reward)\n"
            "        out.insert(0, discounted_reward)\n"
            "    return out\n"
        ),
        rewritten=True,
        note="PPO-PyTorch: episode resets become stretches of the op, exact",
        expected="ppo_pytorch",
        inputs=Inputs("returns_of", "torch.randn(20), (torch.rand(20) < 0.2).tolist(), 0.99", seeds=(0, 1)),
    ),
    Example(
        code=(
            "def gae_advantages(values, rewards, gae_lambda, gae_gamma):\n"
            "    response_length = len(values)\n"
            "    lastgaelam = 0.0\n"
            "    advantages_reversed = []\n"
            "    for t in reversed(range(response_length)):\n"
            "        nextvalues = values[t + 1] if t < response_length - 1 else 0.0\n"
            "        delta = rewards[t] + gae_gamma * nextvalues - values[t]\n"
            "        lastgaelam = delta + gae_gamma * gae_lambda * lastgaelam\n"
            "        advantages_reversed.append(lastgaelam)\n"
            "    return advantages_reversed[::-1]\n"
        ),
        rewritten=True,
        note="per-token GAE (LLM fine-tuning code): the last-step case as a conditional expression; the "
             "peeled first step runs it as written, the other steps take `values[t + 1]`",
        expected="per_token_gae",
        inputs=Inputs("gae_advantages", "torch.randn(12), torch.randn(12), 0.95, 1.0"),
    ),
    Example(
        code=(
            "def returns_of(x, rewards, gamma):\n"
            "    for i in reversed(range(len(rewards))):\n"
            "        x[i] = rewards[i] + gamma * (x[i + 1] if i < len(rewards) - 1 else 0)\n"
            "    return x\n"
        ),
        rewritten=True,
        note="carried through the output's next row, nothing added at the end: exact",
        expected="carried_through_the_output_s_next_row",
        inputs=Inputs("returns_of", "torch.zeros(10), torch.randn(10), 0.99"),
    ),
    Example(
        code=(
            "def f(values, rewards, gamma, lam, adv):\n"
            "    gae = 0.0\n"
            "    for i in reversed(range(len(rewards))):\n"
            "        nv = values[i + 1] if i % 2 else 0.0\n"
            "        gae = rewards[i] + gamma * nv - values[i] + gamma * lam * gae\n"
            "        adv[i] = gae\n"
            "    return adv\n"
        ),
        rewritten=False,
        reason="conditional expression `values[i + 1] if i % 2 else 0.0`",
    ),
    Example(
        code=(
            "def f(values, rewards, gamma, T, adv):\n"
            "    gae = prev = 0.0\n"
            "    for t in reversed(range(T)):\n"
            "        gae = rewards[t] + gamma * prev + gamma * gae\n"
            "        adv[t] = gae\n"
            "        prev = 0.0 if t == T - 1 else values[t]\n"
            "    return adv\n"
        ),
        rewritten=False,
        reason="computes otherwise than the other steps",
    ),
    Example(
        code=(
            "import numpy as np\n"
            "def returns_advs(rews, vals, masks, last_val, gamma, use_gae, gae_lambda, rets, advs):\n"
            "    ret, adv = last_val, np.zeros_like(last_val)\n"
            "    for i in reversed(range(len(rews))):\n"
            "        ret = rews[i] + gamma * masks[i] * ret\n"
            "        if not use_gae:\n"
            "            adv = ret - vals[i]\n"
            "        else:\n"
            "            td_error = rews[i] + gamma * masks[i] * vals[i + 1] - vals[i]\n"
            "            adv = adv * gae_lambda * gamma * masks[i] + td_error\n"
            "        rets[i] = ret\n"
            "        advs[i] = adv\n"
            "    return rets, advs\n"
        ),
        rewritten=True,
        note="a loop-invariant flag unswitched: one loop per branch, each vectorized on its own (the "
             "flag asked once, before the first step, and not at all without steps)",
        expected="a_loop_invariant_flag_unswitched",
        inputs=Inputs("returns_advs", "rng.standard_normal((16, 3)), rng.standard_normal((17, 3)), (rng.random((16, 3)) > 0.1).astype(np.float64), rng.standard_normal(3), 0.99, seed % 2 == 0, 0.95, np.zeros((16, 3)), np.zeros((16, 3))", seeds=(0, 1)),
    ),
    Example(
        code=(
            "def f(rewards, values, gamma, lam, use_gae, out, log):\n"
            "    g = 0.0\n"
            "    for t in reversed(range(len(rewards))):\n"
            "        if use_gae:\n"
            "            g = rewards[t] + gamma * values[t + 1] - values[t] + gamma * lam * g\n"
            "        else:\n"
            "            g = rewards[t] + gamma * g\n"
            "        log(g)\n"
            "        out[t] = g\n"
            "    return out\n"
        ),
        rewritten=False,
        reason="is not unswitched: the body calls `log()`",
    ),
    Example(
        code=(
            "def gae_and_returns(rewards, values, dones, gamma, lam, adv, returns):\n"
            "    gae = ret = 0.0\n"
            "    for t in reversed(range(len(rewards))):\n"
            "        delta = rewards[t] + gamma * values[t + 1] - values[t]\n"
            "        if dones[t]:\n"
            "            gae = 0\n"
            "            ret = 0\n"
            "        else:\n"
            "            gae = delta + gamma * lam * gae\n"
            "            ret = rewards[t] + gamma * ret\n"
            "        adv[t] = gae\n"
            "        returns[t] = ret\n"
            "    return adv, returns\n"
        ),
        rewritten=True,
        note="an episode end stores the constants instead of updating (if/else), two outputs: "
             "switch_linear_recurrence, exact",
        expected="an_episode_end_stores_the_constants",
        inputs=Inputs("gae_and_returns", "torch.randn(10), torch.randn(11), torch.rand(10) < 0.2, 0.99, 0.95, torch.zeros(10), torch.zeros(10)"),
    ),
    Example(
        code=(
            "import numpy as np\n"
            "def discount_rewards(r, gamma):\n"
            "    discounted_r = np.zeros_like(r)\n"
            "    running_add = 0\n"
            "    for t in reversed(range(0, r.size)):\n"
            "        if r[t] != 0:\n"
            "            running_add = 0\n"
            "        running_add = running_add * gamma + r[t]\n"
            "        discounted_r[t] = running_add\n"
            "    return discounted_r\n"
        ),
        rewritten=True,
        note="Karpathy's Pong discount: a non-zero reward ends a game (`r[t] != 0`, the truth of a number)",
        expected="karpathy_s_pong_discount",
        inputs=Inputs("discount_rewards", "rng.standard_normal(40) * (rng.random(40) < 0.3), 0.99"),
    ),
    Example(
        code=(
            "def f(rewards, values, dones, gamma, lam, adv):\n"
            "    gae = 0.0\n"
            "    for t in reversed(range(len(rewards))):\n"
            "        if dones[t]:\n"
            "            gae = 0\n"
            "        else:\n"
            "            delta = rewards[t] + gamma * values[t + 1] - values[t]\n"
            "            gae = delta + gamma * lam * gae\n"
            "        adv[t] = gae\n"
            "    return adv, delta\n"
        ),
        rewritten=False,
        reason="`delta` is computed only on steps that do not end an episode",
    ),
    Example(
        code=(
            "def train(rewards, gamma, optimizer):\n"
            "    R = 0.0\n"
            "    for t in reversed(range(len(rewards))):\n"
            "        R = rewards[t] + gamma * R\n"
            "        optimizer.step()\n"
            "    return R\n"
        ),
        rewritten=False,
        reason="calls `optimizer.step()`",
    ),
    Example(
        code=(
            "def f(r, T):\n"
            "    s = 0.0\n"
            "    for t in reversed(range(T)):\n"
            "        s = s * s + r[t]\n"
            "    return s\n"
        ),
        rewritten=False,
        reason="appears non-affinely",
    ),
    Example(
        code=(
            "def returns_of(returns, rewards, masks, gamma):\n"
            "    for step in reversed(range(rewards.size(0))):\n"
            "        returns[step] = returns[step + 1] * gamma * masks[step + 1] + rewards[step]\n"
            "    return returns\n"
        ),
        rewritten=True,
        note="ikostrikov storage: carried through returns[step + 1]; the mask is regrouped into the "
             "coefficient (reassociated)",
        expected="ikostrikov_storage",
        inputs=Inputs("returns_of", "torch.zeros(11, 2, 1), torch.randn(10, 2, 1), (torch.rand(11, 2, 1) > 0.1).float(), 0.99"),
    ),
    Example(
        code=(
            "def f(out, r, T, gamma):\n"
            "    for t in reversed(range(T - 2)):\n"
            "        out[t] = r[t] + gamma * out[t + 2]\n"
            "    return out\n"
        ),
        rewritten=False,
        reason="recurrence through memory",
    ),
    Example(
        code=(
            "import numpy as np\n"
            "def advantages(self, reward_arr, values, dones_arr):\n"
            "    advantage = np.zeros(len(reward_arr), dtype=np.float32)\n"
            "    for t in range(len(reward_arr)-1):\n"
            "        discount = 1\n"
            "        a_t = 0\n"
            "        for k in range(t, len(reward_arr)-1):\n"
            "            a_t += discount*(reward_arr[k] + self.gamma*values[k+1]*(1-int(dones_arr[k])) - values[k])\n"
            "            discount *= self.gamma*self.gae_lambda\n"
            "        advantage[t] = a_t\n"
            "    return advantage\n"
        ),
        rewritten=True,
        note="Phil Tabor's quadratic GAE: one backward recurrence, reassociated; the discount still "
             "runs across episode ends, as in the original",
        expected="phil_tabor_s_quadratic_gae",
        inputs=Inputs("advantages", "attrs(gamma=0.99, gae_lambda=0.95), rng.standard_normal(40), rng.standard_normal(40), "
                      "rng.random(40) < 0.1"),
    ),
    Example(
        code=(
            "def returns_of(rewards, gamma):\n"
            "    returns = []\n"
            "    for t in range(len(rewards)):\n"
            "        G = 0\n"
            "        for k in range(t, len(rewards)):\n"
            "            G += gamma ** (k - t) * rewards[k]\n"
            "        returns.append(G)\n"
            "    return returns\n"
        ),
        rewritten=True,
        note="quadratic discounted returns with a power discount, appended",
        expected="quadratic_discounted_returns_with_a",
        inputs=Inputs("returns_of", "rng.standard_normal(60).tolist(), 0.99"),
    ),
    Example(
        code=(
            "def truncated(rewards, dones, gamma, out):\n"
            "    for t in range(len(rewards)):\n"
            "        G = 0\n"
            "        for k in range(t, len(rewards)):\n"
            "            G += gamma ** (k - t) * rewards[k]\n"
            "            if dones[k]:\n"
            "                break\n"
            "        out[t] = G\n"
            "    return out\n"
        ),
        rewritten=False,
        reason="episode-truncated sum",
    ),
    Example(
        code=(
            "def f(rewards, gamma, out):\n"
            "    discount = 1\n"
            "    for t in range(len(rewards)):\n"
            "        G = 0\n"
            "        for k in range(t, len(rewards)):\n"
            "            G += discount * rewards[k]\n"
            "            discount *= gamma\n"
            "        out[t] = G\n"
            "    return out\n"
        ),
        rewritten=False,
        reason="is not reset for each `t`",
    ),
    # ---- time indexed in the middle (views.py) and the carried value read back from a list (lists.py)
    Example(
        code=(
            "import torch\n"
            "def generalized_advantage_estimate(gamma, lmbda, state_value, next_state_value, reward, done):\n"
            "    not_done = 1 - done.to(next_state_value.dtype)\n"
            "    *batch_size, time_steps = not_done.shape[:-1]\n"
            "    advantage = torch.empty(*batch_size, time_steps, 1)\n"
            "    prev_advantage = 0\n"
            "    for t in reversed(range(time_steps)):\n"
            "        delta = reward[..., t, :] + (gamma * next_state_value[..., t, :] * not_done[..., t, :]) \\\n"
            "            - state_value[..., t, :]\n"
            "        prev_advantage = advantage[..., t, :] = delta + (gamma * lmbda * prev_advantage * not_done[..., t, :])\n"
            "    return advantage, advantage + state_value\n"
        ),
        rewritten=True,
        note="torchrl GAE over [*B, T, F]: time at dimension -2, read through time-major views "
             "(dim_view(x, -2, 2)); the mask is regrouped into the coefficient (reassociated)",
        expected="torchrl_gae_over_b",
        inputs=Inputs("generalized_advantage_estimate", "0.99, 0.95, torch.randn(3, 10, 1), torch.randn(3, 10, 1), torch.randn(3, 10, 1), torch.rand(3, 10, 1) < 0.1"),
    ),
    Example(
        code=(
            "def returns_of(rewards, dones, gamma):\n"
            "    out = rewards * 0\n"
            "    s = rewards[:, :, -1] * 0\n"
            "    for t in reversed(range(rewards.shape[2])):\n"
            "        s = rewards[:, :, t] + gamma * (1 - dones[:, :, t]) * s\n"
            "        out[:, :, t] = s\n"
            "    return out\n"
        ),
        rewritten=True,
        note="time at dimension 2 of [B, C, T] arrays: bitwise exact",
        expected="time_at_dimension_2_of_b",
        inputs=Inputs("returns_of", "torch.randn(2, 3, 10), (torch.rand(2, 3, 10) < 0.1).float(), 0.99"),
    ),
    Example(
        code=(
            "def f(ret, rewards, gamma):\n"
            "    for t in range(ret.shape[1] - 2, -1, -1):\n"
            "        ret[:, t] = rewards[..., t] + gamma * ret[:, t + 1]\n"
            "    return ret\n"
        ),
        rewritten=True,
        note="rewards[..., t] next to ret[:, t]: each container gets its own view (time at -1 and at 1)",
        expected="rewards_and_ret_containers",
        inputs=Inputs("f", "torch.randn(3, 10), torch.randn(3, 10), 0.99"),
    ),
    Example(
        code=(
            "def f(x, gamma, T):\n"
            "    s = 0.0\n"
            "    for t in reversed(range(T)):\n"
            "        s = x[..., t] + x[:, t] + gamma * s\n"
            "    return s\n"
        ),
        rewritten=False,
        reason="indexed with time along two dimensions",
    ),
    Example(
        code=(
            "import numpy as np\n"
            "def calculate_advantages(rewards, values, gamma=0.99, decay=0.97):\n"
            "    next_values = np.concatenate([values[1:], [0]])\n"
            "    deltas = [rew + gamma * next_val - val for rew, val, next_val in zip(rewards, values, next_values)]\n"
            "    advantages = [deltas[-1]]\n"
            "    for i in reversed(range(len(deltas) - 1)):\n"
            "        advantages.append(deltas[i] + decay * gamma * advantages[-1])\n"
            "    return np.array(advantages[::-1])\n"
        ),
        rewritten=True,
        note="GAE seeded with the last delta, the previous output read back as advantages[-1]: the list's "
             "last element is the carried value (bitwise exact)",
        expected="gae_seeded_with_the_last_delta",
        inputs=Inputs("calculate_advantages", "rng.standard_normal(60), rng.standard_normal(60)"),
    ),
    Example(
        code=(
            "def compute_returns(next_value, rewards, masks, gamma=0.99):\n"
            "    returns = [next_value]\n"
            "    for r, m in zip(reversed(rewards), reversed(masks)):\n"
            "        returns.insert(0, r + gamma * returns[0] * m)\n"
            "    return returns[:-1]\n"
        ),
        rewritten=True,
        note="returns[0] read back after insert(0, ...); the mask is regrouped into the coefficient (reassociated)",
        expected="returns_0_read_back_after_insert",
        inputs=Inputs("compute_returns", "torch.randn(2), [torch.randn(2) for _ in range(8)], [(torch.rand(2) > 0.1).float() for _ in range(8)]"),
    ),
    Example(
        code=(
            "def f(rewards, gamma):\n"
            "    advantages = [0]\n"
            "    for r in reversed(rewards):\n"
            "        advantage = r + gamma * advantages[-1]\n"
            "        advantages.insert(0, advantage)\n"
            "    return advantages\n"
        ),
        rewritten=False,
        reason="while it inserts at its front",
    ),
    Example(
        code=(
            "def f(deltas, gamma, lam):\n"
            "    adv = [0.0, 0.0]\n"
            "    for delta in reversed(deltas):\n"
            "        adv.append(delta + gamma * lam * adv[-2])\n"
            "    return adv\n"
        ),
        rewritten=False,
        reason="reads `adv[-2]`",
    ),
    Example(
        code=(
            "def gae(delta, factor, adv, gae_item):\n"
            "    for t in reversed(range(delta.shape[0])):\n"
            "        gae_item = delta[t] + factor[t] * gae_item\n"
            "        adv[t] += gae_item\n"
            "    return adv\n"
        ),
        rewritten=True,
        note="DI-engine GAE: the output accumulated in place, `adv[1:T - 1] += G` in the middle steps (each row read once)",
        expected="di_engine_gae",
        inputs=Inputs("gae", "torch.randn(10, 2), torch.rand(10, 2), torch.randn(10, 2), torch.zeros(2)"),
    ),
    Example(
        code=(
            "def f(r, out, g):\n"
            "    s = 0.0\n"
            "    for t in reversed(range(len(r))):\n"
            "        s = r[t] + g * s + out[t + 1]\n"
            "        out[t] += s\n"
            "    return out\n"
        ),
        rewritten=False,
        reason="updates `out` in place and the loop also reads it",
    ),
]
