"""The performance analyzer (issue 21 part 1): runtime.telemetry.profile samples the main thread's
stack, scalebox_cst.profile reduces and reports it.

The categorizer is tested on synthetic stacks (code objects compiled under library-like file
names, chained as frames), the reduction on written profile.jsonl files, and the whole path on a
real ``scalebox run`` of a script whose env step is busy for a known time.
"""
import dis
import glob
import json
import os
import textwrap
import threading
import types

import pytest

from scalebox_cst import compare as compare_mod
from scalebox_cst import jsonlines
from scalebox_cst import profile as prof
from scalebox_cst import runs
from scalebox_cst.runtime.telemetry import profile as rp
import harness
from conftest import scalebox

SITE = "/venv/lib/python3.11/site-packages/"
PROJECT = "/proj/"
RUNTIME = os.path.dirname(os.path.dirname(os.path.abspath(rp.__file__)))  # scalebox_cst.runtime


def code_of(filename, source, name):
    """The code object called ``name`` (a qualname) in ``source`` compiled as ``filename``."""
    todo = [harness.compiled(textwrap.dedent(source), filename)]
    while todo:
        c = todo.pop()
        if c.co_qualname == name or (name == "<module>" and c.co_name == "<module>"):
            return c
        todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    raise KeyError(name)


class Frame:
    def __init__(self, code, back=None, lasti=0, line=1):
        self.f_code, self.f_back, self.f_lasti, self.f_lineno = code, back, lasti, line


def stack(*codes, leaf_call=False):
    """Frames for ``codes`` listed outermost first; ``leaf_call``: the innermost one stands at its
    first call instruction (as while a C function it calls runs)."""
    frame = None
    for i, code in enumerate(codes):
        lasti = 0
        if leaf_call and i == len(codes) - 1:
            lasti = next(x.offset for x in dis.get_instructions(code) if x.opname == "CALL")
        frame = Frame(code, frame, lasti, line=code.co_firstlineno + 1)
    return frame


FN = "def f(x):\n    return x\n"
LAUNCH = code_of(os.path.join(RUNTIME, "launch.py"), "def main():\n    pass\n", "main")
IMPORTING = code_of("<frozen importlib._bootstrap>", "def _call_with_frames_removed(f):\n    return f()\n", "_call_with_frames_removed")
LOOP = code_of(PROJECT + "train.py", "def loop(env, t, torch, x):\n    return env.step(x)\n", "loop")


@pytest.fixture
def classifier():
    return rp.Classifier(project=PROJECT)


def lib(path, source=FN, name="f"):
    return code_of(SITE + path, source, name)


def test_an_env_step_through_gymnasium_and_telemetry_wrappers_gives_the_users_env_line(classifier):
    user_step = code_of(PROJECT + "envs.py", "class BusyEnv:\n    def step(self, a):\n        return sum(range(9))\n", "BusyEnv.step")
    wrapper = code_of(os.path.join(RUNTIME, "telemetry", "envs.py"), "def step(self):\n    pass\n", "step")
    frame = stack(LAUNCH, LOOP, lib("gymnasium/wrappers/common.py"), wrapper, user_step, lib("numpy/core/fromnumeric.py"))
    user, category = classifier.classify(frame)
    assert category == "env" and user.f_code is user_step


@pytest.mark.parametrize("path, name, expected", [
    ("torch/autograd/__init__.py", "backward", "backward"),
    ("torch/_tensor.py", "backward", "backward"),
    ("torch/optim/adam.py", "_single_tensor_adam", "optimizer"),
    ("torch/distributions/categorical.py", "f", "distributions"),
    ("torch/utils/tensorboard/writer.py", "f", "logging"),
    ("torch/utils/data/dataloader.py", "f", "replay"),
    ("stable_baselines3/common/buffers.py", "f", "replay"),
    ("numpy/core/fromnumeric.py", "f", "other"),
    ("torch/_tensor.py", "__format__", "other"),
])
def test_library_frames_inside_a_user_line_give_its_category(classifier, path, name, expected):
    inner = lib(path, f"def {name}(x):\n    return x\n", name)
    user, category = classifier.classify(stack(LAUNCH, LOOP, inner))
    assert (user.f_code, category) == (LOOP, expected)


def test_module_calls_are_action_selection_without_grad_and_loss_forward_with_it(classifier, monkeypatch):
    call = code_of(SITE + "torch/nn/modules/module.py", "def _call_impl(self):\n    pass\n", "_call_impl")
    forward = code_of(PROJECT + "model.py", "class Net:\n    def forward(self, x):\n        return x\n", "Net.forward")
    linear = lib("torch/nn/functional.py", "def linear(x):\n    return x\n", "linear")
    frame = stack(LAUNCH, LOOP, call, forward, linear)
    monkeypatch.setattr(rp._Grad, "enabled", False)
    assert classifier.classify(frame) == (frame.f_back, "action")
    monkeypatch.setattr(rp._Grad, "enabled", True)
    assert classifier.classify(frame) == (frame.f_back, "forward")


def test_the_grad_off_category_is_not_named_acting_alone():
    """XinJingHao's Duel-DDQN and sfujim's TD3: their updates' no_grad target forwards (batch 256)
    were listed as "action selection" (16-22% of the run), far more than their acting (batch 1);
    the label said acting was the cost. Grad mode cannot tell the two apart: the label names both."""
    from scalebox_cst.runtime.profile_categories import CATEGORIES

    label = CATEGORIES["action"]
    assert "target" in label and "acting" in label and label != "action selection"
    assert len(label) <= 28  # the width of the profile's and compare's category column


@pytest.mark.parametrize("source, device, expected", [
    ("def f(t):\n    return t.item()\n", True, "sync"),
    ("def f(t):\n    return t.cpu().numpy()\n", True, "sync"),
    ("def f(t):\n    return t.item()\n", False, "tensors"),  # no device in use: a host copy
    ("def f(torch, obs):\n    return torch.as_tensor(obs, dtype=torch.float32)\n", False, "tensors"),
    ("def f(x):\n    print('loss', x)\n", False, "logging"),
    ("def f(x):\n    return len(x)\n", False, "other"),
])
def test_the_c_function_a_user_line_calls_gives_its_category(classifier, monkeypatch, source, device, expected):
    monkeypatch.setattr(rp, "_device_in_use", lambda: device)
    user = code_of(PROJECT + "train.py", source, "f")
    assert classifier.classify(stack(LAUNCH, user, leaf_call=True))[1] == expected


def test_replay_sampling_engine_sites_imports_and_no_project_frame(classifier):
    sample = code_of(PROJECT + "buffer.py", "class ReplayBuffer:\n    def sample(self, n):\n        return n\n", "ReplayBuffer.sample")
    assert classifier.classify(stack(LAUNCH, LOOP, sample, lib("numpy/random/x.py")))[1] == "replay"
    engine = code_of(os.path.join(RUNTIME, "vectorized", "recurrence_guard.py"), FN, "f")
    user, category = classifier.classify(stack(LAUNCH, LOOP, engine, lib("torch/functional.py")))
    assert (user.f_code, category) == (LOOP, "engine")
    # a module imported from a user line runs its top level under the import machinery: start-up,
    # whatever the package and whatever its top level calls
    imported = code_of(SITE + "torch/distributions/__init__.py", "x = 1\n", "<module>")
    assert classifier.classify(stack(LAUNCH, LOOP, IMPORTING, imported))[1] == "imports"
    register = lib("gymnasium/envs/registration.py", "def register(x):\n    return x\n", "register")
    assert classifier.classify(stack(LAUNCH, LOOP, IMPORTING, imported, register))[1] == "imports"
    # torch importing torch._dynamo when the first optimizer steps: start-up, not "optimizer"
    step = lib("torch/optim/optimizer.py", "def _use_grad(x):\n    return x\n", "_use_grad")
    dynamo = code_of(SITE + "torch/_dynamo/__init__.py", "x = 1\n", "<module>")
    assert classifier.classify(stack(LAUNCH, LOOP, step, IMPORTING, dynamo, lib("numpy/core/fromnumeric.py")))[1] == "imports"
    # a library's top level run outside an import (exec of a string, runpy of a file outside the
    # project): no start-up claim
    assert classifier.classify(stack(LAUNCH, LOOP, imported))[1] == "other"
    assert classifier.classify(stack(LAUNCH)) == (None, "other")


def test_the_user_lines_wrappers_are_plumbing_not_engine_sites(classifier):
    """user_lines wraps inspect.getframeinfo in the original's runs too: inspect.stack() under a
    library's import (torch's) was charged to "engine sites" in a run with no site at all."""
    wrapper = code_of(os.path.join(RUNTIME, "user_lines.py"), FN, "f")
    imported = code_of(SITE + "torch/_sources.py", "x = 1\n", "<module>")
    inspect_code = code_of("/usr/lib/python3.11/inspect.py", FN, "f")
    assert classifier.classify(stack(LAUNCH, LOOP, IMPORTING, imported, wrapper, inspect_code))[1] == "imports"
    user, category = classifier.classify(stack(LAUNCH, LOOP, wrapper, inspect_code))
    assert (user.f_code, category) == (LOOP, "other")


@pytest.mark.parametrize("source, name", [
    ("def f(t):\n    return t.item()\n", "item"),
    ("def f(torch, x):\n    return torch.tensor(x, dtype=1)\n", "tensor"),
    ("def f(a, x):\n    return a.b.c(x + 1, y=2)\n", "c"),
    ("def f(x):\n    print(x)\n", "print"),
    ("def f(g, h, x):\n    return g(h(x), x)\n", "h"),  # the first call that runs: h(x)
    ("def f(g):\n    return g()()\n", "g"),
])
def test_callee_names_the_function_a_call_instruction_calls(source, name):
    code = code_of("x.py", source, "f")
    first = next(x.offset for x in dis.get_instructions(code) if x.opname == "CALL")
    assert rp.callee(code, first) == name


def test_grad_mode_hook_follows_the_main_thread_only():
    torch = pytest.importorskip("torch")
    rp.attach_torch(torch)
    rp.attach_torch(torch)  # twice: wrapped once
    assert not getattr(torch.no_grad.__enter__.__wrapped__, "_scalebox_observed", False)
    assert rp._Grad.enabled
    with torch.no_grad():
        assert rp._Grad.enabled is False
        with torch.enable_grad():
            assert rp._Grad.enabled is True
        assert rp._Grad.enabled is False
    assert rp._Grad.enabled is True
    with torch.inference_mode():
        assert rp._Grad.enabled is False
    seen = []

    def other():
        with torch.no_grad():
            seen.append(rp._Grad.enabled)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == [True]  # another thread's no_grad is not the main thread's


# ------------------------------------------------------------------------------- reduction


def write_profile(folder, items, tail=""):
    with open(os.path.join(folder, prof.FILE), "w") as fh:
        for rows in items:
            fh.write(json.dumps({"time": 1.0, "hz": 25.0, "cpu": True, "rows": rows}) + "\n")
        fh.write(tail)


def test_deltas_sum_per_line_and_category_and_a_partial_line_waits(tmp_path):
    write_profile(str(tmp_path), [
        [["train.py", 10, "env", 4, 0.4, 0.3, 2], ["train.py", 12, "backward", 2, 0.2, 0.2, 2], ["", 0, "other", 1, 0.1, 0.0, 1]],
        [["train.py", 10, "env", 2, 0.2, 0.1, 1], ["train.py", 10, "other", 1, 0.1, 0.1, 1]],
        "not json\n",
    ], tail='{"rows": [["train.py", 12, "backward", 9')
    reader = prof.Reader(str(tmp_path)).refresh()
    assert reader.rows[("train.py", 10, "env")] == [6, pytest.approx(0.6), pytest.approx(0.4), 3]
    out = prof.reduce(reader.rows, reader.meta)
    assert [c["category"] for c in out["categories"]] == ["env", "backward", "other"]
    assert out["categories"][0]["share"] == pytest.approx(0.6)
    top = out["lines"][0]
    assert (top["path"], top["line"], top["category"], top["calls"]) == ("train.py", 10, "env", 4)
    assert top["share"] == pytest.approx(0.7) and top["categories"] == {"env": pytest.approx(0.857, abs=1e-3), "other": pytest.approx(0.143, abs=1e-3)}
    assert out["lines"][-1]["path"] == prof.OUTSIDE and out["lines"][-1]["line"] is None
    # the rest of the half-written line arrives: read on from where the reader stopped
    with open(os.path.join(str(tmp_path), prof.FILE), "a") as fh:
        fh.write(', 0.9, 0.9, 3]]}\n')
    assert reader.refresh().rows[("train.py", 12, "backward")] == [11, pytest.approx(1.1), pytest.approx(1.1), 5]


def test_coverage_of_a_hot_line_from_the_sites_and_the_stored_report():
    sites = [{"path": "train.py", "line": 20, "end_line": 24, "transform": "vectorize.recurrence", "vectorized": 9, "fallback": 1}]
    report = {"train.py": [
        {"transform": "vectorize.reduction", "line": 30, "end_line": 31, "action": "skipped", "reason": "the loop body writes a list"},
        {"transform": "grad_clip", "line": 40, "end_line": 40, "action": "rewritten", "reason": "clip inserted"},
    ]}
    got = prof.coverage("train.py", 22, sites, report)
    assert (got["covered"], got["transform"], got["site"], got["pass_rate"]) == (True, "vectorize.recurrence", "train.py:20-24", 0.9)
    got = prof.coverage("train.py", 31, sites, report)
    assert got == {"covered": False, "transform": "vectorize.reduction", "reason": "skipped: the loop body writes a list"}
    got = prof.coverage("train.py", 40, sites, report)
    # a site of one line is named as one line, as scalebox log and diff name it (was "train.py:40-40")
    assert (got["covered"], got["site"]) == (True, "train.py:40")
    assert prof.coverage("train.py", 50, sites, report) == {"covered": False, "reason": "no transform matched this line"}
    assert prof.coverage("other.py", 22, sites, report)["covered"] is False


def test_an_original_runs_hot_lines_name_what_its_branchs_rewrite_does_there(tmp_path):
    """A newcomer profiling the original first (Packt Chapter04/01_cartpole.py) read "no transform
    matched this line" beside a line the rewrite changes and one a transform left with a reason:
    the report was read for rewrite runs only. An original run's lines now name what its branch's
    rewrite does there, and never as covered (it ran none of it)."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text(
        "import torch\n"
        "net = torch.nn.Linear(3, 1)\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    opt.zero_grad()\n"
        "    net(torch.ones(3)).sum().backward()\n"
        "    opt.step()\n")
    scalebox("init", ".", cwd=project)
    scalebox("rewrite", "train.py", cwd=project)
    store = os.path.join(str(project), ".scalebox", "store.git")
    import pygit2

    source = str(pygit2.Repository(store).lookup_reference("refs/heads/source").peel().id)
    folder = runs.allocate_run(str(project), "run/0001")[1]
    record = {"branch": "run/0001", "run": 1, "status": "ok", "variant": "original", "commit": source, "source_commit": source}
    write_profile(folder, [[["train.py", 7, "optimizer", 10, 1.0, 1.0, 3], ["train.py", 1, "imports", 1, 0.1, 0.1, 1]]])
    got = {r["line"]: r for r in prof.build(folder, record, store)["lines"]}
    assert got[7]["code"] == "opt.step()"
    assert got[7]["coverage"] == {"covered": False, "transform": "grad_clip",
                                  "reason": "rewritten in run/0001's rewrite (this run ran your code as written)"}
    rewrite = dict(record, variant="rewrite", commit=str(pygit2.Repository(store).lookup_reference("refs/heads/run/0001").peel().id))
    assert prof.build(folder, rewrite, store)["lines"][0]["coverage"]["covered"] is True  # the rewrite's run: as before


def _run_with_profile(root, branch, shares, started):
    folder = runs.allocate_run(root, branch)[1]
    runs.write_record(folder, {"branch": branch, "run": 1, "status": "ok", "started": started, "variant": "rewrite"})
    write_profile(folder, [[["train.py", i + 1, c, 10, s, s, 1] for i, (c, s) in enumerate(shares.items())]])
    return folder


def test_compare_shows_category_shares_side_by_side(tmp_path):
    root = str(tmp_path)
    _run_with_profile(root, "run/0001", {"env": 0.6, "backward": 0.4}, 1.0)
    _run_with_profile(root, "run/0002", {"env": 0.2, "backward": 0.8}, 2.0)
    groups = [(b, runs.list_runs(root, b)) for b in ("run/0001", "run/0002")]
    result = compare_mod.compare(groups)
    rows = {r["category"]: r["shares"] for r in result["profile"]["categories"]}
    assert rows["env"] == [pytest.approx(0.6), pytest.approx(0.2)] and rows["backward"] == [pytest.approx(0.4), pytest.approx(0.8)]
    text = compare_mod.render(result)
    assert "time by category" in text
    env_row = next(l for l in text.splitlines() if l.strip().startswith("environment step"))
    assert env_row.split()[-2:] == ["60.0%", "20.0%"]


# ------------------------------------------------------------------------------- a real run

BUSY = """
import time

import gymnasium as gym
import numpy as np
import torch


class BusyEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        start = time.perf_counter()
        while time.perf_counter() - start < 0.05:  # BUSY
            pass
        return np.zeros(4, np.float32), 1.0, False, False, {}


torch.manual_seed(0)
env = BusyEnv()
net = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.Tanh(), torch.nn.Linear(512, 128))
opt = torch.optim.SGD(net.parameters(), lr=1e-3)
x = torch.randn(2048, 128)  # a forward of a few ms: sampled at 100 Hz even on a quiet machine
batch = torch.randn(512, 128)
obs, _ = env.reset(seed=0)
for i in range(60):
    with torch.no_grad():
        action = int(net(x).sum() > 0)  # ACTION
    obs, reward, term, trunc, info = env.step(action)
    loss = net(batch).pow(2).mean()  # LOSS
    loss.backward()  # BACKWARD
    opt.step()  # OPT
    opt.zero_grad()
"""


def test_a_run_records_where_its_time_went_per_line_and_category(tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    source = textwrap.dedent(BUSY)
    (project / "train.py").write_text(source)
    line = {tag: i for i, l in enumerate(source.splitlines(), 1) for tag in ("BUSY", "ACTION", "LOSS", "BACKWARD", "OPT") if f"# {tag}" in l}
    scalebox("init", ".", cwd=project)
    scalebox("run", "train.py", cwd=project, env={"SCALEBOX_TELEMETRY_HZ": "100"}, timeout=600)
    records = glob.glob(str(project / ".scalebox" / "runs" / "**" / "record.json"), recursive=True)
    record = json.loads(open(records[0]).read())
    p = record["profile"]
    share = {c["category"]: c["share"] for c in p["categories"]}
    # 60 steps of 50 ms busy env work (3 s) against backward passes of about 6 ms (0.4 s; 1 s on a loaded machine)
    assert share["env"] > share.get("backward", 0) > 0
    assert {"env", "backward", "forward", "action"} <= set(share)
    by_line = {}
    for r in p["lines"]:  # most time first: a line's main category (since the sampler's 0.2 ms GIL
        by_line.setdefault((r["path"], r["line"]), r)  # switch, `.pow(2).mean()` also gets a few "other" samples)
    loop_lines = [r for r in p["lines"] if r["category"] not in ("other", "imports")]  # not start-up
    # the optimizer's construction imports torch._dynamo (torch 2.13): start-up, said so
    assert "imports" in share
    assert all(r["coverage"]["reason"].startswith("start-up") for r in p["lines"] if r["category"] == "imports" and r["path"] == "train.py" and r["line"]), p["lines"]
    top = loop_lines[0]
    assert (top["path"], top["line"], top["category"]) == ("train.py", line["BUSY"], "env")
    assert top["code"] == "while time.perf_counter() - start < 0.05:  # BUSY" and top["calls"] >= 5
    assert top["coverage"] == {"covered": False, "reason": "no transform matched this line"}
    assert by_line[("train.py", line["BACKWARD"])]["category"] == "backward"
    assert by_line[("train.py", line["ACTION"])]["category"] == "action"
    assert by_line[("train.py", line["LOSS"])]["category"] == "forward", [r for r in p["lines"] if r["line"] == line["LOSS"]]
    assert p["cpu_measured"] and 0 < p["cpu_s"] <= p["wall_s"] * 1.05
    # the command shows the same, and --json gives the record's numbers back
    text = scalebox("profile", cwd=project).stdout
    assert "environment step" in text and f"train.py:{line['BUSY']}" in text and "# BUSY" in text
    data = json.loads(scalebox("profile", "run/0001#1", "--json", cwd=project).stdout)
    assert data["run"] == "run/0001#1" and data["profile"]["categories"] == p["categories"]
    # the profile stays out of metrics.jsonl
    metrics = open(glob.glob(str(project / ".scalebox" / "runs" / "**" / "metrics.jsonl"), recursive=True)[0]).read()
    assert "profile" not in metrics and "BUSY" not in metrics


def test_profile_of_an_unknown_run_is_a_one_line_error(tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("print(1)\n")
    scalebox("init", ".", cwd=project)
    proc = scalebox("profile", cwd=project, check=False)
    assert proc.returncode == 1 and proc.stderr.strip() == "scalebox: no run yet (scalebox run SCRIPT)"


def test_flush_maps_rewritten_lines_back_to_the_users(tmp_path, monkeypatch):
    from scalebox_cst.runtime import loader, metrics

    original = "x = 1\nfor i in range(3):\n    x += i\nprint(x)\n"
    rewritten = "import helper\nx = 1\nx += sum(range(3))\nprint(x)\n"
    filename = str(tmp_path / "train.py")
    loader.register_origin(filename, loader.Origin(original, rewritten, [(2, 3, "vectorize.reduction")]))
    monkeypatch.setenv(metrics.ENV_FILE, str(tmp_path / "metrics.jsonl"))
    profiler = rp.Profiler(rp.Classifier(project=str(tmp_path) + os.sep))
    profiler.rows = {(filename, 3, "other"): [2, 0.2, 0.1, 1], (filename, 4, "logging"): [1, 0.1, 0.1, 1],
                     ("", 0, "other"): [1, 0.05, 0.0, 1]}
    rp.flush(profiler)
    line = json.loads((tmp_path / prof.FILE).read_text())
    assert sorted(map(tuple, line["rows"])) == [("", 0, "other", 1, 0.05, 0.0, 1),
                                                ("train.py", 2, "other", 2, 0.2, 0.1, 1),
                                                ("train.py", 4, "logging", 1, 0.1, 0.1, 1)]
    assert profiler.rows == {}
    rp.flush(profiler)  # nothing new: no line
    assert len((tmp_path / prof.FILE).read_text().splitlines()) == 1


def test_code_the_rewrite_added_is_not_charged_to_the_users_next_line(tmp_path, monkeypatch):
    """The support imports a rewrite puts above the user's first line import torch: their samples
    went to that first line (``import argparse`` the hottest line of every rewritten run)."""
    from scalebox_cst.runtime import loader, metrics

    original = "import argparse\nx = 1\nfor i in range(3):\n    x += i\n"
    rewritten = "import helper\nimport argparse\nx = 1\nx += sum(range(3))\n"
    filename = str(tmp_path / "train.py")
    loader.register_origin(filename, loader.Origin(original, rewritten, [(3, 4, "vectorize.reduction")]))
    monkeypatch.setenv(metrics.ENV_FILE, str(tmp_path / "metrics.jsonl"))
    profiler = rp.Profiler(rp.Classifier(project=str(tmp_path) + os.sep))
    profiler.rows = {(filename, 1, "other"): [3, 0.3, 0.1, 1], (filename, 2, "other"): [1, 0.1, 0.1, 1],
                     (filename, 4, "other"): [1, 0.1, 0.1, 1]}
    rp.flush(profiler)
    rows = sorted(map(tuple, json.loads((tmp_path / prof.FILE).read_text())["rows"]))
    assert [r[:2] for r in rows] == [("train.py", rp.ADDED), ("train.py", 1), ("train.py", 3)]
    out = prof.build(str(tmp_path), {})
    added = next(r for r in out["lines"] if r["line"] == prof.ADDED)
    assert added["code"] is None and "added" in added["coverage"]["reason"]
    text = prof.render(out)
    assert "train.py (added by the rewrite)" in text and "train.py:0" not in text


def test_start_up_in_the_rewrites_support_imports_says_the_original_pays_it_too(tmp_path, monkeypatch):
    """A rewrite's support imports come first and import torch: in a short run the row 'train.py
    (added by the rewrite)' was half the run, read 'code the rewrite added', as if the rewrite
    cost that; the original pays torch's import at its own `import torch`."""
    from scalebox_cst.runtime import loader, metrics

    original = "import torch\nx = 1\n"
    rewritten = "import helper\nimport torch\nx = 1\n"
    filename = str(tmp_path / "train.py")
    loader.register_origin(filename, loader.Origin(original, rewritten, []))
    monkeypatch.setenv(metrics.ENV_FILE, str(tmp_path / "metrics.jsonl"))
    profiler = rp.Profiler(rp.Classifier(project=str(tmp_path) + os.sep))
    profiler.rows = {(filename, 1, "imports"): [30, 1.5, 1.5, 1], (filename, 3, "other"): [1, 0.1, 0.1, 1]}
    rp.flush(profiler)
    out = prof.build(str(tmp_path), {})
    added = next(r for r in out["lines"] if r["line"] == prof.ADDED)
    assert added["category"] == "imports"
    assert "original pays" in added["coverage"]["reason"] and "run before your own imports" in added["coverage"]["reason"]


def test_a_subscript_store_on_a_user_line_is_a_tensor_copy(classifier):
    user = code_of(PROJECT + "train.py", "def f(buf, t, r):\n    buf[t] = r\n", "f")
    store = next(x.offset for x in dis.get_instructions(user) if x.opname == "STORE_SUBSCR")
    frame = Frame(user, Frame(LAUNCH), store, line=2)
    assert classifier.classify(frame) == (frame, "tensors")
    frame.f_lasti = 0  # elsewhere on the line: nothing says what it is
    assert classifier.classify(frame) == (frame, "other")


def test_a_relative_file_name_is_the_working_directorys(tmp_path, monkeypatch):
    """``runpy.run_path("train.py")`` compiles with the relative name: it was a library frame,
    and every sample of that script fell on the line that called run_path."""
    monkeypatch.chdir(tmp_path)
    classifier = rp.Classifier(project=os.path.join(str(tmp_path), ""))
    runner = code_of(str(tmp_path / "run.py"), "def main():\n    pass\n", "main")
    script = code_of("train.py", "def loop(torch, x):\n    return x\n", "loop")
    optim = lib("torch/optim/adam.py", "def step(x):\n    return x\n", "step")
    user, category = classifier.classify(stack(runner, script, optim))
    assert (user.f_code, category) == (script, "optimizer")


def test_a_site_without_counts_says_whether_its_transform_counts_at_all():
    """grad_clip's guard ran on every step of xj DQN's profiled run, yet its hot line read "no
    guard counts (a site without a guard, or its guard did not run)": only the vectorize.*
    guards count passes (runtime/telemetry/sites.py), so the text now says which case it is."""
    report = {"train.py": [
        {"transform": "grad_clip", "line": 40, "end_line": 40, "action": "rewritten", "reason": "guard"},
        {"transform": "vectorize.target_update", "line": 50, "end_line": 51, "action": "rewritten", "reason": "foreach"},
        {"transform": "vectorize.elementwise", "line": 60, "end_line": 62, "action": "rewritten", "reason": "scatter"},
    ]}
    text = {line: prof._coverage_text(prof.coverage("train.py", line, [], report)) for line in (40, 50, 61)}
    assert text[40] == "grad_clip site train.py:40, no pass/fallback counts for this transform"
    assert text[50] == "vectorize.target_update site train.py:50-51, its guard did not run (no pass/fallback counts)"
    assert text[61].endswith("its guard did not run (no pass/fallback counts)")
    counted = [{"path": "train.py", "line": 50, "end_line": 51, "transform": "vectorize.target_update", "vectorized": 3, "fallback": 1}]
    assert prof._coverage_text(prof.coverage("train.py", 50, counted, report)).endswith("guard passed 75% (3/4)")


@pytest.mark.parametrize("line", [
    '{"hz": "x", "cpu": true, "rows": []}',
    '{"hz": [1], "cpu": true, "rows": 5}',
    '{"hz": 25.0, "cpu": true, "rows": [["train.py", 3, "other", 1e400, 0.1, 0.05, 1]]}',
    '{"hz": 25.0, "cpu": true, "rows": [["train.py", 1e400, "other", 2, 0.1, 0.05, 1]]}',
    '{"hz": 25.0, "cpu": true, "rows": [["train.py", 3, "other", 2, NaN, 0.05, 1]]}',
])
def test_a_damaged_profile_line_is_passed_over_and_the_rest_read(tmp_path, line):
    """A profile.jsonl line with a rate that is not a number, rows that are not a list, or an
    inf/NaN count made ``scalebox profile``, ``compare`` and the monitor end in a ValueError,
    TypeError or OverflowError (``int(inf)``) (the fourth fault campaign): it is passed over."""
    good = {"hz": 25.0, "cpu": True, "rows": [["train.py", 4, "backward", 3, 0.3, 0.2, 2]]}
    (tmp_path / prof.FILE).write_text(json.dumps(good) + "\n" + line + "\n")
    summary = prof.summarize(str(tmp_path))
    assert summary["hz"] == 25.0 and summary["samples"] == 3 and summary["lines"][0]["line"] == 4
    assert "25 Hz" in prof.render(summary)


def test_a_profile_line_without_its_end_is_read_in_pieces_and_passed_over(tmp_path, monkeypatch):
    """A profile.jsonl whose last line never ends (a run writing without newlines, a damaged file)
    was read whole on every refresh: 280 MB held `scalebox profile` at 312 MB and the monitor read
    it all every poll (the fourth fault campaign). It is read in bounded pieces, and a line longer
    than any profile line is passed over once."""
    monkeypatch.setattr(jsonlines, "LONGEST_LINE", 4096)
    good = {"hz": 25.0, "cpu": True, "rows": [["train.py", 4, "backward", 3, 0.3, 0.2, 2]]}
    path = tmp_path / prof.FILE
    path.write_bytes(json.dumps(good).encode() + b"\n" + b'{"hz": 25.0, "rows": [' + b'["a", 1, "other", 1, 0.1, 0.1, 1],' * 2000)
    reads = []
    real = jsonlines.open_regular

    def counted(*args, **kwargs):
        fh = real(*args, **kwargs)
        read = fh.read
        fh.read = lambda n=-1: reads.append(n) or read(n)
        return fh

    monkeypatch.setattr(jsonlines, "open_regular", counted)
    reader = prof.Reader(str(tmp_path)).refresh()
    assert reader.rows == {("train.py", 4, "backward"): [3.0, 0.3, 0.2, 2.0]}
    assert reads and all(n > 0 for n in reads)  # bounded pieces, never a read of the whole rest
    assert reader.offset == path.stat().st_size  # passed over: the next refresh reads nothing again


PYTHON_BEFORE_TORCH = """
import random, time
import numpy as np
import torch

buf = [(np.random.randn(4).astype(np.float32), 1, 1.0) for _ in range(5000)]
lin = torch.nn.Linear(4, 64)
end = time.perf_counter() + 3.0
while time.perf_counter() < end:
    batch = random.sample(buf, 1024)  # PY
    s, a, r = map(np.stack, zip(*batch))  # PY
    x = torch.FloatTensor(s)  # TORCH
    lin(x).sum().backward()
"""


def test_pure_python_before_a_torch_call_is_charged_to_its_own_lines(tmp_path):
    """quantumiracle's discrete SAC: ``torch.FloatTensor(state)`` (about 1% of the run, timed) was
    its hottest line at 14%, and its replay sample (random.sample, np.stack: ~1 ms of Python a
    call) was under 1%. The sampler takes the main thread's stack only once it holds the GIL;
    with CPython's 5 ms switch interval it got it at the next torch call, which releases it.
    The sample here is of 1,024 rows, ~1 ms of Python as there: 256 rows took 0.24 ms on a faster
    host, under the 0.2 ms interval plus a wait, and every sample went to the torch calls (a
    stretch of Python that short is still charged to the call after it: docs/runs.md)."""
    project = tmp_path / "proj"
    project.mkdir()
    source = textwrap.dedent(PYTHON_BEFORE_TORCH)
    (project / "train.py").write_text(source)
    tags = {i: tag for i, l in enumerate(source.splitlines(), 1) for tag in ("PY", "TORCH") if f"# {tag}" in l}
    scalebox("init", ".", cwd=project)
    scalebox("run", "train.py", cwd=project, env={"OMP_NUM_THREADS": "1"}, timeout=600)
    (record,) = glob.glob(str(project / ".scalebox" / "runs" / "**" / "record.json"), recursive=True)
    lines = json.loads(open(record).read())["profile"]["lines"]
    share = {"PY": 0.0, "TORCH": 0.0}
    for r in lines:
        if r["path"] == "train.py" and r["line"] in tags:
            share[tags[r["line"]]] += r["share"]
    # timed, the two Python lines take ~10x the FloatTensor line's time (about 60% vs 5% of the
    # loop). Sampled: before, 0.01-0.2x; now 2-7x, 0.9x at worst on a host with 5 runnable tasks
    # on 2 CPUs (the sampler thread itself waits for a core then, and the bias comes back in part)
    assert share["PY"] > 0.5 * share["TORCH"], share


def test_a_users_own_env_or_vector_env_class_is_environment_step(classifier):
    """BY571's IQN steps CartPole in its own SubprocVecEnv (MultiPro.py): the wait for the worker
    (`remote.recv()` in `step_wait`) was "other" (13% of the run) and "environment step" read 0.0%."""
    mp_recv = code_of("/usr/lib/python3.11/multiprocessing/connection.py", "def recv(self):\n    return 1\n", "recv")
    vec = "class VecEnv:\n    def step(self, a):\n        return self.step_wait()\nclass SubprocVecEnv(VecEnv):\n    def step_wait(self):\n        return 1\n"
    step = code_of(PROJECT + "MultiPro.py", vec, "VecEnv.step")
    wait = code_of(PROJECT + "MultiPro.py", vec, "SubprocVecEnv.step_wait")
    assert classifier.classify(stack(LAUNCH, LOOP, step, wait, mp_recv))[1] == "env"
    grid = code_of(PROJECT + "gridworld.py", "class GridEnvironment:\n    def reset(self):\n        return 0\n", "GridEnvironment.reset")
    assert classifier.classify(stack(LAUNCH, LOOP, grid))[1] == "env"
    # an agent's step is no env's, and a name merely holding "env" is no env class
    for qual in ("Agent.step", "EnvRunner.step"):
        cls, meth = qual.split(".")
        code = code_of(PROJECT + "agent.py", f"class {cls}:\n    def {meth}(self):\n        return 0\n", qual)
        assert classifier.classify(stack(LAUNCH, LOOP, code))[1] == "other", qual


SNAPS = """
import sys
import time

sys.setswitchinterval(0.1)  # the sampler never takes the GIL from the Python stretch: it waits for a release
for step in range(80):
    start = time.perf_counter()
    while time.perf_counter() - start < 0.03:  # PYTHON
        pass
    time.sleep(0.002)  # FIRST
    x = step
    time.sleep(0.004)  # SECOND
"""


def test_a_short_release_right_after_another_is_sampled_too(tmp_path):
    """A look that waits for the GIL lands on the main thread's first release after a Python
    stretch (FIRST, standing for the loss's forward); with a fixed period after it, every next look
    fell in the Python stretch again, and SECOND (a backward pass right after), 40% of the
    releases' time, was never seen: CI's profile of the run above had no backward. The looks
    come at random intervals now, so every phase of a step is reached."""
    project = tmp_path / "proj"
    project.mkdir()
    source = textwrap.dedent(SNAPS)
    (project / "train.py").write_text(source)
    line = {tag: i for i, l in enumerate(source.splitlines(), 1) for tag in ("PYTHON", "FIRST", "SECOND") if f"# {tag}" in l}
    scalebox("init", ".", cwd=project)
    scalebox("run", "train.py", cwd=project, env={"SCALEBOX_TELEMETRY_HZ": "100"}, timeout=600)
    (record,) = glob.glob(str(project / ".scalebox" / "runs" / "**" / "record.json"), recursive=True)
    rows = json.loads(open(record).read())["profile"]["lines"]
    share = {}
    for r in rows:
        if r["path"] == "train.py":
            share[r["line"]] = share.get(r["line"], 0) + r["share"]
    assert share.get(line["FIRST"], 0) > 0 and share.get(line["SECOND"], 0) > 0, (line, share)
