"""precision.autocast (issue 24 part 1): the loss forward chain of each backward under autocast bf16.
Off by default; the examples; differential runs on CPU in bf16 (close, not equal: changes-semantics);
acting, targets, AMP already present and names read after the step left fp32."""
from __future__ import annotations

import ast
import json

import libcst as cst
import pytest

from scalebox_cst.config import Config
from scalebox_cst.transforms import REGISTRY
from scalebox_cst.transforms.precision import AutocastTransform
import harness

torch = pytest.importorskip("torch")

ID = AutocastTransform.id

SAC_UPDATE = """\
import torch
import torch.nn.functional as F


def update(actor, critic, critic_opt, obs, act, rew, nxt, done):
    with torch.no_grad():
        nxt_act = actor(nxt)
        target = rew + 0.99 * (1 - done) * critic(torch.cat([nxt, nxt_act], 1)).squeeze(1)
    explore = actor(obs)
    q = critic(torch.cat([obs, act], 1)).squeeze(1)
    critic_loss = F.mse_loss(q, target)
    critic_opt.zero_grad()
    critic_loss.backward()
    critic_opt.step()
    return critic_loss.item(), explore
"""


def _rewrite(code, transforms=(ID,), options=None, backend="cpu"):
    cfg = Config()
    cfg.transforms = list(transforms)
    for (section, key), value in (options or {}).items():
        cfg.set_option(section, key, value)
    out, sites = harness.rewrite(code, cfg, backend, dedent=False, path="train.py", check=False)
    return out, [s for s in sites if s.transform == ID]


def _with_blocks(code):
    return [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.With)]


def test_registered_and_off_by_default():
    assert ID in [cls.id for cls in REGISTRY]
    cfg = Config()
    assert not cfg.transform_enabled(ID)
    cfg.set_option("precision", "mode", "bf16")
    assert cfg.transform_enabled(ID)
    cfg = Config()
    cfg.transforms = ["precision.*"]
    assert cfg.transform_enabled(ID)
    out, sites = _rewrite(SAC_UPDATE, transforms=Config().transforms)
    assert "autocast" not in out and sites == []  # the default transforms (grad_clip etc.) run, this one does not


def test_only_the_loss_chain_is_wrapped_in_bf16_autocast():
    out, sites = _rewrite(SAC_UPDATE)
    [rewritten] = sites
    assert rewritten.exactness == "changes-semantics" and (rewritten.line, rewritten.end_line) == (10, 11)
    withs = _with_blocks(out)
    autocast = [w for w in withs if ast.unparse(w.items[0].context_expr).startswith("torch.autocast")]
    assert len(autocast) == 1
    assert ast.unparse(autocast[0].items[0].context_expr) == "torch.autocast(device_type='cpu', dtype=torch.bfloat16)"
    inside = [ast.unparse(s) for s in autocast[0].body]
    assert inside == ["q = critic(torch.cat([obs, act], 1)).squeeze(1)", "critic_loss = F.mse_loss(q, target)"]
    # the acting forward, the no_grad target block, zero_grad, backward and step are outside it
    assert "explore = actor(obs)" not in inside and not any("no_grad" in s for s in inside)


@pytest.mark.parametrize("backend, device_type", [("cuda", "cuda"), ("npu", "npu")])
def test_device_type_follows_the_backend(backend, device_type):
    out, _ = _rewrite(SAC_UPDATE, backend=backend)
    assert f"torch.autocast(device_type='{device_type}', dtype=torch.bfloat16)" in out


FP16_STEP = """\
import torch


def step(m, opt, x):
    loss = m(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    return loss.item()
"""


def test_fp16_threads_a_grad_scaler_through_backward_clip_and_step():
    out, sites = _rewrite(FP16_STEP, transforms=("grad_clip", ID), options={("precision", "mode"): "fp16"})
    [site] = sites
    assert site.action == "rewritten" and "GradScaler" in site.reason
    tree = ast.parse(out)
    assert any(ast.unparse(s) == "_scalebox_scaler = torch.amp.GradScaler('cpu')" for s in tree.body)
    body = [ast.unparse(s) for s in next(n for n in tree.body if isinstance(n, ast.FunctionDef)).body]
    assert body[0].startswith("with torch.autocast(device_type='cpu', dtype=torch.float16):")
    order = [body.index(s) for s in ("_scalebox_scaler.scale(loss).backward()", "_scalebox_scaler.unscale_(opt)",
                                     "torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)",
                                     "_scalebox_scaler.step(opt)", "_scalebox_scaler.update()")]
    assert order == sorted(order)  # unscale before the clip and the guard, step then update
    guard = next(s for s in body if s.startswith("_scalebox_stabilize("))
    assert "scaler=_scalebox_scaler" in guard and body.index(guard) < body.index("_scalebox_scaler.step(opt)")
    # runs (CPU fp16 autocast): finite losses close to fp32's, weights fp32
    runs = []
    for code in (FP16_STEP, out):
        ns = harness.load(code, filename="train.py")
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(3)
        runs.append([ns["step"](m, opt, torch.randn(16, 8, generator=g)) for _ in range(5)])
        assert all(p.dtype == torch.float32 for p in m.parameters())
    for a, b in zip(*runs):
        assert abs(a - b) <= 0.02 * abs(a) + 1e-3


def test_fp16_without_a_step_in_the_block_is_declined():
    code = "import torch\ndef f(m, x):\n    loss = m(x).mean()\n    loss.backward()\n"
    out, sites = _rewrite(code, options={("precision", "mode"): "fp16"})
    assert out == code and "no OPT.step()" in sites[0].reason


@pytest.mark.parametrize("code, reason", [
    # a name of the chain read after the step: it would be bf16 there (numpy has no bf16)
    ("import torch\ndef f(m, o, x, buf):\n    p = m(x)\n    loss = p.pow(2).mean()\n    loss.backward()\n    buf.add(p.detach().numpy())\n",
     "p is read after the step"),
    ("import torch\ndef f(m, o, x, log):\n    loss = m(x).mean()\n    loss.backward()\n    log.append(loss)\n",
     "loss is read after the step"),
    # a loop that carries a chain name into its next round
    ("import torch\ndef f(m, xs):\n    h = None\n    for x in xs:\n        y = m(x, h)\n        loss = y.sum()\n        loss.backward()\n        h = y.detach()\n",
     "y is read after the step"),
    ("import torch\ndef f(m, xs, h):\n    for x in xs:\n        print(y)\n        y = m(x, h)\n        loss = y.sum()\n        loss.backward()\n",
     "y is read after the step"),
    ("import torch\ndef f(m, o, x):\n    m(x).sum().backward()\n", ""),
    ("import torch\ndef f(m, x):\n    self.loss = m(x).mean()\n    self.loss.backward()\n", ""),
    ("import torch\ndef f(loss):\n    loss.backward()\n", "no forward chain"),
])
def test_look_alikes_are_left_alone(code, reason):
    out, sites = _rewrite(code)
    assert out == code
    if reason:
        assert any(reason in s.reason for s in sites), sites


def _sac_nets(seed=0):
    torch.manual_seed(seed)
    actor = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2), torch.nn.Tanh())
    critic = torch.nn.Sequential(torch.nn.Linear(10, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    return actor, critic, torch.optim.Adam(critic.parameters(), lr=1e-3)


def _run(code, steps=20):
    namespace = harness.load(code, filename="train.py")
    actor, critic, opt = _sac_nets()
    g = torch.Generator().manual_seed(1)
    losses, dtypes = [], set()
    for _ in range(steps):
        obs, act, nxt = torch.randn(32, 8, generator=g), torch.rand(32, 2, generator=g) * 2 - 1, torch.randn(32, 8, generator=g)
        rew, done = torch.randn(32, generator=g), torch.zeros(32)
        loss, explore = namespace["update"](actor, critic, opt, obs, act, rew, nxt, done)
        losses.append(loss)
        dtypes.add(explore.dtype)
    return losses, [p.detach().clone() for p in critic.parameters()], dtypes


def test_differential_cpu_bf16_close_not_equal_and_fp32_outside():
    out, _ = _rewrite(SAC_UPDATE)
    base_losses, base_params, base_dtypes = _run(SAC_UPDATE)
    losses, params, dtypes = _run(out)
    assert dtypes == base_dtypes == {torch.float32}  # action selection stays fp32
    assert all(p.dtype == torch.float32 for p in params)  # master weights stay fp32
    assert losses != base_losses  # bf16 matmuls: not the same numbers (changes-semantics)
    for a, b in zip(losses, base_losses):
        assert abs(a - b) <= 0.05 * abs(b) + 0.02
    for p, q in zip(params, base_params):
        assert torch.allclose(p, q, atol=0.02, rtol=0.05)


def test_site_reason_is_one_short_line():
    _, sites = _rewrite(SAC_UPDATE)
    for site in sites:
        assert "\n" not in site.reason and len(site.reason) < 140
    tree = cst.parse_module(_rewrite(SAC_UPDATE)[0])
    assert tree.code == _rewrite(SAC_UPDATE)[0]


CALIBRATED = """\
import torch


def step(enc, head, opt, x):
    h = enc(x)
    y = head(h)
    loss = y.pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


def test_fp16_calibration_keeps_overflowing_lines_and_what_feeds_them_fp32():
    calib = {"train.py:5": [9.0e4, 0.01], "train.py:6": [3.0, 0.001]}
    out, [site] = _rewrite(CALIBRATED, options={("precision", "mode"): "fp16", ("precision", "calibration"): calib})
    body = [ast.unparse(s) for s in next(n for n in ast.parse(out).body if isinstance(n, ast.FunctionDef)).body]
    assert body[0] == "h = enc(x)"  # overflowed fp16 in calibration: outside autocast
    assert body[1].startswith("with torch.autocast(device_type='cpu', dtype=torch.float16):") and "y = head(h)" in body[1]
    assert "kept fp32 by calibration: line 5" in site.reason and "9e+04" in site.reason
    # underflow of the normal range counts too; with every line flagged nothing is left: declined
    calib = {"train.py:5": [1.0, 1e-7], "train.py:6": [1.0, 1e-6], "train.py:7": [1.0, 0.5]}
    out, sites = _rewrite(CALIBRATED, options={("precision", "mode"): "fp16", ("precision", "calibration"): calib})
    body = [ast.unparse(s) for s in next(n for n in ast.parse(out).body if isinstance(n, ast.FunctionDef)).body]
    assert body[:2] == ["h = enc(x)", "y = head(h)"] and body[2].startswith("with torch.autocast")
    # bf16 has fp32's range: calibration does not apply
    out, [site] = _rewrite(CALIBRATED, options={("precision", "calibration"): {"train.py:5": [9.0e4, 0.01]}})
    assert "calibration" not in site.reason and ast.unparse(ast.parse(out)).count("with torch.autocast") == 1
    assert "h = enc(x)" in ast.unparse(next(n for n in ast.walk(ast.parse(out)) if isinstance(n, ast.With)))


def test_calibration_records_module_ranges_per_user_line(tmp_path, monkeypatch):
    from scalebox_cst.runtime import metrics, precision
    from scalebox_cst.runtime.telemetry import fallbacks, training

    monkeypatch.setattr(fallbacks, "_classifier_obj", __import__("scalebox_cst.runtime.telemetry.profile", fromlist=["x"]).Classifier(str(tmp_path) + "/"))
    monkeypatch.setenv(metrics.ENV_FILE, str(tmp_path / "metrics.jsonl"))
    # install() hooks write_json to every later flush: without this, each test after it in the
    # worker that flushed with a metrics file set found this test's precision.json beside it
    monkeypatch.setattr(metrics, "_after_flush", [])
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "big = torch.nn.Linear(4, 4)\n"
        "torch.nn.init.constant_(big.weight, 3.0e4)\n"
        "small = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())\n"
        "def step(x):\n"
        "    a = big(x)\n"
        "    b = small(x)\n"
        "    return a, b\n"
    )
    ns = harness.load(script.read_text(), filename=str(script))
    precision.ranges.clear()
    precision.install(2)
    try:
        for _ in range(3):
            ns["step"](torch.ones(2, 4))
            training.optimizer_steps += 1
        ns["step"](torch.ones(2, 4) * 1e6)  # after the calibration steps: not recorded
    finally:
        precision.stop()
    data = json.loads((tmp_path / "precision.json").read_text())
    rows = {(r["file"], r["line"]): r for r in data["lines"]}
    assert set(rows) == {("train.py", 6), ("train.py", 7)}
    # the nested Linear inside the Sequential counts for its caller's line; the call after the steps does not
    assert 65504 < rows[("train.py", 6)]["max"] < 1e6 and rows[("train.py", 7)]["max"] < 10
    assert not precision._handles


E2E = """\
import torch

torch.manual_seed(0)
enc = torch.nn.Linear(4, 8)
torch.nn.init.constant_(enc.weight, 2.0e4)
head = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(head.parameters(), lr=1e-9)
for step in range(4):
    x = torch.ones(16, 4)
    h = enc(x)
    y = head(h / 1.0e5)
    loss = y.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_calibration_run_then_fp16_rewrite_names_the_kept_line(project):
    from scalebox_cst import runs

    from conftest import scalebox

    (project / "train.py").write_text(E2E)
    (project / "scalebox.toml").write_text('backend = "cpu"\ntransforms = ["precision.autocast"]\n[precision]\nmode = "fp16"\ncalibrate_steps = 2\n')
    scalebox("rewrite", str(project))
    proc = scalebox("run", "--original", "--calibrate-precision", "train.py", cwd=project)  # fp32 ranges, the user's lines
    [run] = runs.list_runs(str(project))
    rows = {r["line"]: r for r in run.record["precision"]["lines"] if r["file"] == "train.py"}
    assert rows[10]["max"] > 65504 and rows[11]["max"] < 65504, proc.stderr
    (project / "train.py").write_text(E2E + "print('next')\n")
    report = json.loads(scalebox("rewrite", str(project), "--json").stdout)
    [site] = [s for f in report["files"] for s in f["sites"] if s["transform"] == ID]
    assert "kept fp32 by calibration: line 10" in site["reason"] and (site["line"], site["end_line"]) == (11, 12)
