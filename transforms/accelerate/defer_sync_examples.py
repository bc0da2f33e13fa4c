"""``accelerate.defer_sync``'s examples: logging loops it defers and look-alikes it must leave alone.

Each example is a whole script logging through ``tensorboardX.SummaryWriter`` (the tests put a
recording fake in its place) and printing what it kept; the differential test runs original and
rewrite on the same seed and compares the writer's calls (values bitwise, same order) and stdout.
Each runs as rewritten for CUDA at
``[accelerate] level = "reassociated"`` (set on all of them below).
"""
from __future__ import annotations

import dataclasses

from ..base import Example

#: the backend and level every example is rewritten at (below "reassociated" the transform does nothing)
_BACKEND, _OPTIONS = "cuda", (("level", "reassociated"),)

_HEAD = """\
import torch
from tensorboardX import SummaryWriter

torch.manual_seed(0)
"""

EXAMPLES = [dataclasses.replace(e, backend=_BACKEND, options=_OPTIONS) for e in [
    Example(_HEAD + """\
writer = SummaryWriter("runs/ppo")
w = torch.randn(4, requires_grad=True)
optimizer = torch.optim.SGD([w], lr=0.05)
global_step = 0
for iteration in range(3):
    clipfracs = []
    for epoch in range(2):
        for start in range(0, 12, 4):
            x = torch.randn(4, 4)
            ratio = (x @ w).exp()
            loss = (x @ w).pow(2).mean()
            clipfracs += [((ratio - 1.0).abs() > 0.2).float().mean().item()]
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            writer.add_scalar("losses/loss", loss.item(), global_step)
            writer.add_scalar("charts/step", global_step, global_step)
            global_step += 1
        if (x @ w).mean() > 100.0:
            break
    writer.add_scalar("losses/clipfrac", sum(clipfracs) / len(clipfracs), global_step)
    print("iteration", iteration, len(clipfracs), clipfracs[-1])
writer.close()
""", True, note="CleanRL PPO update: clipfracs and add_scalar per minibatch, break on kl", expected="cleanrl_ppo_update"),
    Example(_HEAD + """\
def update(w, optimizer, data):
    stats = []
    for x in data:
        loss = (x @ w).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        stats.append(loss.item())
        stats.append(w[0].item())
        stats.extend([float(loss.detach() * 2), w.grad[1].item()])
        loss.mul_(0.0)
    return stats


w = torch.randn(3, requires_grad=True)
optimizer = torch.optim.SGD([w], lr=0.1)
for iteration in range(3):
    print(update(w, optimizer, [torch.randn(2, 3) for _ in range(4)]))
""", True, note="an update function: logged parameters changed in place after (a copy is kept)", expected="an_update_function"),
    Example(_HEAD + """\
writer = SummaryWriter("runs/sac")
q = torch.nn.Linear(3, 1)
optimizer = torch.optim.Adam(q.parameters(), lr=1e-3)
for global_step in range(4):
    for gradient_step in range(3):
        qf = q(torch.randn(5, 3))
        loss = qf.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        writer.add_scalars("losses", {"qf_loss": loss.item(), "qf_values": qf.mean().item()}, global_step)
        writer.add_scalar(tag="losses/bias", scalar_value=q.bias.item(), global_step=global_step)
    print("step", global_step)
""", True, note="several gradient steps per env step: add_scalars dict and keywords", expected="several_gradient_steps_per_env_step"),
    Example(_HEAD + """\
def train_epoch(w, n):
    losses = []
    i = 0
    while i < n:
        losses.append((w * i).sum().item())
        w = w + 0.5
        i += 1
    return losses


for epoch in range(3):
    print(train_epoch(torch.randn(3), 4))
""", True, note="a while loop in a function called in a loop", expected="a_while_loop_in_a_function_called_in_a"),
    Example(_HEAD + """\
writer = SummaryWriter("runs/update")


def update(w, step):
    for epoch in range(3):
        loss = (w * epoch).pow(2).sum()
        writer.add_scalar("losses/loss", loss.item(), step * 3 + epoch)
        w = w - 0.1


for step in range(3):
    update(torch.randn(4), step)
    print("step", step)
writer.close()
""", True, note="a module's writer used by one update function", expected="a_module_s_writer_used_by_one_update"),
    # look-alikes: the number is read in the loop
    Example(_HEAD + """\
losses = []
w = torch.randn(3)
for it in range(3):
    for step in range(5):
        v = (w * step).sum().item()
        losses.append(v)
        if v > 1.0:
            w = w * 0.5
print(losses)
""", False, note="the number is assigned and branched on (no .item() in the log call)"),
    Example(_HEAD + """\
writer = SummaryWriter("runs/x")
w = torch.randn(3)
for it in range(3):
    for step in range(5):
        writer.add_scalar("x", (w * step).sum().item() * 2, step)
""", False, reason="computes with the number", note="arithmetic on the number"),
    Example(_HEAD + """\
w = torch.randn(3)
for it in range(3):
    for step in range(5):
        print("loss", (w * step).sum().item())
        print("step", step)
""", False, reason="print of a number inside a loop", note="prints interleaved with other prints"),
    Example(_HEAD + """\
losses = []
w = torch.randn(3)
for it in range(3):
    for step in range(5):
        losses.append((w * step).sum().item())
        if len(losses) > 6:
            w = w - 1.0
print(losses)
""", False, reason="losses is read inside the loop", note="the list is read in the loop"),
    Example(_HEAD + """\
def fit(w):
    losses = []
    for step in range(5):
        losses.append((w * step).sum().item())
        if step == 3:
            return losses
    return losses


for it in range(3):
    print(fit(torch.randn(3)))
""", False, reason="the loop can return", note="a return inside the loop"),
    Example(_HEAD + """\
def fit(w):
    losses = []
    for step in range(5):
        losses.append((w * step).sum().item())
        yield losses


for it in range(3):
    print(list(fit(torch.randn(3))))
""", False, reason="the loop can yield", note="a generator"),
    Example(_HEAD + """\
writer = SummaryWriter("runs/sac")
w = torch.randn(3)
for global_step in range(10):
    if global_step % 5 == 0:
        writer.add_scalar("losses/qf", (w * global_step).sum().item(), global_step)
""", False, reason="the loop is the module's outermost", note="SAC: logs in the run's only loop (would wait for the end)"),
    Example(_HEAD + """\
def update(w, batches):
    losses = []
    for b in batches:
        losses.append((w * b).sum().item())
    return losses
""", False, reason="the loop is the outermost of update(), which no loop in this file calls",
            note="tianshou: a learner's update loop a library calls (not the run's loop, for all the file shows)"),
    Example(_HEAD + """\
losses = []
history = losses
w = torch.randn(3)
for it in range(3):
    for step in range(5):
        losses.append((w * step).sum().item())
        print(len(history))
""", False, reason="aliased", note="the list aliased by another name"),
    Example(_HEAD + """\
writer = SummaryWriter("runs/x")


def log(tag, value):
    writer.add_scalar(tag, value, 0)


w = torch.randn(3)
for it in range(3):
    for step in range(5):
        writer.add_scalar("a", (w * step).sum().item(), step)
        log("b", step)
""", False, note="a function logs to the same writer (would interleave): not a sink"),
    Example(_HEAD + """\
losses = []
w = torch.randn(3)
for it in range(3):
    for step in range(5):
        losses.append((w * step).sum().item())
    else:
        print(losses)
""", False, reason="else clause", note="for-else reads the list before the flush"),
    Example(_HEAD + """\
losses = []
w = torch.randn(3)
for it in range(3):
    for step in range(5):
        losses.append((w * step).sum().item())
        globals()["seen"] = len(losses)
""", False, reason="globals()", note="introspection could read the list"),
    Example(_HEAD + """\
writer = SummaryWriter("runs/x")
w = torch.randn(3)
for it in range(3):
    for step in range(5):
        writer.add_scalar("a", (w * step).sum().item(), step)
        writer.add_histogram("w", w, step)
""", False, reason="writer is read inside the loop", note="another writer call keeps its order"),
    Example(_HEAD + """\
class Envs:
    def step(self, action):
        return torch.full((3,), float(action))


envs = Envs()
writer = SummaryWriter("runs/ppg")
w = torch.randn(3)
for phase in range(2):
    for update in range(3):
        obs = envs.step(update)
        writer.add_scalar("loss", (w * obs).sum().item(), update)
""", False, reason="steps the environment", note="a rollout loop (PPG's policy phase): logs stay live"),
    Example(_HEAD + """\
losses = []
seen = enumerate(losses)
w = torch.randn(3)
for it in range(3):
    for step in range(5):
        losses.append((w * step).sum().item())
    print(next(seen, None))
""", False, reason="passed on at line 6", note="a lazy reader kept across the loop"),
    Example(_HEAD + """\
writer = SummaryWriter("runs/x")


def helper(w, depth):
    if depth > 0:
        update(w, depth - 1)


def update(w, depth):
    for epoch in range(2):
        writer.add_scalar("loss", (w * epoch).sum().item(), depth)
        helper(w, depth)


for it in range(2):
    update(torch.randn(3), 2)
""", False, reason="may call update again", note="a module's writer and a loop that reenters its function"),
    Example(_HEAD + """\
class Bar:
    def set_description(self, text):
        self.text = text


losses = []
bar = Bar()
w = torch.randn(3)
for epoch in range(2):
    for step in range(4):
        loss = (w * step).sum()
        losses.append(loss.item())
        bar.set_description(f"loss {loss.item():.3f}")
print(losses, bar.text)
""", False, reason="still reads a number every step at line 17",
            note="a progress bar reads the loss each step anyway (decision-transformer): nothing to save"),
    Example(_HEAD + """\
losses = []
w = torch.randn(3)
for epoch in range(2):
    for step in range(4):
        loss = (w * step).sum()
        losses.append(loss.item())
        if step % 100 == 0:
            print("step", step, loss.item())
print(losses)
""", True, note="a read only now and then (under an if) still lets the others wait",
            expected="a_read_only_now_and_then"),
    Example("""\
import numpy as np

terminals = []
for episode in range(2):
    for i in range(5):
        terminals.append(float(i == 4))
print(np.array(terminals))
""", False, reason="imports no torch", note="float() of a Python bool in a numpy-only module (d3rlpy's tests)"),
]]

