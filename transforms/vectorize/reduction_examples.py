"""Documented examples of vectorize.reduction (rewritten and left alone), run by the example tests.
"""
from __future__ import annotations

from ..base import Example, Inputs


EXAMPLES = [
    Example(
        code=(
            "import torch\n"
            "def finish_episode(saved_log_probs, returns):\n"
            "    policy_loss = []\n"
            "    for log_prob, R in zip(saved_log_probs, returns):\n"
            "        policy_loss.append(-log_prob * R)\n"
            "    policy_loss = torch.cat(policy_loss).sum()\n"
            "    return policy_loss\n"
        ),
        rewritten=True,
        note="PyTorch REINFORCE example",
        expected="pytorch_reinforce_example",
        inputs=Inputs("finish_episode", "[torch.randn(1, requires_grad=True) for _ in range(5)], torch.randn(5)"),
    ),
    Example(
        code=(
            "import torch\n"
            "def loss(logp, adv):\n"
            "    losses = []\n"
            "    for i in range(len(adv)):\n"
            "        losses.append(-logp[i] * adv[i])\n"
            "    return torch.stack(losses).mean()\n"
        ),
        rewritten=True,
        note="stack().mean() over an indexed loop",
        expected="stack_mean_over_an_indexed_loop",
        inputs=Inputs("loss", "torch.randn(6, requires_grad=True), torch.randn(6)"),
    ),
    Example(
        code=(
            "import torch\n"
            "def sq_error(pred, target, n):\n"
            "    total = 0.0\n"
            "    for i in range(n):\n"
            "        total += (pred[i] - target[i]) ** 2\n"
            "    return total\n"
        ),
        rewritten=True,
        note="scalar accumulator over range(n)",
        expected="scalar_accumulator_over_range",
        inputs=Inputs("sq_error", "torch.randn(7, 3, requires_grad=True), torch.randn(7, 3), 5"),
    ),
    Example(
        code=(
            "import torch\n"
            "def entropy_bonus(probs, coef):\n"
            "    h = 0\n"
            "    for p in probs:\n"
            "        h = h - coef * p * torch.log(p)\n"
            "    return h\n"
        ),
        rewritten=True,
        note="acc = acc - f(x) with a torch function",
        expected="acc_minus_a_torch_function",
        inputs=Inputs("entropy_bonus", "torch.rand(4, 3).add(0.1).requires_grad_(), 0.01"),
    ),
    Example(
        code=(
            "import torch\n"
            "def values(xs, w):\n"
            "    out = []\n"
            "    for x in xs:\n"
            "        out.append(x * w + 1)\n"
            "    return torch.stack(out)\n"
        ),
        rewritten=True,
        note="stack of element-wise results (exact)",
        expected="stack_of_element_wise_results",
        inputs=Inputs("values", "[torch.randn(3, requires_grad=True) for _ in range(4)], torch.randn(3)"),
    ),
    Example(
        code=(
            "import torch\n"
            "import torch.nn.functional as F\n"
            "def finish_episode(saved_actions, returns):\n"
            "    policy_losses = []\n"
            "    value_losses = []\n"
            "    for (log_prob, value), R in zip(saved_actions, returns):\n"
            "        advantage = R - value.item()\n"
            "        policy_losses.append(-log_prob * advantage)\n"
            "        value_losses.append(F.smooth_l1_loss(value, torch.tensor([R])))\n"
            "    return torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()\n"
        ),
        rewritten=True,
        note="pytorch/examples actor-critic: a temporary from .item(), a per-sample smooth_l1_loss",
        expected="pytorch_examples_actor_critic",
        inputs=Inputs("finish_episode", "[(torch.randn(()), torch.randn(1)) for _ in range(6)], torch.randn(6)"),
    ),
    Example(
        code=(
            "def critic_loss(returns, values):\n"
            "    loss = 0.0\n"
            "    for i in range(len(returns)):\n"
            "        td = returns[i] - values[i]\n"
            "        loss += td ** 2\n"
            "    return loss\n"
        ),
        rewritten=True,
        note="TD errors as a temporary over an index",
        expected="td_errors_as_a_temporary_over_an_index",
        inputs=Inputs("critic_loss", "torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)"),
    ),
    Example(
        code=(
            "import torch\n"
            "def f(log_probs, returns):\n"
            "    loss = 0\n"
            "    for log_prob, R in zip(log_probs, returns):\n"
            "        ratio = torch.exp(log_prob)\n"
            "        loss += -ratio * R\n"
            "    return loss + ratio * R\n"
        ),
        rewritten=True,
        note="a temporary and a loop variable read after the loop: bound as the last iteration binds them",
        expected="a_temporary_and_a_loop_variable_read",
        inputs=Inputs("f", "torch.randn(6, requires_grad=True), torch.randn(6)"),
    ),
    Example(
        code=(
            "def f(log_probs, rewards, gamma):\n"
            "    loss = 0\n"
            "    ret = 0\n"
            "    for t in range(len(rewards) - 1, -1, -1):\n"
            "        ret = rewards[t] + gamma * ret\n"
            "        loss += -log_probs[t] * ret\n"
            "    return loss\n"
        ),
        rewritten=False,
        reason="`ret` carries a value from one iteration to the next",
        note="a temporary that carries across iterations (a return, not a per-sample value)",
    ),
    Example(
        code=(
            "def f(log_probs, values):\n"
            "    loss = 0\n"
            "    for log_prob, value in zip(log_probs, values):\n"
            "        adv = value.sum().item()\n"
            "        loss += -log_prob * adv\n"
            "    return loss\n"
        ),
        rewritten=False,
        reason="not known to act element by element",
        note=".item() of a per-sample sum (not an element-by-element value)",
    ),
    Example(
        code=(
            "def f(log_probs, states, critic):\n"
            "    loss = 0\n"
            "    for log_prob, s in zip(log_probs, states):\n"
            "        v = critic(s)\n"
            "        loss += -log_prob * v\n"
            "    return loss\n"
        ),
        rewritten=False,
        reason="not known to act element by element",
        note="a temporary from a model call (side effects unknown)",
    ),
    Example(
        code=(
            "import torch\n"
            "def loss(model, xs):\n"
            "    total = 0\n"
            "    for x in xs:\n"
            "        total += model(x)\n"
            "    return total\n"
        ),
        rewritten=False,
        reason="not known to act element by element",
        note="calls a model (unknown side effects, not element-wise)",
    ),
    Example(
        code=(
            "import torch\n"
            "def returns(rewards, gamma):\n"
            "    R = 0\n"
            "    for r in rewards:\n"
            "        R = R * gamma + r\n"
            "    return R\n"
        ),
        rewritten=False,
        reason="",
        note="discounted recurrence: not a sum, not reported (vectorize.recurrence's loop)",
    ),
    Example(
        code=(
            "import torch\n"
            "def lambda_returns(target, discount, bootstrap, lambda_):\n"
            "    outputs = []\n"
            "    acc = bootstrap\n"
            "    for t in range(len(target) - 1, -1, -1):\n"
            "        acc = target[t] + discount[t] * lambda_ * acc\n"
            "        outputs.append(acc)\n"
            "    return torch.flip(torch.stack(outputs), [0])\n"
        ),
        rewritten=False,
        reason="",
        note="recurrence collecting its values with append: not a sum, not reported (dreamerv2)",
    ),
    Example(
        code=(
            "import torch\n"
            "def f(xs):\n"
            "    losses = []\n"
            "    for x in xs:\n"
            "        losses.append(x * 2)\n"
            "    print(len(losses))\n"
            "    return torch.stack(losses).sum()\n"
        ),
        rewritten=True,
        note="the list's length is read too: the batched branch fills the list",
        expected="the_list_s_length_is_read_too",
        inputs=Inputs("f", "torch.randn(6, 3, requires_grad=True)"),
    ),
    Example(
        code=(
            "import torch\n"
            "def f(xs):\n"
            "    losses = []\n"
            "    for x in xs:\n"
            "        losses.append(x * 2)\n"
            "    print(losses)\n"
            "    return torch.stack(losses).sum()\n"
        ),
        rewritten=False,
        reason="other than by a stack/cat/sum/mean reduction",
        note="the list is used for something else too",
    ),
    Example(
        code=(
            "import torch\n"
            "def f(xs, opt):\n"
            "    total = 0\n"
            "    for x in xs:\n"
            "        total += x * 2\n"
            "        if total > 10:\n"
            "            break\n"
            "    return total\n"
        ),
        rewritten=False,
        reason="",
        note="early exit in a nested block: not a reduction loop, not reported",
    ),
    Example(
        code=(
            "import torch\n"
            "def f(xs):\n"
            "    total = 0\n"
            "    for x in xs:\n"
            "        total += x * 2\n"
            "    return total * x\n"
        ),
        rewritten=True,
        note="loop variable used after the loop (bound to the last item)",
        expected="loop_variable_used_after_the_loop",
        inputs=Inputs("f", "torch.randn(5, 2, requires_grad=True)"),
    ),
    Example(
        code=(
            "import torch\n"
            "def f(xs, norm):\n"
            "    total = 0\n"
            "    for x in xs:\n"
            "        total += norm.update(x)\n"
            "    return total\n"
        ),
        rewritten=False,
        reason="not known to act element by element",
        note="a running normaliser updated per element",
    ),
]
