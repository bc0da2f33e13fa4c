"""Documented examples of grad_clip (rewritten, and look-alikes left alone), run by the example
tests: plain, actor/critic and several-optimizer steps, accumulation, AMP, a misplaced clip, the
code's own clip in each mode, accelerate, closures, unknown receivers and conditional unscale_.
"""
from __future__ import annotations

from ..base import Example

#: one SGD step at module level (rewritten in each mode)
_SGD_STEP = (
    "import torch\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "loss.backward()\n"
    "opt.step()\n"
)
#: Stable-Baselines3's own clip, torch imported as th
_SB3_CLIPPED = (
    "import torch as th\n"
    "loss.backward()\n"
    "th.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)\n"
    "policy.optimizer.step()\n"
)

#: accelerate's own backward() and clip
_ACCELERATE_CLIPPED = (
    "accelerator.backward(loss)\n"
    "accelerator.clip_grad_norm_(model.parameters(), 1.0)\n"
    "optimizer.step()\n"
)


EXAMPLES = [
    Example(
        _SGD_STEP,
        True,
        note="plain backward/step at module level",
        expected="plain_backward_step_at_module_level",
    ),
    Example(
        "def train(self, loss_q, loss_pi):\n"
        "    self.critic_optimizer.zero_grad()\n"
        "    loss_q.backward()\n"
        "    self.critic_optimizer.step()\n"
        "    self.actor_optimizer.zero_grad()\n"
        "    loss_pi.backward()\n"
        "    self.actor_optimizer.step()\n",
        True,
        note="separate actor and critic pairs (TD3/DDPG style)",
        expected="separate_actor_and_critic_pairs",
    ),
    Example(
        "loss.backward()\n"
        "encoder_opt.step()\n"
        "head_opt.step()\n",
        True,
        note="two optimizers stepped after one backward",
        expected="two_optimizers_stepped_after_one",
    ),
    Example(
        "for i, batch in enumerate(loader):\n"
        "    (model(batch).mean() / k).backward()\n"
        "    if (i + 1) % k == 0:\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()\n",
        True,
        note="gradient accumulation: the clip goes inside the if",
        expected="gradient_accumulation",
    ),
    Example(
        "from torch.cuda.amp import GradScaler\n"
        "scaler = GradScaler()\n"
        "scaler.scale(loss).backward()\n"
        "scaler.step(optimizer)\n"
        "scaler.update()\n",
        True,
        note="AMP: scaler.unscale_ is inserted before the clip",
        expected="amp",
    ),
    Example(
        "import torch\n"
        "optimizer.zero_grad()\n"
        "torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)\n"
        "loss.backward()\n"
        "optimizer.step()\n",
        True,
        note="clip before backward() has no effect: warned, and a working clip is inserted",
        expected="clip_before_backward",
    ),
    Example(
        _SB3_CLIPPED,
        False,
        reason="already clipped",
        note="SB3 style, torch imported as th (fixed mode)",
        options=(("mode", "fixed"),),
    ),
    Example(
        _SB3_CLIPPED,
        True,
        note="guard mode after the code's own clip: measures and skips non-finite steps only",
        expected="guard_mode_after_the_code_s_own_clip",
    ),
    Example(
        _SGD_STEP,
        True,
        note="fixed mode: clip_grad_norm_ to max_norm",
        options=(("mode", "fixed"), ("max_norm", 0.5)),
        expected="fixed_mode",
    ),
    Example(
        _SGD_STEP,
        True,
        note="guard that clips spikes instead of reporting them (spikes = clip)",
        options=(("spikes", "clip"),),
        expected="spikes_clipped",
    ),
    Example(
        _SGD_STEP,
        True,
        note="hot-fix: fixed clip that also skips non-finite steps",
        options=(("mode", "fixed"), ("max_norm", 0.5), ("skip_nonfinite", True)),
        expected="hot_fix",
    ),
    Example(
        "from torch.nn.utils import clip_grad_norm_ as cg\n"
        "loss.backward()\n"
        "if args.max_grad_norm:\n"
        "    cg(agent.parameters(), args.max_grad_norm)\n"
        "optimizer.step()\n",
        False,
        reason="already clipped",
        note="conditional clip under an import alias (fixed mode)",
        options=(("mode", "fixed"),),
    ),
    Example(
        _ACCELERATE_CLIPPED,
        False,
        reason="already clipped",
        options=(("mode", "fixed"),),
    ),
    Example(
        _ACCELERATE_CLIPPED,
        False,
        reason="accelerate's backward() may scale gradients",
    ),
    Example(
        "optimizer = torch.optim.LBFGS(model.parameters())\n"
        "def closure():\n"
        "    optimizer.zero_grad()\n"
        "    loss = loss_fn(model(x), y)\n"
        "    loss.backward()\n"
        "    return loss\n"
        "optimizer.step(closure)\n",
        False,
        reason="closure",
    ),
    Example(
        "loss.backward()\n"
        "trainer.step()\n",
        False,
        reason="cannot tell that trainer is an optimizer",
    ),
    Example(
        "scaler.scale(loss).backward()\n"
        "optimizer.step()\n",
        False,
        reason="scaled",
        note="scaled gradients stepped without scaler.step: clipping them would be wrong",
    ),
    Example(
        "scaler.scale(loss).backward()\n"
        "if log_grads:\n"
        "    scaler.unscale_(optimizer)\n"
        "scaler.step(optimizer)\n",
        False,
        reason="unscale_",
        note="a conditional unscale_: inserting another would raise when it ran",
    ),
]
