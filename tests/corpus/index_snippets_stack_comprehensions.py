"""Two policy-gradient losses built by torch.stack over a comprehension: a REINFORCE loss with a
running baseline (`torch.stack([-lp * (G - baseline) for lp in log_probs]).mean()`, then an
already-present clip_grad_norm_) and a negated history stacked on dim=0 then reduced with amax.

Source: public files located through the code index's exact-string search (find_string for
"= torch.stack([-", ids 56092163038 and 66025622158); the index does not name their
repositories, so commit and license are unknown. Kept because the pattern is common.
Adapted: the surrounding statements are wrapped in functions of the names they read; the lines
holding torch.stack are verbatim.
"""
import torch


def reinforce_epoch(policy, optimizer, log_probs, rewards, baseline, cfg):
        G = sum(rewards)
        baseline = 0.95 * baseline + 0.05 * G
        loss = torch.stack([-lp * (G - baseline) for lp in log_probs]).mean()
        optimizer.zero_grad(); loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.training.grad_clip)
        optimizer.step()
        return loss, baseline


def downward_speed(vel_hist, speed_threshold):
    pre_contact_downward_speed = torch.stack([-hist for hist in vel_hist], dim=0).amax(dim=0)
    excess_downward_speed = torch.clamp(pre_contact_downward_speed - speed_threshold, min=0.0)
    return excess_downward_speed


EXPECT = {
    "loss = torch.stack([-lp * (G - baseline) for lp in log_probs]).mean()": ("vectorize.elementwise", "REWRITTEN", "exact"),
    "optimizer.step()": ("grad_clip", "REWRITTEN", "exact-until-intervention"),
    "pre_contact_downward_speed = torch.stack([-hist for hist in vel_hist], dim=0).amax(dim=0)": ("vectorize.elementwise", "REWRITTEN", "exact"),
}


def run(ns, T, seed):
    from types import SimpleNamespace
    torch.manual_seed(seed)
    net = torch.nn.Linear(3, 1)
    g = torch.Generator().manual_seed(seed)
    log_probs = list(net(torch.randn(T, 3, generator=g))[:, 0].unbind(0))  # 0-d tensors
    rewards = [float(x) for x in torch.rand(T, generator=g)]
    cfg = SimpleNamespace(training=SimpleNamespace(grad_clip=0.5))
    loss, base = ns["reinforce_epoch"](net, torch.optim.SGD(net.parameters(), lr=0.1), log_probs, rewards, 0.3, cfg)
    hist = list(torch.randn(T, 4, 2, generator=g).unbind(0))
    speed = ns["downward_speed"](hist, 0.2)
    return loss.detach(), base, [p.detach().clone() for p in net.parameters()], speed
