"""Differential checks for sites the whole-file sweep of real RL code rewrites, and the sweep tool.

``benchmarks/sweep_real_code.py`` runs the pipeline over complete public training scripts and
library modules (kept outside the repository). Where it showed a REWRITTEN site in a function
that runs on its own, a minimal snippet of the same shape (written here, not copied) is exec'd
original and rewritten on the same random inputs: bitwise equal where the site claims ``exact``,
and the vectorized branch must have run (its runtime guard is traced).
"""
import os

import pytest
import torch

from scalebox_cst.report import CHANGES_SEMANTICS, EXACT, REWRITTEN
from scalebox_cst.runtime import target_update as runtime_target_update
from scalebox_cst.runtime import vectorized as runtime_vectorized
import harness

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rewrite(src, transforms=None, backend="cpu", **options):
    """The shared harness (tests/harness.py); options spelled ``section__key=value``."""
    tables = {}
    for key, value in options.items():
        section, name = key.split("__")
        tables.setdefault(section, {})[name] = value
    return harness.rewrite(src, transforms, backend, dedent=False, options=tables)


def load(code):
    return harness.load(code, filename="<sweep>", module="sweep_snippet")


@pytest.fixture
def traced(monkeypatch):
    """Results of the runtime guards the rewritten code calls, by guard name."""
    seen = {}

    def wrap(module, name):
        real = getattr(module, name)

        def spy(*args, **kwargs):
            result = real(*args, **kwargs)
            seen.setdefault(name, []).append(result)
            return result

        monkeypatch.setattr(module, name, spy)

    wrap(runtime_vectorized, "recurrence_ok")
    wrap(runtime_vectorized, "fused_linear")  # the one-pass tier, tried first on the guard's line
    wrap(runtime_target_update, "soft_update")
    return seen


# ------------------------------------------------------------------ two GAE recurrences in one loop
# Shaped like RND-PPO scripts (extrinsic and intrinsic advantages in the same backward loop; the
# intrinsic stream never stops at episode ends), with the last-step split of CleanRL.

RND_GAE = """\
import torch


def advantages(rewards, curiosity, dones, next_done, ext_values, int_values, last_ext, last_int, steps, gamma, int_gamma, lam):
    ext_adv = torch.zeros_like(rewards)
    int_adv = torch.zeros_like(curiosity)
    ext_last = 0
    int_last = 0
    for t in reversed(range(steps)):
        if t == steps - 1:
            ext_nonterminal = 1.0 - next_done
            int_nonterminal = 1.0
            ext_next = last_ext
            int_next = last_int
        else:
            ext_nonterminal = 1.0 - dones[t+1]
            int_nonterminal = 1.0
            ext_next = ext_values[t+1]
            int_next = int_values[t+1]
        ext_delta = rewards[t] + gamma * ext_next * ext_nonterminal - ext_values[t]
        int_delta = curiosity[t] + int_gamma * int_next * int_nonterminal - int_values[t]
        ext_adv[t] = ext_last = ext_delta + gamma * lam * ext_nonterminal * ext_last
        int_adv[t] = int_last = int_delta + int_gamma * lam * int_nonterminal * int_last
    return ext_adv, int_adv


def returns(rewards, curiosity, dones, next_done, last_ext, last_int, steps, gamma, int_gamma):
    ext_ret = torch.zeros_like(rewards)
    int_ret = torch.zeros_like(curiosity)
    for t in reversed(range(steps)):
        if t == steps - 1:
            ext_nonterminal = 1.0 - next_done
            int_nonterminal = 1.0
            ext_next = last_ext
            int_next = last_int
        else:
            ext_nonterminal = 1.0 - dones[t+1]
            int_nonterminal = 1.0
            ext_next = ext_ret[t+1]
            int_next = int_ret[t+1]
        ext_ret[t] = rewards[t] + gamma * ext_nonterminal * ext_next
        int_ret[t] = curiosity[t] + int_gamma * int_nonterminal * int_next
    return ext_ret, int_ret
"""


def _rnd_inputs(T, N, seed):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    dones = (torch.rand(T, N, generator=g) < 0.1).float()
    next_done = (torch.rand(N, generator=g) < 0.1).float()
    return r(T, N), r(T, N), dones, next_done, r(T, N), r(T, N), r(1, N), r(1, N)


@pytest.mark.parametrize("T", [1, 2, 3, 64])
def test_two_recurrences_in_one_loop(traced, T):
    out, sites = rewrite(RND_GAE, ["vectorize.*"])
    done = [s for s in sites if s.action == REWRITTEN]
    assert len(done) == 2 and all(s.exactness == EXACT for s in done), sites
    orig, new = load(RND_GAE), load(out)
    rew, cur, dones, nd, ev, iv, le, li = _rnd_inputs(T, 4, seed=T)
    args = (rew, cur, dones, nd, ev, iv, le, li, T, 0.99, 0.95, 0.9)
    for a, b in zip(orig["advantages"](*args), new["advantages"](*args)):
        assert torch.equal(a, b)
    rargs = (rew, cur, dones, nd, le, li, T, 0.99, 0.95)
    for a, b in zip(orig["returns"](*rargs), new["returns"](*rargs)):
        assert torch.equal(a, b)
    if T >= runtime_vectorized.MIN_STEPS["torch"]:
        assert traced["recurrence_ok"] == [True, True]


# ------------------------------------------------------------------ rollout storage on self
# Shaped like PFRL's A2C storage: GAE through a temporary, and returns carried through
# self.returns[i + 1], every sequence an attribute of self.

STORAGE = """\
import torch


class Storage:
    def __init__(self, steps, envs, gamma, tau, use_gae):
        self.steps, self.gamma, self.tau, self.use_gae = steps, gamma, tau, use_gae
        self.rewards = torch.zeros(steps, envs)
        self.value_preds = torch.zeros(steps + 1, envs)
        self.returns = torch.zeros(steps + 1, envs)
        self.masks = torch.ones(steps, envs)

    def compute(self, next_value):
        if self.use_gae:
            self.value_preds[-1] = next_value
            gae = 0
            for i in reversed(range(self.steps)):
                delta = (
                    self.rewards[i]
                    + self.gamma * self.value_preds[i + 1] * self.masks[i]
                    - self.value_preds[i]
                )
                gae = delta + self.gamma * self.tau * self.masks[i] * gae
                self.returns[i] = gae + self.value_preds[i]
        else:
            self.returns[-1] = next_value
            for i in reversed(range(self.steps)):
                self.returns[i] = (
                    self.rewards[i] + self.gamma * self.returns[i + 1] * self.masks[i]
                )
"""


@pytest.mark.parametrize("use_gae", [True, False])
@pytest.mark.parametrize("T", [1, 2, 5, 40])
def test_storage_returns_on_self(traced, use_gae, T):
    out, sites = rewrite(STORAGE, ["vectorize.*"])
    done = {s.line: s for s in sites if s.action == REWRITTEN}
    assert len(done) == 2, sites
    stores = []
    for code in (STORAGE, out):
        s = load(code)["Storage"](T, 3, 0.99, 0.95, use_gae)
        g = torch.Generator().manual_seed(T)
        s.rewards.copy_(torch.randn(T, 3, generator=g))
        s.value_preds.copy_(torch.randn(T + 1, 3, generator=g))
        s.masks.copy_((torch.rand(T, 3, generator=g) > 0.1).float())
        s.compute(torch.randn(3, generator=g))
        stores.append(s)
    site = next(s for s in done.values() if ("gae" in s.reason) == use_gae)
    if site.exactness == EXACT:
        assert torch.equal(stores[0].returns, stores[1].returns)
    else:
        torch.testing.assert_close(stores[0].returns, stores[1].returns, rtol=1e-5, atol=1e-6)
    one_pass = [r is not None for r in traced.get("fused_linear", [])]
    if T >= runtime_vectorized.MIN_STEPS["torch"]:
        assert one_pass == [True] or traced["recurrence_ok"] == [True], traced


# ------------------------------------------------------------------ tab-indented CRLF file
# Shaped like the TD3 author's first release: tabs, CRLF line ends, a critic and an actor step,
# soft updates written as target_param.data.copy_(tau * param.data + (1 - tau) * target_param.data).

TD3_TABS = """\
import torch
import torch.nn as nn


class Agent(object):
\tdef __init__(self):
\t\tself.actor = nn.Linear(3, 2)
\t\tself.actor_target = nn.Linear(3, 2)
\t\tself.critic = nn.Linear(5, 1)
\t\tself.critic_target = nn.Linear(5, 1)
\t\tself.actor_optimizer = torch.optim.SGD(self.actor.parameters(), lr=0.1)
\t\tself.critic_optimizer = torch.optim.SGD(self.critic.parameters(), lr=0.1)\t\t

\tdef train(self, state, action, target_Q, tau=0.005):
\t\tcurrent_Q = self.critic(torch.cat([state, action], 1))
\t\tcritic_loss = ((current_Q - target_Q) ** 2).mean() 
\t\tself.critic_optimizer.zero_grad()
\t\tcritic_loss.backward()
\t\tself.critic_optimizer.step()

\t\tactor_loss = -self.critic(torch.cat([state, self.actor(state)], 1)).mean()
\t\tself.actor_optimizer.zero_grad()
\t\tactor_loss.backward()
\t\tself.actor_optimizer.step()

\t\tfor param, target_param in zip(self.critic.parameters(), self.critic_target.parameters()):
\t\t\ttarget_param.data.copy_(tau * param.data + (1 - tau) * target_param.data)

\t\tfor param, target_param in zip(self.actor.parameters(), self.actor_target.parameters()):
\t\t\ttarget_param.data.copy_(tau * param.data + (1 - tau) * target_param.data)
""".replace("\n", "\r\n")


def _agents(code_a, code_b):
    torch.manual_seed(0)
    a = load(code_a)["Agent"]()
    b = load(code_b)["Agent"]()
    for src, dst in zip(
        (a.actor, a.actor_target, a.critic, a.critic_target), (b.actor, b.actor_target, b.critic, b.critic_target)
    ):
        dst.load_state_dict(src.state_dict())
    return a, b


def _batch(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, 3, generator=g) * 10, torch.randn(8, 2, generator=g) * 10, torch.randn(8, 1, generator=g) * 10


def test_tab_crlf_file_soft_updates_are_bitwise(traced):
    out, sites = rewrite(TD3_TABS, ["vectorize.*"])
    assert [s.transform for s in sites if s.action == REWRITTEN] == ["vectorize.target_update"] * 2
    assert all(s.exactness == EXACT for s in sites)
    assert "\r\n" in out and "\n" not in out.replace("\r\n", "")  # CRLF kept on every line
    a, b = _agents(TD3_TABS, out)
    for step in range(3):
        a.train(*_batch(step))
        b.train(*_batch(step))
    for x, y in zip(
        [*a.actor_target.parameters(), *a.critic_target.parameters()],
        [*b.actor_target.parameters(), *b.critic_target.parameters()],
    ):
        assert torch.equal(x, y)
    assert traced["soft_update"] == [True, True] * 3


def test_tab_crlf_file_inserted_clipping_matches_a_manual_clip():
    """grad_clip inserts, in the file's own tabs and CRLF, the clip a user would write by hand:
    both optimizers' steps then see gradients of norm at most max_norm (large inputs: active)."""
    out, sites = rewrite(TD3_TABS, ["grad_clip"], grad_clip__mode="fixed", grad_clip__max_norm=0.5)
    assert [(s.action, s.exactness) for s in sites] == [(REWRITTEN, CHANGES_SEMANTICS)] * 2
    manual = TD3_TABS.replace(
        "\t\tself.critic_optimizer.step()",
        "\t\ttorch.nn.utils.clip_grad_norm_(self.critic.parameters(), 0.5)\r\n\t\tself.critic_optimizer.step()",
    ).replace(
        "\t\tself.actor_optimizer.step()",
        "\t\ttorch.nn.utils.clip_grad_norm_(self.actor.parameters(), 0.5)\r\n\t\tself.actor_optimizer.step()",
    )
    a, b = _agents(manual, out)
    for step in range(3):
        a.train(*_batch(step))
        b.train(*_batch(step))
    for x, y in zip(
        [*a.actor.parameters(), *a.critic.parameters()], [*b.actor.parameters(), *b.critic.parameters()]
    ):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------ the sweep tool itself


def _sweep_module():
    # registered: dataclasses look their module up
    return harness.load_path(os.path.join(ROOT, "benchmarks", "sweep_real_code.py"), "sweep_real_code", register=True)


def test_sweep_tool_runs_clean_on_clean_files(tmp_path, capsys):
    sweep = _sweep_module()
    (tmp_path / "rnd.py").write_text(RND_GAE)
    (tmp_path / "td3.py").write_bytes(TD3_TABS.encode())
    (tmp_path / "py2.py").write_text("print 'hello'\n")  # not the engine's to fix: a note
    # ast parses it, CPython's compiler refuses it (rlpyt's example_6a.py): a note too
    (tmp_path / "late_global.py").write_text("import torch\ndef build():\n    config = 1\n    global config\n")
    # the tool's 200 ms "slow" check is for a quiet machine; under a parallel test run it measures the load
    assert sweep.main([str(tmp_path), "--backends", "cpu", "npu", "--slow-ms", "5000"]) == 0
    text = capsys.readouterr().out
    assert "PROBLEMS: none" in text and "inputs left alone" in text
    assert "the input does not compile: SyntaxError: name 'config' is assigned to before global" in text
    assert "vectorize.recurrence:rewritten" in text and "vectorize.target_update:rewritten" in text


def test_sweep_tool_flags_changes_outside_sites():
    sweep = _sweep_module()
    from scalebox_cst.report import Site

    src = "a = 1\nb = 2\nc = 3\n"
    site = Site("t", 2, 2, REWRITTEN, "r", EXACT)
    assert sweep.changed_outside(src, "import x\na = 1\nb = 20\nc = 3\n", [site]) == []
    assert sweep.changed_outside(src, "a = 1\nb = 20\nc = 30\n", [site])  # line 3 is no site's
    assert sweep.changed_outside(src, "a = 1\nb = 2\nprint(1)\nc = 3\nz = 0\n", [site])  # not next to it


def test_sweep_tool_reports_a_transform_that_raises(tmp_path, monkeypatch, capsys):
    sweep = _sweep_module()
    from scalebox_cst.transforms.grad_clip import GradClip

    def boom(self, ctx):
        raise RuntimeError("analysis bug")

    monkeypatch.setattr(GradClip, "rewrite", boom)
    (tmp_path / "td3.py").write_bytes(TD3_TABS.encode())
    assert sweep.main([str(tmp_path), "--backends", "cpu"]) == 1
    text = capsys.readouterr().out
    assert "td3.py [cpu] error:" in text and "transform grad_clip failed (RuntimeError: analysis bug)" in text


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::SyntaxWarning")  # the input's own
def test_sweep_tool_reports_emitted_code_that_warns(tmp_path, monkeypatch, capsys):
    """Emitted code that compiles with a SyntaxWarning the input has not (an invalid escape in
    a generated string) is a problem; the same warning already in the input is not."""
    import libcst as cst

    sweep = _sweep_module()
    from scalebox_cst.transforms.grad_clip import GradClip

    def warn_once(self, ctx):
        stmt = cst.parse_statement('_emitted = "' + chr(92) + 'd"\n')  # an invalid escape: \d
        return ctx.module.with_changes(body=[*ctx.module.body, stmt]), []

    monkeypatch.setattr(GradClip, "rewrite", warn_once)
    (tmp_path / "a.py").write_text("import torch\ndef f(opt, loss):\n    loss.backward()\n    opt.step()\n")  # grad_clip runs
    assert sweep.main([str(tmp_path), "--backends", "cpu"]) == 1
    assert "the output compiles with new warnings" in capsys.readouterr().out
    (tmp_path / "a.py").write_text('import torch\nx = "' + chr(92) + 'd"\ndef f(opt, loss):\n    loss.backward()\n    opt.step()\n')  # its own warning
    monkeypatch.setattr(GradClip, "rewrite", lambda self, ctx: (None, []))
    assert sweep.main([str(tmp_path), "--backends", "cpu"]) == 0


# ------------------------------------------------------------------ spans that reach every changed line
# Found by the sweep on public scripts: a loop whose block ends in a blank line holding spaces (or
# an indented comment) keeps it in libcst's footer, which the rewrite writes after the loop it keeps
# as the fallback; a reduction rewrites the statement that consumes its list after the loop. Each
# site's span must reach those lines (the review diff and the site list say what changed where).

FOOTER_LOOPS = """\
import torch


def returns(buffer, gamma):
    rewards = []
    R = 0
    for r, done in zip(reversed(buffer.rewards), reversed(buffer.dones)):
        if done:
            R = 0
        R = r + gamma * R
        rewards.insert(0, R)
        \n    # normalised next
    return torch.tensor(rewards)


def soft(net, target, tau):
    for tp, p in zip(target.parameters(), net.parameters()):
        tp.data.copy_(tau * p.data + (1 - tau) * tp.data)
        # indented comment ending the loop's block
    return target
"""

CONSUMED = """\
import torch


def finish(saved, returns, opt):
    policy_loss = []
    for log_prob, R in zip(saved, returns):
        policy_loss.append(-log_prob * R)
    opt.zero_grad()
    policy_loss = torch.cat(policy_loss).sum()
    return policy_loss
"""


@pytest.mark.parametrize("src", [FOOTER_LOOPS, CONSUMED], ids=["block_footers", "consumer_after_loop"])
def test_rewritten_spans_reach_every_changed_line(src):
    sweep = _sweep_module()
    result = harness.rewrite_result(src)
    assert result.report.error is None
    out = result.output.decode()
    rewritten = [s for s in result.report.sites if s.action == REWRITTEN]
    assert rewritten and out != src
    assert sweep.changed_outside(src, out, result.report.sites) == []


def test_trailing_lines_count_the_footers_a_statement_ends_with():
    import libcst as cst
    from scalebox_cst.transforms.analysis.bodies import trailing_lines

    module = cst.parse_module(
        "for t in x:\n    if a:\n        y = 1\n        # inner\n    elif b:\n        y = 2\n\n        # end of elif\n"
        "    # end of loop\nz = 1\nwhile c: pass\nwith m:\n    w = 1\n")
    loop, _, one_line, with_ = module.body
    assert trailing_lines(loop) == 3  # the elif's blank and comment lines, then the loop's comment
    assert trailing_lines(one_line) == 0 and trailing_lines(with_) == 0
    assert trailing_lines(loop.body.body[0]) == 2  # the if/elif chain alone
