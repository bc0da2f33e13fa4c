"""grad_clip: where clipping lands, what is left alone, and what the rewritten code computes.

These goldens pin ``mode = "fixed"`` (the clip_grad_norm_ insertion, no longer the default):
the placement analysis is shared by both modes. The default guard mode is tested in
tests/runtime/test_stabilizer.py.

Golden tests pin the exact output for each pattern found in real RL code; execution tests run the
original and the rewritten training step on the same tiny model and compare with a manual
``clip_grad_norm_`` + ``step()``.
"""
import ast
import re
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scalebox_cst.config import Config
from scalebox_cst.report import CHANGES_SEMANTICS, EXACT_UNTIL_INTERVENTION, REWRITTEN, SKIPPED, WARNING
from scalebox_cst.runtime import clip as runtime_clip
from scalebox_cst.runtime import metrics
from scalebox_cst.transforms import REGISTRY
from scalebox_cst.transforms.grad_clip import GradClip, looks_like_optimizer
import harness

IMPORT = "from scalebox_cst.runtime.clip import clip_grad_norm as _scalebox_clip_grad_norm\n"


def rewrite(src, max_norm=None, dedent=True, mode="fixed"):
    options = {"mode": mode, **({} if max_norm is None else {"max_norm": max_norm})}
    return harness.rewrite(src, "grad_clip", dedent=dedent, options={"grad_clip": options})  # tests/harness.py


def expect(src, out):
    """``out`` is the expected rewrite, less the runtime import that leads it."""
    got, sites = rewrite(src)
    assert got == IMPORT + textwrap.dedent(out)
    return sites


def kinds(sites, action):
    return [s for s in sites if s.action == action]


def test_registered():
    assert GradClip in REGISTRY


# ------------------------------------------------------------------ EXAMPLES


# Outputs, reasons: tests/transforms/test_examples_registry.py. Here: the tier each mode claims.
@pytest.mark.parametrize("example", [e for e in GradClip.EXAMPLES if e.rewritten], ids=lambda e: e.note[:40])
def test_examples_claim_the_modes_tier(example):
    result = harness.rewrite_result(example.code, "grad_clip", example.backend, options={"grad_clip": dict(example.options)},
                                    path="ex.py")
    rewritten = kinds(result.report.sites, REWRITTEN)
    fixed = dict(example.options).get("mode", "guard") == "fixed"
    assert rewritten and all(s.exactness == (CHANGES_SEMANTICS if fixed else EXACT_UNTIL_INTERVENTION) for s in rewritten)


# ------------------------------------------------------------------ where the clip lands


def test_plain_pair_site_and_reason():
    sites = expect(
        """\
        import torch
        optimizer = torch.optim.Adam(model.parameters())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        """,
        """\
        import torch
        optimizer = torch.optim.Adam(model.parameters())
        optimizer.zero_grad()
        loss.backward()
        _scalebox_clip_grad_norm(optimizer, max_norm=1.0)
        optimizer.step()
        """,
    )
    (site,) = sites
    assert (site.action, site.exactness, site.line, site.transform) == (REWRITTEN, CHANGES_SEMANTICS, 5, "grad_clip")
    assert site.reason == (
        "clip grad norm of optimizer's params to max_norm=1.0 between backward() (line 4) and step()"
    )


def test_several_optimizers_after_one_backward_each_clipped_before_its_own_step():
    sites = expect(
        """\
        def update(self, loss):
            self.actor_optimizer.zero_grad()
            self.critic_optimizer.zero_grad()
            loss.backward()
            self.actor_optimizer.step()
            self.critic_optimizer.step()
        """,
        """\
        def update(self, loss):
            self.actor_optimizer.zero_grad()
            self.critic_optimizer.zero_grad()
            loss.backward()
            _scalebox_clip_grad_norm(self.actor_optimizer, max_norm=1.0)
            self.actor_optimizer.step()
            _scalebox_clip_grad_norm(self.critic_optimizer, max_norm=1.0)
            self.critic_optimizer.step()
        """,
    )
    assert [s.line for s in kinds(sites, REWRITTEN)] == [5, 6]


def test_separate_actor_critic_pairs_inside_conditional_delayed_update():
    expect(
        """\
        class TD3:
            def train(self, batch):
                critic_loss = self.critic_loss(batch)
                self.critic_optimizer.zero_grad()
                critic_loss.backward()
                self.critic_optimizer.step()

                if self.total_it % self.policy_freq == 0:
                    actor_loss = -self.critic.Q1(state, self.actor(state)).mean()
                    self.actor_optimizer.zero_grad()
                    actor_loss.backward()
                    self.actor_optimizer.step()
        """,
        """\
        class TD3:
            def train(self, batch):
                critic_loss = self.critic_loss(batch)
                self.critic_optimizer.zero_grad()
                critic_loss.backward()
                _scalebox_clip_grad_norm(self.critic_optimizer, max_norm=1.0)
                self.critic_optimizer.step()

                if self.total_it % self.policy_freq == 0:
                    actor_loss = -self.critic.Q1(state, self.actor(state)).mean()
                    self.actor_optimizer.zero_grad()
                    actor_loss.backward()
                    _scalebox_clip_grad_norm(self.actor_optimizer, max_norm=1.0)
                    self.actor_optimizer.step()
        """,
    )


def test_backward_in_loop_step_after_loop_gets_one_clip_after_the_loop():
    sites = expect(
        """\
        optimizer.zero_grad()
        for chunk in chunks:
            loss = model(chunk).sum() / len(chunks)
            loss.backward()
        # one update for the whole batch

        optimizer.step()
        """,
        """\
        optimizer.zero_grad()
        for chunk in chunks:
            loss = model(chunk).sum() / len(chunks)
            loss.backward()
        # one update for the whole batch

        _scalebox_clip_grad_norm(optimizer, max_norm=1.0)
        optimizer.step()
        """,
    )
    assert len(kinds(sites, REWRITTEN)) == 1


def test_gradient_accumulation_clip_inside_the_if():
    expect(
        """\
        for i, (x, y) in enumerate(loader):
            loss = loss_fn(model(x), y) / accum
            loss.backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()
        """,
        """\
        for i, (x, y) in enumerate(loader):
            loss = loss_fn(model(x), y) / accum
            loss.backward()
            if (i + 1) % accum == 0:
                _scalebox_clip_grad_norm(optimizer, max_norm=1.0)
                optimizer.step()
                optimizer.zero_grad()
        """,
    )


def test_amp_inserts_unscale_before_clip():
    sites = expect(
        """\
        import torch
        scaler = torch.cuda.amp.GradScaler(enabled=args.amp)
        with torch.autocast("cuda"):
            loss = model(x).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        """,
        """\
        import torch
        scaler = torch.cuda.amp.GradScaler(enabled=args.amp)
        with torch.autocast("cuda"):
            loss = model(x).mean()
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        _scalebox_clip_grad_norm(optimizer, max_norm=1.0)
        scaler.step(optimizer)
        scaler.update()
        """,
    )
    (site,) = sites
    assert "scaler.unscale_(optimizer) inserted first" in site.reason and site.line == 6


def test_amp_scaler_recognised_by_assignment_alone_and_two_optimizers():
    expect(
        """\
        from torch.amp import GradScaler as GS
        self.grad_scaler = GS("cuda")
        total.backward()
        self.grad_scaler.step(self.pi_opt)
        self.grad_scaler.step(self.vf_opt)
        self.grad_scaler.update()
        """,
        """\
        from torch.amp import GradScaler as GS
        self.grad_scaler = GS("cuda")
        total.backward()
        self.grad_scaler.unscale_(self.pi_opt)
        _scalebox_clip_grad_norm(self.pi_opt, max_norm=1.0)
        self.grad_scaler.step(self.pi_opt)
        self.grad_scaler.unscale_(self.vf_opt)
        _scalebox_clip_grad_norm(self.vf_opt, max_norm=1.0)
        self.grad_scaler.step(self.vf_opt)
        self.grad_scaler.update()
        """,
    )


def test_amp_existing_unscale_is_not_repeated():
    expect(
        """\
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        log_grad_stats(model)
        scaler.step(optimizer)
        """,
        """\
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        log_grad_stats(model)
        _scalebox_clip_grad_norm(optimizer, max_norm=1.0)
        scaler.step(optimizer)
        """,
    )


def test_clip_before_backward_warns_and_inserts_where_it_works():
    src = """\
    from torch import nn
    for batch in loader:
        optimizer.zero_grad()
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        loss = model(batch).mean()
        loss.backward()
        optimizer.step()
    """
    sites = expect(
        src,
        """\
        from torch import nn
        for batch in loader:
            optimizer.zero_grad()
            nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            loss = model(batch).mean()
            loss.backward()
            _scalebox_clip_grad_norm(optimizer, max_norm=1.0)
            optimizer.step()
        """,
    )
    (warn,) = kinds(sites, WARNING)
    assert warn.line == 4 and "clip before backward() has no effect" in warn.reason
    assert [s.line for s in kinds(sites, REWRITTEN)] == [7]


def test_semicolon_one_liners_stay_valid_and_on_their_line():
    sites = expect(
        """\
        loss.backward(); opt.step()  # fast path
        if ready: q_loss.backward(); q_optimizer.step()
        scaler.scale(l).backward(); scaler.step(opt2); scaler.update()
        """,
        """\
        loss.backward(); _scalebox_clip_grad_norm(opt, max_norm=1.0); opt.step()  # fast path
        if ready: q_loss.backward(); _scalebox_clip_grad_norm(q_optimizer, max_norm=1.0); q_optimizer.step()
        scaler.scale(l).backward(); scaler.unscale_(opt2); _scalebox_clip_grad_norm(opt2, max_norm=1.0); scaler.step(opt2); scaler.update()
        """,
    )
    assert [s.line for s in kinds(sites, REWRITTEN)] == [1, 2, 3]


def test_step_alone_in_a_one_line_suite():
    expect(
        """\
        for i in range(n):
            loss.backward()
            if i % 4 == 3: optimizer.step()
        """,
        """\
        for i in range(n):
            loss.backward()
            if i % 4 == 3: _scalebox_clip_grad_norm(optimizer, max_norm=1.0); optimizer.step()
        """,
    )


def test_if_else_steps_each_clipped_in_their_branch():
    expect(
        """\
        loss.backward()
        if use_a:
            opt_a.step()
        else:
            opt_b.step()
        """,
        """\
        loss.backward()
        if use_a:
            _scalebox_clip_grad_norm(opt_a, max_norm=1.0)
            opt_a.step()
        else:
            _scalebox_clip_grad_norm(opt_b, max_norm=1.0)
            opt_b.step()
        """,
    )


def test_max_norm_option():
    out, sites = rewrite("loss.backward()\nopt.step()\n", max_norm=0.5)
    assert "_scalebox_clip_grad_norm(opt, max_norm=0.5)\n" in out
    assert "max_norm=0.5" in sites[0].reason


def test_invalid_max_norm_is_an_error_not_a_rewrite():
    src = b"loss.backward()\nopt.step()\n"
    result = harness.rewrite_result(src, "grad_clip", options={"grad_clip": {"max_norm": -1, "mode": "fixed"}})
    assert result.output == src and "max_norm" in result.report.error


# ------------------------------------------------------------------ which step() is an optimizer


@pytest.mark.parametrize(
    "name",
    ["optimizer", "opt", "optim", "actor_optim", "q_optimizer", "critic_opt", "policy_optimizer",
     "optimizer2", "optimizerD", "opt_d", "actorOptimizer", "optimizers", "optimiser"],
)
def test_optimizer_like_names(name):
    assert looks_like_optimizer(name)


@pytest.mark.parametrize(
    "name", ["scheduler", "lr_scheduler", "opt_scheduler", "env", "options", "optional", "adopt", "trainer", "model"]
)
def test_not_optimizer_names(name):
    assert not looks_like_optimizer(name)


def test_schedulers_and_env_steps_are_never_touched():
    src = textwrap.dedent(
        """\
        import torch
        from torch.optim.lr_scheduler import CosineAnnealingLR
        decay = CosineAnnealingLR(opt, 100)
        swa = torch.optim.swa_utils.SWALR(opt, 0.05)
        loss.backward()
        decay.step()
        swa.step()
        scheduler.step()
        self.lr_scheduler.step()
        next_obs, reward, done, info = env.step(action)
        """
    )
    out, sites = rewrite(src, dedent=False)
    assert out == src and sites == []


def test_receiver_assigned_from_torch_optim_is_an_optimizer_whatever_its_name():
    expect(
        """\
        import torch.optim as O
        class Agent:
            def __init__(self, net):
                self.updater = O.RMSprop(net.parameters())
            def learn(self, loss):
                loss.backward()
                self.updater.step()
        """,
        """\
        import torch.optim as O
        class Agent:
            def __init__(self, net):
                self.updater = O.RMSprop(net.parameters())
            def learn(self, loss):
                loss.backward()
                _scalebox_clip_grad_norm(self.updater, max_norm=1.0)
                self.updater.step()
        """,
    )


def test_unknown_receiver_reported_not_touched():
    src = "loss.backward()\nself.engine.step()\n"
    out, sites = rewrite(src)
    assert out == src
    (site,) = sites
    assert site.action == SKIPPED and "cannot tell that self.engine is an optimizer" in site.reason


def test_an_optimizer_read_by_its_key_is_an_optimizer_and_ends_the_run_before_it():
    """sheeprl's P2E-DV3 steps each exploration critic's optimizer as critic["optimizer"].step()
    inside a loop, then the task actor's: the critic's step was "cannot tell that
    critic["optimizer"] is an optimizer" (not guarded), and, being no optimizer step, it did not end
    the backward() run, so the actor's guard was said to stand "after the code's own clip (line 6)",
    the critic's clip (found by the unseen-code sweep). The key names the item; a scheduler's key
    is still a scheduler's."""
    src = textwrap.dedent("""\
        import torch
        for k, critic in critics.items():
            value_loss = critic["module"](x).mean()
            value_loss.backward()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(critic["module"].parameters(), clip)
            critic["optimizer"].step()
        policy_loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(actor.parameters(), clip)
        actor_optimizer.step()
        loss.backward()
        parts["scheduler"].step()
        """)
    out, sites = rewrite(src, dedent=False, mode="guard")
    done = {s.line: s for s in sites if s.action == REWRITTEN}
    assert set(done) == {7, 11}, [s.describe() for s in sites]
    assert "critic[\"optimizer\"]'s step" in done[7].reason and "(line 6)" in done[7].reason
    assert "actor_optimizer's step between backward() (line 8)" in done[11].reason and "(line 10)" in done[11].reason


def test_closure_step_skipped_with_reason():
    src = "loss.backward()\noptimizer.step(closure=closure)\n"
    out, sites = rewrite(src)
    assert out == src and "closure" in sites[0].reason and sites[0].action == SKIPPED


def test_step_with_backward_only_in_another_function_is_reported():
    src = "def compute(loss):\n    loss.backward()\n\ndef apply():\n    optimizer.step()\n"
    out, sites = rewrite(src)
    assert out == src and "no backward()" in sites[0].reason and sites[0].line == 5


def test_backward_and_step_in_exclusive_branches_do_not_pair():
    src = "if phase == 'grad':\n    loss.backward()\nelse:\n    optimizer.step()\n"
    out, sites = rewrite(src)
    assert out == src and "no backward()" in sites[0].reason


# ------------------------------------------------------------------ already clipped


@pytest.mark.parametrize(
    "imports, call",
    [
        ("import torch", "torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)"),
        ("import torch as th", "th.nn.utils.clip_grad_norm_(model.parameters(), 0.5)"),
        ("import torch.nn as nn", "nn.utils.clip_grad_norm_(model.parameters(), 0.5)"),
        ("from torch import nn", "nn.utils.clip_grad_value_(model.parameters(), 0.5)"),
        ("from torch.nn.utils import clip_grad_norm_ as cg", "cg(model.parameters(), 0.5)"),
        ("from torch.nn.utils.clip_grad import clip_grad_norm_", "clip_grad_norm_(model.parameters(), 0.5)"),
        ("", "accelerator.clip_grad_norm_(model.parameters(), 0.5)"),
        ("", "self.clip_gradients(0.5)"),
    ],
)
@pytest.mark.parametrize("conditional", [False, True])
def test_already_clipped_is_left_alone(imports, call, conditional):
    body = f"if args.max_grad_norm:\n    {call}\n" if conditional else call + "\n"
    src = f"{imports}\noptimizer.zero_grad()\nloss.backward()\n{body}optimizer.step()\n"
    out, sites = rewrite(src, dedent=False)
    assert out == src
    (site,) = sites
    assert site.action == SKIPPED and "already clipped" in site.reason


def test_alias_that_is_not_a_clip_does_not_count_as_one():
    # ``cg`` bound to some other torch function: still clipped by us
    src = "from torch.nn.utils import parameters_to_vector as cg\nloss.backward()\ncg(model.parameters())\nopt.step()\n"
    out, sites = rewrite(src)
    assert "_scalebox_clip_grad_norm(opt, max_norm=1.0)\nopt.step()" in out


def test_accelerate_backward_without_clip_is_skipped():
    src = "from accelerate import Accelerator\nacc = Accelerator()\nacc.backward(loss)\noptimizer.step()\n"
    out, sites = rewrite(src)
    assert out == src and "accelerate" in sites[0].reason


# ------------------------------------------------------------------ imports, bytes, determinism


def test_import_added_once_for_many_sites_and_after_docstring():
    src = '"""Trainer."""\nfrom __future__ import annotations\n# training\nimport torch\na.backward()\nopt_a.step()\nb.backward()\nopt_b.step()\n'
    out, _ = rewrite(src)
    assert out.count("import clip_grad_norm") == 1
    assert out.startswith('"""Trainer."""\nfrom __future__ import annotations\n' + IMPORT)


def test_alias_avoids_user_name():
    out, _ = rewrite("_scalebox_clip_grad_norm = None\nloss.backward()\nopt.step()\n")
    assert "from scalebox_cst.runtime.clip import clip_grad_norm as _scalebox_clip_grad_norm_2\n" in out
    assert "_scalebox_clip_grad_norm_2(opt, max_norm=1.0)\nopt.step()" in out
    harness.compiled(out, "t.py")


REALISTIC = '''\
"""CleanRL-style DQN update, abridged."""
import random  # comment kept

import torch
import torch.nn.functional as F
import torch.optim as optim


def train(args, q_network, target_network, rb, envs):
    optimizer = optim.Adam(q_network.parameters(), lr=args.learning_rate)   # odd  spacing
    for global_step in range(args.total_timesteps):
        actions = envs.action_space.sample()
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)

        if global_step > args.learning_starts:
            data = rb.sample(args.batch_size)
            with torch.no_grad():
                target_max, _ = target_network(data.next_observations).max(dim=1)
            old_val = q_network(data.observations).gather(1, data.actions).squeeze()
            loss = F.mse_loss(data.rewards.flatten(), old_val)

            # optimize the model
            optimizer.zero_grad()
            loss.backward()
            # step

            optimizer.step()   # trailing comment
\t
'''


def _strip_inserted(text):
    return "".join(
        line for line in text.splitlines(True)
        if "_scalebox_clip_grad_norm" not in line and ".unscale_(" not in line
    )


def test_everything_outside_inserted_lines_is_byte_for_byte():
    out, sites = rewrite(REALISTIC, dedent=False)
    assert out != REALISTIC
    assert _strip_inserted(out) == REALISTIC
    lines = out.splitlines()
    step = lines.index("            optimizer.step()   # trailing comment")
    assert lines[step - 1] == "            _scalebox_clip_grad_norm(optimizer, max_norm=1.0)"
    assert lines[step - 2] == "" and lines[step - 3] == "            # step"
    assert [s.action for s in sites] == [REWRITTEN]


def test_deterministic_and_idempotent():
    first = rewrite(REALISTIC, dedent=False)
    second = rewrite(REALISTIC, dedent=False)
    assert first == second
    again, sites = rewrite(first[0], dedent=False)
    assert again == first[0]
    assert [s.action for s in sites] == [SKIPPED] and "already clipped" in sites[0].reason


# ------------------------------------------------------------------ property: random training scripts

_STMTS = ["loss.backward()", "opt_a.step()", "opt_b.step()", "self.q_opt.step()", "scheduler.step()",
          "obs = env.step(act)", "nn.utils.clip_grad_norm_(m.parameters(), 1.0)", "x = 1  # note",
          "scaler.scale(loss).backward()", "scaler.step(opt_a)", "scaler.unscale_(opt_a)"]
_SIMPLE = ["loss.backward()", "opt_a.step()", "opt_b.step()", "x = 1"]


def _indent(lines):
    return ["    " + line if line else line for line in lines]


@st.composite
def _blocks(draw, depth=0):
    """A statement list mixing every compound statement form, semicolons and one-line suites."""
    out = []
    forms = ["stmt"] * 4 + ["semi", "suite", ""] + (
        ["for", "if", "elif", "else_if", "try", "with", "while", "def", "match"] if depth < 2 else []
    )
    for _ in range(draw(st.integers(1, 4))):
        form = draw(st.sampled_from(forms))
        body = lambda: _indent(draw(_blocks(depth + 1)))  # noqa: E731
        if form == "stmt":
            out.append(draw(st.sampled_from(_STMTS)))
        elif form == "":
            out.append(draw(st.sampled_from(["", "# comment"])))
        elif form == "semi":
            out.append("; ".join(draw(st.lists(st.sampled_from(_SIMPLE), min_size=2, max_size=3))))
        elif form == "suite":
            out.append("if i: " + "; ".join(draw(st.lists(st.sampled_from(_SIMPLE), min_size=1, max_size=3))))
        elif form == "for":
            out += ["for i in range(3):", *body()]
        elif form == "while":
            out += ["while i:", *body()]
        elif form == "with":
            out += ["with ctx:", *body()]
        elif form == "def":
            out += ["def f(i):", *body()]
        elif form == "if":
            out += ["if i % 2:", *body()]
        elif form == "elif":
            out += ["if i % 2:", *body(), "elif i:", *body(), "else:", *body()]
        elif form == "else_if":
            out += ["if i:", *body(), "else:", "    if j:", *_indent(body()), "    x = 2"]
        elif form == "try":
            out += ["try:", *body(), "except ValueError:", *body(), "else:", *body(), "finally:", *body()]
        elif form == "match":
            out += ["match i:", "    case 1:", *_indent(body()), "    case _:", *_indent(body())]
    if all(not line.strip() or line.lstrip().startswith("#") for line in out):
        out.append("pass")
    return out


def _tokens(text):
    return [t for t in re.split(r"(; |\n|\x00)", text.replace("if i: ", "if i:\x00")) if t]


def _assert_only_inserted(src, out):
    """``out`` is ``src`` with clip (and unscale_) statements added, nothing else changed."""
    want, got = _tokens(src), _tokens(out)
    i = 0
    for token in got:
        if i < len(want) and token == want[i]:
            i += 1
        else:
            assert token in ("; ", "\n") or token.strip().startswith(("_scalebox_clip_grad_norm(", "scaler.unscale_(")), token
    assert i == len(want)


@settings(max_examples=80, deadline=None)
@given(_blocks())
def test_property_random_scripts(lines):
    src = "from torch import nn\n" + "\n".join(lines) + "\n"
    ast.parse(src)
    out, sites = rewrite(src, dedent=False)
    ast.parse(out)
    assert out.startswith(IMPORT) or out == src
    _assert_only_inserted(src, out.replace(IMPORT, "", 1))
    rewritten = kinds(sites, REWRITTEN)
    inserted_unscales = sum("inserted first" in s.reason for s in rewritten)
    assert out.count("scaler.unscale_(") - src.count("scaler.unscale_(") == inserted_unscales
    # every inserted clip is the statement right before a step() of the optimizer it clips
    for line in out.splitlines():
        for part in line.split("; "):
            part = part.strip()
            if part.startswith("if i: "):
                part = part[len("if i: "):]
            if part.startswith("_scalebox_clip_grad_norm("):
                name = part[len("_scalebox_clip_grad_norm("):].split(",")[0]
                follows = line.split(part, 1)[1].lstrip("; ").strip()
                if not follows:  # on its own line: the next line holds the step
                    nxt = out.splitlines()[out.splitlines().index(line) + 1].strip()
                    follows = nxt
                assert follows.startswith((f"{name}.step()", f"scaler.step({name})")), (line, follows)
    assert out.count("_scalebox_clip_grad_norm(") == len(rewritten)
    assert all(s.exactness == CHANGES_SEMANTICS for s in rewritten)
    again, _ = rewrite(out, dedent=False)
    assert again == out


# ------------------------------------------------------------------ execution: original vs rewritten

TRAIN = """\
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
head = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
head_opt = torch.optim.SGD(head.parameters(), lr=0.1)
x = torch.randn(16, 4) * 50
"""


def _exec(code):
    return harness.load(code, filename="train.py")


def _params(ns, *names):
    return [p.detach().clone() for n in names for p in ns[n].parameters()]


def test_exec_rewritten_step_equals_manual_clip_then_step():
    step = "loss = (head(model(x)) ** 2).mean()\noptimizer.zero_grad()\nloss.backward()\noptimizer.step()\n"
    src = TRAIN + step
    out, _ = rewrite(src, dedent=False)
    before = metrics.summary().get("scalebox/grad_norm", {}).get("count", 0)
    got = _params(_exec(out), "model")
    assert metrics.summary()["scalebox/grad_norm"]["count"] == before + 1
    manual = src.replace("optimizer.step()", "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\noptimizer.step()")
    want = _params(_exec(manual), "model")
    plain = _params(_exec(src), "model")
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert any(not torch.equal(g, p) for g, p in zip(got, plain))  # clipping really changed the update


def test_exec_two_optimizers_after_one_backward():
    step = "loss = (head(model(x)) ** 2).mean()\nloss.backward()\noptimizer.step()\nhead_opt.step()\n"
    src = TRAIN + step
    out, _ = rewrite(src, dedent=False)
    manual = src.replace(
        "optimizer.step()\nhead_opt.step()",
        "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\noptimizer.step()\n"
        "torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)\nhead_opt.step()",
    )
    got, want = _exec(out), _exec(manual)
    for g, w in zip(_params(got, "model", "head"), _params(want, "model", "head")):
        assert torch.equal(g, w)


def test_exec_gradient_accumulation():
    step = (
        "for i in range(4):\n"
        "    loss = (model(x[i::4]) ** 2).mean() / 2\n"
        "    loss.backward()\n"
        "    if (i + 1) % 2 == 0:\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()\n"
    )
    src = TRAIN + step
    out, _ = rewrite(src, dedent=False)
    manual = src.replace(
        "        optimizer.step()", "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n        optimizer.step()"
    )
    for g, w in zip(_params(_exec(out), "model"), _params(_exec(manual), "model")):
        assert torch.equal(g, w)


AMP = TRAIN + """\
scaler = torch.amp.GradScaler("cpu")
loss = (model(x) ** 2).mean()
optimizer.zero_grad()
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
"""


def test_exec_amp_unscales_before_clipping():
    out, _ = rewrite(AMP, dedent=False)
    manual = AMP.replace(
        "scaler.step(optimizer)",
        "scaler.unscale_(optimizer)\ntorch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\nscaler.step(optimizer)",
    )
    wrong_order = AMP.replace(
        "scaler.step(optimizer)", "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\nscaler.step(optimizer)"
    )
    got, want, wrong = (_params(_exec(c), "model") for c in (out, manual, wrong_order))
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert any(not torch.equal(g, w) for g, w in zip(got, wrong))


def test_exec_amp_with_user_unscale_does_not_unscale_twice():
    src = AMP.replace("scaler.step(optimizer)", "scaler.unscale_(optimizer)\nscaler.step(optimizer)")
    out, _ = rewrite(src, dedent=False)
    assert out.count("unscale_(") == 1
    _exec(out)  # a second unscale_ would raise RuntimeError


def test_exec_amp_call_order_with_mock_scaler(monkeypatch):
    calls = []

    class Scaler:
        def scale(self, loss):
            calls.append("scale")
            return loss

        def unscale_(self, opt):
            calls.append("unscale_")

        def step(self, opt):
            calls.append("step")
            opt.step()

        def update(self):
            calls.append("update")

    real = runtime_clip.clip_grad_norm

    def spy(opt, max_norm=1.0, **kw):
        calls.append("clip")
        return real(opt, max_norm=max_norm, **kw)

    monkeypatch.setattr(runtime_clip, "clip_grad_norm", spy)
    src = TRAIN + (
        "scaler = make_scaler()\n"
        "loss = (model(x) ** 2).mean()\n"
        "scaler.scale(loss).backward()\n"
        "scaler.step(optimizer)\n"
        "scaler.update()\n"
    )
    out, _ = rewrite(src, dedent=False)
    harness.load(out, filename="train.py", namespace={"make_scaler": Scaler})
    assert calls == ["scale", "unscale_", "clip", "step", "update"]


def test_exec_non_optimizer_with_optimizer_name_warns_and_runs(monkeypatch):
    monkeypatch.setattr(runtime_clip, "_warned_types", set())
    src = TRAIN + (
        "class Stepper:\n"
        "    def step(self):\n"
        "        self.stepped = True\n"
        "opt = Stepper()\n"
        "for _ in range(3):\n"
        "    (model(x) ** 2).mean().backward()\n"
        "    opt.step()\n"
    )
    out, _ = rewrite(src, dedent=False)
    assert "_scalebox_clip_grad_norm(opt, max_norm=1.0)" in out
    with pytest.warns(RuntimeWarning, match="Stepper") as caught:
        ns = _exec(out)
    assert ns["opt"].stepped and len([w for w in caught if "Stepper" in str(w.message)]) == 1


def test_nothing_to_insert_parses_no_libcst_tree():
    """Found by the whole-file sweep: with nothing to insert (the code already clips) grad_clip
    still parsed the file with libcst (60 ms for 900 lines) and re-parsed it with ``ast``; it now
    reads the pipeline's shared ast and leaves libcst alone."""
    from scalebox_cst.transforms import FileContext

    src = textwrap.dedent(
        """\
        import torch
        def update(model, opt, loss):
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
        """
    )
    import ast as _ast

    tree = _ast.parse(src)
    cfg = Config(transforms=["grad_clip"])
    cfg.set_option("grad_clip", "mode", "fixed")
    ctx = FileContext("t.py", None, cfg, "cpu", code=src, tree=tree)
    module, sites = GradClip().rewrite(ctx)
    assert module is None and "module" not in ctx.__dict__
    assert [s.action for s in sites] == [SKIPPED] and "already clipped" in sites[0].reason


@pytest.mark.parametrize("head, other", [("import warp as wp\nfrom warp_nn.optimizers import Adam\n", "warp"),
                                          ("import jax\nimport optax\n", "jax")])
def test_a_module_of_another_array_library_keeps_its_steps_with_the_reason(head, other):
    """Found on skrl's Warp agents: ``tape.backward(loss); self.entropy_optimizer.step()`` got a
    guard importing torch's stabilizer into a module without torch (warp_nn's Adam has no
    param_groups: the guard did nothing). The same code with torch imported is guarded."""
    body = ("def update(tape, loss, policy_optimizer):\n"
            "    tape.backward(loss)\n"
            "    policy_optimizer.step()\n")
    src = head + body
    out, sites = harness.rewrite(src, "grad_clip", dedent=False)
    assert out == src and [s.action for s in sites] == [SKIPPED]
    assert f"the module imports {other}, not torch" in sites[0].reason
    out, sites = harness.rewrite("import torch\n" + body, "grad_clip", dedent=False)
    assert [s.action for s in sites] == [REWRITTEN]
