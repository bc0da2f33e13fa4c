"""hot.no_grad: values that leave the flow the analysis follows, and ends that depend on grad.

A forward's output bound to a name declared ``global``/``nonlocal`` (or readable through
``locals()``/``eval``) is read where its use is not followed; ``.numpy()`` and numpy functions
raise on a tensor that requires grad and do not under ``no_grad``. Each case runs the original
and the rewrite on the same inputs: same values, or the same exception.
"""
import pytest
import torch

from scalebox_cst.report import REWRITTEN, SKIPPED
from scalebox_cst.transforms.hot.no_grad import ID
import harness
from harness import rewriter

rewrite = rewriter(ID)


def same(a, b):
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if hasattr(a, "tobytes"):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    return a == b


# A forward's output bound to a name declared global (or nonlocal): another function reads it
# with its graph. The flow followed the name only in the function, so `last = net(x)` went under
# no_grad and learn()'s backward then raised "element 0 of tensors does not require grad".
DECLARED = '''
import torch, torch.nn as nn
torch.manual_seed(0)
net = nn.Linear(3, 1); last = None
def act(x):
    global last
    last = net(x)
    return last.sum().item()
def learn():
    last.sum().backward(); return net.weight.grad
def run(x):
    return act(x), learn()
def outer(x):
    kept = None
    def step(x):
        nonlocal kept
        kept = net(x)
        return kept.sum().item()
    for _ in range(2):
        step(x)
    kept.sum().backward()
    return net.weight.grad
'''


@pytest.mark.parametrize("name, reason", [("run", "`last` is declared global"), ("outer", "`kept` is declared nonlocal")])
def test_a_name_declared_global_or_nonlocal_is_refused(name, reason):
    original, rewritten, out, sites = harness.pair(DECLARED, name, ID)
    assert any(reason in s.reason for s in sites if s.action == SKIPPED), sites
    assert not [s for s in sites if s.action == REWRITTEN], out
    x = torch.ones(2, 3)
    assert same(original(x), rewritten(x))


@pytest.mark.parametrize("read", ["print(locals())", "eval('None')", "exec('pass')", "print(vars())"])
def test_a_scope_reading_names_by_their_text_is_refused(read):
    src = f"import torch\nimport torch.nn as nn\nnet = nn.Linear(3, 2)\ndef f(x):\n    out = net(x)\n    a = out.argmax().item()\n    {read}\n    return a\n"
    out, sites = rewrite(src, dedent=False)
    assert out == src
    assert any("can be read through" in s.reason for s in sites if s.action == SKIPPED), sites


def test_other_declarations_and_vars_of_an_object_keep_the_rewrite():
    """CleanRL: `global_step` declared global, `vars(args)` at module level; the acting forward's
    output is a local (or a module-level name no function reads)."""
    src = '''
    import argparse
    import numpy as np
    import torch
    import torch.nn as nn
    args = argparse.Namespace(seed=0)
    print("|".join(f"{k}={v}" for k, v in vars(args).items()))
    q_network = nn.Linear(4, 2)
    steps = 0
    def act(obs):
        global steps
        steps += 1
        q_values = q_network(torch.Tensor(obs))
        return torch.argmax(q_values, dim=1).cpu().numpy()
    obs = np.ones((3, 4), dtype=np.float32)
    for global_step in range(3):
        q_values = q_network(torch.Tensor(obs))
        actions = torch.argmax(q_values, dim=1).cpu().numpy()
    '''
    out, sites = rewrite(src)
    assert len([s for s in sites if s.action == REWRITTEN]) == 2, sites


# `.numpy()` (and numpy functions, which call it) raise on a tensor that requires grad, and do
# not under no_grad: taking them for an end turned an error into success
# (`out = self._mlp(torch.tensor(x)); return out[0].cpu().numpy()`).
NUMPY = '''
import numpy as np
import torch
import torch.nn as nn
class Agent:
    def __init__(self):
        torch.manual_seed(0)
        self._mlp = nn.Linear(3, 4)
    def predict(self, x):
        out = self._mlp(torch.tensor(x))
        return END
def run(x):
    return Agent().predict(x)
'''


@pytest.mark.parametrize("end, rewritten", [
    ("out[0].cpu().numpy()", False),
    ("np.asarray(out)", False),
    ("np.array(out[0])", False),
    ("out.max(0)[0].numpy()", False),              # the values of a max: they require grad
    ("torch.max(out, torch.zeros(4))[1].numpy()", False),  # elementwise: [1] is a row of values
    ("out.detach().cpu().numpy()", True),
    ("out.cpu().data.numpy()", True),
    ("out[0].numpy(force=True)", True),
    ("out.argmax().item()", True),
    ("out.argmax(-1).numpy()", True),
    ("out.max(-1)[1].numpy()", True),               # the indices of a max over a dim
    ("torch.max(out, dim=1)[1].numpy()", True),
    ("out.topk(2)[1].numpy()", True),
    ("out.tolist()", True),                         # tolist works on a tensor that requires grad
    ("out[0, 0].item()", True),
])
def test_numpy_of_a_value_that_requires_grad_is_refused(end, rewritten):
    original, new, out, sites = harness.pair(NUMPY.replace("END", end), "run", ID)
    assert bool([s for s in sites if s.action == REWRITTEN]) is rewritten, sites
    if not rewritten:
        assert any("requires grad" in s.reason for s in sites if s.action == SKIPPED), sites
    x = [[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]]
    results = []
    for fn in (original, new):
        try:
            results.append(fn(x))
        except RuntimeError as exc:
            results.append(type(exc))
    assert same(results[0], results[1]), results


class _BoxEnv:
    """Converts its action to numpy, as gym's Box spaces do (np.asarray)."""

    def step(self, a):
        import numpy as np
        return float(np.asarray(a, dtype=np.float32).sum())


@pytest.mark.parametrize("action, rewritten", [("a", False), ("a.detach().numpy()", True), ("a.argmax().item()", True)])
def test_a_tensor_given_to_the_environment_as_it_is_is_refused(action, rewritten):
    src = ("import torch\nimport torch.nn as nn\ntorch.manual_seed(0)\nnet = nn.Linear(3, 2)\n"
           f"def run(env, x):\n    a = net(x)\n    return env.step({action})\n")
    original, new, out, sites = harness.pair(src, "run", ID, dedent=False)
    assert bool([s for s in sites if s.action == REWRITTEN]) is rewritten, sites
    results = []
    for fn in (original, new):
        try:
            results.append(fn(_BoxEnv(), torch.ones(3)))
        except RuntimeError as exc:
            results.append(type(exc))
    assert same(results[0], results[1]), results


# phasic-policy-gradient's impala_cnn residual block: the output of bn1 was said to be "passed to
# `self.conv0(...)`", a use two lines above it (the analysis follows a name flow-insensitively).
# The reason now cites the first refused use after the binding; the verdict is the same.
RESIDUAL = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_utils as tu
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv0, self.conv1 = tu.NormedConv2d(4, 4), tu.NormedConv2d(4, 4)
        self.bn0, self.bn1 = nn.BatchNorm1d(4), nn.BatchNorm1d(4)
    def residual(self, x):
        if getattr(self, "batch_norm", True):
            x = self.bn0(x)
        x = F.relu(x, inplace=False)
        x = self.conv0(x)
        if getattr(self, "batch_norm", True):
            x = self.bn1(x)
        x = F.relu(x, inplace=True)
        x = self.conv1(x)
        print(x.sum().item())
'''


def test_a_refused_use_is_cited_in_program_order_after_its_binding():
    out, sites = rewrite(RESIDUAL, dedent=False)
    assert out == RESIDUAL
    reasons = {s.line: s.reason for s in sites if s.action == SKIPPED}
    assert "`x` (line 18) may be changed in place (inplace=True)" in reasons[17], reasons
    assert "`x` (line 15) is passed to `self.conv0(...)`" in reasons[13], reasons
    # where the block returns ``x`` the forwards are its callers' to decide: silent (as a value
    # returned before any other use always was), whatever the walk meets on the way out
    returned = RESIDUAL.replace("print(x.sum().item())", "return x")
    assert rewrite(returned, dedent=False) == (returned, [])


def test_a_callee_bound_in_the_file_is_not_said_to_be_elsewhere():
    """RL-Adventure: `Variable = lambda *args: autograd.Variable(*args)` at the top; a forward
    calling it was refused as calling code "not in this file"."""
    src = (
        "import torch\nimport torch.nn as nn\n"
        "Variable = lambda *args: torch.autograd.Variable(*args)\n"
        "class Q(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.l = nn.Linear(4, 2)\n"
        "    def forward(self, x):\n        return self.l(Variable(x))\n"
        "q = Q()\n"
        "def act(o):\n    return q(o).argmax().item()\n"
    )
    out, sites = rewrite(src, dedent=False)
    assert out == src
    (site,) = sites
    assert "`forward` (line 8) calls Variable, bound to a lambda (line 3), which is not followed" in site.reason, site


# Deep-Reinforcement-Learning-Hands-On's seq2seq model (Chapter14/libbots/model.py): an LSTM given a
# PackedSequence returns one, and `out.data` is its packed tensor, graph and all (not Tensor.data).
# `.data` was taken for an end: the decoder ran under no_grad and teacher-forced training gave the
# decoder and the encoder (through hid) no gradient at all.
PACKED = '''
import torch
import torch.nn as nn
import torch.nn.utils.rnn as rnn_utils
class PhraseModel(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.decoder = nn.LSTM(input_size=5, hidden_size=7, num_layers=1, batch_first=True)
        self.output = nn.Linear(7, 3)
    def decode_teacher(self, hid, input_seq):
        out, _ = self.decoder(input_seq, hid)
        out = self.output(out.data)
        return out
    def greedy(self, hid, input_seq):
        out, _ = self.decoder(input_seq, hid)
        return END
def run(x, h):
    net = PhraseModel()
    packed = rnn_utils.pack_padded_sequence(x, [4, 2], batch_first=True)
    loss = net.decode_teacher((h, torch.zeros(1, 2, 7)), packed).pow(2).sum()
    loss.backward()
    return loss, net.decoder.weight_ih_l0.grad, h.grad, net.greedy((h, torch.zeros(1, 2, 7)), packed)
'''


@pytest.mark.parametrize("end, rewritten", [
    ("out.data.max(1)[1]", True),                # the indices of a max: no gradient, tensor or not
    ("out.data.detach()", True),
    ("out.data", False),                         # returned: a PackedSequence's data keeps its graph
])
def test_data_of_an_element_of_a_forwards_result_is_not_an_end(end, rewritten):
    original, new, out, sites = harness.pair(PACKED.replace("END", end), "run", ID, dedent=False)
    assert "self.decoder(input_seq, hid)\n        out = self.output(out.data)" in out, out  # decode_teacher kept
    greedy = [s for s in sites if s.action == REWRITTEN]
    assert bool(greedy) is rewritten and all(s.line == 16 for s in greedy), [s.describe() for s in sites]
    x = torch.randn(2, 4, 5)
    results = [fn(x, torch.zeros(1, 2, 7, requires_grad=True)) for fn in (original, new)]
    assert results[0][1] is not None and results[0][2] is not None
    assert all(same(a.detach(), b.detach()) for a, b in zip(results[0][:3], results[1][:3])), results


def test_data_of_an_indexed_element_of_a_forwards_result_is_not_an_end():
    """The same PackedSequence reached by an index, ``self.decoder(input_seq, hid)[0].data``: it
    was still taken for an end (the decoder ran under no_grad, the gradients were None). An
    index into a name bound to the whole result (``res[0].data``) is the same case."""
    for teacher in ("out = self.output(self.decoder(input_seq, hid)[0].data)",
                    "res = self.decoder(input_seq, hid)\n        out = self.output(res[0].data)"):
        code = PACKED.replace("out, _ = self.decoder(input_seq, hid)\n        out = self.output(out.data)", teacher)
        original, new, out, sites = harness.pair(code.replace("END", "out.data.detach()"), "run", ID, dedent=False)
        assert teacher in out, out  # decode_teacher kept as written
        x = torch.randn(2, 4, 5)
        results = [fn(x, torch.zeros(1, 2, 7, requires_grad=True)) for fn in (original, new)]
        assert results[1][1] is not None and results[1][2] is not None
        assert all(same(a.detach(), b.detach()) for a, b in zip(results[0][:3], results[1][:3])), results


# A forward read only for its shape, as an index or as a test: MushroomRL's networks size their
# head with ``np.prod(self._h3(self._h2(self._h1(dummy_obs))).shape)``; the site's reason said the
# outputs "end in nothing", which is false (they end in .shape).
@pytest.mark.parametrize("use, end", [
    ("n = int(np.prod(net(x).shape))", ".shape"),
    ("n = table[net(x)]", "an index"),
    ("n = 1 if net(x) else 0", "a test"),
    ("n = net(x).dtype", ".dtype"),
])
def test_the_reason_names_where_a_forward_read_for_its_metadata_ends(use, end):
    src = f'''
import numpy as np
import torch, torch.nn as nn
net = nn.Linear(3, 1)
table = torch.arange(12.0).view(4, 3)
def f(x):
    {use}
    return n
'''
    out, sites = rewrite(src)
    done = [s for s in sites if s.action == REWRITTEN]
    assert len(done) == 1, [s.describe() for s in sites]
    assert f"its outputs end in {end} and reach no gradient" in done[0].reason, done[0].reason
    assert "end in nothing" not in done[0].reason
    original, rewritten = harness.load(src, "f"), harness.load(out, "f")
    results = []
    for fn in (original, rewritten):
        try:
            results.append(fn(torch.full((3,), 0.25)))
        except IndexError as exc:  # a float tensor as an index: raised alike
            results.append(type(exc))
    assert same(*results)


def test_a_forward_whose_output_is_never_read_still_ends_in_nothing():
    src = '''
import torch, torch.nn as nn
net = nn.Linear(3, 1)
def f(x):
    y = net(x)
    return 1
'''
    out, sites = rewrite(src)
    done = [s for s in sites if s.action == REWRITTEN]
    assert len(done) == 1 and "its outputs end in nothing" in done[0].reason, [s.describe() for s in sites]


# Popular-RL-Algorithms' policy networks bind a torch function to a name in `forward`
# (`activation = F.relu`) and call the name; the acting forward was refused as calling a name
# "bound to `F.relu`, which is not followed". A name bound only to functions of torch or numpy is
# that function; one bound to anything else stays unknown.
ALIAS = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
BINDING
class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l1 = nn.Linear(3, 8)
        self.l2 = nn.Linear(8, 2)
    def forward(self, x):
        LOCAL
        return self.l2(activation(self.l1(x)))
policy = Policy()
def act(x):
    a = policy(torch.tensor(x))
    return a.detach().numpy()
'''


@pytest.mark.parametrize("binding, local", [
    ("", "activation = F.relu"),
    ("", "activation = torch.tanh"),
    ("", "activation = F.relu if self.l1.in_features > 2 else torch.tanh"),
    ("activation = F.leaky_relu", "pass"),
    ("from torch.nn.functional import elu as activation", "pass"),
])
def test_a_name_bound_to_a_torch_function_is_that_function(binding, local):
    src = ALIAS.replace("BINDING", binding).replace("LOCAL", local)
    original, new, out, sites = harness.pair(src, "act", ID)
    assert [s.action for s in sites] == [REWRITTEN], sites
    assert "torch.no_grad()" in out
    x = [[1.0, -2.0, 3.0], [0.5, -1.0, 2.0]]
    a, b = original(x), new(x)
    assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("binding, local, why", [
    # rebound by a function that declares it global: the module's assignment is not all it holds
    ("activation = F.relu\ndef use_memo():\n    global activation\n    activation = lambda t: t", "pass", "activation"),
    # a function touching autograd, or one changing its argument in place
    ("", "activation = torch.autograd.Variable", "autograd"),
    ("", "activation = torch.Tensor.relu_", "activation"),
    # a choice where one side is not a torch function
    ("def mine(t):\n    return t", "activation = F.relu if self.l1.in_features > 2 else mine", "activation"),
])
def test_a_name_bound_to_anything_else_stays_unknown(binding, local, why):
    src = ALIAS.replace("BINDING", binding).replace("LOCAL", local)
    out, sites = rewrite(src)
    assert "no_grad" not in out
    assert [s.action for s in sites] == [SKIPPED], sites
    assert why in sites[0].reason, sites


def test_a_call_of_a_method_that_trains_says_so():
    """Popular-RL-Algorithms' PPO calls `self.a_train(...)` from `update`; the refusal named the
    first call the analysis could not follow (`self.actor_optimizer.zero_grad, whose code is not
    in this file`), true but beside the point: the method runs a backward pass."""
    src = (
        "import torch\nimport torch.nn as nn\n"
        "class PPO:\n"
        "    def __init__(self):\n        self.actor = nn.Linear(3, 2)\n"
        "        self.opt = torch.optim.Adam(self.actor.parameters())\n"
        "    def a_train(self, s):\n"
        "        self.opt.zero_grad()\n"
        "        loss = self.actor(s).sum()\n"
        "        loss.backward()\n"
        "        self.opt.step()\n"
        "    def update(self, s):\n"
        "        self.a_train(s)\n"
    )
    out, sites = rewrite(src, dedent=False)
    assert out == src
    assert [s.action for s in sites] == [SKIPPED, SKIPPED], sites
    site = sites[1]
    assert "`a_train` (line 7) trains: it calls loss.backward() (line 10)" in site.reason, site


def test_a_method_that_runs_forwards_inside_is_a_call_not_a_forward():
    """MrSyee/pg-is-all-you-need: ``action = self.select_action(state)`` and
    ``self.update_model(next_state)`` were labelled "forward of self.select_action" and "forward
    of self.update_model: `update_model` (line 212) trains"; neither is a forward (they run
    forwards inside). A call of a module (torch's, or a forward of the file) keeps "forward of"."""
    src = (
        "import torch\nimport torch.nn as nn\n"
        "class Agent:\n"
        "    def __init__(self):\n"
        "        self.actor = nn.Linear(3, 1)\n"
        "        self.opt = torch.optim.Adam(self.actor.parameters())\n"
        "        self.kept = []\n"
        "    def select_action(self, s):\n"
        "        a = self.actor(s)\n"
        "        self.kept.append(a)\n"
        "        return a.detach().numpy()\n"
        "    def update_model(self, s):\n"
        "        loss = self.actor(s).sum()\n"
        "        self.opt.zero_grad()\n"
        "        loss.backward()\n"
        "        self.opt.step()\n"
        "    def train(self, states):\n"
        "        for s in states:\n"
        "            action = self.select_action(s)\n"
        "            self.update_model(s)\n"
        "            print(self.actor(s).sum().item())\n"
    )
    sites = rewrite(src, dedent=False)[1]
    labels = {s.line: s.reason.split(":")[0] for s in sites}
    assert labels[19] == "call of self.select_action" and labels[20] == "call of self.update_model", sites
    assert labels[21] == "forward of self.actor runs under torch.no_grad()", sites
