"""hot.distribution_args on ``Categorical(probs)`` from a softmax: which calls are rewritten (and
which look-alikes are not), bitwise equality with the original on the same seeds, and the run-time
bound of runtime/hot_distributions.py (its worst case passes torch's simplex check; beyond it, and
for a softmax not over the last dim, the original, validating path is taken).
"""
import textwrap

import pytest
import torch
from torch.distributions import Categorical, constraints

from scalebox_cst.report import EXACT, REWRITTEN, SKIPPED
from scalebox_cst.runtime.hot_distributions import BOUNDS, categorical_probs
from scalebox_cst.transforms.hot import distributions
import harness

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\nfrom torch.distributions import Categorical\n"

MODEL = HEAD + '''
class Net(nn.Module):
    def __init__(self, n):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, n)
        self.sm = nn.Softmax(dim=-1)
    def pi(self, x, softmax_dim=0):
        x = self.fc(x)
        prob = F.softmax(x, dim=softmax_dim)
        return prob
    def pi_sm(self, x):
        return self.sm(self.fc(x))
    def forward(self, x):
        return self.fc(x).softmax(dim=-1)
    def both(self, x):
        action_prob = F.softmax(self.fc(x), dim=-1)
        value = x.sum()
        return action_prob, value
    def redo(self, x):
        x = self.fc(x)
        x = F.softmax(x, dim=0)
        return x
'''

#: (body of f(net, s), note): each builds the distribution as public scripts do
REWRITTEN_CASES = [
    ("prob = net.pi(s)\n    m = Categorical(prob)", "minimalRL: a method returning F.softmax(dim=param)"),
    ("m = Categorical(probs=net.pi_sm(s))", "an nn.Softmax(dim=-1) attribute"),
    ("m = Categorical(net(s))", "forward returning .softmax(dim=-1)"),
    ("probs = torch.softmax(net.fc(s), -1)\n    m = Categorical(probs)", "torch.softmax bound once"),
    ("m = Categorical(F.softmax(net.fc(s), dim=1))", "pytorch/examples: dim=1 literal"),
    ("probs, v = net.both(s)\n    m = Categorical(probs)", "pytorch/examples actor-critic: a tuple's [0]"),
    ("prob = net.redo(s)\n    m = Categorical(prob)\n    keep = [prob[0]]", "minimalRL REINFORCE: x rebound, kept after"),
]


def rewrite(src):
    return harness.rewrite(src, distributions.ID)


def program(body):
    return MODEL + f"\ndef f(n, s, seed, init=None):\n    net = Net(n)\n    if init is not None:\n        init(net)\n    {body}\n    torch.manual_seed(seed)\n" \
        "    a = m.sample()\n    return a, m.log_prob(a), m.entropy(), m.probs, getattr(m, '_validate' + '_args')\n"  # read so the file is not taken to set it


def same(a, b):
    a, b = a.detach().reshape(-1), b.detach().reshape(-1)
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("body,note", REWRITTEN_CASES, ids=[c[1][:30] for c in REWRITTEN_CASES])
@pytest.mark.parametrize("n", [2, 6])
def test_rewritten_and_bitwise(body, note, n):
    src = program(body)
    out, sites = rewrite(src)
    done = [s for s in sites if s.action == REWRITTEN]
    assert len(done) == 1 and done[0].exactness == EXACT and "_sb_categorical_probs(Categorical" in out
    assert len(done[0].reason) <= 300 and "no longer raise" in done[0].reason
    orig, new = harness.load(src, "f", filename="<o>"), harness.load(out, "f", filename="<n>")
    fast = 0
    for seed in range(6):
        g = torch.Generator().manual_seed(seed)
        shape = (4,) if seed % 2 or "dim=1" not in body else (3, 4)
        s = torch.randn(*shape, generator=g) * (10 if seed > 3 else 1)
        if "dim=1" in body:
            s = s.reshape(-1, 4)
        ro, rn = orig(n, s, seed), new(n, s, seed)
        assert all(same(x, y) for x, y in zip(ro[:4], rn[:4]))
        assert ro[4] is True  # the original validates
        fast += rn[4] is False
    assert fast == 6  # within the bound, over the last dim: no validation


def test_reason_says_what_the_bound_limits():
    """The newcomer's walkthrough (Lizhi-sjtu PPO-discrete: ``Categorical(probs=self.actor(s))``)
    read "probs are self.actor(...) returns a softmax (dim 1): no validation where rows are at
    most the dtype's bound": what the bound limits is a row's number of entries, and the probs'
    origin is a clause of its own."""
    out, sites = rewrite(program("m = Categorical(probs=net(s))"))
    reason = next(s.reason for s in sites if s.action == REWRITTEN)
    assert reason.startswith("Categorical(probs): probs: net(...) returns a softmax (dim -1): ")
    assert "where a row (the last dim) has at most the dtype's bound of entries (float32: 8)" in reason
    assert "probs are" not in reason and "rows are at most" not in reason


SEQUENTIAL = HEAD + """
class Actor(nn.Module):
    def __init__(self, n):
        super().__init__()
        torch.manual_seed(0)
        self.actor = nn.Sequential(
                nn.Linear(4, 8),
                nn.ReLU(),
                nn.Linear(8, n),
                nn.Softmax(dim=-1)
        )
    def forward(self, state):
        dist = self.actor(state)
        dist = Categorical(dist)
        return dist
def f(n, s, seed):
    net = Actor(n)
    m = net(s)
    torch.manual_seed(seed)
    a = m.sample()
    return a, m.log_prob(a), m.entropy(), m.probs, getattr(m, '_validate' + '_args')
"""


def test_a_sequential_ending_in_softmax_rebound_to_its_distribution():
    """philtabor's PPO (ReinforcementLearning/PolicyGradient/PPO/torch/ppo_torch.py): the actor is
    ``nn.Sequential(..., nn.Softmax(dim=-1))`` and forward says ``dist = self.actor(state)``,
    ``dist = Categorical(dist)``. Both were refused ("probs not provably an unmodified softmax"):
    the Sequential was not followed to its last layer, and a statement naming the probs twice was
    refused even where the second is only its target, bound after the call."""
    out, sites = rewrite(SEQUENTIAL)
    done = [s for s in sites if s.action == REWRITTEN]
    assert len(done) == 1 and "`dist` = an nn.Sequential ending in nn.Softmax (dim -1)" in done[0].reason, sites
    orig, new = harness.load(SEQUENTIAL, "f", filename="<o>"), harness.load(out, "f", filename="<n>")
    for seed in range(4):
        s = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed)) * (10 if seed > 1 else 1)
        ro, rn = orig(3, s, seed), new(3, s, seed)
        assert all(same(x, y) for x, y in zip(ro[:4], rn[:4])) and ro[4] is True and rn[4] is False


@pytest.mark.parametrize("change", [
    "net.actor[-1] = nn.Identity()", "del net.actor[3]", "net.actor.append(nn.Identity())",
    "net.actor.insert(4, nn.Identity())", "net.actor += nn.Sequential(nn.Identity())",
    "setattr(net.actor, '3', nn.Identity())", "net.actor.register_forward_hook(lambda m, i, o: o * 2)",
])
def test_a_sequential_whose_layers_may_change_is_left_alone(change):
    src = SEQUENTIAL.replace("    m = net(s)\n", f"    {change}\n    m = net(s)\n")
    assert change in src
    out, sites = rewrite(src)
    assert not [s for s in sites if s.action == REWRITTEN], sites


def test_a_walrus_rebinding_the_probs_inside_the_call_is_left_alone():
    src = SEQUENTIAL.replace("dist = Categorical(dist)", "dist = Categorical(dist if (dist := dist * 2) is None else dist)")
    assert "dist := dist * 2" in src
    out, sites = rewrite(src)
    assert not [s for s in sites if s.action == REWRITTEN], sites


def test_non_last_dim_takes_the_validating_path():
    """minimalRL's pi(x, softmax_dim=0) on a batch: the softmax is over dim 0, its rows need not
    sum to anything, a row may even be all zeros -- the original raises there and so must the rewrite."""
    src = program("prob = net.pi(s)\n    m = Categorical(prob)")
    out, _ = rewrite(src)
    orig, new = harness.load(src, "f", filename="<o>"), harness.load(out, "f", filename="<n>")

    def init(net):
        with torch.no_grad():
            net.fc.weight.zero_()
            net.fc.bias.zero_()
            net.fc.weight[:, 0] = torch.tensor([1.0, 1.0])  # logits [[0, 0], [-200, -200]] over dim 0
    s = torch.tensor([[0.0, 0, 0, 0], [-200.0, 0, 0, 0]])
    for fn in (orig, new):
        with pytest.raises(ValueError):
            fn(2, s, 0, init)
    ok = torch.tensor([[0.0, 0, 0, 0], [0.5, 0, 0, 0]])
    assert new(2, ok, 0, init)[4] is True  # 2-D, dim unknown: validated as written


LOOKALIKES = [
    ("p = s.exp()\n    m = Categorical(p / p.sum())", "normalised by hand"),
    ("m = Categorical(torch.tensor([0.5, 0.5]))", "a probs list"),
    ("prob = F.softmax(s, dim=-1)\n    prob[0] = 0.9\n    m = Categorical(prob)", "softmax then edited"),
    ("prob = F.softmax(s, dim=-1)\n    prob.mul_(2)\n    m = Categorical(prob)", "softmax then edited in place"),
    ("prob = F.softmax(s, dim=-1)\n    prob = prob * 2\n    m = Categorical(prob)", "softmax rebound"),
    ("prob = F.softmax(s, dim=-1)\n    tweak(prob)\n    m = Categorical(prob)", "softmax passed to user code"),
    ("m = Categorical(F.softmax(s, dim=-1), validate_args=True)", "validate_args given"),
    ("m = Categorical(probs=F.softmax(s, dim=-1), logits=None)", "extra argument"),
    ("m = Categorical(maybe(s))", "a function that sometimes returns something else"),
    ("m = Categorical(falls(s))", "a function that may fall off its end"),
    ("m = Categorical(deco(s))", "a decorated function"),
    ("m = Categorical(F.softmax(s, dim=-1) + 0.0)", "softmax then modified"),
    ("m = Categorical(s.softmax(-1) ** 2)", "softmax squared"),
    ("prob = F.softmax(s, dim=-1)\n    q = prob\n    q[0] = 0.9\n    m = Categorical(prob)", "edited via an alias"),
    ("prob = F.softmax(s, dim=-1)\n    v = prob[0:1]\n    v.zero_()\n    m = Categorical(prob)", "edited via a view"),
    ("prob = F.softmax(s, dim=-1)\n    if s.sum() > 0:\n        prob = s\n    m = Categorical(prob)", "rebound on a branch"),
    ("prob, v = pair(s)\n    m = Categorical(prob)", "a tuple whose [0] is no softmax"),
    ("m = Categorical(stored(s))", "a function that keeps its softmax"),
    ("m = Categorical(edits(s))", "a function that edits its softmax"),
    ("m = Categorical(F.softmax(s))", "implicit dim (statically unknown): rewritten"),
    ("def g():\n        prob.zero_()\n    prob = F.softmax(s, dim=-1)\n    g()\n    m = Categorical(prob)",
     "edited by a closure"),
]
HELPERS = '''
def tweak(p):
    p[0] = 0.9
def maybe(x):
    if x.sum() > 0:
        return F.softmax(x, dim=-1)
    return x
def falls(x):
    if x.sum() > 0:
        return F.softmax(x, dim=-1)
def pair(x):
    return x, F.softmax(x, dim=-1)
KEPT = []
def stored(x):
    p = F.softmax(x, dim=-1)
    KEPT.append(p)
    return p
def edits(x):
    p = F.softmax(x, dim=-1)
    p[0] = 1.0
    return p
def memo(fn):
    return fn
@memo
def deco(x):
    return F.softmax(x, dim=-1)
'''


@pytest.mark.parametrize("body,note", LOOKALIKES, ids=[c[1][:30] for c in LOOKALIKES])
def test_lookalikes_left_alone(body, note):
    src = HEAD + HELPERS + f"\ndef f(s):\n    {body}\n    return m\n"
    out, sites = rewrite(src)
    if note.endswith("rewritten"):  # the guard decides at run time (1-D only)
        assert out != src and any(s.action == REWRITTEN for s in sites)
        return
    assert out == src, note
    assert any(s.action == SKIPPED for s in sites)


def test_subclass_override_and_softmax_dim_change_refused():
    base = HEAD + "class Base(nn.Module):\n    def pi(self, x):\n        return F.softmax(x, dim=-1)\n" \
        "    def act(self, s):\n        prob = self.pi(s)\n        return Categorical(prob)\n"
    assert rewrite(base)[0] != base  # Base alone: rewritten
    over = base + "class Sub(Base):\n    def pi(self, x):\n        return x\n"
    assert rewrite(over)[0] == over  # a subclass's pi may run instead
    dim = MODEL + "net = Net(2)\nnet.sm.dim = 0\nm = Categorical(net.pi_sm(torch.ones(2, 4)))\n"
    assert rewrite(dim)[0] == dim
    glob = HEAD + "def f(s):\n    global prob\n    prob = F.softmax(s, dim=-1)\n    g()\n    return Categorical(prob)\n"
    assert rewrite(glob)[0] == glob


def test_forward_hook_in_file_refuses_module_output():
    src = MODEL + "net = Net(2)\nnet.register_forward_hook(lambda m, i, o: o * 2)\nm = Categorical(net(torch.ones(4)))\n"
    out, _ = rewrite(src)
    assert out == src


def test_user_default_kept():
    src = HEAD + "torch.distributions.Distribution.set_default_validate_args(True)\n" \
        "m = Categorical(F.softmax(torch.ones(3), dim=-1))\n"
    assert rewrite(src)[0] == src


# ------------------------------------------------------------------ the run-time bound


def _extreme_logits(n, trials, g):
    yield torch.zeros(trials, n)  # all equal: 1/n each, the sum's rounding at its worst
    yield torch.randn(trials, n, generator=g)
    yield torch.randn(trials, n, generator=g) * 30
    yield torch.randn(trials, n, generator=g) * 1e4  # one entry near 1, the rest underflowing
    yield torch.rand(trials, n, generator=g) * 1e-6  # nearly equal
    yield torch.randint(-2, 3, (trials, n), generator=g).double() * 17.3  # ties
    x = torch.full((trials, n), -88.0)
    x[:, 0] = 0
    yield x  # one 1, the rest denormal-small


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_bound_passes_the_simplex_check(dtype):
    """At n = the dtype's bound, softmax probs renormalised as Categorical does pass the check the
    original runs (what the fast path skips), on random and extreme logits."""
    n = BOUNDS[dtype]
    trials = 4 if n > 4096 else 4096
    g = torch.Generator().manual_seed(n)
    for logits in _extreme_logits(n, trials, g):
        for k in (1, n):  # the bound itself and 1
            p = torch.softmax(logits[:, :k].to(dtype), dim=-1)
            d = categorical_probs(Categorical, p, -1)
            assert d._validate_args is False
            q = p / p.sum(-1, keepdim=True)
            assert bool(constraints.simplex.check(q).all()), (dtype, k)
            assert torch.equal(d.probs, q)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_beyond_bound_takes_the_original_path(dtype):
    n = BOUNDS[dtype] + 1
    p = torch.softmax(torch.randn(3, n), -1).to(dtype)
    assert categorical_probs(Categorical, p, -1)._validate_args is True
    bad = torch.full((n,), float("nan"), dtype=dtype)
    with pytest.raises(ValueError):
        categorical_probs(Categorical, bad, -1)


def test_guard_cases():
    p = torch.softmax(torch.randn(2, 3), -1)
    assert categorical_probs(Categorical, p, -1)._validate_args is False
    assert categorical_probs(Categorical, p, 1)._validate_args is False
    assert categorical_probs(Categorical, p, 0)._validate_args is True  # not the last dim
    assert categorical_probs(Categorical, p, None)._validate_args is True  # unknown dim, 2-D
    assert categorical_probs(Categorical, p[0], None)._validate_args is False  # 1-D: dim 0 is the last
    with pytest.raises(ValueError):
        categorical_probs(Categorical, torch.ones(0), -1)  # no entries: the original's check raises
    with pytest.raises(ValueError):
        categorical_probs(Categorical, torch.tensor(1.0), None)  # 0-d: raises as the original does
    with pytest.raises(AttributeError):
        categorical_probs(Categorical, [0.5, 0.5], None)  # not a tensor: exactly the original call (which fails)


def test_no_grad_still_sees_the_action_selection():
    """hot.distribution_args runs before hot.no_grad: the helper call in place of Categorical(prob)
    must not hide minimalRL's action selection from no_grad (it did before callees.ENGINE_PURE)."""
    from scalebox_cst.transforms.hot import no_grad
    src = MODEL + textwrap.dedent('''
    def rollout(env_s):
        model = Net(2)
        total = 0
        for t in range(3):
            prob = model.pi(torch.as_tensor(env_s))
            m = Categorical(prob)
            a = m.sample().item()
            total += a
        return total
    ''')
    first, _ = rewrite(src)
    assert "_sb_categorical_probs(" in first
    _, sites = harness.rewrite(first, no_grad.ID)
    assert any(s.action == REWRITTEN for s in sites), [s.reason for s in sites]


def test_annotation_without_value_binds_nothing():
    # ``x: T`` (no value) in a function whose returned name is checked for changes: it neither aliases
    # the softmax nor fails the file (the old check walked the missing value: AttributeError)
    for ann in ("note: int", "p: torch.Tensor"):
        src = HEAD + f"def g(s):\n    {ann}\n    p = F.softmax(s, dim=-1)\n    if s.dim() > 1:\n        return p\n" \
            "    return p\ndef f(s):\n    m = Categorical(g(s))\n    return m\n"
        out, sites = rewrite(src)
        assert "_sb_categorical_probs(Categorical" in out and [s.action for s in sites] == [REWRITTEN], ann


def test_softmax_of_a_rebound_module_alias_is_no_tensor_method():
    """machin's test/auto/env/test_openai_gym.py imports ``torch as t`` and binds ``t = Thread(...)``
    in another function: the alias is ambiguous (not qualified), and ``t.softmax(self.fc3(a), dim=1)``
    was read as a tensor's ``x.softmax(dim)``, its input taken for a second dim: rewritten, reason
    'a softmax (dim not a literal)', a helper call that takes the validating path for every 2-D batch.
    A method of a name an import binds is a module's function, not provably torch's: left alone."""
    src = ("import torch as t\nfrom torch.distributions import Categorical\n\n\n"
           "def act(x):\n    probs = t.softmax(x, dim=1)\n    return Categorical(probs=probs)\n\n\n"
           "def launch():\n    t = object()\n    return t\n")
    out, sites = rewrite(src)
    assert out == src
    assert [s.action for s in sites] == [SKIPPED]
    plain = src.replace("    t = object()\n    return t\n", "    return None\n")
    out, sites = rewrite(plain)  # the alias bound once: torch.softmax, dim 1
    assert [s.action for s in sites] == [REWRITTEN] and "(dim 1)" in sites[0].reason
