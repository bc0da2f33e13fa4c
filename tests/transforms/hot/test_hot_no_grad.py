"""hot.no_grad: which forwards run under torch.no_grad(), and that the rewrite changes nothing.

Differential tests run the original and the rewrite on the same seed: the actions a rollout takes
and what it logs must be bitwise equal, and for a script that trains between rollouts, the
parameters after a few updates too. Look-alikes (a value kept for a loss, autograd state read,
a forward returned) come back byte for byte with their reason.
"""
import textwrap

import pytest
import torch

from scalebox_cst.config import Config
from scalebox_cst.report import EXACT, REWRITTEN, SKIPPED
from scalebox_cst.transforms import REGISTRY
from scalebox_cst.transforms.hot.no_grad import ID, HotNoGrad
import harness
from harness import rewriter


rewrite = rewriter(ID)  # the shared differential harness (tests/harness.py)


def load(code):
    return harness.load(code, filename="<rewritten>", module="sbtest")


def same(a, b):
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if hasattr(a, "tobytes"):
        return a.tobytes() == b.tobytes()
    return a == b


def test_registered_and_on_by_default():
    assert ID in [cls.id for cls in REGISTRY]
    assert Config().transform_enabled(ID)


@pytest.mark.parametrize("example", [e for e in HotNoGrad.EXAMPLES if e.rewritten], ids=lambda e: e.note[:40])
def test_examples_are_exact(example):
    """Outputs, reasons and run(seed) side by side: tests/transforms/test_examples_registry.py."""
    _, sites = rewrite(example.code)
    done = [s for s in sites if s.action == REWRITTEN]
    assert done and all(s.exactness == EXACT for s in done)


TRAIN = '''
import numpy as np
import torch
import torch.nn as nn
from torch.distributions import Categorical


class Env:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.s = self.rng.normal(size=4).astype(np.float32)

    def step(self, a):
        self.s = (self.s * 0.9 + (a - 0.5)).astype(np.float32)
        return self.s, float(self.s.sum() > 0), False


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
        self.value = nn.Linear(4, 1)

    def forward(self, x):
        return torch.softmax(self.body(x), dim=-1)


def train(seed, updates=4, steps=8):
    torch.manual_seed(seed)
    env, policy = Env(seed), Policy()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    actions, returns = [], []
    for u in range(updates):
        obs_buf, act_buf, rew_buf = [], [], []
        s = env.s
        for t in range(steps):
            probs = policy(torch.as_tensor(s))
            a = Categorical(probs).sample().item()
            v = policy.value(torch.as_tensor(s)).detach().numpy()
            print(f"v={v}")
            s2, r, done = env.step(a)
            obs_buf.append(s)
            act_buf.append(a)
            rew_buf.append(r)
            actions.append(a)
            s = s2
        obs = torch.as_tensor(np.stack(obs_buf))
        logp = Categorical(policy(obs)).log_prob(torch.as_tensor(act_buf))
        loss = -(logp * torch.as_tensor(rew_buf)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        returns.append(sum(rew_buf))
    return actions, returns, [p.detach().clone() for p in policy.parameters()]
'''


def test_training_is_bitwise_the_original():
    out, sites = rewrite(TRAIN)
    done = [s for s in sites if s.action == REWRITTEN]
    assert [s.line for s in done] == [37, 39], sites  # the acting and logging forwards only
    skipped = [s for s in sites if s.action == SKIPPED]
    assert any(s.line == 48 and "backward" in s.reason for s in skipped), skipped  # the loss forward
    for seed in (0, 3):
        a = load(TRAIN)["train"](seed)
        b = load(out)["train"](seed)
        assert same(a, b)


def test_adjacent_statements_share_one_block_and_comments_survive():
    src = '''
    import torch
    import torch.nn as nn
    net = nn.Linear(3, 2)
    for t in range(3):
        # act
        q = net(torch.ones(3)).argmax().item()
        v = net(torch.ones(3)).max().item()
        print(q, v)
    '''
    out, sites = rewrite(src)
    assert out.count("with torch.no_grad():") == 1
    assert "    # act\n    with torch.no_grad():\n        q = net" in out


def test_value_appended_without_detach_is_refused_even_through_names():
    src = '''
    import torch
    import torch.nn as nn
    net = nn.Linear(3, 2)
    values = []
    for t in range(3):
        out = net(torch.ones(3))
        v = out * 2
        values.append(v)
    loss = torch.stack(values).sum()
    '''
    out, sites = rewrite(src)
    assert out == textwrap.dedent(src)
    assert any("values.append" in s.reason for s in sites if s.action == SKIPPED)


@pytest.mark.parametrize("body, reason", [
    ("buf[t] = net(x)", "stored into"),  # a preallocated tensor a later loss reads (CleanRL without no_grad)
    ("y = net(x)\n    y.add_(1)", "in place"),
    ("y = net(x)\n    g = y.grad_fn", "grad_fn"),
    ("y = net(x)\n    helper(y)", "helper"),
])
def test_look_alikes(body, reason):
    src = (
        "import torch\nimport torch.nn as nn\nfrom lib import helper\nnet = nn.Linear(3, 2)\nbuf = torch.zeros(3, 2)\n"
        "x = torch.ones(3)\nfor t in range(3):\n    " + body + "\n"
    )
    out, sites = rewrite(src)
    assert out == src
    assert any(reason in s.reason for s in sites if s.action == SKIPPED), sites


def test_forward_with_side_effects_is_refused():
    src = '''
    import torch
    import torch.nn as nn
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)
        def forward(self, x):
            self.hidden = self.fc(x)
            return self.hidden
    net = Net()
    for t in range(3):
        a = net(torch.ones(3)).argmax().item()
    '''
    out, sites = rewrite(src)
    assert out == textwrap.dedent(src)
    assert any("stores into self.hidden" in s.reason for s in sites)


def test_a_call_of_a_parameter_is_named_as_one():
    """Packt's cross-entropy CartPole (Chapter04/01_cartpole.py) acts with ``sm(net(obs_v))`` in
    ``def iterate_batches(env, net, batch_size)``, and its class Net is in the same file: the
    reason said "calls net, whose code is not in this file". (Where Net is defined before the
    function, the call is checked at run time instead: tests/transforms/hot/test_hot_no_grad_params.py.)"""
    src = '''
    import torch
    import torch.nn as nn
    def act(net, obs):
        sm = nn.Softmax(dim=1)
        probs = sm(net(obs))
        return probs.data.numpy()[0]
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)
        def forward(self, x):
            return self.fc(x)
    '''
    out, sites = rewrite(src)
    reasons = [s.reason for s in sites if s.action == SKIPPED]
    assert "forward of sm: the statement calls net, a parameter of `act` (line 4): what it runs is not known here" in reasons, reasons
    assert not any("whose code is not in this file" in r for r in reasons), reasons


def test_numpy_after_data_of_an_element_says_why_data_was_no_end():
    """Lizhi-sjtu's SAC-continuous.py acts with ``a, _ = self.actor(s, ...)`` and returns
    ``a.data.numpy().flatten()``: the reason said ".numpy() before .detach()", which the code does
    not do; what stops it is that ``.data`` of an element may be a PackedSequence's."""
    src = '''
    import torch
    import torch.nn as nn
    class Actor(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)
        def forward(self, x):
            return self.fc(x), None
    class Agent:
        def __init__(self):
            self.actor = Actor()
        def choose_action(self, s):
            a, _ = self.actor(s)
            return a.data.numpy().flatten()
    a = Agent().choose_action(torch.ones(1, 3))
    '''
    _, sites = rewrite(src)
    reasons = [s.reason for s in sites if s.action == SKIPPED]
    assert any("calls .numpy() on `a.data`: an element of the forward's result may be a PackedSequence" in r for r in reasons), reasons
    assert not any("before .detach()" in r for r in reasons), reasons


def test_already_under_no_grad_is_not_a_candidate():
    src = '''
    import torch
    import torch.nn as nn
    net = nn.Linear(3, 2)
    for t in range(3):
        with torch.no_grad():
            a = net(torch.ones(3)).argmax().item()
    '''
    out, sites = rewrite(src)
    assert out == textwrap.dedent(src) and not sites


def test_method_of_the_module_that_keeps_its_argument_is_refused():
    """minimalRL REINFORCE: `pi.put_data((r, prob[a]))` keeps the probability for the loss."""
    src = '''
    import torch
    import torch.nn as nn
    from torch.distributions import Categorical
    class Policy(nn.Module):
        def __init__(self):
            super().__init__()
            self.data = []
            self.fc = nn.Linear(4, 2)
        def forward(self, x):
            return torch.softmax(self.fc(x), dim=0)
        def put_data(self, item):
            self.data.append(item)
    pi = Policy()
    for t in range(3):
        prob = pi(torch.ones(4))
        a = Categorical(prob).sample()
        pi.put_data((1.0, prob[a]))
    '''
    out, sites = rewrite(src)
    assert out == textwrap.dedent(src)
    assert any("pi.put_data" in s.reason for s in sites if s.action == SKIPPED), sites


REBIND = '''
import torch
import torch.nn as nn
class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
    def forward(self, x):
        return self.fc(x)
    def get_action(self, x):
        mean = self(x)
        return torch.tanh(mean), mean
def run(seed):
    torch.manual_seed(seed)
    actor = Actor()
    kept = []
    for t in range(4):
        actions, _ = actor.get_action(torch.randn(3))
        SKIP
        actions = actions.detach().numpy()
        kept.append(actions)
    return kept
'''


def test_rebinding_ends_the_tensor_binding():
    """CleanRL SAC: `actions = actions.detach().cpu().numpy()` before `rb.add(..., actions, ...)`;
    `self(x)` inside a method is the module's own forward."""
    src = REBIND.replace("SKIP", "pass")
    out, sites = rewrite(src)
    assert [s.action for s in sites] == [REWRITTEN], sites
    for seed in (0, 1):
        assert same(load(src)["run"](seed), load(out)["run"](seed))


def test_a_continue_before_the_rebinding_keeps_the_binding_live():
    src = REBIND.replace("SKIP", "if t == 2:\n            continue")
    out, sites = rewrite(src)
    assert out == textwrap.dedent(src)
    assert any("kept.append" in s.reason for s in sites if s.action == SKIPPED), sites


def test_forward_storing_through_a_local_alias_of_self_is_refused():
    src = '''
    import torch
    import torch.nn as nn
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)
            self.last = [None]
        def forward(self, x):
            last = self.last
            out = self.fc(x)
            last[0] = out
            return out
    net = Net()
    for t in range(3):
        a = net(torch.ones(3)).argmax().item()
    '''
    out, sites = rewrite(src)
    assert out == textwrap.dedent(src)
    assert any("stores into last[0]" in s.reason for s in sites if s.action == SKIPPED), sites


def test_in_place_op_in_the_statement_is_refused():
    """`w.add_(1)` on a parameter raises with grad on and succeeds under no_grad."""
    src = '''
    import torch
    import torch.nn as nn
    net = nn.Linear(3, 2)
    w = torch.ones(3, requires_grad=True)
    for t in range(3):
        a = net(w.mul_(1)).argmax().item()
    '''
    out, sites = rewrite(src)
    assert out == textwrap.dedent(src)
    assert any("in place" in s.reason for s in sites if s.action == SKIPPED), sites


def test_a_function_reading_the_name_as_a_global_is_refused_but_a_local_namesake_is_not():
    src = '''
    import torch
    import torch.nn as nn
    net = nn.Linear(3, 2)
    def report():
        return prob.sum()
    def other(x):
        prob = x * 2
        return prob
    for t in range(3):
        prob = net(torch.ones(3))
        a = prob.argmax().item()
    '''
    out, sites = rewrite(src)
    assert out == textwrap.dedent(src)
    assert any("read in report" in s.reason for s in sites if s.action == SKIPPED), sites
    out, sites = rewrite(src.replace("        return prob.sum()\n", "        return 0\n"))
    assert [s.action for s in sites] == [REWRITTEN], sites


# A method that acts and returns numpy (Lizhi-sjtu/DRL-code-pytorch's choose_action) called from
# the rollout, its value stored in a buffer: the skip said the value "may keep the value where a
# later loss reads it", untrue of a numpy value; it now says why the call site is left alone.
AGENT = '''import numpy as np
import torch
import torch.nn as nn


class Agent:
    def __init__(self):
        self.net = nn.Linear(4, 2)
        self.buf = []

    def choose_action(self, s, greedy):
        s = torch.as_tensor(s, dtype=torch.float32).unsqueeze(0)
        prob = torch.softmax(self.net(s), 1).detach().numpy().flatten()
        if greedy:
            a = np.argmax(prob)
        else:
            a = np.random.choice(2, p=prob)
        return a

    def store(self, *t):
        self.buf.append(t)


agent = Agent()
s = np.zeros(4, dtype=np.float32)
for _ in range(3):
    a = agent.choose_action(s, False)
    agent.store(s, a)
'''


def _call_site(src):
    line = src.splitlines().index("    a = agent.choose_action(s, False)") + 1
    out, sites = rewrite(src)
    [site] = [s for s in sites if s.line == line]
    return out, site


def test_a_call_returning_numpy_is_skipped_for_what_it_returns():
    out, site = _call_site(AGENT)
    assert site.action == SKIPPED
    line = AGENT.splitlines().index("    def choose_action(self, s, greedy):") + 1
    assert site.reason.endswith(f"`choose_action` (line {line}) returns no tensor (numpy or Python values); "
                                "its forwards are decided inside it"), site.reason
    assert "        with torch.no_grad():\n            prob = torch.softmax" in out  # decided inside


@pytest.mark.parametrize("ret", [
    "return torch.as_tensor(a)",                  # a tensor
    "return prob, self.net(s)",                   # one entry is a forward's output
    "return a if greedy else s",                  # s: a tensor on one branch
    "for a in prob:\n            pass\n        return a",  # `a` bound by a loop too
])
def test_a_call_that_may_return_a_tensor_keeps_the_reason_about_its_use(ret):
    src = AGENT.replace("        return a\n", f"        {ret}\n")
    _, site = _call_site(src)
    assert site.action == SKIPPED
    assert "returns no tensor" not in site.reason and "is passed to `agent.store(...)`" in site.reason, site.reason


# An activation picked by a flag among torch.nn modules (Lizhi-sjtu/DRL-code-pytorch's PPO nets:
# `self.activate_func = [nn.ReLU(), nn.Tanh()][args.use_tanh]`): calling it runs a torch.nn
# forward. It was "code not in this file", so every forward of those nets was skipped.
PICKED = TRAIN.replace(
    "        self.body = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))\n",
    "        self.fc1 = nn.Linear(4, 16)\n"
    "        self.fc2 = nn.Linear(16, 2)\n"
    "        self.act = [nn.ReLU(), nn.Tanh()][USE_TANH]\n"
    "        self.out = nn.Identity() if USE_TANH else nn.Tanh()\n",
).replace(
    "        return torch.softmax(self.body(x), dim=-1)\n",
    "        return torch.softmax(self.out(self.fc2(self.act(self.fc1(x)))), dim=-1)\n",
).replace("class Policy(nn.Module):", "USE_TANH = 1\n\n\nclass Policy(nn.Module):")


def _acting_line(src):
    return src.splitlines().index("            probs = policy(torch.as_tensor(s))") + 1


def test_a_module_picked_among_torch_modules_is_a_torch_forward():
    out, sites = rewrite(PICKED)
    [acting] = [s for s in sites if s.line == _acting_line(PICKED)]
    assert acting.action == REWRITTEN, acting.reason
    for seed in (0, 3):
        assert same(load(PICKED)["train"](seed), load(out)["train"](seed))


@pytest.mark.parametrize("pick", [
    "[nn.ReLU(), make_act()][USE_TANH]",          # one choice is code this file does not show
    "nn.Tanh() if USE_TANH else make_act()",
    "[nn.ReLU(), nn.Tanh()][0:USE_TANH + 1]",     # a slice: a list, not a module
    "{0: nn.ReLU(), 1: nn.Tanh()}[USE_TANH]",     # not a list or tuple display
])
def test_a_pick_that_may_not_be_a_torch_module_stays_unknown(pick):
    src = PICKED.replace("[nn.ReLU(), nn.Tanh()][USE_TANH]", pick).replace(
        "import numpy as np\n", "import numpy as np\nfrom acts import make_act\n")
    out, sites = rewrite(src)
    [acting] = [s for s in sites if s.line == _acting_line(src)]
    assert acting.action == SKIPPED and "self.act" in acting.reason, acting.reason


# Layers bound by a tuple assignment. `self.fc1, self.fc2 = nn.Linear(..), nn.Linear(..)` was no
# binding at all: the forward was "code not in this file"; and where the same attribute was also
# assigned plainly, a tuple, annotated, loop or with binding of it was missed (taken as the plain one).
TUPLED = PICKED.replace(
    "        self.fc1 = nn.Linear(4, 16)\n        self.fc2 = nn.Linear(16, 2)\n",
    "        self.fc1, self.fc2 = nn.Linear(4, 16), nn.Linear(16, 2)\n")


def test_layers_bound_by_a_tuple_display_are_torch_modules():
    assert "self.fc1, self.fc2 = nn.Linear(4, 16), nn.Linear(16, 2)" in TUPLED
    out, sites = rewrite(TUPLED)
    [acting] = [s for s in sites if s.line == _acting_line(TUPLED)]
    assert acting.action == REWRITTEN, acting.reason
    for seed in (0, 3):
        assert same(load(TUPLED)["train"](seed), load(out)["train"](seed))


@pytest.mark.parametrize("rebind", [
    "self.fc2, self.extra = make_head(), 1",   # a tuple display with an unknown entry
    "self.fc2, self.extra = make_heads()",      # a tuple target from one unknown value
    "(self.fc2, self.extra), n = make_heads(), 2",
    "self.fc2: nn.Module = make_head()",        # an annotated assignment
    "for self.fc2 in make_heads():\n            pass",
    "with make_head() as self.fc2:\n            pass",
])
def test_a_layer_rebound_elsewhere_to_unknown_code_is_unknown(rebind):
    src = PICKED.replace(
        "    def forward(self, x):\n",
        f"    def swap_head(self):\n        {rebind}\n\n    def forward(self, x):\n").replace(
        "import numpy as np\n", "import numpy as np\nfrom heads import make_head, make_heads\n")
    assert rebind in src
    _, sites = rewrite(src)
    [acting] = [s for s in sites if s.line == _acting_line(src)]
    assert acting.action == SKIPPED and "self.fc2" in acting.reason, acting.reason


NETWORK_SPELLINGS = [
    "import torch\npolicy = torch.nn.Linear(4, 2)\n",
    "from torch import nn as N\npolicy = N.Linear(4, 2)\n",
    "import torch.nn as T\npolicy = T.Linear(4, 2)\n",
    "from torch.nn import Linear as L\npolicy = L(4, 2)\n",
    "import torch\nclass Policy:\n    def __call__(self, x):\n        return x\n",
    "import torch\ndef f():\n    if True:\n        class Policy(object):\n            pass\n",
    "import torch\npolicy = torch.ｎｎ.Linear(4, 2)\n",  # NFKC: the same name as nn
]


@pytest.mark.parametrize("src", NETWORK_SPELLINGS)
def test_every_way_to_reach_a_network_is_seen_by_the_early_exit(src):
    import ast
    from scalebox_cst.transforms.hot.callees import may_hold_network
    assert may_hold_network(src, ast.parse(src))


def test_a_file_with_no_network_is_left_before_any_scan():
    import ast
    from scalebox_cst.transforms.hot.callees import may_hold_network
    src = "import torch\ndef gae(r, v):\n    out = torch.zeros_like(r)\n    for t in reversed(range(len(r))):\n        out[t] = r[t] + v[t]\n    return out\n"
    assert not may_hold_network(src, ast.parse(src))
    out, sites = rewrite(src)
    assert out == src and sites == []


def test_methods_of_a_torch_module_other_than_its_forward_are_no_forwards():
    """Found on garage, DI-engine and sample-factory: ``self.fc.apply(init)``, ``add_module``,
    ``.to(device)`` (and a parameter's ``size``) were taken for a torch module's forward and put
    under no_grad, ``apply`` running a function whose code may not be in the file. Only calling
    the module (or its ``forward``) is a forward."""
    code = textwrap.dedent('''
        import torch
        import torch.nn as nn


        def weight_init(m):
            if isinstance(m, nn.Linear):
                nn.init.orthogonal_(m.weight)


        class Net(nn.Module):
            def __init__(self, device):
                super().__init__()
                self.fc = nn.Linear(4, 2)
                self.fc.apply(weight_init)
                self.fc.add_module("extra", nn.ReLU())
                self.fc.to(device)
                n = self.fc.weight.size(1)

            def forward(self, x):
                return self.fc(x)

            def act(self, obs):
                return self.fc.forward(torch.as_tensor(obs)).argmax().item()
        ''')
    out, sites = rewrite(code)
    done = [(s.line, s.action) for s in sites if s.action == REWRITTEN]
    assert all(line > 22 for line, _ in done), sites  # only act's forward, none of __init__'s calls
    assert "apply" not in "".join(s.reason for s in sites if s.action == REWRITTEN)


def test_a_container_of_a_module_that_keeps_a_value_is_not_known_code():
    """Found by a differential review: ``nn.Sequential(Memo(), nn.Tanh())`` counted as torch's
    code, so a forward of it went under no_grad although Memo's forward keeps ``self.last`` (a
    later loss on it then raised). A container is known only where what it holds is (CleanRL's
    ``layer_init(nn.Linear(...))`` returns the torch module it is given)."""
    code = textwrap.dedent('''
        import torch
        import torch.nn as nn
        from mylib import Encoder


        class Memo(nn.Module):
            def forward(self, x):
                y = x * 2
                self.last = y
                return y


        def layer_init(layer, std=1.0):  # CleanRL's: initialises its argument and returns it
            torch.nn.init.orthogonal_(layer.weight, std)
            return layer


        def main(env, o, layers):
            net = nn.Sequential(Memo(), nn.Tanh())
            a = net(torch.as_tensor(o)).detach().numpy()
            env.step(a)
            wrapped = nn.DataParallel(Encoder())
            b = wrapped(torch.as_tensor(o)).detach().numpy()
            env.step(b)
            built = nn.Sequential(*layers)
            c = built(torch.as_tensor(o)).detach().numpy()
            env.step(c)
            plain = nn.Sequential(layer_init(nn.Linear(2, 2)), nn.ModuleList([nn.Tanh()]))
            d = plain(torch.as_tensor(o)).detach().numpy()
            env.step(d)
        ''')
    out, sites = rewrite(code)
    done = [s.line for s in sites if s.action == REWRITTEN]
    plain = code.splitlines().index("    d = plain(torch.as_tensor(o)).detach().numpy()") + 1
    assert done == [plain], [(s.line, s.action, s.reason) for s in sites]  # only the plain torch container


def test_a_discarded_forward_reads_as_one():
    """Stable-Baselines3's tests/test_utils.py runs ``model(th.ones(3, 5))`` for its BatchNorm
    statistics and drops the output: the reason read 'its outputs end in discarded and reach no
    gradient' (an adjective among the nouns the other ends are)."""
    code = textwrap.dedent('''\
        import torch


        def warm_up(x):
            model = torch.nn.Sequential(torch.nn.Linear(5, 5), torch.nn.BatchNorm1d(5))
            model(x)
            return model
        ''')
    out, sites = rewrite(code)
    done = [s for s in sites if s.action == REWRITTEN]
    assert len(done) == 1 and "with torch.no_grad():\n        model(x)" in out
    assert "its outputs end in a discarded expression and reach no gradient" in done[0].reason, done[0].reason


def test_a_trained_forward_says_it_is_trained_whatever_its_callee():
    """Found by a newcomer (XinJingHao's Duel-DDQN): the training forward `current_q = self.q_net(s)`
    was reported "skipped: `forward` (line 34) calls self.hidden, whose code is not in this file"
    (self.hidden comes from a build_net helper): read as if the engine, seeing that code, would
    have put the forward whose loss is differentiated under no_grad. Its output reaches
    .backward(): that is the reason, whatever the callee."""
    code = textwrap.dedent(
        """\
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        def build_net(sizes, act):
            layers = []
            for i in range(len(sizes) - 1):
                layers += [nn.Linear(sizes[i], sizes[i + 1]), act()]
            return nn.Sequential(*layers)

        class Duel(nn.Module):
            def __init__(self):
                super().__init__()
                self.hidden = build_net([4, 8], nn.ReLU)
                self.A = nn.Linear(8, 2)

            def forward(self, s):
                return self.A(self.hidden(s))

        class Agent:
            def __init__(self):
                self.q_net = Duel()
                self.opt = torch.optim.Adam(self.q_net.parameters())

            def train(self, s, a, target):
                current_q = self.q_net(s)
                q_loss = F.mse_loss(current_q.gather(1, a), target)
                self.opt.zero_grad()
                q_loss.backward()
                self.opt.step()
        """
    )
    out, sites = rewrite(code)
    assert out == code
    (site,) = [s for s in sites if s.line == 26]
    assert site.action == SKIPPED
    assert site.reason == "forward of self.q_net: its output `q_loss` (line 29) reads .backward"


def test_a_layer_built_from_a_name_bound_to_classes_is_followed():
    """BY571's IQN (model.py) builds ``self.ff_1 = layer(...)`` after ``layer = NoisyLinear`` or
    ``layer = nn.Linear``, NoisyLinear defined above it: the reason said "calls self.ff_1, whose
    code is not in this file". Each class the name may hold is followed: NoisyLinear's forward
    resamples its noise in place (the true reason); with nn.Linear alone the forward is plain."""
    src = '''
    import torch
    import torch.nn as nn
    class NoisyLinear(nn.Linear):
        def __init__(self, i, o):
            super().__init__(i, o)
            self.register_buffer("eps", torch.zeros(o, i))
        def forward(self, x):
            self.eps.normal_()
            return nn.functional.linear(x, self.weight + self.eps, self.bias)
    class Net(nn.Module):
        def __init__(self, noisy):
            super().__init__()
            if noisy:
                layer = NoisyLinear
            else:
                layer = nn.Linear
            self.ff_1 = layer(3, 2)
        def forward(self, x):
            return torch.relu(self.ff_1(x))
    net = Net(False)
    for t in range(3):
        a = net(torch.ones(3)).argmax().item()
    '''
    out, sites = rewrite(src)
    reasons = [s.reason for s in sites if s.action == SKIPPED]
    assert out == textwrap.dedent(src)
    assert not any("whose code is not in this file" in r for r in reasons), reasons
    assert any("updates self.eps in place (normal_)" in r for r in reasons), reasons
    plain = textwrap.dedent(src).replace("layer = NoisyLinear", "layer = nn.Linear")
    out, sites = rewrite(plain)
    done = [s for s in sites if s.action == REWRITTEN]
    assert done and all(s.exactness == EXACT for s in done), sites
    assert "with torch.no_grad():" in out


def test_a_value_kept_in_a_namedtuple_is_followed_to_where_it_is_kept():
    """sweetice's AC_CartPole: `model.save_actions.append(SavedAction(m.log_prob(action),
    state_value))` with `SavedAction = namedtuple(...)`: the skip said "passed to
    `SavedAction(...)`, whose effects are unknown"; a namedtuple holds its arguments as a tuple
    does, and the reason now names where the value is kept (for a later loss)."""
    src = '''
    import torch
    import torch.nn as nn
    from collections import namedtuple
    SavedAction = namedtuple('SavedAction', ['log_prob', 'value'])
    class Policy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)
            self.saved = []
        def forward(self, x):
            return self.fc(x)
    model = Policy()
    def select_action(state):
        out = model(state)
        model.saved.append(SavedAction(out[0], out[1:]))
        return out.argmax().item()
    '''
    out, sites = rewrite(src)
    reasons = [s.reason for s in sites if s.action == SKIPPED]
    assert out == textwrap.dedent(src)
    assert not any("whose effects are unknown" in r for r in reasons), reasons
    assert any("`model.saved.append(...)`" in r and "later loss" in r for r in reasons), reasons


def test_a_forward_a_helper_returns_is_silent_also_after_an_in_place_update():
    """pranz24/pytorch-soft-actor-critic's GaussianPolicy.sample: the forward's values are
    followed to ``log_prob -= ...`` and then returned. A helper returning its forward is silent
    (its callers decide: the update trains on ``sample``'s values); this one was skipped with
    "its output `log_prob` is updated in place", the first problem met, which read as if the
    in-place update alone kept the forward out of no_grad."""
    src = textwrap.dedent('''
        import torch
        import torch.nn as nn
        from torch.distributions import Normal
        class GaussianPolicy(nn.Module):
            def __init__(self):
                super().__init__()
                self.mean = nn.Linear(3, 1)
                self.log_std = nn.Linear(3, 1)
            def forward(self, state):
                return self.mean(state), self.log_std(state).clamp(-20, 2)
            def sample(self, state):
                mean, log_std = self.forward(state)
                normal = Normal(mean, log_std.exp())
                x_t = normal.rsample()
                y_t = torch.tanh(x_t)
                log_prob = normal.log_prob(x_t)
                log_prob -= torch.log(1 - y_t.pow(2) + 1e-6)
                log_prob = log_prob.sum(1, keepdim=True)
                return y_t, log_prob, torch.tanh(mean)
    ''')
    out, sites = rewrite(src, dedent=False)
    assert out == src and sites == []
    # updated in place and not returned: the in-place update is still the reason
    kept = src.replace("return y_t, log_prob, torch.tanh(mean)", "print(log_prob.sum().item())")
    assert [s.reason for s in rewrite(kept, dedent=False)[1]] == [
        "forward of self.forward: its output `log_prob` is updated in place (line 18: "
        "`log_prob -= torch.log(1 - y_t.pow(2) + 1e-06)`)"]


def test_a_layer_given_back_by_an_init_function_of_the_file_is_the_layer_built_before():
    """MrSyee/pg-is-all-you-need: ``self.mu_layer = nn.Linear(32, 1)`` then
    ``self.mu_layer = init_layer_uniform(self.mu_layer)`` (weights set in place, the same module
    returned). The forward was refused as calling "self.mu_layer, whose code is not in this file",
    which hid the real reason where there was one (the rollout appends the output) and kept plain
    acting forwards out of no_grad."""
    src = textwrap.dedent('''
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        def init_layer_uniform(layer, init_w=3e-3):
            layer.weight.data.uniform_(-init_w, init_w)
            layer.bias.data.uniform_(-init_w, init_w)
            return layer
        class Actor(nn.Module):
            def __init__(self):
                super().__init__()
                self.hidden = nn.Linear(3, 32)
                self.mu_layer = nn.Linear(32, 1)
                self.mu_layer = init_layer_uniform(self.mu_layer)
            def forward(self, state):
                return torch.tanh(self.mu_layer(F.relu(self.hidden(state))))
        actor = Actor()
        def act(states):
            out = []
            for s in states:
                a = actor(torch.as_tensor(s)).detach().numpy()
                out.append(a)
            return out
    ''')
    out, sites = rewrite(src, dedent=False)
    assert [(s.line, s.action) for s in sites] == [(21, REWRITTEN)], sites
    # given another attribute (not followed: only the attribute's own module given back is)
    other = src.replace("init_layer_uniform(self.mu_layer)", "init_layer_uniform(self.hidden)")
    assert [s.action for s in rewrite(other, dedent=False)[1]] == [SKIPPED]
    unknown = src.replace("self.mu_layer = nn.Linear(32, 1)", "self.mu_layer = make_layer()")
    assert [(s.action, "not in this file" in s.reason) for s in rewrite(unknown, dedent=False)[1]] == [(SKIPPED, True)]
