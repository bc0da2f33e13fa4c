"""Spinning Up PPO update(): early stopping on KL before backward(), MPI gradient averaging
between backward() and step(), no clipping.

Source: openai/spinningup, spinup/algos/pytorch/ppo/ppo.py @
20921137141b154454c0a2698709d9f9a0302101 (the nested update() of ppo()). License: MIT.
Adapted: update() is a closure in ppo(); the names it closes over become parameters of a factory
with the same closure shape; mpi_avg/mpi_avg_grads (identity on one process) come from the test.
"""
def make_update(buf, ac, pi_optimizer, vf_optimizer, compute_loss_pi, compute_loss_v, train_pi_iters,
                train_v_iters, target_kl, logger, mpi_avg, mpi_avg_grads):

    def update():
        data = buf.get()

        pi_l_old, pi_info_old = compute_loss_pi(data)
        pi_l_old = pi_l_old.item()
        v_l_old = compute_loss_v(data).item()

        # Train policy with multiple steps of gradient descent
        for i in range(train_pi_iters):
            pi_optimizer.zero_grad()
            loss_pi, pi_info = compute_loss_pi(data)
            kl = mpi_avg(pi_info['kl'])
            if kl > 1.5 * target_kl:
                logger.log('Early stopping at step %d due to reaching max kl.'%i)
                break
            loss_pi.backward()
            mpi_avg_grads(ac.pi)    # average grads across MPI processes
            pi_optimizer.step()

        logger.store(StopIter=i)

        # Value function learning
        for i in range(train_v_iters):
            vf_optimizer.zero_grad()
            loss_v = compute_loss_v(data)
            loss_v.backward()
            mpi_avg_grads(ac.v)    # average grads across MPI processes
            vf_optimizer.step()

        # Log changes from update
        kl, ent, cf = pi_info['kl'], pi_info_old['ent'], pi_info['cf']
        logger.store(LossPi=pi_l_old, LossV=v_l_old,
                     KL=kl, Entropy=ent, ClipFrac=cf,
                     DeltaLossPi=(loss_pi.item() - pi_l_old),
                     DeltaLossV=(loss_v.item() - v_l_old))

    return update


EXPECT = {
    "pi_optimizer.step()": ("grad_clip", "REWRITTEN", "exact-until-intervention"),
    "vf_optimizer.step()": ("grad_clip", "REWRITTEN", "exact-until-intervention"),
}
LENGTHS = (1, 3)


def run(ns, T, seed):
    import torch
    from types import SimpleNamespace
    torch.manual_seed(seed)
    nn = torch.nn
    ac = nn.Module()
    ac.pi = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
    ac.v = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    g = torch.Generator().manual_seed(seed)
    data = {"obs": torch.randn(32, 4, generator=g), "act": torch.randint(0, 2, (32,), generator=g),
            "adv": torch.randn(32, generator=g), "ret": torch.randn(32, generator=g)}
    data["logp"] = torch.log_softmax(ac.pi(data["obs"]), -1).gather(1, data["act"][:, None])[:, 0].detach()

    def loss_pi(d):
        logp = torch.log_softmax(ac.pi(d["obs"]), -1).gather(1, d["act"][:, None])[:, 0]
        ratio = torch.exp(logp - d["logp"])
        clip_adv = torch.clamp(ratio, 0.8, 1.2) * d["adv"]
        kl = (d["logp"] - logp).mean().item()
        return -(torch.min(ratio * d["adv"], clip_adv)).mean(), dict(kl=kl, ent=0.0, cf=0.0)

    def loss_v(d):
        return ((ac.v(d["obs"])[:, 0] - d["ret"]) ** 2).mean()

    logs = []
    logger = SimpleNamespace(store=lambda **kw: logs.append(sorted(kw.items())), log=lambda m: logs.append(m))
    update = ns["make_update"](
        SimpleNamespace(get=lambda: data), ac, torch.optim.SGD(ac.pi.parameters(), lr=0.5),
        torch.optim.SGD(ac.v.parameters(), lr=0.05), loss_pi, loss_v, 4 * T, 2 * T, 0.01, logger,
        lambda x: x, lambda m: None)
    update()
    return [p.detach().clone() for p in ac.parameters()], logs
