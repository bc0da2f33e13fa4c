"""accelerate.defer_sync and runtime/deferred.py: logged .item() numbers read when their loop ends.

What is checked: nothing happens at the default level; at level "reassociated" the examples are
rewritten (every site ``reassociated``) or left byte for byte with their reason; original and
rewrite, run on the same seed with the runtime deferring CPU tensors too (so the deferral path
runs here), log the same calls in the same order with bitwise the same numbers and print the
same lines, while the rewrite's numbers are read at the loop's end (fewer reads than logs); a
logged tensor changed in place after its ``.item()`` keeps its logged value; an exception in the
loop still writes what was logged before it; a mutable argument flushes and calls at once;
``--fast`` turns the transform on.
"""
import contextlib
import io
import sys
import time
import types

import harness
import pytest
import torch

from scalebox_cst.config import Config
from scalebox_cst.report import REASSOCIATED, REWRITTEN
from scalebox_cst.runtime import deferred as rd
from scalebox_cst.transforms import REGISTRY
from scalebox_cst.transforms.accelerate.defer_sync import ID, AccelerateDeferSync

from conftest import scalebox


def rewrite(code, level="reassociated", backend="cuda"):
    return harness.rewrite(code, ID, backend, dedent=False, options={"accelerate": {"level": level}} if level else None)


def _walltime(kwargs):
    """The rewrite passes the step's wall time (taken where the call stood, before this call runs)."""
    walltime = kwargs.pop("walltime", None)
    assert walltime is None or (isinstance(walltime, float) and walltime <= time.time())
    return kwargs


class _Writer:
    """Records each call (the arguments' repr: floats bitwise)."""

    def __init__(self, log, *args, **kwargs):
        self.log = log

    def add_scalar(self, *args, **kwargs):
        self.log.append(("add_scalar", repr(args), repr(sorted(_walltime(kwargs).items()))))

    def add_scalars(self, *args, **kwargs):
        self.log.append(("add_scalars", repr(args), repr(sorted(_walltime(kwargs).items()))))

    def add_histogram(self, *args, **kwargs):
        self.log.append(("add_histogram", args[0]))

    def close(self):
        self.log.append(("close",))


def run(code, monkeypatch):
    """The script's writer calls and stdout, with CPU tensors deferred like device ones."""
    log = []
    fake = types.ModuleType("tensorboardX")
    fake.SummaryWriter = lambda *a, **k: _Writer(log, *a, **k)
    monkeypatch.setitem(sys.modules, "tensorboardX", fake)
    monkeypatch.setattr(rd, "DEFER_ON_CPU", True)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        harness.load(code, filename="<script>", module="__main__")
    return log, out.getvalue()


def test_registered_and_off_at_the_default_level():
    assert ID in [cls.id for cls in REGISTRY]
    assert Config().transform_enabled(ID)
    for example in AccelerateDeferSync.EXAMPLES:
        for level in (None, "exact"):
            out, sites = rewrite(example.code, level)
            assert out == example.code and not sites


@pytest.mark.parametrize("example", [e for e in AccelerateDeferSync.EXAMPLES if e.rewritten], ids=lambda e: e.note[:40])
def test_examples_log_the_same_in_batches(example, monkeypatch):
    """Outputs and reasons: tests/transforms/test_examples_registry.py. Here: the whole script, run
    both ways with a recording writer."""
    out, sites = rewrite(example.code)
    done = [s for s in sites if s.action == REWRITTEN]
    assert done and all(s.exactness == REASSOCIATED and len(s.reason) <= 300 for s in done)
    assert "written after the loop's other output" in done[0].reason
    before = dict(rd.STATS)
    torch.manual_seed(0)
    original = run(example.code, monkeypatch)
    assert rd.STATS == before  # the original does not touch the runtime
    torch.manual_seed(0)
    rewritten = run(out, monkeypatch)
    assert rewritten == original  # same calls, same order, bitwise the same numbers (repr), same stdout
    deferred = rd.STATS["deferred"] - before["deferred"]
    flushes = rd.STATS["flushes"] - before["flushes"]
    assert deferred > 0 and 0 < flushes < deferred  # the numbers were read in batches, not one by one


def test_logs_are_written_when_the_loop_ends(monkeypatch):
    """The timing changes (why the tier is reassociated): a writer that prints shows its calls after
    the loop's own prints; the same lines, in another interleaving."""
    code = """\
import torch
from tensorboardX import SummaryWriter

writer = SummaryWriter("runs/x")
w = torch.arange(3.0)
for it in range(2):
    for step in range(3):
        writer.add_scalar("w", w[step].item(), step)
        print("minibatch", step)
"""
    out, sites = rewrite(code)
    assert [s.action for s in sites] == [REWRITTEN]
    monkeypatch.setattr(_Writer, "add_scalar", lambda self, *a, **k: print("logged", *a))
    assert "walltime=_sbx_defer.now()" in out
    _, original = run(code, monkeypatch)
    _, rewritten = run(out, monkeypatch)
    assert original.splitlines()[:2] == ["logged w 0.0 0", "minibatch 0"]
    assert rewritten.splitlines()[:4] == ["minibatch 0", "minibatch 1", "minibatch 2", "logged w 0.0 0"]
    assert sorted(original.splitlines()) == sorted(rewritten.splitlines())


def test_in_place_change_after_the_item_keeps_the_logged_value(monkeypatch):
    code = """\
import torch


def update(w):
    seen = []
    for step in range(4):
        seen.append(w.sum().item())
        seen.append(w[0].item())
        w.add_(1.0)
    return seen


for it in range(2):
    print(update(torch.zeros(3)))
"""
    out, sites = rewrite(code)
    assert [s.action for s in sites] == [REWRITTEN, REWRITTEN]
    original = run(code, monkeypatch)
    assert original[1].splitlines()[0] == "[0.0, 0.0, 3.0, 1.0, 6.0, 2.0, 9.0, 3.0]"
    assert run(out, monkeypatch) == original
    # what the copy protects against: keeping the tensor itself would log the final value
    class NoCopy(rd.Deferred):
        def _keep(self, x, convert):
            return rd._Item(x.detach().reshape(()), convert)
    monkeypatch.setattr(rd, "Deferred", NoCopy)
    assert run(out, monkeypatch) != original


def test_an_exception_in_the_loop_still_writes_what_was_logged(monkeypatch):
    code = """\
import torch
from tensorboardX import SummaryWriter

writer = SummaryWriter("runs/x")
w = torch.arange(5.0)
for it in range(1):
    for step in range(5):
        writer.add_scalar("w", w[step].item(), step)
        if step == 2:
            raise ValueError("stop")
"""
    out, sites = rewrite(code)
    assert any(s.action == REWRITTEN for s in sites)
    for src in (code, out):
        log = []
        fake = types.ModuleType("tensorboardX")
        fake.SummaryWriter = lambda *a, **k: _Writer(log, *a, **k)
        monkeypatch.setitem(sys.modules, "tensorboardX", fake)
        monkeypatch.setattr(rd, "DEFER_ON_CPU", True)
        with pytest.raises(ValueError):
            harness.load(src, filename="<s>")
        assert log == [("add_scalar", repr(("w", float(i), i)), "[]") for i in range(3)]


def test_runtime_mutable_argument_flushes_and_calls_at_once(monkeypatch):
    monkeypatch.setattr(rd, "DEFER_ON_CPU", True)
    got = []
    d = rd.Deferred("t")
    d.call(got.append, d.item(torch.tensor(1.5)))
    holder = [0]
    d.call(got.append, holder)  # a list a name holds: may change before the flush
    assert got == [1.5, [0]]
    d.call(got.append, d.float(torch.tensor(2)))
    d.call(got.append, {"a": d.item(torch.tensor(True)), "b": 3})
    assert got == [1.5, [0]]
    d.flush()
    assert got == [1.5, [0], 2.0, {"a": True, "b": 3}] and type(got[2]) is float
    d.call(lambda x, h: got.append((x, h)), d.item(torch.tensor(0.5)), holder)  # kept number and a mutable list
    assert got[-1] == (0.5, [0]) and not d.calls
    with pytest.raises(RuntimeError):
        d.item(torch.zeros(2))  # .item() of two elements raises where the original did


def test_left_alone_for_cpu_with_the_measured_reason():
    example = AccelerateDeferSync.EXAMPLES[0]
    out, sites = rewrite(example.code, backend="cpu")
    assert out == example.code and not [s for s in sites if s.action == REWRITTEN]
    skipped = [s for s in sites if "would be read after the loop" in s.reason]
    assert len(skipped) == 2 and all("no device sync" in s.reason and len(s.reason) <= 300 for s in skipped)
    out, sites = rewrite(example.code, backend="npu")
    assert out != example.code and len([s for s in sites if s.action == REWRITTEN]) == 2


def test_cpu_tensors_are_read_at_once_by_default():
    got = []
    d = rd.Deferred("t")
    d.call(got.append, d.item(torch.tensor(0.25)))
    assert got == [0.25] and not d.calls  # no device sync to save: the original's timing


def test_fast_turns_it_on(tmp_path):
    code = AccelerateDeferSync.EXAMPLES[0].code
    (tmp_path / "train.py").write_text(code)
    fast = scalebox("rewrite", "train.py", "--fast", "--backend", "cuda", "--out", "fast", cwd=tmp_path)
    assert f"{ID} rewritten [reassociated]" in fast.stdout, fast.stdout
    assert "_sbx_defer.item(loss)" in (tmp_path / "fast" / "train.py").read_text()


def test_cleanrl_ppo_update_from_the_corpus_bitwise(monkeypatch):
    """CleanRL's update as the corpus keeps it: clipfracs per minibatch read once per epoch,
    `return clipfracs, v_loss.item(), ...` after the loop; same list, losses and parameters."""
    import os

    from conftest import ROOT

    path = os.path.join(ROOT, "tests", "corpus", "cleanrl_ppo_update.py")
    code = open(path).read()
    out, sites = rewrite(code)
    assert [(s.line, s.end_line) for s in sites if s.action == REWRITTEN] == [(20, 64)]  # the minibatch loop it wraps
    monkeypatch.setattr(rd, "DEFER_ON_CPU", True)
    results = []
    for src in (code, out):
        ns = harness.load(src, filename=path, module="corpus")
        before = rd.STATS["deferred"]
        (fracs, v_loss, pg_loss), params = ns["run"](ns, 3, 0)
        results.append((repr(fracs), repr(v_loss), repr(pg_loss), [p.tolist() for p in params], rd.STATS["deferred"] - before))
    assert results[0][:4] == results[1][:4] and len(eval(results[0][0])) == 12
    assert results[0][4] == 0 and results[1][4] == 12


JAX_LOOP = """\
import jax
import jax.numpy as jnp

def update(epochs, batches):
    means = []
    for epoch in range(epochs):
        divergences = []
        for batch in batches:
            kl = jnp.mean(batch)
            divergences.append(kl.item())
        means.append(sum(divergences) / len(divergences))
    return means
"""


def test_a_module_of_another_array_library_is_left_alone_with_its_reason():
    """Found on skrl's JAX agents: their ``kl_divergence.item()`` loops were deferred, which made
    a JAX module import torch (runtime.deferred) and claimed one sync instead of one per step."""
    out, sites = rewrite(JAX_LOOP)
    assert out == JAX_LOOP and [s.action for s in sites] == ["skipped"]
    assert "imports jax, not torch" in sites[0].reason and len(sites[0].reason) <= 300
    both = "import torch\n" + JAX_LOOP  # torch there too: its tensors may be what .item() reads
    out, sites = rewrite(both)
    assert out != both and [s.action for s in sites] == [REWRITTEN]


SB3_PPO_LOOP = """\
import torch


def train(w, optimizer, batches, epochs, verbose):
    entropy_losses = []
    pg_losses, value_losses = [], []
    for epoch in range(epochs):
        for x in batches:
            policy_loss = (x @ w).pow(2).mean()
            pg_losses.append(policy_loss.item())
            entropy_loss = -(x @ w).exp().mean()
            entropy_losses.append(entropy_loss.item())
            with torch.no_grad():
                approx_kl = (x @ w).mean().cpu().numpy()
            optimizer.zero_grad()
            policy_loss.backward()
            optimizer.step()
    return entropy_losses, pg_losses, approx_kl
"""


def test_a_loop_that_still_reads_the_device_each_step_is_left_alone():
    """Stable-Baselines3's PPO.train: of its minibatch loop's numbers only entropy_losses' could be
    deferred, while ``pg_losses.append(policy_loss.item())`` and ``.cpu().numpy()`` still wait for the
    device every step: the loop was wrapped anyway, its site claiming 'one sync instead of one per
    step' (none saved, the logs' order changed for nothing)."""
    out, sites = rewrite(SB3_PPO_LOOP)
    assert out == SB3_PPO_LOOP and not [s for s in sites if s.action == REWRITTEN], sites
    skipped = [s for s in sites if "entropy_losses.append" in s.reason]
    assert len(skipped) == 1 and "policy_loss.item()" in skipped[0].reason and len(skipped[0].reason) <= 300
    assert "deferring this one saves no wait" in skipped[0].reason
    lone = SB3_PPO_LOOP.replace("            pg_losses.append(policy_loss.item())\n", "            if verbose:\n"
                                "                pg_losses.append(policy_loss.item())\n").replace(".cpu().numpy()", "")
    out, sites = rewrite(lone)  # a read only some steps make: the others still save their sync
    assert [s.action for s in sites if s.action == REWRITTEN] == [REWRITTEN] and "_sbx_defer.item(entropy_loss)" in out
